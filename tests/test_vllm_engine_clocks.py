"""The real vLLM CPU server's own per-request clocks in the record and the time ledger, with
``--enable-per-request-metrics`` (the packaged profile's) and without it (an attached
server started without the flag: the ledger falls back to the /metrics histograms and
says so).

Both servers are the packaged vllm-cpu profile's command, one after the other (a
module-scoped fixture per arm: one vLLM at a time, ~4 GB each). Opt-in as
tests/test_vllm_cpu.py: `bash scripts/setup.sh --vllm`.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass, replace

import pytest
from engine_case import case_runner
from engine_target import VLLM, engine_paths, packaged_launch

from strata_plugin.agent.collectors.prom import NameMapper, parse_exposition
from strata_plugin.analysis.ledger import case_ledger, server_clocks
from strata_plugin.load.workload import Workload
from strata_plugin.run.server import Server
from tests.test_vllm_cpu import PROFILE

pytestmark = [pytest.mark.vllm, pytest.mark.integration]  # a real vLLM server
FLAG = "--enable-per-request-metrics"


@pytest.fixture(scope="module", params=["flag", "no_flag"])
def vllm_arm(request, tmp_path_factory):
    engine_paths(VLLM)
    spec = packaged_launch(PROFILE, tmp_path_factory.mktemp("vllm") / "server.log")
    assert FLAG in spec.argv  # the packaged profile asks for them
    if request.param == "no_flag":
        spec = replace(spec, argv=tuple(a for a in spec.argv if a != FLAG))
    server = Server(spec, spec.base_url)
    server.start()
    yield request.param, server
    server.stop()


@dataclass(frozen=True)
class _Row:
    """What server_clocks reads of a /metrics series over the case (HwStat's fields)."""

    source: str
    metric: str
    delta: float


def _histograms(base_url: str) -> dict[str, float]:
    """vLLM's queue and prefill histograms' _sum and _count, by Strata's names."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as resp:
        samples = parse_exposition(resp.read().decode())
    names = NameMapper()
    mapping = names.update({s.family for s in samples})
    out: dict[str, float] = {}
    for s in samples:
        n = names.name(s, mapping)
        if n.startswith(("queue_time_seconds_", "prefill_time_seconds_")) and n.endswith(
                ("_sum", "_count")):
            out[n] = out.get(n, 0.0) + s.value
    return out


def test_queue_and_prefill_per_request_from_the_engine_or_the_stated_fallback(vllm_arm):
    arm, server = vllm_arm
    runner = case_runner(server, PROFILE, "completions", "vllm", salt=arm)
    before = _histograms(server.base_url)
    w = Workload("decode_clocks", isl=200, osl=12, concurrency=3, requests=9, warmups=1,
                 seed=31)
    res = runner.run(w, scale=False)
    after = _histograms(server.base_url)
    assert res.problems == ()
    every = (*res.warmup_records, *res.records)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    # the histograms saw exactly these requests (no other generation ran)
    assert delta["queue_time_seconds_count"] == len(every)
    hw = [_Row("prom", k, v) for k, v in delta.items()]
    clocks = server_clocks(hw, None, len(every), None)
    led = case_ledger("c", w.name, {"osl": w.osl, "concurrency": w.concurrency},
                      res.records, clocks=clocks)
    assert led.n == len(res.records)
    for r in res.records:
        assert r.server_request_id is not None and r.server_request_id.startswith("cmpl-")
    if arm == "flag":
        engs = [r.engine for r in every]
        assert all(e is not None and e.source == "vllm per-request metrics" for e in engs)
        assert all(e.queue_ms is not None and e.prefill_ms is not None
                   and e.decode_ms is not None and e.mean_itl_ms is not None for e in engs)
        # the same engine-core timestamps as the histograms: their means agree
        q_mean = sum(e.queue_ms for e in engs) / len(engs)
        pf_mean = sum(e.prefill_ms for e in engs) / len(engs)
        assert q_mean == pytest.approx(clocks.queue_ms, rel=0.01, abs=0.05)
        assert pf_mean == pytest.approx(clocks.prefill_ms, rel=0.01, abs=0.05)
        # the ledger takes each request's own, not the case's mean
        assert led.engine_sources == (("vllm per-request metrics", len(res.records)),)
        assert not any("case's mean" in m for m in led.merged), led.merged
        by_id = {r.request_id: r for r in res.records}
        for rl in led.requests:
            eng = by_id[rl.request_id].engine
            assert rl.part("prefill") == pytest.approx(eng.prefill_ms, abs=1e-6)
            # its own queue (bounded by the TTFT the client saw, less send and prefill)
            assert rl.part("server_queue") >= min(eng.queue_ms, rl.ttft_ms - eng.prefill_ms
                                                  - rl.part("client_send")) - 1e-6
        spread = {round(by_id[rl.request_id].engine.queue_ms, 3) for rl in led.requests}
        assert len(spread) > 1  # per request, not one mean smeared over the case
    else:
        assert all(r.engine is None for r in every)
        assert led.engine_sources == ()
        queue_note = ("server_queue: the case's mean (the engine's queue_time_seconds "
                      "histogram): the response carried no per-request queue time (vLLM sends "
                      "them with --enable-per-request-metrics")
        prefill_note = ("prefill: the case's mean (the engine's prefill_time_seconds "
                        "histogram): the response carried no per-request prefill (vLLM sends "
                        "them with --enable-per-request-metrics")
        assert any(m.startswith(queue_note) for m in led.merged), led.merged
        assert any(m.startswith(prefill_note) for m in led.merged), led.merged
        for rl in led.requests:
            assert rl.part("prefill") == pytest.approx(clocks.prefill_ms, abs=1e-6)

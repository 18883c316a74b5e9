"""A real llama-server behind a proxy that buffers the response: named ``outside_server``
(delivery) with the server's own token clock as its evidence; the same case without the
proxy is not (issue 31, "Done when").

One plugin run, one llama-server (the embedded build and model), one decode case three
ways: straight to the server; through testing/relay.LatencyProxy holding the response
and flushing it every 60 ms (``--buffer-flush-ms``); and through it again with the
server's token clock switched off (``timings_per_token`` false: what a server that does
not stamp tokens gives). The delivery thresholds were set on the fault suite's 100 ms
flush (cases/test_faults.py, tuning set); 60 ms judges them. Each arm's verdict and
delivery figures are printed.
"""

from __future__ import annotations

import json

import pytest

from strata_plugin.analysis.thresholds import value
from strata_plugin.report import summarize_case
from tests.test_robustness_support import PytestRun, local_profile, make_project

pytestmark = pytest.mark.integration

FLUSH_MS = 60.0

CASES = f"""
from dataclasses import replace

from strata_plugin.load.workload import Workload
from strata_plugin.testing.relay import LatencyProxy

W = Workload("decode_delivery", isl=32, osl=128, concurrency=2, requests=6, warmups=1,
             seed=5)


def test_delivery(strata):
    base = strata.setup
    strata.run(W, case_id="direct", scale=False)
    with LatencyProxy(base.base_url, delay_ms=0.0, buffer_flush_ms={FLUSH_MS}) as px:
        strata.setup = replace(base, base_url=px.url)
        try:
            strata.run(W, case_id="buffered", scale=False)
            strata.run(W, case_id="buffered_no_token_clock", scale=False,
                       extra_body={{"timings_per_token": False}})
        finally:
            strata.setup = base
"""


def _figures(run_dir, case_id: str) -> dict:
    a = summarize_case(run_dir, case_id)
    led = a.ledger
    return {"verdict": a.verdict.summary(), "past": list(a.verdict.past_threshold),
            "delivery_frac": a.signals.delivery_frac,
            "delivery_clumped_frac": a.signals.delivery_clumped_frac,
            "line": led.delivery.line() if led.delivery is not None else "",
            "evidence": [f"{e.metric}={e.value}{e.op}{e.threshold_value}"
                         for e in a.verdict.evidence if e.cls == "outside_server"],
            "notes": list(a.verdict.notes), "_analysis": a}


def test_a_buffering_proxy_is_delivery_outside_the_server_on_the_servers_token_clock(
        tmp_path):
    profile = local_profile(tmp_path / "profile.toml", scaled=False)
    (tmp_path / "proj").mkdir()
    proj = make_project(tmp_path / "proj", CASES)
    reports = tmp_path / "reports"
    run = PytestRun.start(["-rA", f"--strata-profile={profile}",
                           f"--strata-reports-dir={reports}", "--strata-run-id=run"],
                          tmp_path / "out.txt", reports / "run", cwd=proj)
    rc = run.wait(600)
    assert rc == 0, run.text()[-4000:]
    arms = {c: _figures(run.run_dir, c)
            for c in ("direct", "buffered", "buffered_no_token_clock")}
    for c, f in arms.items():
        print(c, json.dumps({k: v for k, v in f.items() if k != "_analysis"}, default=str))
    direct, buf, blind_clock = (arms["direct"], arms["buffered"],
                                arms["buffered_no_token_clock"])

    # through the buffer: named, from the server's own token clock
    a = buf["_analysis"]
    assert "outside_server" in a.verdict.classes, buf
    assert not a.verdict.inconclusive, buf
    ev = [e for e in a.verdict.evidence if e.metric == "delivery_frac"]
    assert ev and ev[0].met, ev
    assert "the server's own token clock" in buf["line"], buf
    assert any(n.startswith("delivery: bursts of") for n in a.verdict.notes), buf
    assert all(r.delivery is not None and r.delivery.evidence == "token_clock"
               for r in a.ledger.requests)
    # not interference: the stall time with a prefill in flight that the client's clock
    # alone reads in the buffered stream is mostly the path's (its delivered gaps)
    from strata_plugin.analysis import interference
    from strata_plugin.analysis.case_summary import load_run

    bundle, _ = load_run(run.run_dir)
    blind = interference.analyze("buffered", bundle.records["buffered"])
    assert blind.stall_with_prefill_ms_per_request > 0, blind
    assert (a.interference.stall_with_prefill_ms_per_request
            <= 0.5 * blind.stall_with_prefill_ms_per_request), (a.interference, blind)

    # straight to the server: its delivery is noise, not named
    assert "outside_server" not in direct["past"], direct
    assert direct["delivery_frac"] is not None, direct
    assert direct["delivery_frac"] < value("delivery_frac"), direct

    # without the token clock the records carry none, and nothing claims its evidence
    assert all(not r.engine.token_ms for r in bundle.records["buffered_no_token_clock"]
               if r.phase == "measured" and r.engine is not None)
    assert blind_clock["delivery_frac"] is None, blind_clock

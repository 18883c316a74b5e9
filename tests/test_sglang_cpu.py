"""Against a real SGLang server on the CPU (the packaged sglang-cpu profile's command):
exact ISL/OSL over /generate, the engine's own per-request clocks from meta_info, the
radix cache hit and its flush (POST /flush_cache), its /metrics families under Strata's
names, its profiler's start and stop, and the served path (torch-native, the stand-in
sgl_kernel never called).

Opt-in: the server needs its own virtualenv (`bash scripts/setup.sh --sglang`, minutes
once, then cached). Without it these tests skip saying so; with STRATA_REQUIRE_SGLANG=1 a
missing setup fails them instead.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import replace

import pytest
from engine_case import case_runner, exact_cold_case
from engine_target import SGLANG, engine_paths, packaged_server, serving

from strata_plugin.agent.collectors.prom import NameMapper, parse_exposition
from strata_plugin.analysis.metrics import request_metrics
from strata_plugin.configure.profile import load_profile, packaged_profiles
from strata_plugin.load.cache_flush import flush_prefix_cache
from strata_plugin.load.workload import Workload
from strata_plugin.run import engine_http_profile as hp

pytestmark = [pytest.mark.sglang, pytest.mark.integration]  # a real SGLang server
PROFILE = load_profile(packaged_profiles()[SGLANG.profile])
#: ms the engine's clocks may exceed the client's span of the same request: both read
#: this host's wall clock, SGLang's converted from its perf_counter at start (a rounding
#: and conversion error of microseconds; a unit error would be 1000x).
CLOCK_SLACK_MS = 5.0


@pytest.fixture(scope="module")
def paths() -> dict:
    return engine_paths(SGLANG)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """The {run_dir} the profile's server writes into (its profiler's traces)."""
    return tmp_path_factory.mktemp("sglang-run")


@pytest.fixture(scope="module")
def sglang(paths, run_dir):
    yield from serving(packaged_server(PROFILE, run_dir / "server.log", run_dir))


def _runner(server, salt="it"):
    return case_runner(server, PROFILE, "sglang", "sglang", salt)


def test_exact_lengths_a_flushed_cold_prefix_and_the_engines_own_clocks(sglang):
    res = exact_cold_case(sglang, PROFILE, "sglang", "sglang", "POST /flush_cache")
    for r in res.records:
        # meta_info's clocks, each inside the client's own span of the same request
        e, m = r.engine, request_metrics(r)
        assert e is not None and e.source == "sglang meta_info"
        assert e.queue_ms is not None and 0 <= e.queue_ms
        assert e.prefill_ms is not None and e.ttft_ms is not None and e.decode_ms is not None
        assert 0 < e.prefill_ms <= e.ttft_ms <= m.ttft_ms + CLOCK_SLACK_MS
        assert 0 < e.decode_ms
        client_ms = (r.done_ns - r.dispatched_ns) / 1e6
        assert 0 < r.extra["engine_e2e_ms"] <= client_ms + CLOCK_SLACK_MS
        assert e.ttft_ms + e.decode_ms <= r.extra["engine_e2e_ms"] + CLOCK_SLACK_MS
    assert res.metrics.n_ok == 4 and res.metrics.ttft.p50 > 0 and res.metrics.tpot.p50 > 0


def test_a_repeated_prefix_hits_the_radix_cache_and_the_flush_empties_it(sglang):
    w = replace(Workload("warm", isl=400, osl=2, requests=1, seed=11),
                prefix="shared", shared_prefix_tokens=400)
    first = _runner(sglang, salt="repeat").run(w, scale=False).records[0]
    again = _runner(sglang, salt="repeat").run(w, scale=False).records[0]
    assert first.usage.cached_tokens == 0
    # the radix cache matches whole pages (16 tokens, the profile's --page-size) short of
    # the last prompt token: 384 of 400
    assert again.usage.cached_tokens == 384
    flush = flush_prefix_cache("sglang", sglang.base_url)
    assert flush.ok, flush.detail
    cold = _runner(sglang, salt="repeat").run(w, scale=False).records[0]
    assert cold.usage.cached_tokens == 0 and cold.usage.prompt_tokens == 400


def test_a_json_schema_constrains_the_native_generate(sglang):
    """strata.constrain's keys reach /generate's sampling_params: the random model's
    output is the schema's JSON, ended by the grammar (stop), not cut at the length."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    runner = _runner(sglang, salt="json")
    res = runner.run(Workload("json", isl=32, osl=64, requests=2, expect_stop=True, seed=3),
                     scale=False, extra_body=runner.constrain(json_schema=schema))
    assert res.problems == (), [r.output_text for r in res.records]
    for r in res.records:
        assert r.finish_reason == "stop"
        assert set(json.loads(r.output_text)) == {"n"}


def test_metrics_families_map_onto_strata_names(sglang):
    # a cache hit first: SGLang creates its cached-token counter on the first one
    w = replace(Workload("hit", isl=200, osl=2, requests=1, seed=13),
                prefix="shared", shared_prefix_tokens=200)
    for _ in range(2):
        _runner(sglang, salt="metrics").run(w, scale=False)
    with urllib.request.urlopen(sglang.base_url + "/metrics", timeout=10) as resp:
        samples = parse_exposition(resp.read().decode())
    families = {s.family for s in samples}
    common = set(NameMapper().update(families).values())
    for name in ("running_requests", "waiting_requests", "kv_cache_usage", "kv_cache_tokens",
                 "prompt_tokens_total", "generation_tokens_total", "cached_prompt_tokens_total",
                 "requests_finished_total", "generation_tokens_per_s", "ttft_seconds",
                 "itl_seconds", "e2e_seconds", "queue_time_seconds"):
        assert name in common, (name, sorted(f for f in families if f.startswith("sglang")))


def test_the_profiler_starts_stops_and_writes_a_torch_trace(sglang, run_dir):
    out = run_dir / "traces" / "engine" / "sglang"
    before = hp.listing(out)
    hp.start(sglang.base_url, "itprofile")
    _runner(sglang, salt="profile").run(Workload("p", isl=64, osl=4, requests=1, seed=5),
                                         scale=False)
    hp.stop(sglang.base_url)
    new = sorted(hp.listing(out) - before)
    assert [n for n in new if n.startswith("itprofile-") and n.endswith(".trace.json.gz")], new


def test_the_served_path_is_torch_native_with_the_stand_in_kernels(sglang, paths):
    """Setup put the stand-in in place of PyPI's CUDA sgl_kernel, and the server said it
    runs torch's own kernels; the requests above reached none of the stand-in's names
    (each raises when called, and the server would have answered an error)."""
    assert paths["sgl_kernel"].startswith("stand-in ")
    assert paths["sglang"] == "0.5.23" and paths["torch"].startswith("2.14.1")
    log = sglang.spec.log_path.read_text(errors="replace")
    assert "will fallback to torch_native backend" in log
    assert "Strata's stand-in" not in log and "NotImplementedError" not in log

"""Against a real vLLM server (the CPU build): exact ISL/OSL, cold and warm prefixes, the
engine's prefix-cache flush, chat prompts to its templated count, its /metrics series.

Opt-in: the server needs its own virtualenv (`bash scripts/setup.sh --vllm`, minutes once,
then cached). Without it these tests skip saying so; with STRATA_REQUIRE_VLLM=1 (what
`bash scripts/test.sh --vllm` and CI set) a missing setup fails them instead.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from engine_case import case_runner, exact_cold_case
from engine_target import VLLM, engine_paths, packaged_server, serving

from strata_plugin.agent.collectors.prom import NameMapper, parse_exposition
from strata_plugin.configure.profile import load_profile, packaged_profiles
from strata_plugin.embedded.llama_setup import cache_root
from strata_plugin.formats.cases import CaseLine
from strata_plugin.load.cache_flush import flush_prefix_cache
from strata_plugin.load.case_runner import CaseRunner, CaseSetup
from strata_plugin.load.client import Timeouts
from strata_plugin.load.workload import TokenSpace, Workload

pytestmark = [pytest.mark.vllm, pytest.mark.integration]  # a real vLLM server
PROFILE = load_profile(packaged_profiles()[VLLM.profile])


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    engine_paths(VLLM)
    yield from serving(packaged_server(PROFILE, tmp_path_factory.mktemp("vllm") / "server.log"))


def _runner(server, salt="it"):
    return case_runner(server, PROFILE, "completions", "vllm", salt)


def test_exact_lengths_and_a_verified_cold_prefix(vllm):
    res = exact_cold_case(vllm, PROFILE, "completions", "vllm", "POST /reset_prefix_cache")
    assert res.metrics.n_ok == 4 and res.metrics.ttft.p50 > 0 and res.metrics.tpot.p50 > 0


def test_shared_prefix_hits_the_cache_and_the_flush_empties_it(vllm):
    """The same 400-token prompt again is served from vLLM's prefix cache in whole blocks;
    after POST /reset_prefix_cache the same prompt is cold again."""
    w = replace(Workload("warm", isl=400, osl=2, requests=1, seed=11),
                prefix="shared", shared_prefix_tokens=400)
    # Two runners with one salt send the same prompt (one runner salts repetitions apart).
    first = _runner(vllm, salt="repeat").run(w, scale=False).records[0]
    again = _runner(vllm, salt="repeat").run(w, scale=False).records[0]
    assert first.usage.cached_tokens == 0
    assert again.usage.cached_tokens is not None and 256 <= again.usage.cached_tokens < 400
    flush = flush_prefix_cache("vllm", vllm.base_url)
    assert flush.ok, flush.detail
    cold = _runner(vllm, salt="repeat").run(w, scale=False).records[0]
    assert cold.usage.cached_tokens == 0 and cold.usage.prompt_tokens == 400


def test_chat_has_exact_isl_from_usage(vllm):
    """The chat API: prompts built to vLLM's own templated count (POST /tokenize with
    messages; the profile's --chat-template), checked against usage.prompt_tokens."""
    setup = CaseSetup(vllm.base_url, "chat", "it", TokenSpace(300, 1000), Timeouts(read_s=120),
                      salt="chat", engine="vllm", model=PROFILE.server.model_name)
    cases: list[CaseLine] = []
    runner = CaseRunner(setup, record=lambda r: None, mark=lambda *a: None,
                        add_case=cases.append)
    w = Workload("chat", isl=300, osl=8, concurrency=2, requests=4, warmups=1, seed=3)
    res = runner.run(w, scale=False)
    assert res.problems == ()
    for r in (*res.records, *res.warmup_records):
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (300, 8)
        assert sum(e.n_tokens for e in r.events) == 8
    assert cases[-1].isl_exact is True
    assert "POST /tokenize with messages (vllm)" in cases[-1].isl_note
    assert cases[-1].cold_prefix == "verified cold: 0 cached prompt tokens in 4 requests"
    one_more = runner.run(replace(w, isl=301, requests=1, warmups=0), scale=False)
    assert one_more.problems == () and one_more.records[0].usage.prompt_tokens == 301


def test_metrics_series_map_onto_strata_names(vllm):
    with urllib.request.urlopen(vllm.base_url + "/metrics", timeout=10) as resp:
        samples = parse_exposition(resp.read().decode())
    mapping = NameMapper().update({s.family for s in samples})
    common = set(mapping.values())
    for name in ("running_requests", "waiting_requests", "kv_cache_usage",
                 "prefix_cache_queries_total", "prefix_cache_hits_total",
                 "queue_time_seconds", "prefill_time_seconds", "decode_time_seconds",
                 "prompt_tokens_total", "generation_tokens_total"):
        assert name in common, (name, sorted(f for f in {s.family for s in samples}
                                             if f.startswith("vllm")))


def test_setup_records_a_cpu_torch_and_no_cuda_vision_packages(vllm):
    rec = json.loads((cache_root() / "vllm-venv" / "strata_vllm.json").read_text())
    assert "cpu" in rec["torch"] and rec["vllm"].startswith("0.")
    site = next(Path(cache_root(), "vllm-venv", "lib").glob("python3*/site-packages"))
    assert not [p for p in ("torchvision", "torchaudio", "torchcodec") if (site / p).exists()]

"""Against the real llama-server: exact ISL/OSL, cold prefixes, per-request counters."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from strata_plugin.configure.profile import load_profile, packaged_profiles
from strata_plugin.load.case_runner import CaseRunner, CaseSetup, check_case
from strata_plugin.load.client import Timeouts
from strata_plugin.load.workload import TokenSpace, Workload
from strata_plugin.run.server import LaunchSpec, Server, free_port, process_counters

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


def _paths() -> dict:
    out = subprocess.run([sys.executable, "-m", "strata_plugin", "setup",
                          "--print-paths"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.fail("llama-server is not built: run `bash scripts/setup.sh` first\n"
                    + out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    paths = _paths()
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    argv = (paths["llama_server"], "-m", paths["model"], "--host", "127.0.0.1",
            "--port", str(port), "-t", "2", "-c", "8192", "-np", "2", "-kvu", "--metrics")
    server = Server(LaunchSpec("it", argv, (), f"http://127.0.0.1:{port}", "/health", 60, 5,
                               log), f"http://127.0.0.1:{port}")
    server.start()
    yield server
    server.stop()


def _runner(server, salt="it", records=None):
    lo, hi = load_profile(packaged_profiles()["local"]).server.token_id_range
    setup = CaseSetup(server.base_url, "llamacpp", "it", TokenSpace(lo, hi), Timeouts(read_s=60),
                      salt=salt)
    return CaseRunner(setup, record=(records.append if records is not None else lambda r: None),
                      mark=lambda *a: None, add_case=lambda c: None,
                      counters=process_counters(server))


def test_exact_lengths_and_cold_prefix(llama):
    w = Workload("it", isl=300, osl=17, concurrency=2, requests=4, warmups=1, seed=7)
    res = _runner(llama).run(w, scale=False)
    assert res.problems == ()
    for r in res.records:
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (300, 17)
        assert r.usage.cached_tokens == 0 and r.timings.prompt_n == 300
        assert sum(e.n_tokens for e in r.events) == 17
        assert r.finish_reason == "length"
    assert res.metrics.n_ok == 4 and len(res.warmup_records) == 1
    assert res.metrics.ttft.p50 > 0 and res.metrics.tpot.p50 > 0


def test_same_prompts_again_hit_the_cache_and_the_check_says_so(llama):
    """With cache_prompt on, a repeat of the same prompt is served from the prompt cache,
    and the cold-prefix check must catch it with the numbers."""
    w = Workload("warm", isl=400, osl=2, requests=1, seed=11)
    # Two runners: a runner salts each repetition apart; a fresh one sends the same prompt.
    first = _runner(llama, salt="repeat").run(
        replace(w, prefix="shared", shared_prefix_tokens=400), scale=False)
    again = _runner(llama, salt="repeat").run(
        replace(w, prefix="shared", shared_prefix_tokens=400), scale=False)
    cached = again.records[0].usage.cached_tokens
    assert first.records[0].usage.cached_tokens == 0
    assert cached is not None and cached >= 390, cached
    problems = check_case(w, again.records)  # judged as if it had to be cold
    assert any(f"{cached} cached prompt tokens on a cold prefix" in p for p in problems)


def test_per_request_counters_at_concurrency_one(llama):
    res = _runner(llama).run(Workload("c1", isl=1000, osl=8, requests=2, seed=3), scale=False)
    for r in res.records:
        assert r.proc is not None and not r.proc.shared
        assert r.proc.cpu_s > 0.05, r.proc  # prefilling 1000 tokens burns CPU in the server
    assert os.path.exists(llama.log_path)

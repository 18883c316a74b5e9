"""The shipped example profiles match the engines of today.

* vllm-1gpu: only arguments current ``vllm serve`` accepts (``--disable-log-requests``
  was removed; request logging is off by default), and a context that holds every case
  as this profile scales it; it and vllm-cpu ask for each response's own clocks
  (``--enable-per-request-metrics``).
* sglang-dsv4pro-2node: its log probes read the lines SGLang's scheduler prints.
* every non-local profile says in its header what has been run for real.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cases import matrix
from strata_plugin.agent.collectors.log import LogCollector
from strata_plugin.configure.profile import load_profile
from strata_plugin.load.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "fixtures" / "profiles"
#: Lines in the formats of SGLang's scheduler log (older release with the cache hit
#: rate, newer one without it and with the inflight field).
SGLANG_LINES = [
    "[2026-05-01 10:00:00 TP0] Prefill batch. #new-seq: 2, #new-token: 16384, "
    "#cached-token: 128, cache hit rate: 0.78%, token usage: 0.12, #running-req: 30, "
    "#queue-req: 3",
    "[2026-05-01 10:00:01 TP0] Prefill batch. #new-seq: 1, #new-token: 8192, "
    "#cached-token: 0, token usage: 0.20, #running-req: 31, #queue-req: 0, "
    "#inflight-req: 0",
    "[2026-05-01 10:00:02 TP0] Decode batch. #running-req: 32, #token: 40960, "
    "token usage: 0.25, cuda graph: True, gen throughput (token/s): 1234.56, "
    "#queue-req: 1, ",
]


def test_vllm_profile_arguments_and_context():
    p = load_profile(PROFILES / "vllm-1gpu.toml")
    argv = p.server.configs[0].argv
    assert "--disable-log-requests" not in argv
    assert "--enable-prompt-tokens-details" in argv
    # each response's own clocks (the ledger's per-request queue and prefill); the flag
    # refuses to start with --disable-log-stats
    assert "--enable-per-request-metrics" in argv and "--disable-log-stats" not in argv
    max_len = int(argv[argv.index("--max-model-len") + 1])
    assert max_len <= 40960  # Qwen3-8B's max_position_embeddings, no rope scaling
    scale = dict(p.scale)
    workloads = [v for v in vars(matrix).values() if isinstance(v, Workload)]
    assert workloads
    for w in workloads:
        s = w.scaled(context=scale.get("context", 1), output=scale.get("output", 1),
                     concurrency=scale.get("concurrency", 1))
        assert s.isl + s.osl <= max_len, (w.name, s.isl, s.osl, max_len)
    assert dict(p.server.configs[0].env)["VLLM_SERVER_DEV_MODE"] == "1"


def test_the_packaged_vllm_cpu_profile_asks_for_per_request_metrics():
    from strata_plugin.configure.profile import packaged_profiles

    argv = load_profile(packaged_profiles()["vllm-cpu"]).server.configs[0].argv
    assert "--enable-per-request-metrics" in argv and "--disable-log-stats" not in argv


def test_sglang_log_probes_read_the_scheduler_lines(tmp_path):
    p = load_profile(PROFILES / "sglang-dsv4pro-2node.toml")
    log = tmp_path / "server.log"
    log.write_text("")
    c = LogCollector(str(log), dict(p.telemetry.log_patterns), defaults=False)
    c.probe()
    log.write_text("\n".join(SGLANG_LINES) + "\n")
    got = {(m, round(v, 2)) for _, _, m, v, kind in c.sample(time.time_ns()) if kind == "gauge"}
    want = {("sglang_prefill.new_tokens", 16384), ("sglang_prefill.cached_tokens", 128),
            ("sglang_prefill.new_tokens", 8192), ("sglang_prefill.cached_tokens", 0),
            ("sglang_cache_hit.pct", 0.78), ("sglang_prefill_usage.token_usage", 0.2),
            ("sglang_decode.running", 32), ("sglang_decode.tokens", 40960),
            ("sglang_decode_usage.token_usage", 0.25),
            ("sglang_decode_throughput.tok_s", 1234.56), ("sglang_queue.queue", 1)}
    assert want <= got, sorted(want - got)


@pytest.mark.parametrize("path", sorted(PROFILES.glob("*.toml")), ids=lambda p: p.stem)
def test_every_example_profile_says_what_was_run_for_real(path):
    header = "".join(line for line in path.read_text().splitlines(keepends=True)
                     if line.startswith("#"))
    assert "Status:" in header and ("dry-run" in header or "run for real" in header)

"""The diagnostic round's cost, and that it leaves the timing round alone.

Not pass/fail by default: it prints figures (STRATA_BENCH_ASSERT=1 fails when the timed
medians with the option on differ from those with it off by more than the off runs differ
among themselves plus 10%). Needs root and tracefs, and the embedded llama-server::

    pytest benchmarks/test_trace_overhead.py -s

The same decode case runs REPEATS times with ``--strata-escalate`` off and on, in
alternating order (off on on off ...), against one real llama-server:

* ``timed`` rows: the timed repetition's TPOT p50, TTFT p50 and output tok/s, off vs on -
  the option must not change them (the trace is never on during the timed repetition);
* ``traced`` rows: the traced repetition against its own timed one (same run): the
  trace's overhead on throughput and latency (sched + block events).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from strata_plugin.load.case_runner import CaseRunner, CaseSetup
from strata_plugin.load.client import Timeouts
from strata_plugin.load.workload import TokenSpace, Workload
from strata_plugin.run import tracing
from strata_plugin.run.diagnostic_round import DiagnosticRunner
from strata_plugin.run.server import LaunchSpec, Server, free_port

REPEATS = int(os.environ.get("STRATA_BENCH_REPEATS", "3"))
W = Workload("ovh", isl=64, osl=32, concurrency=2, requests=8, warmups=1, seed=61)
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or tracing.tracefs_root() is None,
                                reason="needs root and tracefs")


def _figures(r) -> dict[str, float]:
    m = r.metrics
    return {"tpot_p50_ms": m.tpot.p50, "ttft_p50_ms": m.ttft.p50,
            "output_tok_s": m.output_tok_s}


def test_trace_overhead_and_timed_medians(tmp_path: Path):
    out = subprocess.run([sys.executable, "-m", "strata_plugin", "setup", "--print-paths"],
                         capture_output=True, text=True, check=True)
    paths = json.loads(out.stdout.strip().splitlines()[-1])
    port = free_port()
    argv = (paths["llama_server"], "-m", paths["model"], "--host", "127.0.0.1", "--port",
            str(port), "-t", "2", "-c", "4096", "-np", "2", "--no-webui")
    server = Server(LaunchSpec("ovh", argv, (), f"http://127.0.0.1:{port}", "/health", 60, 5,
                               tmp_path / "server.log"), f"http://127.0.0.1:{port}")
    server.start()
    setup = CaseSetup(server.base_url, "llamacpp", "ovh", TokenSpace(300, 1000),
                      Timeouts(read_s=60), salt="ovh")
    kw = dict(record=lambda r: None, mark=lambda *a: None, add_case=lambda c: None)
    off: list[dict] = []
    on: list[dict] = []
    traced: list[dict] = []
    try:
        for i in range(REPEATS):
            for arm in (("off", "on") if i % 2 == 0 else ("on", "off")):
                cid = f"ovh/{arm}/{i}"
                if arm == "off":
                    off.append(_figures(CaseRunner(setup, **kw).run(W, case_id=cid,
                                                                    scale=False)))
                    continue
                runner = DiagnosticRunner(setup, escalate=(cid,), run_dir=tmp_path,
                                          server_pid=server.pid, settle_s=0.0, **kw)
                on.append(_figures(runner.run(W, case_id=cid, scale=False)))
                traced.append(_figures(runner.diagnostics[-1]))
    finally:
        server.stop()
    assert tracing.strata_instances() == []

    def med(rows: list[dict], k: str) -> float:
        return statistics.median(r[k] for r in rows)

    print(f"\ndiagnostic round, {REPEATS} runs per arm, {W.requests} requests of "
          f"{W.isl}/{W.osl} tokens at concurrency {W.concurrency} (medians of the runs)")
    print(f"{'figure':<14}{'timed, off':>12}{'timed, on':>12}{'on/off':>8}{'traced':>10}"
          f"{'traced/timed':>14}")
    spread = {}
    for k in ("tpot_p50_ms", "ttft_p50_ms", "output_tok_s"):
        a, b, c = med(off, k), med(on, k), med(traced, k)
        spread[k] = (max(r[k] for r in off) - min(r[k] for r in off)) / a
        print(f"{k:<14}{a:>12.4g}{b:>12.4g}{b / a:>8.3f}{c:>10.4g}{c / b:>14.3f}")
    print("off runs' own spread (max-min)/median: "
          + ", ".join(f"{k} {v:.1%}" for k, v in spread.items()))
    if os.environ.get("STRATA_BENCH_ASSERT"):
        for k, v in spread.items():
            assert abs(med(on, k) / med(off, k) - 1) <= v + 0.10, k

"""A packaged engine profile's torch profile over a case window, run for real: one inner
pytest run of the profile with ``--strata-engine-profile`` (Strata launches the server
and starts and stops its profiler over the window), one case of prefills one at a time,
re-run as ``<case>~traced`` with the profile; then what the run folder says of the
traced repetition, and where each request's prefill lies against its TTFT slice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_target import Target, engine_paths
from test_trace_events import format_problems

from strata_plugin.report import trace_events as te

ROOT = Path(__file__).resolve().parents[1]
ISL, OSL, REQUESTS = 200, 4, 4
#: the traced repetition's folder under traces/engine/
TRACED = "tp__prefills~traced"

CASES = f'''
from strata_plugin.load.workload import Workload

W = Workload("tp", isl={ISL}, osl={OSL}, concurrency=1, requests={REQUESTS}, warmups=1,
             seed=44)


def test_prefills(strata, strata_server):
    strata.run(W, case_id="tp/prefills", scale=False)
'''


def profiled_run(target: Target, factory: pytest.TempPathFactory, timeout_s: float) -> Path:
    """The inner run's folder (the calling test skipped or failed as ``engine_paths`` says
    where the target is not set up); the inner run failing or outlasting ``timeout_s``
    fails the calling test with its output's tail."""
    engine_paths(target)
    tmp = factory.mktemp(f"{target.flag}-torch")
    (tmp / "pytest.ini").write_text(
        f"[pytest]\nstrata_profile = {target.profile}\n"
        f"strata_reports_dir = {tmp / 'reports'}\n")
    (tmp / "test_tp.py").write_text(CASES)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strata-run-id=tp",
         "--strata-engine-profile=tp/prefills", "test_tp.py"],
        cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the inner run stops its server
        stdout, stderr = proc.communicate(timeout=120)
        pytest.fail(f"the inner run took over {timeout_s} s\n" + stdout[-3000:]
                    + stderr[-3000:])
    assert proc.returncode == 0, stdout[-4000:] + stderr[-4000:]
    return tmp / "reports" / "tp"


def server_argv(run: Path) -> list[str]:
    """The command the inner run launched its server with, as its manifest recorded it."""
    manifest = json.loads((run / "manifest.json").read_text())
    return next(iter(manifest["servers"].values()))["argv"]


def traced(run: Path) -> tuple[dict, dict]:
    """The traced repetition's capture meta and its timeline file."""
    folder = run / "traces" / "engine" / TRACED
    meta = json.loads((folder / "meta.json").read_text())
    report = (run / "report.md").read_text()
    names = [p for p in (run / "timeline").glob("case-tp_prefills_traced*.json")]
    assert len(names) == 1, (sorted(p.name for p in (run / "timeline").iterdir()), report[-2000:])
    return meta, json.loads(names[0].read_text())


def assert_prefills_in_ttft(run: Path, step_prefix: str, prefill: str, what: str) -> None:
    """The timeline of the traced repetition has the torch ops, each inside Strata's stamps
    of the window; the steps named ``prefill`` (among the annotations starting
    ``step_prefix``) are one per measured request, the k-th the k-th request's (one at a
    time, so matched by order and not by the clock under test), each inside its TTFT
    slice within the stated clock error. Printed: that error and, per request, where its
    step (``what``) lies in its slice (ms after the dispatch, ms before the first token)."""
    meta, trace = traced(run)
    assert format_problems(trace) == []
    (eng,) = [e for e in trace["metadata"]["engine_traces"] if "torch" in e["name"]]
    err_us = eng["error_us"]
    origin = trace["metadata"]["origin_wall_ns"]
    said = meta["engine_profiler"]
    s0 = (said["start_wall_ns"][0] - origin) / 1000
    e1 = (said["stop_wall_ns"][1] - origin) / 1000
    ops = [e for e in trace["traceEvents"] if e.get("cat") in ("cpu_op", "user_annotation")]
    assert len(ops) > 100
    assert all(s0 - err_us <= e["ts"] and e["ts"] + e["dur"] <= e1 + err_us for e in ops)
    steps = sorted((e for e in ops if e["cat"] == "user_annotation"
                    and e["name"].startswith(step_prefix)), key=lambda e: e["ts"])
    prefills = [e for e in steps if e["name"] == prefill]
    client = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == te.CLIENT_PID]
    measured = {(e["tid"], e["ts"]) for e in client if e["args"].get("phase") == "measured"}
    ttft = sorted((e for e in client if e["name"] == "TTFT" and (e["tid"], e["ts"]) in measured),
                  key=lambda e: e["ts"])
    assert len(prefills) == len(ttft) == REQUESTS, ([e["name"] for e in steps], len(ttft))
    gaps = []
    for step, slot in zip(prefills, ttft, strict=True):
        lead = step["ts"] - slot["ts"]  # the step's start after the dispatch
        tail = slot["ts"] + slot["dur"] - (step["ts"] + step["dur"])  # its end before 1st token
        gaps.append((round(lead / 1000, 3), round(tail / 1000, 3)))
        assert lead >= -err_us and tail >= -err_us, (gaps, err_us)
    print(f"clock error ±{err_us / 1000:.3f} ms; {what} (ms after dispatch, ms before "
          f"the first token): {gaps}")

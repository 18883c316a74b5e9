"""The real SGLang CPU server's torch profile over a case window, end to end: one inner
pytest run of the packaged sglang-cpu profile with ``--strata-engine-profile`` (Strata
makes the run's server folder at launch, run/deployment.py, and names it in the start's
``output_dir``), one case of prefills one at a time, re-run as ``<case>~traced`` with the
profile; then the run folder is read back.

* the launch carried no profiler flag (SGLang needs none), and the window's trace, named
  SGLang's way (``<prefix>-<profile_id>-TP-0.trace.json.gz``), was moved from the run's
  server folder into the traced case's ``traces/engine/<case>/torch/``;
* the timeline of the traced case has the torch ops, each inside Strata's stamps of the
  window, and each request's prefill forward (SGLang's step span around
  ``ModelRunner.forward``, ``step[EXTEND bs=1 toks=<ISL>]``: one new prompt, nothing
  cached) inside that request's TTFT slice (dispatch to first token) within the stated
  clock error: the k-th prefill forward is the k-th request's (one request at a time),
  matched by order, so the match does not lean on the clock it checks;
* report.md's case section says the capture, its file and the clock error, and its
  diagnostic section the repetition's overhead.

Opt-in as tests/test_sglang_cpu.py (`bash scripts/setup.sh --sglang`); one SGLang start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_sglang_cpu import _set_up
from test_trace_events import format_problems

from strata_plugin.report import trace_events as te

pytestmark = [pytest.mark.sglang, pytest.mark.integration]  # a real SGLang server
ROOT = Path(__file__).resolve().parents[1]
ISL, OSL, REQUESTS = 200, 4, 4
#: The inner run: an SGLang start (~40 s warm, minutes on a loaded host), the roofline
#: probe, a baseline, the case twice, the report.
INNER_TIMEOUT_S = float(os.environ.get("STRATA_SGLANG_PROFILE_TIMEOUT_S", "1500"))
#: SGLang's step span of one prefill of ISL new tokens (sglang/srt/utils/profile_utils.py:
#: build_step_span_name, around ModelRunner.forward).
PREFILL = f"step[EXTEND bs=1 toks={ISL}]"

CASES = f'''
from strata_plugin.load.workload import Workload

W = Workload("tp", isl={ISL}, osl={OSL}, concurrency=1, requests={REQUESTS}, warmups=1,
             seed=44)


def test_prefills(strata, strata_server):
    strata.run(W, case_id="tp/prefills", scale=False)
'''


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    got = _set_up()
    if isinstance(got, str):
        msg = f"the SGLang CPU target is not set up ({got}); `bash scripts/setup.sh --sglang`"
        if os.environ.get("STRATA_REQUIRE_SGLANG") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    tmp = tmp_path_factory.mktemp("sglang-torch")
    (tmp / "pytest.ini").write_text(
        f"[pytest]\nstrata_profile = sglang-cpu\nstrata_reports_dir = {tmp / 'reports'}\n")
    (tmp / "test_tp.py").write_text(CASES)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strata-run-id=tp",
         "--strata-engine-profile=tp/prefills", "test_tp.py"],
        cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=INNER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the inner run stops its server
        stdout, stderr = proc.communicate(timeout=120)
        pytest.fail(f"the inner run took over {INNER_TIMEOUT_S} s\n" + stdout[-3000:]
                    + stderr[-3000:])
    assert proc.returncode == 0, stdout[-4000:] + stderr[-4000:]
    return tmp / "reports" / "tp"


def _traced(run: Path) -> tuple[dict, dict]:
    """The traced repetition's capture meta and its timeline file."""
    folder = run / "traces" / "engine" / "tp__prefills~traced"
    meta = json.loads((folder / "meta.json").read_text())
    report = (run / "report.md").read_text()
    names = [p for p in (run / "timeline").glob("case-tp_prefills_traced*.json")]
    assert len(names) == 1, (sorted(p.name for p in (run / "timeline").iterdir()), report[-2000:])
    return meta, json.loads(names[0].read_text())


def test_the_windows_trace_was_written_into_the_run_and_collected_by_sglangs_name(run):
    manifest = json.loads((run / "manifest.json").read_text())
    argv = next(iter(manifest["servers"].values()))["argv"]
    assert not [a for a in argv if "profiler" in a], argv
    meta, _ = _traced(run)
    said = meta["engine_profiler"]
    assert "problem" not in said, said
    assert said["engine"] == "sglang" and said["started"] == "yes: its files moved into torch/"
    traces = [f for f in said["files"] if f.endswith(".trace.json.gz")]
    assert len(traces) == 1, said["files"]
    assert traces[0].startswith("torch/tp__prefills_traced-") and traces[0].endswith(
        "-TP-0.trace.json.gz")
    assert (run / "traces/engine/tp__prefills~traced" / traces[0]).is_file()
    # SGLang wrote it where the start said, and nothing of the window's is left there
    server = run / "traces/engine/_server/default"
    assert server.is_dir() and not any(n.endswith(".gz") for n in os.listdir(server))


def test_each_requests_prefill_forward_lies_in_its_ttft_slice_within_the_stated_error(run):
    meta, trace = _traced(run)
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
                    and e["name"].startswith("step[")), key=lambda e: e["ts"])
    prefills = [e for e in steps if e["name"] == PREFILL]
    client = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == te.CLIENT_PID]
    measured = {(e["tid"], e["ts"]) for e in client if e["args"].get("phase") == "measured"}
    ttft = sorted((e for e in client if e["name"] == "TTFT" and (e["tid"], e["ts"]) in measured),
                  key=lambda e: e["ts"])
    assert len(prefills) == len(ttft) == REQUESTS, ([e["name"] for e in steps], len(ttft))
    gaps = []
    for step, slot in zip(prefills, ttft, strict=True):
        lead = step["ts"] - slot["ts"]  # the forward's start after the dispatch
        tail = slot["ts"] + slot["dur"] - (step["ts"] + step["dur"])  # its end before 1st token
        gaps.append((round(lead / 1000, 3), round(tail / 1000, 3)))
        assert lead >= -err_us and tail >= -err_us, (gaps, err_us)
    print(f"clock error ±{err_us / 1000:.3f} ms; prefill forward (ms after dispatch, ms "
          f"before the first token): {gaps}")


def test_the_report_says_the_capture_its_file_its_clock_error_and_the_overhead(run):
    report = (run / "report.md").read_text()
    assert "The server's own profiler (sglang): started and stopped over the window" in report
    assert "Its torch trace in `traces/engine/tp__prefills~traced/`" in report
    assert "-TP-0.trace.json.gz`: " in report and "ops on the timeline, clock error ±" in report
    assert "Trace overhead: **" in report

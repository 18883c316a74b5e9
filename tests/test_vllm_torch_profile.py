"""The real vLLM CPU server's torch profile over a case window, end to end: one inner
pytest run of the packaged vllm-cpu profile with ``--strata-engine-profile`` (Strata
launches the server with its profiler, run/deployment.py), one case of prefills one at a
time, re-run as ``<case>~traced`` with the profile; then the run folder is read back.

* the launch carried ``--profiler-config`` into the run folder, and the window's trace
  was moved from there into the traced case's ``traces/engine/<case>/torch/``;
* the timeline of the traced case has the torch ops, each inside Strata's stamps of the
  window, and each request's prefill step (vLLM's CPU worker names it
  ``execute_context_1(<ISL>)_generation_0(0)``: one prompt, no decode) inside that
  request's TTFT slice (dispatch to first token) within the stated clock error: the
  k-th prefill step is the k-th request's (one request at a time), matched by order, so
  the match does not lean on the clock it checks;
* report.md's case section says the capture, its file and the clock error, and its
  diagnostic section the repetition's overhead.

Opt-in as tests/test_vllm_cpu.py (`bash scripts/setup.sh --vllm`); one vLLM start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from engine_profile_run import ISL, assert_prefills_in_ttft, profiled_run, server_argv, traced
from engine_target import VLLM

pytestmark = [pytest.mark.vllm, pytest.mark.integration]  # a real vLLM server
#: The inner run: a vLLM start (70 s warm, ~270 s on a loaded host), the roofline probe,
#: a baseline, the case twice, the report.
INNER_TIMEOUT_S = float(os.environ.get("STRATA_VLLM_PROFILE_TIMEOUT_S", "1500"))


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return profiled_run(VLLM, tmp_path_factory, INNER_TIMEOUT_S)


def test_the_launch_carried_the_profiler_and_the_windows_trace_was_collected(run):
    argv = server_argv(run)
    conf = json.loads(argv[argv.index("--profiler-config") + 1])
    assert conf["torch_profiler_dir"] == str(run.resolve() / "traces/engine/_server/default")
    meta, _ = traced(run)
    said = meta["engine_profiler"]
    assert "problem" not in said, said
    traces = [f for f in said["files"] if f.endswith(".pt.trace.json.gz")]
    assert len(traces) == 1 and traces[0].startswith("torch/tp__prefills_traced_")
    assert (run / "traces/engine/tp__prefills~traced" / traces[0]).is_file()
    # nothing of the window's is left where the server wrote it
    assert not any(n.endswith(".gz") for n in os.listdir(
        run / "traces/engine/_server/default"))


def test_each_requests_prefill_step_lies_in_its_ttft_slice_within_the_stated_error(run):
    assert_prefills_in_ttft(run, "execute_context_",
                            f"execute_context_1({ISL})_generation_0(0)", "prefill step")


def test_the_report_says_the_capture_its_file_its_clock_error_and_the_overhead(run):
    report = (run / "report.md").read_text()
    assert "Its torch trace in `traces/engine/tp__prefills~traced/`" in report
    assert "ops on the timeline, clock error ±" in report
    assert "Trace overhead: **" in report

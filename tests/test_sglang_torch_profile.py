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

import os
from pathlib import Path

import pytest
from engine_profile_run import ISL, assert_prefills_in_ttft, profiled_run, server_argv, traced
from engine_target import SGLANG

pytestmark = [pytest.mark.sglang, pytest.mark.integration]  # a real SGLang server
#: The inner run: an SGLang start (~40 s warm, minutes on a loaded host), the roofline
#: probe, a baseline, the case twice, the report.
INNER_TIMEOUT_S = float(os.environ.get("STRATA_SGLANG_PROFILE_TIMEOUT_S", "1500"))
#: SGLang's step span of one prefill of ISL new tokens (sglang/srt/utils/profile_utils.py:
#: build_step_span_name, around ModelRunner.forward).
PREFILL = f"step[EXTEND bs=1 toks={ISL}]"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return profiled_run(SGLANG, tmp_path_factory, INNER_TIMEOUT_S)


def test_the_windows_trace_was_written_into_the_run_and_collected_by_sglangs_name(run):
    argv = server_argv(run)
    assert not [a for a in argv if "profiler" in a], argv
    meta, _ = traced(run)
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
    assert_prefills_in_ttft(run, "step[", PREFILL, "prefill forward")


def test_the_report_says_the_capture_its_file_its_clock_error_and_the_overhead(run):
    report = (run / "report.md").read_text()
    assert "The server's own profiler (sglang): started and stopped over the window" in report
    assert "Its torch trace in `traces/engine/tp__prefills~traced/`" in report
    assert "-TP-0.trace.json.gz`: " in report and "ops on the timeline, clock error ±" in report
    assert "Trace overhead: **" in report

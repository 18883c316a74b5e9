"""Ctrl-C, SIGTERM and SIGHUP at every stage of a real run: nothing left running, data kept,
the report written and marked incomplete.

Each test starts ``python -m pytest cases/test_matrix.py`` against the real
llama-server with a short profile, waits until the run folder shows the stage (the
server command written, the agent's log, request lines, the report's plot folder),
snapshots the process tree, sends one signal to pytest, and then checks through /proc
that none of those processes (server, sampling agent) survives and that nothing else
mentions the run folder.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.test_robustness_support import (
    DELAY_SHIM,
    PytestRun,
    cmdline,
    count_lines,
    descendants,
    local_profile,
    processes_mentioning,
    survivors,
    wait_for,
)

pytestmark = pytest.mark.integration
CASE = ["cases/test_matrix.py", "-k", "decode_1k_1k"]  # 32 requests, ~5-10 s of decode


def _setup(run_dir: Path) -> bool:
    # The server command is on disk and the (slow-starting) server is being waited on.
    return (run_dir / "commands" / "server-default.json").exists() and (
        run_dir / "service" / "default" / "server.log").exists()


def _baseline(run_dir: Path) -> bool:
    return (run_dir / "nodes" / "local" / "samples" / "cpu.csv").exists()


def _mid_case(run_dir: Path) -> bool:
    return count_lines(run_dir / "requests.jsonl") >= 3


def _report(run_dir: Path) -> bool:
    return (run_dir / "plots").exists()


STAGES: dict[str, Callable[[Path], bool]] = {
    "setup": _setup, "baseline": _baseline, "mid_case": _mid_case, "report": _report}


@pytest.mark.parametrize(("stage", "sig"), [
    ("setup", signal.SIGINT),
    ("baseline", signal.SIGINT),
    ("mid_case", signal.SIGINT),
    ("mid_case", signal.SIGTERM),
    ("mid_case", signal.SIGHUP),  # a closed terminal or ssh session
    ("report", signal.SIGINT),
], ids=["setup-INT", "baseline-INT", "mid_case-INT", "mid_case-TERM", "mid_case-HUP",
        "report-INT"])
def test_signal_leaves_nothing_running_and_an_incomplete_report(tmp_path, stage, sig):
    prefix = (sys.executable, "-c", DELAY_SHIM, "6") if stage == "setup" else ()
    profile = local_profile(tmp_path / "profile.toml", argv_prefix=prefix,
                            baseline_s=4 if stage == "baseline" else 0.5)
    reports = tmp_path / "reports"
    run = PytestRun.start([*CASE, f"--strata-profile={profile}",
                           f"--strata-reports-dir={reports}", "--strata-run-id=run",
                           f"--junitxml={tmp_path / 'junit.xml'}"],
                          tmp_path / "out.txt", reports / "run")
    try:
        wait_for(lambda: STAGES[stage](run.run_dir) or run.proc.poll() is not None, 90,
                 what=f"stage {stage}")
        assert run.proc.poll() is None, f"the run ended before {stage}:\n{run.text()[-3000:]}"

        def snapshot() -> tuple[list[int], dict[int, str]]:
            seen = descendants(run.proc.pid)
            return seen, {p: cmdline(p) for p in seen}

        def has_server(cmds: dict[int, str]) -> bool:
            return any("llama-server" in c or "-c import os" in c for c in cmds.values())

        if stage != "report":  # the report is written after everything was stopped
            # server.log is opened just before the server is spawned: give the fork a moment
            wait_for(lambda: has_server(snapshot()[1]) or run.proc.poll() is not None, 10,
                     what="the server process")
        seen, cmds = snapshot()
        if stage != "report":
            assert has_server(cmds), cmds
        os.kill(run.proc.pid, sig)
        rc = run.wait(90)
    finally:
        if run.proc.poll() is None:
            run.kill()
    out = run.text()
    assert rc != 0, out[-3000:]
    left = {**survivors(seen, cmds), **processes_mentioning(str(run.run_dir))}
    assert not left, f"left running after {signal.Signals(sig).name} at {stage}: {left}"
    m = run.manifest()
    assert m["complete"] is False, m
    assert m["incomplete_reason"], m
    report = (run.run_dir / "report.md").read_text()
    assert "incomplete" in report, report[:2000]
    assert (run.run_dir / "markers.csv").exists()
    if stage in ("mid_case", "report"):
        assert count_lines(run.run_dir / "requests.jsonl") >= 3
    if stage != "setup":
        assert list((run.run_dir / "nodes" / "local" / "samples").glob("*.csv"))
    if stage == "report":
        assert "interrupted while writing the report" in m["incomplete_reason"]

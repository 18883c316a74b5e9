"""A run killed mid-case, rebuilt offline, says it is incomplete (issue 32, item 4).

pytest is SIGKILLed while a case is measuring a scripted server (nothing of Strata's
teardown runs: no end marker, ``complete: false`` from the first manifest, no reason).
``python -m strata_plugin report DIR`` must then say the run did not finish, with the
reason, in report.md's first lines, in summary.json and in its exit status (1), and the
case that was cut off must be labelled partial: never a headline in report.md, the
terminal table or the CI files.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.sse_script_server import ScriptServer
from tests.test_plugin import llama_reply
from tests.test_robustness_support import (
    PytestRun,
    kill_mid_case,
    make_project,
    processes_mentioning,
    wait_for,
)

pytestmark = pytest.mark.integration

PROFILE = """
name = "killed"
[server]
engine = "llamacpp"
api = "llamacpp"
health_timeout_s = 5
token_id_range = [300, 1000]
[telemetry]
interval_s = 0.25
baseline_s = 0.3
cooldown_s = 0
collectors = ["proc", "cpu", "mem"]
"""

CASES = """
from strata_plugin.load.workload import Workload

def test_done_first(strata):
    strata.run(Workload("first", isl=8, osl=6, concurrency=2, requests=6), scale=False)

def test_cut_off(strata):
    strata.run(Workload("long", isl=8, osl=6, concurrency=2, requests=5000), scale=False)
"""

CUT = "test_cases.py::test_cut_off"


def test_a_killed_run_rebuilt_offline_says_it_did_not_finish(tmp_path):
    (tmp_path / "proj").mkdir()
    proj = make_project(tmp_path / "proj", CASES)
    (proj / "profile.toml").write_text(PROFILE)
    with ScriptServer(llama_reply) as srv:
        run = PytestRun.start([f"--strata-profile={proj / 'profile.toml'}",
                               f"--strata-server-url={srv.url}",
                               f"--strata-reports-dir={tmp_path / 'reports'}",
                               "--strata-run-id=run"], tmp_path / "out.txt",
                              tmp_path / "reports" / "run", cwd=proj)
        _, rc = kill_mid_case(run, lambda: run.proc.pid, after_requests=30, start_s=120,
                              finish_s=30)
    assert rc == -9, run.text()[-3000:]
    wait_for(lambda: not processes_mentioning(str(run.run_dir)), 20, 0.2,
             "the agents to end with their harness")
    m = run.manifest()
    assert m["complete"] is False and "finished_utc" not in m and not m.get(
        "incomplete_reason"), m  # what a kill leaves: nothing says why
    time.sleep(0.1)
    off = subprocess.run([sys.executable, "-m", "strata_plugin", "report", str(run.run_dir)],
                         capture_output=True, text=True, check=False, timeout=180)
    assert off.returncode == 1, off.stdout + off.stderr
    said = "the run did not finish: no end marker"
    assert said in off.stderr, off.stderr

    report = (run.run_dir / "report.md").read_text()
    head = "\n".join(report.splitlines()[:4])
    assert f"**Run incomplete:** {said}" in head, head
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["outcome"]["complete"] is False
    assert summary["outcome"]["incomplete_reasons"][0]["kind"] == "not_finished"
    cases = {c["case_id"].split("[")[0]: c for c in summary["cases"]}
    assert cases[CUT]["partial"], cases[CUT]
    assert not cases["test_cases.py::test_done_first"]["partial"]

    # report.md: the cut-off case's summary row is labelled, with no headline number
    row = next(x for x in report.splitlines() if x.startswith(f"| [`{CUT}"))
    assert "partial: the run ended inside this case" in row, row
    assert "output tok/s" not in row and "no headline" in row, row
    done = next(x for x in report.splitlines() if x.startswith("| [`test_cases.py::test_done"))
    assert "output tok/s" in done, done
    # nor on a dashboard
    assert "test_cut_off" not in (run.run_dir / "metrics.txt").read_text()
    from strata_plugin.report.terminal import run_results

    line = next(x for x in run_results(run.run_dir).splitlines() if "test_cut_off" in x)
    assert "partial" in line, line

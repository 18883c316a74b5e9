"""The sampling agent dies mid-case: the run says so, the verdict says so, the next case
has an agent again.

A lost agent used to leave the run ``complete: true``, exit 0, nothing on the terminal,
and every missing signal read "no samples in the window". Now the case's verdict names
the lost agent, the terminal and the manifest say the run is incomplete and why, and
the agent is started again before the next case.
"""

from __future__ import annotations

import json

import pytest

from tests.test_robustness_support import (
    PytestRun,
    descendants,
    kill_mid_case,
    local_profile,
    make_project,
    processes_mentioning,
)

pytestmark = pytest.mark.integration

CASES = """
from strata_plugin.load.workload import Workload

def test_a_long(strata):
    strata.run(Workload("long", isl=32, osl=32, concurrency=2, requests=16), scale=False)

def test_b_after(strata):
    r = strata.run(Workload("after", isl=32, osl=16, concurrency=2, requests=6), scale=False)
    assert not r.problems, r.problems
"""


def _agent_pid(root: int) -> int | None:
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if b"strata_plugin.agent" in argv:
            return pid
    return None


def test_agent_killed_mid_case_is_named_and_restarted(tmp_path):
    (tmp_path / "proj").mkdir()
    proj = make_project(tmp_path / "proj", CASES)
    profile = local_profile(tmp_path / "profile.toml", baseline_s=0.5, scaled=False)
    reports = tmp_path / "reports"
    run = PytestRun.start(["-rA", f"--strata-profile={profile}", f"--strata-reports-dir={reports}",
                           "--strata-run-id=run"], tmp_path / "out.txt", reports / "run",
                          cwd=proj)
    _, rc = kill_mid_case(run, lambda: _agent_pid(run.proc.pid), after_requests=3,
                          start_s=120, finish_s=400)  # generous: a shared 2-core VM
    out = run.text()
    # The measurements stand: both cases pass.
    assert rc == 0, out[-4000:]
    assert "PASSED test_cases.py::test_b_after" in out, out[-4000:]
    # The terminal names the lost agent, once when found and in the run's summary.
    lost_line = "agent on local lost during test_cases.py::test_a_long"
    assert lost_line in out, out[-4000:]
    assert f"run incomplete: {lost_line}" in out, out[-4000:]
    assert "restarted" in out
    m = run.manifest()
    assert m["complete"] is False, m.get("incomplete_reason")
    (lost,) = m["agents_lost"]
    assert lost["node"] == "local" and lost["restarted"] is True
    assert lost["cases"] == ["test_cases.py::test_a_long[default]"] and lost["reason"], lost
    # The verdict of the case it died in says so; the next case's does not.
    summary = json.loads((run.run_dir / "summary.json").read_text())
    verdicts = {c["case_id"]: c["verdict"] for c in summary["cases"]}
    a = verdicts["test_cases.py::test_a_long[default]"]
    b = verdicts["test_cases.py::test_b_after[default]"]
    assert any("agent on local lost during this case" in n for n in a["notes"]), a
    assert not any("lost" in n for n in b["notes"]), b
    # A second agent ran for the next case: two agent commands, and cpu samples in
    # case b's window (its verdict assessed the host CPU).
    cmds = list((run.run_dir / "nodes" / "local" / "collector_commands").glob("agent*.json"))
    assert len(cmds) == 2, cmds
    missing_b = b["missing_signals"]
    assert not [m for m in missing_b if m.split(" ")[0] in ("host_busy_cores",
                                                             "server_cpu_cores")], missing_b
    assert not processes_mentioning(str(run.run_dir))

"""A worker of a two-node server dies mid-case: that case fails, the next restarts the
whole group (worker first, then the head that connects to it) and passes.

The real parts: llama-server on the head with ``--rpc`` to a ggml-rpc-server that the
harness starts in the lab's worker namespace over ssh (tests/netlab.py); the worker is
SIGKILLed from outside while the first case's requests are flowing.
"""

from __future__ import annotations

import pytest
from netlab import lab_fixture

from tests.test_faults_network import two_node_profile
from tests.test_robustness_support import PytestRun, kill_mid_case, make_project

pytestmark = [pytest.mark.integration, pytest.mark.netlab, pytest.mark.root]

CASES = """
from strata_plugin.load.workload import Workload

def test_a_long(strata):
    strata.run(Workload("long", isl=16, osl=64, requests=40), scale=False)

def test_b_after(strata):
    r = strata.run(Workload("after", isl=16, osl=16, requests=4), scale=False)
    assert not r.problems, r.problems
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from lab_fixture(tmp_path_factory)


def _rpc_server(lab) -> int | None:
    return next((pid for pid, cmd in lab.worker_processes().items()
                 if "ggml-rpc-server" in cmd), None)


def test_a_dead_worker_fails_its_case_and_the_group_restarts(lab, tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    make_project(proj, CASES)
    two_node_profile(proj / "profile.toml", lab, caps=False)
    reports = tmp_path / "reports"
    run = PytestRun.start(["-rA", f"--strata-profile={proj / 'profile.toml'}",
                           f"--strata-reports-dir={reports}", "--strata-run-id=run"],
                          tmp_path / "out.txt", reports / "run", cwd=proj,
                          env={"STRATA_SSH_CONFIG": str(lab.sshd.config)})
    _, rc = kill_mid_case(run, lambda: _rpc_server(lab), after_requests=4, start_s=120,
                          finish_s=240)
    out = run.text()
    assert rc == 1, out[-4000:]
    # The case it died in fails with a reason: the worker's death, or the head's when
    # llama-server gives up on its lost RPC backend first.
    assert ("worker worker of server default died during the case" in out
            or "server default died during the case" in out), out[-4000:]
    # One failure, judged when the case's body ends (not a pass and a teardown ERROR)
    assert "FAILED test_cases.py::test_a_long" in out, out[-4000:]
    assert "ERROR test_cases.py::test_a_long" not in out, out[-4000:]
    # The next case got a fresh worker and head, and passed.
    assert "PASSED test_cases.py::test_b_after" in out, out[-4000:]
    m = run.manifest()
    assert "worker" in m["restart_default_workers"], m
    # Incomplete for that case alone: its requests failed with the worker (failures.py)
    assert m["complete"] is False
    assert "test_a_long" in m["incomplete_reason"], m["incomplete_reason"]
    assert "test_b_after" not in m["incomplete_reason"], m["incomplete_reason"]
    # Nothing left in the worker namespace: neither the killed worker's guard nor the
    # restarted one.
    assert not lab.wait_worker_clean(10), lab.worker_processes()

"""The server dies mid-case, or never becomes healthy: clear failures, nothing hangs.

A SIGKILLed llama-server fails the case it died in, with the server's log tail; the
next case restarts it (once) and its telemetry follows the new process. A server that
never answers its health URL fails the run within the configured timeout, with the
reason and the log tail, and is not left running.
"""

from __future__ import annotations

import json
import os
import sys
import time

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
    strata.run(Workload("long", isl=32, osl=64, concurrency=2, requests=40), scale=False)

def test_b_after(strata):
    r = strata.run(Workload("after", isl=32, osl=32, concurrency=2, requests=8), scale=False)
    assert not r.problems, r.problems
"""


def _llama_pid(root: int) -> int | None:
    for pid in descendants(root):
        try:
            if os.readlink(f"/proc/{pid}/exe").endswith("llama-server"):
                return pid
        except OSError:
            continue
    return None


def test_server_killed_mid_case_fails_that_case_and_the_next_restarts_it(tmp_path):
    (tmp_path / "proj").mkdir()
    proj = make_project(tmp_path / "proj", CASES)
    profile = local_profile(tmp_path / "profile.toml", baseline_s=0.5, scaled=False)
    reports = tmp_path / "reports"
    run = PytestRun.start(["-rA", f"--strata-profile={profile}", f"--strata-reports-dir={reports}",
                           "--strata-run-id=run", f"--junitxml={tmp_path / 'junit.xml'}"],
                          tmp_path / "out.txt", reports / "run", cwd=proj)
    first, rc = kill_mid_case(run, lambda: _llama_pid(run.proc.pid), after_requests=4,
                              start_s=90, finish_s=120)
    out = run.text()
    assert rc == 1, out[-4000:]
    # The case it died in fails, naming the exit and quoting the server's log.
    assert "server default died during the case (exit -9)" in out, out[-4000:]
    # The quoted tail is the server's own log: its first line is a line of server.log. (Which
    # lines they are depends on how far the server got before the kill, so the test does not
    # look for particular words in them.)
    quoted = out.split("--- log tail ---\n", 1)[1].splitlines()[0]
    logs = "".join(p.read_text(errors="replace")
                   for p in (run.run_dir / "service").rglob("*.log"))
    assert quoted.strip() and quoted in logs.splitlines(), (quoted, out[-4000:])
    assert "PASSED test_cases.py::test_b_after" in out, out[-4000:]
    m = run.manifest()
    # The run is incomplete for that case alone: its requests mostly failed (failures.py).
    assert m["restart_default"] == -9 and m["complete"] is False
    assert m["incomplete_reason"].startswith("case test_cases.py::test_a_long[default]: "
                                             "requests_failed: "), m["incomplete_reason"]
    assert "test_b_after" not in m["incomplete_reason"]
    records = [json.loads(x) for x in (run.run_dir / "requests.jsonl").read_text().splitlines()]
    failed = [r for r in records if "::test_a_long" in r["case_id"] and r["error"]]
    assert failed and {r["error"]["cls"] for r in failed} <= {"reset", "connect",
                                                              "truncated_stream"}
    # The agent followed the restarted server: its process rows name a second PID.
    proc_rows = (run.run_dir / "nodes" / "local" / "samples" / "proc.csv").read_text()
    pids = {line.split(",")[3] for line in proc_rows.splitlines()[1:]
            if line.split(",")[3].startswith("pid")}
    assert f"pid{first}" in pids and len(pids) >= 2, pids
    assert not processes_mentioning(str(run.run_dir))


@pytest.mark.parametrize("how", ["never_listens", "exits_at_once"])
def test_server_that_never_becomes_healthy_fails_within_the_timeout(tmp_path, how):
    (tmp_path / "proj").mkdir()
    proj = make_project(tmp_path / "proj", CASES)
    code = ("import time; time.sleep(300)" if how == "never_listens"
            else "import sys; print('error: unknown argument --bogus'); sys.exit(1)")
    profile = tmp_path / "profile.toml"
    profile.write_text(f"""
name = "unhealthy"
[server]
engine = "llamacpp"
api = "llamacpp"
argv = {json.dumps([sys.executable, "-c", code, "--port", "{port}"])}
health_timeout_s = 3
stop_timeout_s = 2
[telemetry]
interval_s = 0.25
baseline_s = 0
cooldown_s = 0
collectors = ["cpu"]
""")
    reports = tmp_path / "reports"
    t0 = time.monotonic()
    run = PytestRun.start(["-x", f"--strata-profile={profile}", f"--strata-reports-dir={reports}",
                           "--strata-run-id=run"], tmp_path / "out.txt", reports / "run",
                          cwd=proj)
    rc = run.wait(60)
    elapsed = time.monotonic() - t0
    out = run.text()
    assert rc != 0
    if how == "never_listens":
        assert "server not healthy at http://127.0.0.1:" in out and "after 3 s" in out, out
        assert elapsed < 3 + 20, elapsed  # the timeout, plus pytest's own start and stop
    else:
        assert "server exited with code 1 before becoming healthy" in out, out
        assert "error: unknown argument --bogus" in out  # the log tail
        assert elapsed < 20, elapsed
    m = run.manifest()
    assert m["complete"] is False or "error" in out
    assert not processes_mentioning(code)

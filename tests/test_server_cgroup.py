"""A llama-server starved by its own cgroup's CPU quota is named, with the throttling as
evidence, even when no other process is to blame.

Before, the agent read its own cgroup (the harness's), so a server 5x slower under a
container quota came out as ``headroom``. The server here is started through a shim
that moves itself into a cgroup this test made (a 0.1-core CFS quota) and then execs
llama-server; the verdict is read from the run folder as the report reads it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from strata_plugin.testing.faults import FaultUnavailable, _cpu_cgroup_root
from tests.test_robustness_support import PytestRun, local_profile, make_project

pytestmark = [pytest.mark.integration, pytest.mark.root]

QUOTA_CORES = 0.1  # binds even when other work on the 2 cores slows the server
#: Moves itself into the cgroup whose cgroup.procs is argv[1], then execs the server.
CGROUP_SHIM = ("import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
               "os.execv(sys.argv[2], sys.argv[2:])")

CASES = """
from strata_plugin.load.workload import Workload

def test_decode(strata):
    r = strata.run(Workload("decode", isl=32, osl=16, concurrency=2, requests=4), scale=False)
    assert not r.problems, r.problems
"""


def test_a_server_under_its_own_cpu_quota_is_named_cpu_limited(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    try:
        root, version = _cpu_cgroup_root()
    except FaultUnavailable as exc:
        pytest.skip(str(exc))
    cg = root / f"strata-server-test-{os.getpid()}"
    cg.mkdir()
    try:
        if version == "v1":
            (cg / "cpu.cfs_period_us").write_text("100000")
            (cg / "cpu.cfs_quota_us").write_text(str(int(QUOTA_CORES * 100000)))
        else:
            (cg / "cpu.max").write_text(f"{int(QUOTA_CORES * 100000)} 100000")
        (tmp_path / "proj").mkdir()
        proj = make_project(tmp_path / "proj", CASES)
        profile = local_profile(tmp_path / "profile.toml", baseline_s=0.5, scaled=False,
                                argv_prefix=(sys.executable, "-c", CGROUP_SHIM,
                                             str(cg / "cgroup.procs")))
        reports = tmp_path / "reports"
        run = PytestRun.start(["-rA", f"--strata-profile={profile}",
                               f"--strata-reports-dir={reports}", "--strata-run-id=run"],
                              tmp_path / "out.txt", reports / "run", cwd=proj)
        rc = run.wait(400)
        out = run.text()
        assert rc == 0, out[-4000:]
    finally:
        for _ in range(100):  # the server has stopped; its cgroup empties a moment later
            try:
                cg.rmdir()
                break
            except OSError:


                time.sleep(0.05)
    summary = json.loads((run.run_dir / "summary.json").read_text())
    (case,) = summary["cases"]
    v = case["verdict"]
    assert v["classes"][0] == "cpu_limited", v
    ev = [e for e in v["evidence"] if e["metric"] == "cgroup_throttled_frac"]
    assert ev and ev[0]["met"] and ev[0]["value"] <= 1.0, v["evidence"]
    # The agent read the server's cgroup, quota included.
    cpu_csv = Path(run.run_dir / "nodes" / "local" / "samples" / "cpu.csv").read_text()
    quota = [line for line in cpu_csv.splitlines() if ",cgroup_quota_cores," in line]
    assert quota and float(quota[-1].split(",")[-2]) == pytest.approx(QUOTA_CORES), quota[-1:]

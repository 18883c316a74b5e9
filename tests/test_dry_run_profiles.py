"""Every shipped profile collects and dry-runs this repository's whole ``cases/``.

The README's commands (``pytest cases/ --strata-profile fixtures/profiles/...``) must
work for a new user: a case that needs a configuration the profile lacks is skipped
with the reason, never a collection error, and the dry run leaves the operator's
checklist (case plan, commands per node with env names, Prometheus queries,
preflight) in the run folder, with nothing started.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from strata_plugin.configure.profile import packaged_profiles

ROOT = Path(__file__).resolve().parents[1]
PROFILES = [*sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fixtures" / "profiles").glob(
    "*.toml")), *sorted(packaged_profiles())]
#: The only skip reasons a dry run may give: planned, or a configuration the profile lacks.
REASON = re.compile(r"dry run: \d+ case\(s\) planned, nothing started|profile \S+ has no "
                    r"configuration")


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_dry_runs_the_cases(profile, tmp_path):
    env = {**os.environ, "CI_NO_PROGRESS": "1"}
    env.pop("STRATA_API_KEY", None)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "cases/", "--strata-dry-run",
         f"--strata-profile={profile}", f"--strata-reports-dir={tmp_path}",
         "--strata-run-id=dry", "-p", "no:cacheprovider", "-rs", "-q"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    skips = [line for line in out.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skips and all(REASON.search(s) for s in skips), "\n".join(skips)
    run = tmp_path / "dry"
    plan = json.loads((run / "dry_run.json").read_text())
    # The case plan: every test that could run planned at least its first case.
    assert plan["cases"], "no case planned"
    for case in plan["cases"]:
        assert case["params"]["isl"] > 0 and case["params"]["requests"] > 0
        assert case["block_id"] and case["config_id"]
    mixed = [c for c in plan["cases"] if c.get("ab_group") == "mixed"]
    assert [c["ab_arm"] for c in mixed[:2]] == ["control", "treatment"]
    assert mixed[0]["injection"] is None and mixed[1]["injection"]["offset_s"] == 0.5
    # Every server, worker and agent command with its env names, per node.
    cmds = plan["commands"]
    servers = [c for n, c in cmds.items() if n.startswith("server-")]
    assert servers and all(isinstance(c["env_names"], list) for c in servers)
    assert any(n.startswith("agent-") for n in cmds)
    assert (run / "dry_run.md").read_text().count("| ") > len(plan["cases"])
    # Nothing started: no server log, no agent samples, no requests.
    assert not (run / "service").exists() and not (run / "nodes").exists()
    assert (run / "requests.jsonl").read_text() == ""


def test_dry_run_lists_worker_env_names_queries_and_preflight(tmp_path):
    """The two-node profile: the worker's env names, the Prometheus queries, the
    preflight's ssh probe and the DCGM command, and no secret value anywhere."""
    profile = "fixtures/profiles/sglang-dsv4pro-2node.toml"
    env = {**os.environ, "PROM_TOKEN": "s3cr3t-token-value", "CI_NO_PROGRESS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "cases/test_matrix.py", "--strata-dry-run",
         f"--strata-profile={profile}", f"--strata-reports-dir={tmp_path}",
         "--strata-run-id=dry", "-p", "no:cacheprovider", "-q"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stdout[-3000:]
    plan = json.loads((tmp_path / "dry" / "dry_run.json").read_text())
    worker = plan["commands"]["worker-baseline-worker"]
    assert worker["env_names"] == ["NCCL_CROSS_NIC", "NCCL_IB_HCA", "NCCL_NET_GDR_LEVEL"]
    assert plan["preflight"]["nodes"] == {"worker": "worker-node"}
    assert plan["preflight"]["ports"] == [30000]
    prom = plan["prometheus"]
    assert prom["auth_env"] == "PROM_TOKEN"
    assert any(q.startswith("DCGM_FI_") for q in prom["queries"]["dcgm"])
    assert prom["queries"]["sglang"][0].startswith("timestamp(up{job=\"sglang\"})")
    dcgm = plan["commands"]["agent-worker"]["collectors"]["dcgm"]
    assert dcgm[:2] == ["dcgmi", "dmon"] and dcgm[dcgm.index("-d") + 1] == "500"
    assert [c["case_id"] for c in plan["cases"]][:2] == [
        "cases/test_matrix.py::test_prefill[baseline-prefill_128k_1_c1]",
        "cases/test_matrix.py::test_prefill[baseline-prefill_32k_1_c16]"]  # pytest node ids
    assert plan["cases"][0]["params"]["isl"] == 128 * 1024  # no [scale]: nominal sizes
    for path in (tmp_path / "dry").rglob("*"):
        if path.is_file():
            assert "s3cr3t-token-value" not in path.read_text(errors="replace"), path

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


@pytest.mark.integration
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
    inj = mixed[1]["injection"]
    assert mixed[0]["injection"] is None and (inj["offset_s"], inj["at_output"]) == (0.0, 0.25)
    assert inj["token_mark"] == -(-mixed[1]["params"]["osl"] // 4)  # a quarter of the OSL, up
    assert f"after every stream has {inj['token_mark']} output tokens" in (
        run / "dry_run.md").read_text()
    # Every server, worker and agent command with its env names, per node.
    cmds = plan["commands"]
    servers = [c for n, c in cmds.items() if n.startswith("server-")]
    assert servers and all(isinstance(c["env_names"], list) for c in servers)
    assert any(n.startswith("agent-") for n in cmds)
    assert (run / "dry_run.md").read_text().count("| ") > len(plan["cases"])
    # Nothing started: no server log, no agent samples, no requests.
    assert not (run / "service").exists() and not (run / "nodes").exists()
    assert (run / "requests.jsonl").read_text() == ""


@pytest.mark.integration
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


@pytest.mark.integration
def test_dry_run_lists_the_container_command_and_its_stop(tmp_path):
    """The docker profile: the runtime's run argv is the server command, the server's argv
    is its command after the image, every variable named (the secret's value nowhere),
    the runtime is what the preflight looks for, and the stop and rm commands are listed."""
    profile = "fixtures/profiles/vllm-1gpu-docker.toml"
    env = {**os.environ, "HF_TOKEN": "hf_s3cr3t-value", "CI_NO_PROGRESS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "cases/test_matrix.py", "--strata-dry-run",
         f"--strata-profile={profile}", f"--strata-reports-dir={tmp_path}",
         "--strata-run-id=dry", "-p", "no:cacheprovider", "-q"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stdout[-3000:]
    plan = json.loads((tmp_path / "dry" / "dry_run.json").read_text())
    server = plan["commands"]["server-default"]
    argv = server["argv"]
    assert argv[:2] == ["docker", "run"] and argv[argv.index("--name") + 1] == (
        "strata-vllm-dry-default")
    image = argv.index("vllm/vllm-openai:v0.11.0")
    assert argv[image + 1:] == server["container"]["command"]
    assert argv[image + 1:image + 3] == ["--model", "Qwen/Qwen3-8B"]
    assert server["env_names"] == ["VLLM_SERVER_DEV_MODE", "HF_TOKEN"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-e"] == server["env_names"]
    assert argv[argv.index("--gpus") + 1] == "device=0"
    assert server["container"]["stop_argv"] == ["docker", "stop", "-t", "30",
                                                 "strata-vllm-dry-default"]
    assert server["container"]["rm_argv"] == ["docker", "rm", "-f", "strata-vllm-dry-default"]
    assert "docker" in plan["preflight"]["tools"] and "--model" not in plan["preflight"]["tools"]
    assert "docker container inspect" in (tmp_path / "dry" / "dry_run.md").read_text()
    for path in (tmp_path / "dry").rglob("*"):
        if path.is_file():
            assert "hf_s3cr3t-value" not in path.read_text(errors="replace"), path

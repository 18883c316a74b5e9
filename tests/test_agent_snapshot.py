"""Static snapshots of this machine: facts, commands run, and reasons for what is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from fake_nvml import FakeNvml

from strata_plugin.agent.snapshot import collect_snapshot, cpu_summary, static_snapshot


def test_static_snapshot_here(tmp_path) -> None:
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        written = static_snapshot(tmp_path / "before", server_pids=[server.pid])
    finally:
        server.kill()
        server.wait()
    for name in (
        "host.json",
        "cpu.json",
        "numa.json",
        "sysctl.json",
        "python_packages.json",
        "server.json",
        "commands.json",
        "errors.json",
    ):
        assert name in written and (tmp_path / "before" / name).exists(), name
    host = json.loads(written["host.json"].read_text())
    assert host["uname"]["release"] == os.uname().release
    cpu = json.loads(written["cpu.json"].read_text())
    model = next(
        line.split(":", 1)[1].strip()
        for line in open("/proc/cpuinfo")
        if line.startswith("model name")
    )
    assert cpu["model_name"] == model and cpu["logical_cpus"] == os.cpu_count()
    assert "node0" in json.loads(written["numa.json"].read_text())
    packages = json.loads(written["python_packages.json"].read_text())
    assert "pytest" in {k.lower() for k in packages}
    servers = json.loads(written["server.json"].read_text())
    assert servers[0]["argv"][:2] == [sys.executable, "-c"]
    assert servers[0]["affinity"]
    # the server runs on Python: its own package list was taken with its interpreter
    assert f"server_python_packages_{server.pid}.json" in written
    errors = json.loads(written["errors.json"].read_text())
    commands = json.loads(written["commands.json"].read_text())
    if shutil.which("nvidia-smi") is None:
        assert "not found" in errors["nvidia_smi_topo"]
        assert "nvml" in errors
    assert all(isinstance(argv, list) for argv in commands.values())


def test_gpu_facts_from_nvml_and_tool_failures_are_recorded() -> None:
    def runner(argv, timeout):
        return 9, "", "NVIDIA-SMI has failed because it couldn't communicate with the driver"

    files = collect_snapshot(
        runner=runner, nvml=FakeNvml(), which=lambda name: "/usr/bin/" + name, python_packages=False
    )
    gpus = json.loads(files["gpus.json"])
    assert gpus["driver_version"] == "550.54.15" and gpus["cuda_driver_version"] == "12040"
    assert gpus["gpus"][0]["name"].startswith("FAKE NVIDIA H100")
    assert "UNAVAILABLE" in str(gpus["gpus"][0]["serial"])  # the fake has no serial call
    errors = json.loads(files["errors.json"])
    assert errors["nvidia_smi_topo"].startswith("exit 9: NVIDIA-SMI has failed")
    assert json.loads(files["commands.json"])["nvidia_smi_topo"] == ["nvidia-smi", "topo", "-m"]


def test_cpu_summary_reads_only_the_first_cpu() -> None:
    text = "processor : 0\nmodel name : Xeon X\nflags : a b\n\nprocessor : 1\nmodel name : Y\n"
    s = cpu_summary(text)
    assert s["model_name"] == "Xeon X" and s["logical_cpus"] == 2 and s["flags"] == ["a", "b"]

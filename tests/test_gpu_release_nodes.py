"""GPU release checked on every node by its own agent, against the scripted NVML stub.

The stub says a process holds 1 GiB on gpu0 for as long as that process lives, so the
check sees the real process die (the agent's NVML is the only fake: the GPU).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from strata_plugin.agent.handle import AgentHandle, agent_argv
from strata_plugin.run.gpu_release import GpuNotReleased, release_on_nodes, require_gpu_release

TESTS = Path(__file__).resolve().parent

STUB = """
import os, sys
sys.path.insert(0, {tests!r})
from fake_nvml import FakeNvml, FakeProcess

HOLDER = {holder}


class HeldWhileAlive(FakeNvml):
    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self._check("nvmlDeviceGetComputeRunningProcesses")
        try:
            alive = open(f"/proc/{{HOLDER}}/stat").read().split(") ")[1][0] != "Z"
        except OSError:
            alive = False
        return [FakeProcess(HOLDER, 1 << 30)] if alive and h == 0 else []


def stub():
    return HeldWhileAlive()
"""


def _agent(tmp: Path, name: str, stub: Path, pids: list[int]) -> AgentHandle:
    argv = agent_argv(name, 0.2, pids=pids, collectors=["cpu", "nvml"],
                      extra=["--nvml-stub", str(stub)], python=sys.executable)
    return AgentHandle.start(name, tmp / name, argv)


def test_every_node_answers_and_a_leftover_holder_fails_by_node(tmp_path):
    server = subprocess.Popen(["sleep", "60"])
    other = subprocess.Popen(["sleep", "60"])
    stub = tmp_path / "stub.py"
    stub.write_text(STUB.format(tests=str(TESTS), holder=server.pid))
    head = _agent(tmp_path, "head", stub, [other.pid])
    worker = _agent(tmp_path, "worker", stub, [server.pid])  # the process that holds gpu0
    try:
        results = release_on_nodes([head, worker], timeout_s=1.0)
        assert results["head"].ok and f"pids [{other.pid}]" in results["head"].detail
        held = results["worker"]
        assert not held.ok and held.waited_s >= 1.0
        assert f"pid {server.pid} on gpu0 (1024 MiB)" in held.detail
        try:
            require_gpu_release(held, "worker")
            raise AssertionError("a held GPU must fail the run")
        except GpuNotReleased as exc:
            assert "on worker" in str(exc)
        server.kill()
        server.wait()
        again = release_on_nodes([head, worker], timeout_s=5.0)
        assert again["worker"].ok and again["worker"].waited_s < 5.0
    finally:
        for p in (server, other):
            p.kill()
            p.wait()
        head.stop()
        worker.stop()


def test_an_agent_that_followed_nothing_requires_idle_gpus(tmp_path):
    holder = subprocess.Popen(["sleep", "60"])
    stub = tmp_path / "stub.py"
    stub.write_text(STUB.format(tests=str(TESTS), holder=holder.pid))
    h = _agent(tmp_path, "n", stub, [])
    try:
        r = release_on_nodes([h], timeout_s=0.5)["n"]
        assert not r.ok and f"pid {holder.pid} on gpu0" in r.detail
        h.stop()
        dead = release_on_nodes([h], timeout_s=0.5)["n"]
        assert not dead.ok and "could not ask the agent" in dead.detail
    finally:
        holder.kill()
        holder.wait()
        h.stop()

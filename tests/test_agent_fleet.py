"""The run's agent fleet (run/agents.py): which node's agent follows the server, and one
block's life with real agents: start, snapshot, flush, a lost agent recovered, stop."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from package_source import package_files, parsed

from strata_plugin.configure.profile import NodeSpec, TelemetrySpec
from strata_plugin.run.agents import ALLOWANCE, CONNS, PATH, RUNSTATE, AgentFleet

PKG = Path(__file__).resolve().parents[1] / "strata_plugin"


class Recorder:
    """The manifest part of run_folder.RunRecorder (the fleet writes nothing else)."""

    def __init__(self) -> None:
        self.manifest: dict = {}

    def update_manifest(self, **fields) -> None:
        self.manifest.update(fields)


def _wait(pred, timeout_s: float = 10.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return bool(pred())


def test_the_head_rule_is_written_once():
    """``NodeSpec.is_head`` is the only reader of a node's role: the loader, the fleet,
    the session's workers and the dry run all ask it (three places had their own
    ``role == "head"`` before)."""
    readers = []
    for path in package_files():
        tree = parsed(path)
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and node.attr == "role":
                    readers.append(f"{path.relative_to(PKG)}:{fn.name}")
    assert sorted(set(readers)) == ["configure/profile.py:is_head"]
    assert NodeSpec("a").is_head and not NodeSpec("b", "worker").is_head


def test_only_the_head_agent_follows_the_server(tmp_path):
    t = TelemetrySpec(interval_s=0.5, collectors=("proc", "cpu", "prom", "log"))
    fleet = AgentFleet((NodeSpec("w1", "worker"), NodeSpec("gpu-a"), NodeSpec("w2", "worker")),
                       t, tmp_path, Recorder())
    assert fleet.head == "gpu-a"
    server = SimpleNamespace(base_url="http://127.0.0.1:8000", log_path=tmp_path / "server.log")
    cmds = fleet.commands(4321, server)
    assert list(cmds) == ["w1", "gpu-a", "w2"]  # the profile's order
    head = cmds["gpu-a"]
    assert head[head.index("--pid") + 1] == "4321"
    assert head[head.index("--prom-url") + 1] == "http://127.0.0.1:8000/metrics"
    assert head[head.index("--log-file") + 1] == str(tmp_path / "server.log")
    assert head[head.index("--collectors") + 1] == (
        f"proc,cpu,prom,log,{RUNSTATE},{PATH},{ALLOWANCE},{CONNS}")
    assert "--path-pid" not in head  # a server we started: the client connects to it
    for worker in (cmds["w1"], cmds["w2"]):
        assert not {"--pid", "--prom-url", "--log-file"} & set(worker), worker
        assert worker[worker.index("--collectors") + 1] == "proc,cpu,prom,log"
        assert worker[worker.index("--cgroup") + 1] == "none"
    # a profile without nodes still has a head to name (the GPU check falls back to it)
    assert AgentFleet((), t, tmp_path, Recorder()).head == "local"


class Tracked:
    def __init__(self, node: str, alive: bool = True) -> None:
        self.node, self.alive, self.pids = node, alive, []

    def track_pids(self, pids) -> None:
        self.pids.append(list(pids))


def test_a_restarted_server_is_followed_by_the_head_agent_alone(tmp_path):
    fleet = AgentFleet((NodeSpec("w1", "worker"), NodeSpec("gpu-a")), TelemetrySpec(),
                       tmp_path, Recorder())
    worker, head = Tracked("w1"), Tracked("gpu-a")
    fleet.blocks["b"] = [worker, head]
    fleet.retrack(SimpleNamespace(block_key="b", pid=777))
    assert head.pids == [[777]] and worker.pids == []
    fleet.retrack(SimpleNamespace(block_key="other", pid=778))  # no agents there
    fleet.retrack(SimpleNamespace(block_key="b", pid=None))  # no PID yet: nothing to follow
    head.alive = False
    fleet.retrack(SimpleNamespace(block_key="b", pid=779))  # a dead agent is not written to
    assert head.pids == [[777]]


@pytest.fixture
def sleeper():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p
    p.kill()
    p.wait()


def test_one_block_with_real_agents(tmp_path, sleeper):
    """Start (a clock offset per node), the ``before`` snapshot, a flush, a killed agent
    found, recorded and restarted into the same folder, then the stop: every agent ends
    and its end-of-block clock is in the manifest."""
    rec = Recorder()
    t = TelemetrySpec(interval_s=0.1, collectors=("proc", "cpu"))
    fleet = AgentFleet((NodeSpec("local"),), t, tmp_path, rec)
    server = SimpleNamespace(pid=sleeper.pid, base_url="http://127.0.0.1:9", log_path=None,
                             block_key="b", container=None)
    handles = fleet.start(server)
    try:
        (h,) = handles
        assert fleet.handles("b") is handles and h.alive
        start = rec.manifest["nodes"]["local"]
        assert start["clock_uncertainty_ns"] > 0 and start["end_wall_ns"] is None
        fleet.snapshot(server, "before")
        assert rec.manifest["static_snapshots"] == {"local": {"before": "ok"}}
        assert (tmp_path / "nodes" / "local" / "static" / "before").is_dir()
        assert fleet.flush("b") is True
        assert fleet.recover(server) == []  # nothing lost yet

        os.kill(h.proc.pid, signal.SIGKILL)
        assert _wait(lambda: not h.alive, 5.0)
        (line,) = fleet.recover(server, ("c1",))
        assert line.startswith("agent on local lost during c1 (") and line.endswith("restarted")
        (lost,) = rec.manifest["agents_lost"]
        assert lost["node"] == "local" and lost["cases"] == ["c1"] and lost["restarted"]
        (again,) = fleet.handles("b")
        assert again is not h and again.alive
        cmds = sorted((tmp_path / "nodes" / "local" / "collector_commands").glob("agent*.json"))
        assert len(cmds) == 2  # the second agent appends to the same node folder
        assert fleet.flush("b") is True
    finally:
        fleet.stop("b")
    assert not again.alive and fleet.handles("b") == []
    end = rec.manifest["nodes"]["local"]
    assert end["end_wall_ns"] > end["start_wall_ns"] and end["clock_drift_ppm"] is not None
    assert "agent_exit" not in end  # the restarted agent was stopped, not lost
    assert fleet.lost == rec.manifest["agents_lost"]

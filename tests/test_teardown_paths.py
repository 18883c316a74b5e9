"""Teardown when a part fails: every agent is stopped, no half-written file is left."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from strata_plugin.configure.profile import NodeSpec, TelemetrySpec
from strata_plugin.formats.windows import Marker, read_markers, write_markers
from strata_plugin.run.agents import AgentFleet


@dataclass
class FakeAgent:
    """The part of an AgentHandle that AgentFleet.stop uses; it can fail where asked."""

    node: str
    fail_clock: bool = False
    fail_stop: bool = False
    alive: bool = True
    offsets: list = field(default_factory=list)
    exit_info: object = None
    stopped: bool = False

    def measure_clock_offset(self):
        if self.fail_clock:
            raise TimeoutError("no pong within 5 s")
        raise AssertionError("not reached: no start offset")

    def stop(self, timeout: float) -> None:
        self.stopped = True
        if self.fail_stop:
            raise OSError("ssh: connection reset")


class FakeRecorder:
    def __init__(self) -> None:
        self.manifest: dict = {"nodes": {}}

    def update_manifest(self, **fields) -> None:
        self.manifest.update(fields)


def _fleet(tmp_path, recorder=None) -> AgentFleet:
    nodes = (NodeSpec("a"), NodeSpec("b", "worker"), NodeSpec("c", "worker"))
    return AgentFleet(nodes, TelemetrySpec(), tmp_path, recorder or FakeRecorder())


def test_every_agent_is_stopped_when_one_fails_to_stop_or_to_answer(tmp_path):
    agents = [FakeAgent("a", fail_stop=True), FakeAgent("b", fail_clock=True, offsets=[object()]),
              FakeAgent("c")]
    fleet = _fleet(tmp_path)
    fleet.blocks["default"] = agents
    with pytest.raises(RuntimeError, match="could not stop the agent on a: OSError"):
        fleet.stop("default")
    assert [a.stopped for a in agents] == [True, True, True]
    nodes = fleet.recorder.manifest["nodes"]
    assert nodes["b"]["clock_end_error"] == "TimeoutError: no pong within 5 s"
    assert fleet.handles("default") == []  # the block has no agents left to stop twice


def test_a_failed_markers_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "markers.csv"
    good = [Marker("case", "c1", "c1", 10, 20)]
    write_markers(path, good)
    with pytest.raises(AttributeError):
        write_markers(path, [*good, object()])  # fails mid-write, after the header
    assert read_markers(path) == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["markers.csv"]


def test_a_failed_manifest_write_keeps_the_old_manifest_and_no_temporary(tmp_path):
    from strata_plugin.run.run_folder import atomic_write_text

    path = tmp_path / "manifest.json"
    atomic_write_text(path, '{"complete": false}\n')
    with pytest.raises(TypeError):
        atomic_write_text(path, b"not text")  # type: ignore[arg-type]  # fails mid-write
    assert path.read_text() == '{"complete": false}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


class FakeProc:
    """A head or worker process: the shape of service.Server / remote.RemoteProcess."""

    def __init__(self, name: str, log: list, *, alive: bool = True, code: int | None = None):
        self.node = self.config_id = self.block_id = self.block_key = name
        self.log, self._alive, self.code = log, alive, code
        self.spec, self.restarts, self.pid = object(), 0, None

    def alive(self) -> bool:
        return self._alive

    def exit_code(self):
        return None if self._alive else self.code

    def stop(self):
        self.log.append(f"stop {self.node}")
        self._alive = False

    def start(self):
        self.log.append(f"start {self.node}")
        self._alive = True


def _deployment(log: list, workers: list, tmp_path):
    from strata_plugin.run.deployment import Deployment

    recorder = FakeRecorder()
    fleet = _fleet(tmp_path, recorder)  # no agents: a retrack has nothing to do
    dep = Deployment(SimpleNamespace(server_url=None), tmp_path, recorder, fleet,
                     add_reason=lambda kind, detail="": None)
    dep.workers = {"default": workers}

    def start_workers(spec, block_id):
        log.append(f"start workers of {block_id}")
        return [FakeProc(w.node, log) for w in workers]

    dep.start_workers = start_workers
    return dep


def test_a_dead_worker_restarts_the_whole_group_once_then_skips(tmp_path):
    log: list[str] = []
    head = FakeProc("default", log)
    workers = [FakeProc("w0", log, alive=False, code=137), FakeProc("w1", log)]
    dep = _deployment(log, workers, tmp_path)
    assert dep.ensure_alive(head) is head
    # the live head is stopped too (it cannot finish a collective), workers start first
    assert log == ["stop default", "stop w0", "stop w1", "start workers of default",
                   "start default"]
    assert dep.recorder.manifest["restart_default_workers"] == {"w0": 137}
    assert head.restarts == 1 and dep.dead_workers(head) == []
    dep.workers["default"][1]._alive = False  # dies again: no second restart
    from strata_plugin.run.deployment import ServerDown

    with pytest.raises(ServerDown, match="worker w1 exit None"):
        dep.ensure_alive(head)


def test_a_healthy_group_is_left_alone(tmp_path):
    log: list[str] = []
    head = FakeProc("default", log)
    dep = _deployment(log, [FakeProc("w0", log)], tmp_path)
    assert dep.ensure_alive(head) is head and log == []


def test_a_worker_that_died_during_the_case_fails_it_with_its_log_tail(tmp_path):
    from strata_plugin.plugin.case_teardown import judge_call

    log = tmp_path / "worker-1.log"
    log.write_text("loading shard 3\nNCCL error: unhandled system error\n")
    worker = SimpleNamespace(node="node1", exit_code=lambda: 1, log_path=log)
    head = SimpleNamespace(config_id="tp16", alive=lambda: True)
    sess = SimpleNamespace(run_dir=tmp_path, cfg=SimpleNamespace(baseline_dir=None),
                           deployment=SimpleNamespace(dead_workers=lambda server: [worker]))
    item = SimpleNamespace(stash={}, user_properties=[], nodeid="cases/x.py::t")
    runner = SimpleNamespace(case_lines={}, results=[], expectations=[])
    with pytest.raises(pytest.fail.Exception) as failed:
        judge_call(item, sess, head, runner, None)
    text = str(failed.value)
    assert "worker node1 of server tp16 died during the case (exit 1)" in text
    assert "NCCL error: unhandled system error" in text
    # A test whose own body failed keeps its exception; the reason goes beside it.
    own = AssertionError("tokens/s below the floor")
    with pytest.raises(AssertionError) as kept:
        judge_call(item, sess, head, runner, own)
    assert kept.value is own
    from strata_plugin.plugin.case_teardown import call_problems_key

    assert "worker node1 of server tp16 died during the case" in item.stash[call_problems_key]

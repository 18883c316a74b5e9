"""The agent started and stopped for real, as a subprocess, through AgentHandle."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata_plugin.agent.collectors import registry
from strata_plugin.agent.handle import AgentDied, AgentHandle, AgentStartError, agent_argv

IB = Path(__file__).parent / "data" / "sysfs_infiniband"
LOG = Path(__file__).parent / "data" / "logs" / "llamacpp_server.log"


@pytest.fixture
def server():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p
    p.kill()
    p.wait()


@pytest.fixture
def handles():
    made: list[AgentHandle] = []
    yield made
    for h in made:
        h.stop(2.0)


def start(handles, out: Path, **kw) -> AgentHandle:
    kw.setdefault("interval_s", 0.1)
    h = AgentHandle.start("n1", out, agent_argv("n1", **kw))
    handles.append(h)
    return h


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def wait_for(pred, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_start_sample_stop(tmp_path, server, handles) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    h = start(handles, tmp_path, pids=[server.pid], ib_root=IB, log_file=log)
    statuses = h.hello["collectors"]
    assert set(statuses) == set(registry.names())  # by default, every registered one
    for name in ("proc", "cpu", "mem", "disk", "net", "rdma", "log", "numa", "runstate"):
        assert statuses[name] == {"status": "ok"}, name
    assert statuses["prom"]["status"] == "UNAVAILABLE"
    assert h.hello["pid"] == h.proc.pid and h.hello["node"] == "n1"
    with open(log, "a") as fh:
        fh.write(LOG.read_text())
    assert wait_for(
        lambda: h.samples_written.get("log", 0) > 0 and h.samples_written.get("proc", 0) > 0
    )
    time.sleep(0.3)
    asked = time.time_ns()
    info = h.stop()
    assert info.expected and info.returncode == 0 and info.bye["reason"] == "stop"
    assert not h.alive and not h.died
    h.check()  # a stopped agent is not an error

    samples = tmp_path / "samples"
    for src in ("proc", "cpu", "mem", "disk", "net", "rdma", "numa", "log", "runstate", "agent"):
        r = rows(samples / f"{src}.csv")
        assert r, src
        assert list(r[0]) == ["wall_ns", "node", "source", "device", "metric", "value", "kind"]
        assert all(x["source"] == src and x["node"] == "n1" for x in r)
        assert all(x["kind"] in ("gauge", "counter") for x in r)
    proc = rows(samples / "proc.csv")
    assert any(x["device"] == f"pid{server.pid}" and x["metric"] == "rss_bytes" for x in proc)
    log_rows = rows(samples / "log.csv")
    assert [float(x["value"]) for x in log_rows if x["metric"] == "llama_eval.ms"] == [
        190.19,
        1501.77,
    ]
    # stop sends a final tick: the last samples were taken after the stop was asked for
    last = max(int(x["wall_ns"]) for x in rows(samples / "cpu.csv"))
    assert asked <= last <= info.bye["wall_ns"]

    unavailable = json.loads((tmp_path / "unavailable.json").read_text())
    assert unavailable["prom"] == "no --prom-url given"
    assert "nvml" in unavailable and "dcgm" in unavailable
    assert json.loads((tmp_path / "collector_commands" / "agent.json").read_text()) == h.argv
    kinds = [json.loads(line)["kind"] for line in open(tmp_path / "agent_log.jsonl")]
    assert kinds[0] == "hello" and kinds[-1] == "bye"


def test_clock_offset_on_one_host_is_near_zero(tmp_path, handles) -> None:
    h = start(handles, tmp_path, collectors=["cpu", "mem"])
    off = h.measure_clock_offset(n=8)
    assert 0 < off.rtt_ns < 50_000_000
    assert off.uncertainty_ns == off.rtt_ns // 2
    assert abs(off.offset_ns) <= off.uncertainty_ns + 1_000_000
    saved = [json.loads(x) for x in open(tmp_path / "clock_offsets.jsonl")]
    assert saved[0]["offset_ns"] == off.offset_ns and saved[0]["node"] == "n1"


def test_agent_killed_mid_run_is_reported_and_samples_kept(tmp_path, handles) -> None:
    exits = []
    h = AgentHandle.start(
        "n1", tmp_path, agent_argv("n1", 0.1, collectors=["cpu", "mem"]), on_exit=exits.append
    )
    handles.append(h)
    assert wait_for(lambda: h.samples_written.get("cpu", 0) > 40)
    os.kill(h.proc.pid, signal.SIGKILL)
    assert wait_for(lambda: h.exit_info is not None, 5.0)
    assert h.died and not h.alive
    assert h.exit_info.signal == "SIGKILL" and not h.exit_info.expected
    assert "SIGKILL" in h.exit_info.reason
    assert exits == [h.exit_info]
    with pytest.raises(AgentDied, match="died: killed by SIGKILL"):
        h.check()
    with pytest.raises(AgentDied):
        h.measure_clock_offset()
    t0 = time.monotonic()
    assert h.stop(5.0) is h.exit_info  # stopping a dead agent does not hang
    assert time.monotonic() - t0 < 3.0  # a hang waits out the 5 s
    kept = rows(tmp_path / "samples" / "cpu.csv")
    assert len(kept) >= 40 and all(r["metric"] for r in kept)


def test_eof_on_stdin_stops_the_agent(tmp_path, handles) -> None:
    h = start(handles, tmp_path, collectors=["cpu"])
    h.proc.stdin.close()  # what a dropped ssh connection looks like to a remote agent
    assert wait_for(lambda: h.exit_info is not None, 5.0)
    assert h.exit_info.returncode == 0 and h.exit_info.bye["reason"] == "eof"


def test_sigterm_flushes_and_says_bye(tmp_path, handles) -> None:
    h = start(handles, tmp_path, collectors=["cpu"])
    assert wait_for(lambda: h.samples_written.get("cpu", 0) > 0)
    h.proc.send_signal(signal.SIGTERM)
    assert wait_for(lambda: h.exit_info is not None, 5.0)
    assert h.exit_info.bye["reason"] == "sigterm"
    assert h.died  # nobody asked it to stop: the harness must hear about it


def test_pids_control_line_starts_the_process_collectors(tmp_path, server, handles) -> None:
    h = start(handles, tmp_path, collectors=["proc", "cpu"])
    assert h.hello["collectors"]["proc"]["status"] == "UNAVAILABLE"
    assert "proc" in json.loads((tmp_path / "unavailable.json").read_text())
    h.track_pids([server.pid])
    assert wait_for(lambda: h.samples_written.get("proc", 0) > 0)
    assert "proc" not in json.loads((tmp_path / "unavailable.json").read_text())
    h.stop()
    assert any(r["device"] == f"pid{server.pid}" for r in rows(tmp_path / "samples" / "proc.csv"))


def test_snapshot_over_the_control_channel(tmp_path, server, handles) -> None:
    h = start(handles, tmp_path, pids=[server.pid], collectors=["cpu"])
    dest = h.snapshot("before")
    assert dest == tmp_path / "static" / "before"
    host = json.loads((dest / "host.json").read_text())
    assert host["uname"]["sysname"] == "Linux"
    servers = json.loads((dest / "server.json").read_text())
    assert servers[0]["pid"] == server.pid and servers[0]["argv"][0] == sys.executable
    assert (dest / "errors.json").exists() and (dest / "commands.json").exists()


def test_unknown_control_line_is_an_error_not_a_crash(tmp_path, handles) -> None:
    h = start(handles, tmp_path, collectors=["cpu"])
    h.send("frobnicate now")
    assert wait_for(lambda: h.errors)
    assert "unknown control line" in h.errors[0]["error"]
    assert h.alive


def test_bad_arguments_fail_the_start_with_stderr(tmp_path) -> None:
    argv = agent_argv("n1", 0.01)
    with pytest.raises(AgentStartError, match=r"--interval must be >= 0\.1"):
        AgentHandle.start("n1", tmp_path, argv, hello_timeout_s=10)
    argv = agent_argv("n1", 0.5, collectors=["cpu", "gpu_magic"])
    with pytest.raises(AgentStartError, match="unknown collector 'gpu_magic'"):
        AgentHandle.start("n1", tmp_path / "b", argv, hello_timeout_s=10)


def test_agent_argv_builds_a_list() -> None:
    argv = agent_argv(
        "node-a",
        0.25,
        pids=[10, 11],
        pid_pattern="llama-server",
        prom_url="http://127.0.0.1:8080/metrics",
        log_file="/tmp/s.log",
        log_patterns={"x": r"took (?P<ms>\d+) ms"},
        collectors=["cpu", "proc"],
        python="/usr/bin/python3",
    )
    assert argv[:3] == ["/usr/bin/python3", "-m", "strata_plugin.agent"]
    assert argv[argv.index("--interval") + 1] == "0.25"
    assert argv.count("--pid") == 2 and "--log-pattern" in argv
    assert argv[argv.index("--log-pattern") + 1] == r"x=took (?P<ms>\d+) ms"
    sub = agent_argv("n", module="strata_plugin", python="py")
    assert sub[:4] == ["py", "-m", "strata_plugin", "agent"]
    with pytest.raises(ValueError):
        agent_argv("bad,node")


def test_two_agents_in_turn_share_one_folder(tmp_path, server, handles) -> None:
    first = start(handles, tmp_path, collectors=["cpu", "proc"])
    assert wait_for(lambda: first.samples_written.get("cpu", 0) > 0)
    first.stop()
    assert "proc" in json.loads((tmp_path / "unavailable.json").read_text())
    second = start(handles, tmp_path, collectors=["cpu", "proc"], pids=[server.pid])
    assert wait_for(lambda: second.samples_written.get("proc", 0) > 0)
    second.stop()
    # the newer agent's word wins; files append without a second header
    assert "proc" not in json.loads((tmp_path / "unavailable.json").read_text())
    lines = (tmp_path / "samples" / "cpu.csv").read_text().splitlines()
    assert sum(1 for line in lines if line.startswith("wall_ns")) == 1
    commands = tmp_path / "collector_commands"
    assert json.loads((commands / "agent.json").read_text()) == first.argv
    assert json.loads((commands / "agent.2.json").read_text()) == second.argv
    kinds = [json.loads(line)["kind"] for line in open(tmp_path / "agent_log.jsonl")]
    assert kinds.count("hello") == 2 and kinds.count("bye") == 2

"""Remote nodes over ssh: the shipped agent, remote commands under the guard, dropped
connections, a rate-capped link seen in the samples, clocks over a slow path.

The first tests run the remote side through a fake ssh (``sh -c`` of the remote line,
with an empty environment), so the quoting, the bootstrap and the guard are checked in
a second. The integration tests use the namespace lab (tests/netlab.py): a real sshd
in a worker namespace, reached over a veth pair.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
from netlab import children, cmdline, lab_fixture

from strata_plugin.agent.handle import AgentHandle, agent_argv
from strata_plugin.agent.procfs import process_tree
from strata_plugin.analysis import clocks as clock
from strata_plugin.analysis import rails
from strata_plugin.analysis.clocks import node_clocks
from strata_plugin.analysis.timeline import Window, load_samples, summarize_window
from strata_plugin.run import remote
from strata_plugin.run.server import LaunchSpec, Server, free_port

SYS_PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"


def _fake_ssh(tmp: Path) -> str:
    """An 'ssh' that runs the remote line with sh in an empty environment, like sshd."""
    path = tmp / "fakessh"
    path.write_text(
        "#!/bin/sh\n"
        'while [ "$1" != "--" ]; do shift; done; shift 2\n'
        'exec env -i PATH=/usr/bin:/bin HOME=/tmp sh -c "$1"\n'
    )
    path.chmod(0o755)
    return str(path)


def _wait(pred, timeout_s: float = 10.0, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


# --- commands, without a network ---------------------------------------------------------


def test_remote_argv_quotes_every_element_and_rejects_option_hosts():
    local = agent_argv(
        "worker",
        0.5,
        pid_pattern=r"sglang\.launch_server --tp 16 'x'",
        log_patterns={"oom": r"out of memory; \$HOME `x`"},
    )
    argv = remote.remote_agent_argv("gpu-b", local, ssh_options=("-F", "/tmp/cfg"))
    assert argv[:5] == [sys.executable, "-m", "strata_plugin.run.remote", "agent", "--"]
    ssh = argv[5:]
    assert ssh[0] == "ssh" and "BatchMode=yes" in ssh and ssh[ssh.index("--") + 1] == "gpu-b"
    assert ssh[ssh.index("-F") + 1] == "/tmp/cfg"
    remote_words = shlex.split(ssh[-1])  # what the remote shell will see
    assert remote_words[:3] == ["python3", "-c", remote.BOOTSTRAP]
    assert remote_words[3:] == local[3:]  # the agent's own options, unchanged
    installed = remote.remote_agent_argv("gpu-b", local, ssh_options=(), ship=False)
    assert shlex.split(installed[-1])[:3] == ["python3", "-m", "strata_agent"]
    for bad in ("-oProxyCommand=touch /tmp/x", "a b", "", "host;rm"):
        with pytest.raises(ValueError):
            remote.remote_agent_argv(bad, local, ssh_options=())


def test_ssh_config_comes_from_the_environment_only_as_a_path():
    assert remote.ssh_options_from_env({"STRATA_SSH_CONFIG": "/etc/strata/ssh"}) == (
        "-F",
        "/etc/strata/ssh",
    )
    assert remote.ssh_options_from_env({}) == ()


def test_shipped_agent_runs_from_memory_on_a_bare_python(tmp_path):
    """The remote side has only python3: no strata on disk, no PYTHONPATH."""
    argv = remote.remote_agent_argv(
        "fake",
        agent_argv("w", 0.2, collectors=["cpu", "net"]),
        ssh_options=(),
        ssh=_fake_ssh(tmp_path),
        remote_python=SYS_PY,
    )
    h = AgentHandle.start("w", tmp_path / "w", argv)
    try:
        assert h.hello["argv"][0] == "strata_agent"
        assert h.hello["collectors"]["cpu"] == {"status": "ok"}
        off = h.measure_clock_offset()
        assert abs(off.offset_ns) <= off.uncertainty_ns + 1_000_000  # same host clock
        assert _wait(lambda: h.samples_written.get("net", 0) > 0, 5)
    finally:
        info = h.stop()
    assert info.expected and info.bye["reason"] == "stop", info


def test_guard_forwards_env_by_name_and_kills_the_group_when_the_session_ends(tmp_path):
    secret = "s3cr3t-value-never-on-a-command-line"
    out = tmp_path / "env.txt"
    script = (
        "import os, subprocess, sys, time\n"
        f"open({str(out)!r}, 'w').write(os.environ.get('STRATA_T_SECRET', ''))\n"
        "subprocess.Popen(['sleep', '300'])\n"
        "time.sleep(300)\n"
    )
    rp = remote.RemoteProcess.start(
        "w",
        "fake",
        [SYS_PY, "-c", script],
        tmp_path / "w.log",
        env={"STRATA_T_SECRET": secret},
        grace_s=2.0,
        ssh_options=(),
        ssh=_fake_ssh(tmp_path),
        remote_python=SYS_PY,
    )
    try:
        assert _wait(lambda: out.exists() and out.read_text() == secret, 10)
        assert secret not in json.dumps(rp.argv)
        tree = process_tree(rp.pid)
        assert len(tree) >= 5, tree  # helper, fake ssh -> guard, python, sleep
        for pid in tree:
            assert secret not in " ".join(cmdline(pid))
        # The session ends the hard way: the helper is SIGKILLed. ssh gets its
        # parent-death signal, the guard sees EOF / SIGTERM and takes the group down.
        os.kill(rp.pid, signal.SIGKILL)
        assert _wait(lambda: not any(_alive(p) for p in tree), 10), [
            (p, cmdline(p)) for p in tree if _alive(p)
        ]
    finally:
        rp.stop()
    log = (tmp_path / "w.log").read_text()
    assert "[strata-remote] started pid" in log


def test_a_remote_head_runs_under_service_server_with_health_and_teardown(tmp_path):
    """remote_command_argv is a plain argv: service.Server launches it, polls health
    through it, and its group teardown ends the remote side too."""
    port = free_port()
    argv = remote.remote_command_argv(
        "fake",
        [SYS_PY, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        env_names=["STRATA_T_KEY"],
        grace_s=2.0,
        ssh_options=(),
        ssh=_fake_ssh(tmp_path),
        remote_python=SYS_PY,
    )
    assert argv[argv.index("--env") + 1] == "STRATA_T_KEY"
    base = f"http://127.0.0.1:{port}"
    spec = LaunchSpec(
        "remote", tuple(argv), (("STRATA_T_KEY", "v"),), base, "/", 30, 5, tmp_path / "server.log"
    )
    server = Server(spec, base)
    server.start()
    try:
        tree = process_tree(server.pid)
        assert any("http.server" in " ".join(cmdline(p)) for p in tree), tree
        assert server.alive() and server.startup_s is not None
    finally:
        server.stop()
    assert _wait(lambda: not any(_alive(p) for p in tree), 10), [
        (p, cmdline(p)) for p in tree if _alive(p)
    ]
    assert "session ended" in (tmp_path / "server.log").read_text()


# --- the lab: real ssh into a worker namespace -------------------------------------------


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from lab_fixture(tmp_path_factory)


def _ssh_opts(lab) -> tuple[str, ...]:
    return ("-F", str(lab.sshd.config))


def _start_remote_agent(
    lab,
    run_dir: Path,
    node: str = "worker",
    interval: float = 0.2,
    collectors=("net", "cpu"),
    ssh_options=None,
):
    argv = remote.remote_agent_argv(
        lab.sshd.alias,
        agent_argv(node, interval, collectors=list(collectors)),
        ssh_options=ssh_options or _ssh_opts(lab),
        remote_python=SYS_PY,
    )
    out = run_dir / "nodes" / node
    return AgentHandle.start(node, out, argv, on_exit=remote.on_agent_exit(out))


def _start_local_agent(run_dir: Path, node: str = "head", interval: float = 0.2):
    return AgentHandle.start(
        node, run_dir / "nodes" / node, agent_argv(node, interval, collectors=["net", "cpu"])
    )


def _sink(lab, port: int):
    code = (
        "import socket, threading\n"
        f"s = socket.create_server(({lab.worker_addr!r}, {port}))\n"
        "def drain(c):\n"
        "    while c.recv(1 << 16):\n"
        "        pass\n"
        "while True:\n"
        "    c, _ = s.accept()\n"
        "    threading.Thread(target=drain, args=(c,), daemon=True).start()\n"
    )
    p = lab.ns_popen([SYS_PY, "-c", code])
    assert _wait(lambda: _can_connect(lab.worker_addr, port), 10)
    return p


def _can_connect(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.3):
            return True
    except OSError:
        return False


def _blast(host: str, port: int, seconds: float) -> int:
    """Send as fast as the link lets us for ``seconds``; returns bytes sent."""
    sent = 0
    buf = b"\0" * 65536
    with socket.create_connection((host, port)) as s:
        s.settimeout(0.2)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                sent += s.send(buf)
            except TimeoutError:
                continue
    return sent


@pytest.mark.integration
@pytest.mark.netlab
@pytest.mark.root
def test_agent_over_ssh_sees_the_capped_link_in_its_window(lab, tmp_path):
    run = tmp_path / "run"
    sink = _sink(lab, 5201)
    head = _start_local_agent(run)
    worker = _start_remote_agent(lab, run)
    try:
        starts = {h.node: h.measure_clock_offset() for h in (head, worker)}
        time.sleep(0.5)
        t0 = time.time_ns()
        _blast(lab.worker_addr, 5201, 2.0)
        t1 = time.time_ns()
        lab.cap()
        time.sleep(0.3)
        t2 = time.time_ns()
        _blast(lab.worker_addr, 5201, 3.0)
        t3 = time.time_ns()
        time.sleep(0.5)
        ends = {h.node: h.measure_clock_offset() for h in (head, worker)}
    finally:
        lab.uncap()
        for h in (head, worker):
            h.stop()
        sink.kill()
        sink.wait(5)
    assert worker.exit_info.expected and worker.exit_info.bye["reason"] in ("stop", "eof")
    assert lab.wait_worker_clean(5) == {}  # the remote agent is gone with its session
    manifest = {"nodes": {n: clock.fit(n, starts[n], ends[n]).manifest() for n in starts}}
    clocks = node_clocks(manifest)
    assert set(clocks) == {"head", "worker"} and clocks["worker"].measured
    store = load_samples(run, clocks)
    free = summarize_window(store, Window("case", "uncapped", "uncapped", t0, t1))
    capped = summarize_window(store, Window("case", "capped", "capped", t2, t3))

    def rate(rows, node, dev, metric):
        (r,) = [
            r for r in rows if (r.node, r.source, r.device, r.metric) == (node, "net", dev, metric)
        ]
        return r.rate

    w_free = rate(free, "worker", lab.worker_if, "rx_bytes")
    w_cap = rate(capped, "worker", lab.worker_if, "rx_bytes")
    h_cap = rate(capped, "head", lab.head_if, "tx_bytes")
    print(
        f"\nveth rx on the worker: uncapped {w_free / 1e6:.1f} MB/s, "
        f"capped {w_cap / 1e6:.3f} MB/s (tbf 8mbit = 1 MB/s)"
    )
    assert w_free > 20e6  # a veth moves far more than the cap when free
    assert 0.6e6 < w_cap < 1.15e6  # 8 Mbit/s = 1e6 B/s, plus framing
    assert abs(h_cap - w_cap) / w_cap < 0.15  # both ends saw the same bytes
    caps = {("head", lab.head_if): 1e6, ("worker", lab.worker_if): 1e6}
    rep = rails.analyze(capped, window="capped", link_caps=caps)
    sat = rep.by_class("network")
    assert {(f.kind, f.node) for f in sat} >= {("net_saturated", "worker")}
    assert rep.signals()["net_util"] >= 0.7


@pytest.mark.integration
@pytest.mark.netlab
@pytest.mark.root
def test_ssh_killed_mid_run_marks_the_node_and_leaves_nothing_running(lab, tmp_path):
    run = tmp_path / "run"
    head = _start_local_agent(run)
    worker = _start_remote_agent(lab, run)
    helper = worker.proc.pid
    try:
        assert _wait(lambda: worker.samples_written.get("net", 0) > 0, 5)
        assert lab.worker_processes(), "the remote agent runs in the worker namespace"
        (ssh_pid,) = [p for p in children(helper) if cmdline(p)[:1] == ["ssh"]]
        os.kill(ssh_pid, signal.SIGKILL)
        assert _wait(lambda: worker.exit_info is not None, 10)
        info = worker.exit_info
        assert worker.died and not info.expected and info.signal == "SIGKILL", info
        with pytest.raises(Exception, match="died"):
            worker.check()
        unavailable = json.loads((run / "nodes" / "worker" / "unavailable.json").read_text())
        assert "agent lost mid-run" in unavailable["agent"]
        # the run goes on: the head's agent keeps sampling
        n = head.samples_written.get("net", 0)
        assert _wait(lambda: head.samples_written.get("net", 0) > n, 3) and head.alive
        # nothing left on either side
        assert lab.wait_worker_clean(10) == {}
        assert _wait(lambda: not _alive(helper) and not _alive(ssh_pid), 5)
    finally:
        worker.stop(2.0)
        head.stop()
    assert worker.stop(1.0) is info  # stopping a dead agent is harmless and says why


@pytest.mark.integration
@pytest.mark.netlab
@pytest.mark.root
def test_remote_command_dies_with_its_ssh_session(lab, tmp_path):
    marker = tmp_path / "worker-env.txt"
    script = (
        "import os, subprocess, time\n"
        f"open({str(marker)!r}, 'w').write(os.environ['STRATA_T_TOKEN'])\n"
        "subprocess.Popen(['sleep', '300'])\n"
        "time.sleep(300)\n"
    )
    # 1. the ssh client is killed: the guard sees EOF and takes the group down
    rp = remote.RemoteProcess.start(
        "worker",
        lab.sshd.alias,
        [SYS_PY, "-c", script],
        tmp_path / "w1.log",
        env={"STRATA_T_TOKEN": "tok-1"},
        grace_s=2.0,
        ssh_options=_ssh_opts(lab),
        remote_python=SYS_PY,
    )
    try:
        assert _wait(lambda: marker.exists() and marker.read_text() == "tok-1", 15)
        procs = lab.worker_processes()
        assert any("sleep 300" in c for c in procs.values()), procs
        (ssh_pid,) = [p for p in children(rp.pid) if cmdline(p)[:1] == ["ssh"]]
        os.kill(ssh_pid, signal.SIGKILL)
        assert lab.wait_worker_clean(10) == {}
        assert _wait(lambda: not rp.alive(), 5)
    finally:
        rp.stop()
    # 2. the harness stops it: SIGTERM to the helper ends the session cleanly
    marker.unlink()
    rp = remote.RemoteProcess.start(
        "worker",
        lab.sshd.alias,
        [SYS_PY, "-c", script],
        tmp_path / "w2.log",
        env={"STRATA_T_TOKEN": "tok-2"},
        grace_s=2.0,
        ssh_options=_ssh_opts(lab),
        remote_python=SYS_PY,
    )
    try:
        assert _wait(lambda: marker.exists() and marker.read_text() == "tok-2", 15)
        t = time.monotonic()
        rp.stop()
        stop_s = time.monotonic() - t
        assert lab.wait_worker_clean(5) == {}
        assert not rp.alive() and stop_s < 8, stop_s
    finally:
        rp.stop()
    assert "tok-2" not in json.dumps(rp.argv)
    assert "session ended" in (tmp_path / "w2.log").read_text()


@pytest.mark.integration
@pytest.mark.netlab
@pytest.mark.root
def test_clock_uncertainty_over_a_slow_path_is_measured_and_warned(lab, tmp_path):
    """Through a relay that holds every chunk 120 ms, the round trip is >= 240 ms: the
    offset (truly 0: one host) must fall within the stated uncertainty, and the report
    warns because the uncertainty exceeds the 100 ms sampling interval."""
    relay = lab.relay(0.12, lab.sshd.port)
    cfg = lab.write_ssh_config("127.0.0.1", relay.port, name="config-slow")
    worker = _start_remote_agent(
        lab, tmp_path, interval=0.1, collectors=("net",), ssh_options=("-F", str(cfg))
    )
    try:
        off = worker.measure_clock_offset(n=4)
    finally:
        worker.stop()
    assert off.rtt_ns >= 240e6
    assert abs(off.offset_ns) <= off.uncertainty_ns
    fit = clock.fit("worker", off)
    warning = clock.clock_warning("worker", fit.uncertainty_ns, 0.1)
    assert warning and "worker" in warning
    assert clock.clock_warnings({"nodes": {"worker": fit.manifest()}}, 0.1) == [warning]
    assert clock.clock_warning("worker", fit.uncertainty_ns, 1.0) is None

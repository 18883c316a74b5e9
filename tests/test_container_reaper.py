"""A container outlives a SIGKILLed harness no longer (run/container.py: the watchdog and
the next run's sweep).

No container runtime runs on this machine (a docker CLI without a daemon, no podman), so
these tests drive the real ``Server`` and the real watchdog against a stand-in ``docker``
(tests/fake_container_runtime.py) at the CLI boundary: its "container" is a process in a
session of its own, not a child of the client, so killing the client leaves it running,
as with a real runtime. tests/test_container_podman.py runs the real lifecycle where
podman can run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata_plugin.run import container as ctr

REPO = Path(__file__).resolve().parents[1]

HARNESS = """
import os, socket, sys, time
from pathlib import Path
from strata_plugin.configure.profile import ContainerSpec
from strata_plugin.run.container import build_launch
from strata_plugin.run.server import LaunchSpec, Server

site, port, how = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cmd = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port),
       "--directory", str(site)]
launch = build_launch(ContainerSpec(runtime="docker", image="img"), name="strata-r-b",
                      command=cmd, env_names=[], host="127.0.0.1", port=port, volumes=[],
                      args=[], image="img")
spec = LaunchSpec("b", tuple(launch.run_argv), (), f"http://127.0.0.1:{port}", "/health",
                  20, 2.0, site / "server.log", container=launch)
server = Server(spec, spec.base_url)
server.start()
print("ready", server.pid, flush=True)
if how == "stop":
    server.stop()
    print("stopped", server.container_removal.removed, flush=True)
else:
    time.sleep(600)
"""


@pytest.fixture
def runtime(tmp_path, monkeypatch) -> Path:
    """A ``docker`` on PATH that is the stand-in; its state folder."""
    bindir, state = tmp_path / "bin", tmp_path / "state"
    bindir.mkdir()
    state.mkdir()
    exe = bindir / "docker"
    exe.write_text(f"#!{sys.executable}\n"
                   + (REPO / "tests" / "fake_container_runtime.py").read_text())
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_RUNTIME_DIR", str(state))
    return state


def _calls(state: Path) -> list[list[str]]:
    path = state / "calls.jsonl"
    return [json.loads(line)["argv"] for line in path.read_text().splitlines()] \
        if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _harness(tmp_path: Path, how: str) -> tuple[subprocess.Popen, int]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "health").write_text("ok\n")
    proc = subprocess.Popen([sys.executable, "-c", HARNESS, str(site), str(_free_port()), how],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "ready", line
    return proc, int(line[1])


def _wait(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_a_sigkilled_harness_leaves_no_container(runtime, tmp_path):
    """The harness is SIGKILLed with its server up: its watchdog removes the container
    (``rm -f``) and the container's process ends. Before the watchdog the container ran
    on (the client died by its death signal; the container is not its child)."""
    proc, cpid = _harness(tmp_path, "sleep")
    try:
        assert _alive(cpid) and (runtime / "strata-r-b.json").exists()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert _wait(lambda: not _alive(cpid), 15.0), "the container still runs"
        assert not (runtime / "strata-r-b.json").exists()
        assert ["rm", "-f", "strata-r-b"] in _calls(runtime)
    finally:
        if _alive(cpid):
            os.kill(cpid, signal.SIGKILL)


def test_a_normal_stop_removes_it_once_and_the_watchdog_does_nothing(runtime, tmp_path):
    proc, cpid = _harness(tmp_path, "stop")
    out, _ = proc.communicate(timeout=60)
    assert out.split() == ["stopped", "True"] and proc.returncode == 0
    assert not _alive(cpid)
    time.sleep(1.0)  # a watchdog that was not told "done" would run rm -f by now
    rms = [c for c in _calls(runtime) if c[0] == "rm"]
    assert rms == [["rm", "-f", "strata-r-b"]], rms
    label = next(c for c in _calls(runtime) if c[0] == "run")
    assert f"strata.owner={ctr.owner_label(proc.pid)}" not in label  # that pid is gone now
    assert any(a.startswith("strata.owner=") and a.split(":")[1] == str(proc.pid)
               for a in label)


def _record(state: Path, name: str, owner: str) -> None:
    (state / f"{name}.json").write_text(json.dumps({
        "Id": name, "Name": f"/{name}", "State": {"Pid": 0, "Status": "running"},
        "Config": {"Image": "img", "Labels": {"strata.owner": owner}, "Env": []},
        "Image": "sha256:0"}))


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_the_next_run_sweeps_only_containers_whose_owner_is_gone(runtime):
    """What the watchdog could not do (it was killed too) the next start does: of five
    labelled containers it removes the one whose owner PID is gone and the one whose PID
    now belongs to another process (another start time), and leaves a live owner's,
    another host's and an unreadable label's."""
    host, me = socket.gethostname(), os.getpid()
    start = ctr._start_time(me)
    owners = {"dead": f"{host}:{_dead_pid()}:12345",
              "reused": f"{host}:{me}:{int(start) - 1}",
              "live": f"{host}:{me}:{start}",
              "elsewhere": f"other-host-{host}:{_dead_pid()}:1",
              "garbled": "not-a-label"}
    for name, owner in owners.items():
        _record(runtime, name, owner)
    assert ctr.owner_label() == owners["live"]
    removed = ctr.sweep_orphans("docker")
    assert sorted(removed) == ["dead", "reused"]
    assert sorted(p.stem for p in runtime.glob("*.json")) == ["elsewhere", "garbled", "live"]


def test_a_runtime_that_cannot_list_removes_nothing(runtime, monkeypatch):
    _record(runtime, "dead", f"{socket.gethostname()}:{_dead_pid()}:1")
    monkeypatch.setenv("FAKE_RUNTIME_DIR", str(runtime / "nope"))  # every call fails
    assert ctr.sweep_orphans("docker") == []
    assert (runtime / "dead.json").exists()

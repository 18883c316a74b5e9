"""A second SIGTERM/SIGHUP while the first one's teardown still runs: nothing left running.

The first signal becomes KeyboardInterrupt and the teardown calls ``Server.stop``, which
waits out the server's grace period. A second signal then (a CI runner that sends TERM
twice, an impatient user) must not end the interpreter by default with the server, in
its own session, still up: the reaper SIGKILLs every registered group and exits 128+N.

The test runs a real interpreter with the real handler and a real ``Server`` whose
process (and a child of it in the same group) ignores SIGTERM, so its stop hangs for the
whole grace period, as a wedged server's would.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import default_signals
import pytest

from strata_plugin.process_globals import STATE
from strata_plugin.run import reaper
from tests.test_robustness_support import ROOT, alive, wait_for

GRACE_S = 60.0  # the server's stop grace: the run must end long before it

#: The "server": notes each SIGTERM and goes on, with a child in its group that ignores it.
SERVER = """
import os, signal, time
signal.signal(signal.SIGTERM, lambda s, f: os.write(1, b"server ignores TERM\\n"))
kid = os.fork()
if kid == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)
os.write(1, f"pids {os.getpid()} {kid}\\n".encode())
while True:
    time.sleep(1)
"""

#: A run in miniature: the handler, a registered server, a teardown that stops it.
DRIVER = f"""
import os, subprocess, sys, time
from pathlib import Path
from strata_plugin.run import reaper
from strata_plugin.run.server import LaunchSpec, Server

reaper.install_sigterm_handler()
spec = LaunchSpec("c", ("server",), (), "http://127.0.0.1:9", "/health", 1.0, {GRACE_S},
                  Path(os.devnull))
server = Server(spec, spec.base_url)
with open(sys.argv[1], "ab") as log:  # not our pipes: the test reads them to their end
    server.proc = subprocess.Popen([sys.executable, "-c", {SERVER!r}], stdout=log,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
reaper.register(server)
try:
    while True:
        time.sleep(1)
except KeyboardInterrupt:
    os.write(1, b"teardown: stopping the server\\n")
    server.stop()
    os.write(1, b"teardown: done\\n")
"""


def _line(path, needle: str) -> str:
    text = path.read_text() if path.exists() else ""
    return next((x for x in text.splitlines() if needle in x), "")


def _read_until(proc: subprocess.Popen, needle: str, timeout_s: float, seen: list[str]) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if needle in line:
                return line
    raise AssertionError(f"no {needle!r} within {timeout_s} s; output so far: {seen}")


@pytest.mark.parametrize(("first", "second"), [(signal.SIGTERM, signal.SIGTERM),
                                               (signal.SIGHUP, signal.SIGTERM)])
def test_a_second_signal_during_teardown_kills_the_registered_groups(tmp_path, first, second):
    server_log = tmp_path / "server.log"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(server_log)], cwd=ROOT,
                              text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)),
                              start_new_session=True, preexec_fn=default_signals.restore)
    seen: list[str] = []
    pids: list[int] = []
    try:
        line = wait_for(lambda: _line(server_log, "pids "), 30, what="the server's pids")
        pids = [int(p) for p in line.split()[1:]]
        driver.send_signal(first)
        _read_until(driver, "teardown: stopping", 10, seen)
        wait_for(lambda: _line(server_log, "server ignores TERM"), 10,
                 what="the server to get SIGTERM")  # stop() now waits out GRACE_S
        t0 = time.monotonic()
        driver.send_signal(second)
        rc = driver.wait(15)
        took = time.monotonic() - t0
        err = driver.stderr.read()
        deadline = time.monotonic() + 5  # SIGKILL was sent: gone (or a zombie) at once
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        left = [p for p in pids if alive(p)]
        assert not left, f"left running: {left} (driver exit {rc}, stderr: {err})"
        assert rc == 128 + second, err
        assert took < GRACE_S / 4, took
        assert "killed 1 process group(s)" in err
        assert not any("teardown: done" in line for line in seen)
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)


class _Stub:
    """A registered process whose stop can be interrupted (the reaper's contract only)."""

    def __init__(self, log: list[str], name: str, fail: BaseException | None = None):
        self.log, self.name, self.fail = log, name, fail

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")
        if self.fail is not None:
            raise self.fail

    def kill_group(self) -> None:
        self.log.append(f"kill {self.name}")


def test_stop_all_goes_on_after_an_interrupted_stop(monkeypatch):
    log: list[str] = []
    monkeypatch.setattr(STATE, "live_processes", {})
    old, new = _Stub(log, "old"), _Stub(log, "new", KeyboardInterrupt("signal 15"))
    STATE.live_processes.update({id(old): old, id(new): new})
    with pytest.raises(KeyboardInterrupt):
        reaper.stop_all()
    assert log == ["stop new", "kill new", "stop old"]
    assert list(STATE.live_processes.values()) == [new]  # the interrupted one stays registered

"""A harness killed with SIGKILL leaves no server running.

SIGKILL (a CI job's timeout, the OOM killer) runs no atexit hook and no signal handler,
so the reaper never sees it; the server runs in its own session, so nothing else stops
it. ``Server.start`` asks the kernel for a parent-death signal (``reaper.die_with_parent``):
the server gets SIGTERM when the harness dies.

The test runs a real interpreter that starts a real ``Server`` (Python's http.server,
healthy on ``/``) from its main thread, SIGKILLs that interpreter, and expects the
server gone within seconds; and one started from a worker thread that then ends, which
must keep running (the kernel's signal follows the thread that forked, not the process).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from strata_plugin.run.server import free_port
from tests.test_robustness_support import ROOT, alive, wait_for

DRIVER = """
import os, sys, threading, time
from pathlib import Path
from strata_plugin.run.server import LaunchSpec, Server

port, where = int(sys.argv[1]), sys.argv[2]
spec = LaunchSpec("c", (sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                        str(port)), (), f"http://127.0.0.1:{port}", "/", 30.0, 5.0,
                  Path(os.devnull))
server = Server(spec, spec.base_url)
if where == "main":
    server.start()
else:
    t = threading.Thread(target=server.start)
    t.start()
    t.join()
print("server", server.proc.pid, flush=True)
while True:
    time.sleep(1)
"""


def _start(where: str) -> tuple[subprocess.Popen, int]:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(free_port()), where],
                              cwd=ROOT, text=True, stdout=subprocess.PIPE,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)),
                              start_new_session=True)
    assert driver.stdout is not None
    line = driver.stdout.readline()
    assert line.startswith("server "), line
    return driver, int(line.split()[1])


def test_a_sigkilled_harness_takes_its_server_with_it():
    driver, pid = _start("main")
    try:
        assert alive(pid)
        t0 = time.monotonic()
        driver.kill()
        driver.wait(10)
        wait_for(lambda: not alive(pid), 5, what=f"server {pid} to go with its harness")
        assert time.monotonic() - t0 < 5
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
        if driver.poll() is None:
            driver.kill()


def test_a_server_started_from_a_thread_outlives_the_thread():
    driver, pid = _start("thread")
    try:
        time.sleep(1.0)  # the thread that forked it has ended: no signal may follow
        assert alive(pid)
    finally:
        driver.kill()
        driver.wait(10)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)

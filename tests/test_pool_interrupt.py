"""Ctrl-C keeps what it saw through the pool too: the run of
tests/test_interrupt_keeps_records.py with ``[load] processes = 2``. The parent's SIGINT
reaches the workers (load/pool.py sends them one), each records its requests in flight
as ``interrupted`` with the events they had, and requests.jsonl holds all four."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import default_signals
import pytest
from sse_script_server import ScriptServer
from test_interrupt_keeps_records import N_TOKENS, PROFILE, ROOT, _slow

pytestmark = pytest.mark.integration  # a whole pytest run of the plugin, in a subprocess


def test_sigint_mid_case_keeps_the_pool_workers_in_flight_requests(tmp_path):
    (tmp_path / "profile.toml").write_text(PROFILE + "[load]\nprocesses = 2\n")
    (tmp_path / "pytest.ini").write_text(
        f"[pytest]\nstrata_profile = {tmp_path / 'profile.toml'}\n"
        f"strata_reports_dir = {tmp_path / 'reports'}\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), CI_NO_PROGRESS="1")
    with ScriptServer(_slow) as srv:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
             "no:hypothesispytest", f"--strata-server-url={srv.url}",
             f"--strata-workload=isl=8,osl={N_TOKENS},concurrency=4,requests=8",
             "--strata-run-id=int"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=default_signals.restore)
        try:
            deadline = time.monotonic() + 60
            posts = []
            while time.monotonic() < deadline:  # four streams, each 3 tokens in
                posts = [s for s in srv.seen if s.method == "POST"]
                if len(posts) >= 4 and all(len(s.sent_ns) >= 3 for s in posts[:4]):
                    break
                time.sleep(0.05)
            assert len(posts) == 4, f"{len(posts)} requests reached the server"
            proc.send_signal(signal.SIGINT)  # the harness only, as SIGTERM would be
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 2, out
    run = tmp_path / "reports" / "int"
    recs = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    assert len(recs) == 4, out
    assert {r["error"]["cls"] for r in recs} == {"interrupted"}, [r["error"] for r in recs]
    assert all(3 <= len(r["events"]) < N_TOKENS for r in recs)
    left = []  # no worker of this run left behind (their cwd is the run's)
    for pid in subprocess.run(["pgrep", "-f", "strata_plugin.load.pool_worker"],
                              capture_output=True, text=True).stdout.split():
        try:
            if os.readlink(f"/proc/{pid}/cwd") == str(tmp_path):
                left.append(pid)
        except OSError:
            pass
    assert not left


def _ignores_sigint(pid: int) -> bool:
    """SIGINT's bit in the process's ignored-signals mask (proc(5), SigIgn)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    raise AssertionError("no SigIgn line")


@pytest.mark.parametrize("inherited", [signal.SIG_IGN, signal.SIG_DFL])
def test_a_worker_takes_the_parents_sigint_whatever_it_inherited(inherited):
    """A harness started in the background of a script (``pytest ... &``) has SIGINT
    ignored, and its workers with it: the parent's stop (SIGINT, load/pool.py) then reached
    none of them. A worker sets its own handler before it says it is ready."""
    import socket
    from multiprocessing.connection import Connection

    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "strata_plugin.load.pool_worker", str(theirs.fileno())],
        pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        preexec_fn=lambda: signal.signal(signal.SIGINT, inherited))
    theirs.close()
    conn = Connection(ours.detach())
    try:
        assert conn.poll(30) and conn.recv()[0] == "ready"
        assert not _ignores_sigint(proc.pid)
    finally:
        conn.send(None)
        conn.close()
        proc.wait(10)

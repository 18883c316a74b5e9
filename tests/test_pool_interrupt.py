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
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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

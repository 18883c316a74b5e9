"""An engine SIGKILLed mid-case and restarted by its supervisor, seen by a real run.

A real pytest run of the plugin in a subprocess, attached to a scripted engine in a
process of its own (tests/engine_process.py); a supervisor loop here starts it again on
the same port each time it ends, as systemd or a container runtime would. The engine is
killed while the case's requests stream. The report's first lines must say when it died,
how, that a new PID took over the port, and how many failed requests that cost; the same
lines come back from the run folder alone (``report DIR``)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import default_signals
import pytest

from strata_plugin.formats.engine_events import ENGINE_EXIT, ENGINE_NEW, engine_events
from strata_plugin.formats.windows import read_markers

pytestmark = pytest.mark.integration  # a whole pytest run of the plugin, in a subprocess

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

PROFILE = """
name = "engine-lifetime"
[server]
engine = "other"
api = "completions"
health_timeout_s = 30
token_id_range = [300, 1000]
[telemetry]
interval_s = 0.1
baseline_s = 0
cooldown_s = 0
collectors = ["proc"]
"""


class Supervisor:
    """Starts the engine on ``port`` and starts it again whenever it ends, until stopped."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.pids: list[int] = []
        self.proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._up = threading.Condition()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            p = subprocess.Popen([sys.executable, str(TESTS / "engine_process.py"),
                                  str(self.port)], stdout=subprocess.PIPE, text=True,
                                 stdin=subprocess.DEVNULL)
            self.proc = p
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.startswith("listening "):
                with self._up:
                    self.pids.append(int(line.split()[1]))
                    self._up.notify_all()
            p.wait()
            self._stop.wait(0.3)  # the supervisor's restart delay

    def wait_for(self, n: int, timeout_s: float = 30.0) -> int:
        """The PID of the ``n``-th engine once it listens."""
        with self._up:
            assert self._up.wait_for(lambda: len(self.pids) >= n, timeout_s), self.pids
            return self.pids[n - 1]

    def __enter__(self) -> Supervisor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self._thread.join(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _records(run: Path) -> list[dict]:
    try:
        text = (run / "requests.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(x) for x in text.splitlines() if x.endswith("}")]


def _engine_line(report: str) -> str:
    head = report.split("\n## ", 1)[0]  # the first lines, before any section
    (line,) = [x for x in head.splitlines() if x.startswith("**Engine died:**")]
    return line


def test_an_engine_killed_mid_case_and_restarted_is_told_in_the_first_lines(tmp_path):
    (tmp_path / "profile.toml").write_text(PROFILE)
    (tmp_path / "pytest.ini").write_text(
        f"[pytest]\nstrata_profile = {tmp_path / 'profile.toml'}\n"
        f"strata_reports_dir = {tmp_path / 'reports'}\n")
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{TESTS}", CI_NO_PROGRESS="1")
    port = _free_port()
    run = tmp_path / "reports" / "died"
    with Supervisor(port) as sup:
        first = sup.wait_for(1)
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
             "no:hypothesispytest", "-p", "no:benchmark",
             f"--strata-server-url=http://127.0.0.1:{port}",
             "--strata-workload=isl=8,osl=10,arrival=poisson,rate=4,requests=40",
             "--strata-run-id=died"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=default_signals.restore)
        try:
            deadline = time.monotonic() + 90
            while sum(r["phase"] == "measured" for r in _records(run)) < 6:  # mid-case
                assert time.monotonic() < deadline and proc.poll() is None, "no requests"
                time.sleep(0.05)
            os.kill(first, signal.SIGKILL)
            second = sup.wait_for(2)
            out, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert second != first
    recs = _records(run)
    failed = [r for r in recs if r["error"] is not None]
    answered = [r for r in recs if r["error"] is None]
    assert failed, out  # the kill cost requests (those in flight at least)
    assert len(answered) > 4, out  # and the new engine served the rest
    report = (run / "report.md").read_text()
    line = _engine_line(report)
    got = re.fullmatch(
        rf"\*\*Engine died:\*\* the engine \(pid {first}\) died ([0-9.]+) s into case "
        # attached: the engine is not Strata's child, so how it ended is not Strata's to know
        r"`adhoc`: gone \(not Strata's child: how it ended went to its own parent\); "
        rf"pid {second} took over port {port} ([0-9.]+) s later; "
        rf"([0-9]+) failed requests? tied to it \(ended between its death and the new "
        r"engine's first answer, ±0\.5 s: engine_outage_margin_s\)", line)
    assert got is not None, line
    assert float(got.group(1)) > 0
    assert int(got.group(3)) == len(failed), (line, [r["error"] for r in failed])
    events = engine_events(read_markers(run / "markers.csv"))
    (died,) = [e for e in events if e.kind == ENGINE_EXIT and e.pid == first]
    (new,) = [e for e in events if e.kind == ENGINE_NEW and e.pid == second]
    # The supervisor waited 0.3 s after the death before starting the new engine: the
    # look that saw the new one listening came at least that long after the last look
    # that saw the old one alive (each look, however late, on the right side of its change)
    assert new.wall_ns - died.after_ns >= 0.3e9, (new, died)
    # and the line tells the gap between the looks that saw the two
    assert got.group(2) == f"{(new.wall_ns - died.wall_ns) / 1e9:.1f}", (line, new, died)
    markers = (run / "markers.csv").read_text()
    assert f"engine_exit pid={first} port={port} how=gone" in markers
    assert f"engine_new pid={second} port={port} how=listens" in markers
    # the run folder alone says it again
    (run / "report.md").unlink()
    subprocess.run([sys.executable, "-m", "strata_plugin", "report", str(run)], cwd=ROOT,
                   env=env, check=True, capture_output=True, timeout=300)
    assert _engine_line((run / "report.md").read_text()) == line

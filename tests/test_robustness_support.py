"""Shared pieces of the robustness tests (no tests here): short profiles, a pytest run
driven as a subprocess, and process-tree checks through /proc.

Why a real subprocess: signals, crashes and full disks are about what the harness does
as a program (its teardown, its files, its children), which an in-process call cannot
show.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import default_signals

from strata_plugin.agent.procfs import process_tree

ROOT = Path(__file__).resolve().parents[1]


def llama_paths() -> dict:
    out = subprocess.run([sys.executable, "-m", "strata_plugin", "setup",
                          "--print-paths"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError("llama-server is not built: run `bash scripts/setup.sh` first\n"
                           + out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def local_profile(path: Path, *, argv_prefix: tuple[str, ...] = (), baseline_s: float = 1,
                  cooldown_s: float = 0, health_timeout_s: float = 60,
                  interval_s: float = 0.25, extra_server: str = "",
                  scaled: bool = True) -> Path:
    """The local llama-server profile, one configuration, short windows.

    ``argv_prefix`` goes in front of the server command (a shim that delays or breaks
    the start). ``scaled``: the local profile's [scale] (the seeds' matrix shrunk to 4
    slots of 1K context), so ``cases/`` run as they do on the local profile.
    """
    p = llama_paths()
    argv = [*argv_prefix, p["llama_server"], "-m", p["model"], "--host", "{host}",
            "--port", "{port}", "-t", "2", "-c", "4096", "-np", "4", "--metrics",
            "--no-webui"]
    path.write_text(f"""
name = "robustness"
[server]
engine = "llamacpp"
api = "llamacpp"
argv = {json.dumps(argv)}
health_timeout_s = {health_timeout_s}
stop_timeout_s = 5
request_timeout_s = 60
token_id_range = [300, 1000]
{extra_server}
[telemetry]
interval_s = {interval_s}
baseline_s = {baseline_s}
cooldown_s = {cooldown_s}
collectors = ["proc", "cpu", "mem", "prom", "log"]
""" + ("""
[scale]
context = 0.015625
output = 0.0625
concurrency = 0.125
""" if scaled else ""))
    return path


#: A stand-in for a slow-starting server: sleeps, then execs the real command.
DELAY_SHIM = ("import os, sys, time; time.sleep(float(sys.argv[1])); "
              "os.execv(sys.argv[2], sys.argv[2:])")


@dataclass
class PytestRun:
    """``python -m pytest ...`` started in its own process group, output in a file."""

    proc: subprocess.Popen
    out: Path
    run_dir: Path

    @classmethod
    def start(cls, args: list[str], out: Path, run_dir: Path,
              env: dict[str, str] | None = None, cwd: Path = ROOT) -> PytestRun:
        full_env = dict(os.environ, PYTHONPATH=str(ROOT), CI_NO_PROGRESS="1")
        full_env.update(env or {})
        fh = out.open("wb")
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                                 *args], cwd=cwd, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=full_env,
                                start_new_session=True, preexec_fn=default_signals.restore)
        fh.close()
        return cls(proc, out, run_dir)

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"pytest did not finish within {timeout_s} s:\n"
                                 + self.text()[-3000:]) from None

    def kill(self) -> None:
        """Last resort for the test itself: the whole group and every descendant."""
        pids = descendants(self.proc.pid)
        for pid in [self.proc.pid, *pids]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(10)

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def manifest(self) -> dict:
        return json.loads((self.run_dir / "manifest.json").read_text())


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``: the harness's own process-tree walk, root left out."""
    return [p for p in process_tree(pid) if p != pid]


def alive(pid: int) -> bool:
    """Running (a zombie or a reused pid with another start time counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def survivors(pids: list[int], cmds: dict[int, str]) -> dict[int, str]:
    """Which of ``pids`` still run the same command as when they were seen."""
    return {p: cmds[p] for p in pids if alive(p) and cmdline(p) == cmds[p]}


def processes_mentioning(text: str) -> dict[int, str]:
    """Every process whose command line contains ``text`` (e.g. a run folder)."""
    out = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            c = cmdline(int(entry))
            if text in c and alive(int(entry)):
                out[int(entry)] = c
    return out


def wait_for(pred: Callable[[], object], timeout_s: float, step_s: float = 0.02,
             what: str = "condition") -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def kill_mid_case(run: PytestRun, find_pid: Callable[[], int | None], *, after_requests: int,
                  start_s: float, finish_s: float) -> tuple[int, int]:
    """SIGKILL a process of the run once ``after_requests`` are recorded; wait for the
    run to end; returns (the pid killed, pytest's exit code). A hung run is killed."""
    try:
        wait_for(lambda: count_lines(run.run_dir / "requests.jsonl") >= after_requests
                 or run.proc.poll() is not None, start_s, what="requests of the first case")
        pid = find_pid()
        assert pid is not None, run.text()[-3000:]
        os.kill(pid, signal.SIGKILL)
        return pid, run.wait(finish_s)
    finally:
        if run.proc.poll() is None:
            run.kill()


def count_lines(path: Path) -> int:
    try:
        with path.open("rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def make_project(tmp: Path, cases: str, name: str = "test_cases.py") -> Path:
    """A project folder whose pytest loads the Strata plugin, with one cases file."""
    (tmp / "conftest.py").write_text('"""Strata loads through its entry point."""\n')
    (tmp / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n"
                                    "markers =\n    decode: d\n")
    (tmp / name).write_text(cases)
    return tmp

"""The engine's own profile over exactly one measured window: CPU samples of the engine's
threads taken by ``perf record`` with a software event.

Why a software event: ``cpu-clock`` is a kernel hrtimer, present in a VM without a PMU
(this project's hosts have none), so it samples an engine without a profiler of its own
(llama.cpp) anywhere ``perf`` runs. It is named as what it is in every file and in the
report: "CPU samples (perf cpu-clock, software event)", not a hardware profile.

Why a control FIFO (``--control fifo:ctl,ack`` with ``--delay=-1``): perf attaches to
the threads before the window, recording nothing; "enable" is written at the window's
start and "disable" at its end, each answered by "ack" once perf has done it. The
capture's start is read before "enable" is written and its end after "disable" is
answered, so no sample lies outside them, and the seconds perf takes to start never
land inside the window.

One clock: ``-k mono`` stamps samples with ``CLOCK_MONOTONIC``, the clock the load
generator stamps requests with. The timeline is on the harness's wall clock; the
relation is measured here, at the window's start and at its end, as the narrowest of
several (monotonic, wall, monotonic) reads: its error is half that read's width plus
any step of the wall clock between the two (both in ``meta.json``).

Files, in ``traces/engine/<case>/``: ``perf.data`` (perf's own, for ``perf report``),
``samples.txt`` (``perf script`` text, written after the window so it never competes
with the sampled engine) and ``meta.json`` (what, whose threads, the window, the clock
relation and any problem, in words). A capture that fails says so in ``meta.json`` and
costs the case nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from strata_plugin.formats.atomic import atomic_write_text
from strata_plugin.process_globals import at_exit
from strata_plugin.run import engine_http_profile as hp
from strata_plugin.run.engine_http_profile import ProfileUnavailable

KIND = "CPU samples (perf cpu-clock, software event)"
#: Samples a second per thread. A prime, so the timer does not beat with the engine's
#: own periodic work; ~1 ms apart, finer than a decode step (tens of ms here) and, at
#: about 2 us of kernel time each, well under 1% of a core.
FREQ_HZ = 997
#: Seconds perf may take to answer "enable"/"disable" or to exit after SIGINT. Past it
#: the capture is said to have failed (an engine or perf that ignores the stop).
CONTROL_TIMEOUT_S = 10.0
SCRIPT_FIELDS = "comm,pid,tid,time,ip,sym,dso"
FOLDER = ("traces", "engine")

_LIVE: dict[int, subprocess.Popen[bytes]] = {}


def engine_dir(run_dir: Path, case_id: str) -> Path:
    """Where a case's engine profile goes (case ids may hold '/')."""
    return Path(run_dir).joinpath(*FOLDER, case_id.replace("/", "__"))


def perf_unavailable() -> str:
    """Why ``perf`` cannot sample here ("" when it can)."""
    if shutil.which("perf") is None:
        return ("perf is not installed (Debian: apt-get install linux-perf; "
                "scripts/install_system_deps.sh)")
    if os.geteuid() != 0:
        try:
            level = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
        except (OSError, ValueError):
            level = 2
        if level > 1:
            return (f"kernel.perf_event_paranoid is {level}: sampling another user's or "
                    "kernel threads needs it at 1 or below, or root")
    return ""


@dataclass(frozen=True)
class ClockRelation:
    """Harness wall clock minus ``CLOCK_MONOTONIC`` (ns), and how far it can be off."""

    wall_minus_mono_ns: int
    error_ns: int
    method: str = ("narrowest of 7 (monotonic, wall, monotonic) reads in the harness, at "
                   "the window's start and end; error: half its width plus the wall "
                   "clock's step between the two")


def _one_relation(reads: int = 7) -> tuple[int, int]:
    best: tuple[int, int] | None = None
    for _ in range(reads):
        a = time.monotonic_ns()
        w = time.time_ns()
        b = time.monotonic_ns()
        cand = (w - (a + b) // 2, (b - a + 1) // 2)
        if best is None or cand[1] < best[1]:
            best = cand
    assert best is not None
    return best


def relate(start: tuple[int, int], end: tuple[int, int]) -> ClockRelation:
    """The relation from a start and an end measurement (each (offset, half-width))."""
    step = abs(end[0] - start[0])
    return ClockRelation(start[0], max(start[1], end[1]) + step)


def _kill_live() -> None:
    for p in list(_LIVE.values()):
        with contextlib.suppress(OSError):
            p.kill()
        with contextlib.suppress(Exception):
            p.wait(timeout=5)
        _LIVE.pop(p.pid, None)


class PerfCapture:
    """``perf record`` attached to ``pids`` (all their threads), recording only between
    :meth:`start` and :meth:`stop`. A context manager; :meth:`stop` is idempotent and
    never raises: a failure is ``meta['problem']``."""

    def __init__(self, pids: tuple[int, ...], out: Path, *, case_id: str = "",
                 freq_hz: int = FREQ_HZ, timeout_s: float = CONTROL_TIMEOUT_S) -> None:
        if not pids:
            raise ValueError("PerfCapture: no process to sample")
        self.pids, self.out, self.case_id = tuple(pids), Path(out), case_id
        self.freq_hz, self.timeout_s = freq_hz, timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmp: Path | None = None
        self._ctl = self._ack = -1
        self._rel0: tuple[int, int] | None = None
        self.meta: dict[str, Any] = {
            "kind": KIND, "tool": "perf", "event": "cpu-clock", "freq_hz": freq_hz,
            "case_id": case_id, "pids": list(self.pids), "clock": "CLOCK_MONOTONIC (-k mono)",
            "files": [], "problem": "",
        }
        self._done = False

    # --- control FIFO ----------------------------------------------------------------

    def _command(self, word: str) -> None:
        """Write ``word`` to perf's control FIFO and wait for its "ack"."""
        os.write(self._ctl, word.encode() + b"\n")
        deadline = time.monotonic() + self.timeout_s
        got = b""
        while b"ack" not in got:
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc is not None and self.proc.poll() is not None):
                raise ProfileUnavailable(f"perf did not answer {word!r} within "
                                         f"{self.timeout_s:g} s" + self._stderr())
            r, _, _ = select.select([self._ack], [], [], min(left, 0.2))
            if r:
                got += os.read(self._ack, 64)

    def _stderr(self) -> str:
        p = self.out / "perf.stderr"
        with contextlib.suppress(OSError):
            text = p.read_text(errors="replace").strip()
            if text:
                return f" (perf said: {text[-300:]})"
        return ""

    def start(self) -> PerfCapture:
        """perf attached and enabled; raises ProfileUnavailable (in words) otherwise."""
        why = perf_unavailable()
        if why:
            raise ProfileUnavailable(why)
        self.out.mkdir(parents=True, exist_ok=True)
        self._tmp = Path(tempfile.mkdtemp(prefix="strata-perf-"))
        ctl, ack = self._tmp / "ctl", self._tmp / "ack"
        os.mkfifo(ctl)
        os.mkfifo(ack)
        # both ends opened here without blocking: O_RDWR on a FIFO never waits for a peer
        self._ctl = os.open(ctl, os.O_RDWR)
        self._ack = os.open(ack, os.O_RDWR | os.O_NONBLOCK)
        argv = ["perf", "record", "-e", "cpu-clock", "-F", str(self.freq_hz), "-k", "mono",
                "-p", ",".join(str(p) for p in self.pids), "--delay=-1",
                f"--control=fifo:{ctl},{ack}", "-q", "-o", str(self.out / "perf.data")]
        at_exit(_kill_live)
        with (self.out / "perf.stderr").open("wb") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err)
        _LIVE[self.proc.pid] = self.proc
        self.meta["argv"] = argv
        # the start is read before "enable" is written, the end after "disable" is
        # answered: a busy thread's sample may be stamped between the write and the
        # answer, and must still fall inside the stated bounds
        t0 = time.monotonic_ns()
        try:
            self._command("enable")
        except BaseException:
            self.abort()
            raise
        self.meta["start_mono_ns"] = t0
        self._rel0 = _one_relation()
        return self

    def stop(self) -> dict[str, Any]:
        """Disabled, perf ended, its samples written as text; the meta returned."""
        if self._done or self.proc is None:
            return self.meta
        self._done = True
        try:
            ended = self.proc.poll() is not None
            if not ended:
                self._command("disable")
            self.meta["end_mono_ns"] = time.monotonic_ns()
            assert self._rel0 is not None
            self.meta["clock_relation"] = asdict(relate(self._rel0, _one_relation()))
            if ended:  # every sampled process exited: perf ended with them, data intact
                self.meta["ended_early"] = ("perf ended before the window's end: the "
                                            "sampled processes exited; samples stop there")
            else:
                self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                raise ProfileUnavailable(f"perf did not exit within {self.timeout_s:g} s "
                                         "of SIGINT") from None
            self.meta["files"].append("perf.data")
            self._script()
        except (ProfileUnavailable, OSError) as exc:
            self.meta["problem"] = str(exc)
        finally:
            self.abort()
            self._write_meta()
        return self.meta

    def _script(self) -> None:
        """``perf script`` into samples.txt (after the window: it never competes)."""
        with (self.out / "samples.txt").open("wb") as dst, \
                (self.out / "perf-script.stderr").open("wb") as err:
            r = subprocess.run(["perf", "script", "-i", str(self.out / "perf.data"), "--ns",
                                "-F", SCRIPT_FIELDS], stdin=subprocess.DEVNULL, stdout=dst,
                               stderr=err, timeout=300, check=False)
        if r.returncode != 0:
            raise ProfileUnavailable(f"perf script exited {r.returncode}" + _tail(
                self.out / "perf-script.stderr"))
        self.meta["files"].append("samples.txt")

    def abort(self) -> None:
        """perf killed if still running, the FIFOs closed and removed."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        if self.proc is not None:
            _LIVE.pop(self.proc.pid, None)
        for fd in (self._ctl, self._ack):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._ctl = self._ack = -1
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _write_meta(self) -> None:
        PerfCapture.write_meta(self.out, self.meta)

    @staticmethod
    def write_meta(out: Path, meta: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            atomic_write_text(out / "meta.json", json.dumps(meta, indent=1, sort_keys=True)
                              + "\n")

    def __enter__(self) -> PerfCapture:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _tail(p: Path) -> str:
    with contextlib.suppress(OSError):
        text = p.read_text(errors="replace").strip()
        if text:
            return f" ({text[-300:]})"
    return ""


def unavailable_meta(out: Path, case_id: str, why: str) -> dict[str, Any]:
    """The meta.json of a capture that could not start: what was asked, and why not."""
    meta = {"kind": KIND, "tool": "perf", "case_id": case_id, "files": [], "problem": why}
    with contextlib.suppress(OSError):
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "meta.json", json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return meta


def process_tree(pid: int) -> tuple[int, ...]:
    """``pid`` and its descendants now (an engine's workers: vLLM's EngineCore, a
    llama.cpp RPC child), read from ``/proc/<pid>/task/*/children``."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.append(p)
        for kids in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                todo.extend(int(x) for x in kids.read_text().split())
    return tuple(out)


#: Engines that serve their own profiler over HTTP (run/engine_http_profile.py).
HTTP_PROFILER_ENGINES = ("vllm", "sglang")


@contextlib.contextmanager
def profile_window(run_dir: Path, case_id: str, server_pid: int | None, *,
                   engine: str = "", base_url: str = "",
                   headers: dict[str, str] | None = None,
                   torch_dir: Path | None = None) -> Iterator[dict[str, Any]]:
    """The engine's CPU samples over the ``with`` block, into ``traces/engine/<case>/``;
    yields the capture's meta (its ``problem`` says why, in words, when none was taken).
    On an engine with a profiler of its own (vLLM, SGLang) its ``/start_profile`` is
    asked too, and whether the server has one is said (``meta['engine_profiler']``);
    ``torch_dir``: where a server Strata launched writes its torch traces
    (engine_http_profile.server_trace_dir: vLLM's by its launch flag, SGLang's by the
    start's ``output_dir``), whose files of this window are moved into the case's folder
    (``torch/``). Never raises for the capture: a failed one costs the
    case nothing."""
    if engine in HTTP_PROFILER_ENGINES and base_url:
        out = engine_dir(run_dir, case_id)
        with _http_profiler(engine, base_url, case_id, headers or {}, torch_dir,
                            out / TORCH_FOLDER) as said, \
                _perf_window(run_dir, case_id, server_pid) as meta:
            yield meta
        meta["engine_profiler"] = said  # after its stop was answered (or not)
        out.mkdir(parents=True, exist_ok=True)
        PerfCapture.write_meta(out, meta)
        return
    with _perf_window(run_dir, case_id, server_pid) as meta:
        yield meta


#: The case folder's subfolder for the files the server's own profiler wrote.
TORCH_FOLDER = "torch"


@contextlib.contextmanager
def _http_profiler(engine: str, base_url: str, case_id: str, headers: dict[str, str],
                   torch_dir: Path | None, dest: Path) -> Iterator[dict[str, Any]]:
    """``/start_profile`` before, ``/stop_profile`` after; what happened, in words. The
    wall clock is read before each is sent and after it is answered (``start_wall_ns``,
    ``stop_wall_ns``): the profiler starts and stops between them, which relates its
    clock to Strata's (analysis/traces/torch_trace.py)."""
    prefix = hp.profile_prefix(case_id)
    said: dict[str, Any] = {"engine": engine, "what": hp.KIND, "prefix": prefix}
    before = hp.listing(torch_dir)
    t0 = time.time_ns()
    try:
        hp.start(base_url, prefix, engine=engine, output_dir=torch_dir, headers=headers)
        said["start_wall_ns"] = [t0, time.time_ns()]
    except ProfileUnavailable as exc:
        said["problem"] = str(exc)
        yield said
        return
    said["started"] = f"yes: into {torch_dir}" if torch_dir is not None else _ELSEWHERE.get(
        engine, _ELSEWHERE["vllm"])
    try:
        yield said
    finally:
        try:
            t1 = time.time_ns()
            hp.stop(base_url, engine=engine, headers=headers)
            said["stop_wall_ns"] = [t1, time.time_ns()]
            if torch_dir is not None:
                _collect(said, torch_dir, before, prefix, dest, engine)
        except (ProfileUnavailable, OSError) as exc:
            said["problem"] = str(exc)


#: Where a server Strata did not launch writes its files: its own setting, on its host.
_ELSEWHERE = {
    "vllm": "yes: its files are written where the server's profiler config says",
    "sglang": ("yes: its files are written where the server's SGLANG_TORCH_PROFILER_DIR "
               "says (/tmp without it), on the server's host"),
}


def _collect(said: dict[str, Any], torch_dir: Path, before: frozenset[str], prefix: str,
             dest: Path, engine: str) -> None:
    names = hp.collect(torch_dir, before, prefix, dest)
    said["files"] = [f"{TORCH_FOLDER}/{n}" for n in names]
    if not any(n.endswith(hp.TRACE_SUFFIXES) for n in names):
        name = hp.TRACE_NAME.get(engine, hp.TRACE_NAME["vllm"]).format(prefix=prefix)
        said["problem"] = (f"the server answered /stop_profile but wrote no trace named "
                           f"{name} into {torch_dir}")
    else:
        said["started"] = f"yes: its files moved into {TORCH_FOLDER}/"


@contextlib.contextmanager
def _perf_window(run_dir: Path, case_id: str, server_pid: int | None
                 ) -> Iterator[dict[str, Any]]:
    out = engine_dir(run_dir, case_id)
    why = "" if server_pid is not None else (
        "the server's PID is not known here (attached to a server by URL or on another "
        "node): perf needs the engine's threads on this host")
    c: PerfCapture | None = None
    if not why:
        assert server_pid is not None
        c = PerfCapture(process_tree(server_pid), out, case_id=case_id)
        try:
            c.start()
        except (ProfileUnavailable, OSError) as exc:
            why, c = str(exc), None
    if c is None:
        yield unavailable_meta(out, case_id, why)
        return
    try:
        yield c.meta
    finally:
        c.stop()

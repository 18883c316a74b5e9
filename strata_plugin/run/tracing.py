"""Kernel traces for exactly one measured window, through a tracefs instance of our own.

Why an instance: the global trace buffer and its event switches belong to whoever else
traces this machine (another tool, another user); an instance (``instances/strata-<pid>-
<n>``) has its own buffer, clock and event switches, so Strata never reads or changes
anyone else's settings. Its clock is set to ``mono`` so event times are
``CLOCK_MONOTONIC``, the clock the load generator stamps requests with: the readers clip
the trace to the measured window without any alignment.

Clean-up on every path: :meth:`TraceCapture.stop` disables the events and removes the
instance and is idempotent; it runs from ``__exit__`` (normal end, exception, Ctrl-C),
from a SIGTERM handler installed while a capture is live (when nobody else installed
one, SIGTERM becomes ``KeyboardInterrupt`` as in ``run/reaper.py``), and from ``atexit``.
A process killed with SIGKILL cannot clean up; the next capture removes instances whose
owner process is gone (:func:`sweep_stale`).

What it needs: tracefs mounted (it mounts it at ``/sys/kernel/tracing`` when root and
it is not), write access to ``instances/`` (root), and each event present in the
kernel. :func:`availability` says which of these is missing, in words.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from strata_plugin.errors import StrataError
from strata_plugin.formats.atomic import atomic_open

TRACEFS_PATHS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
PREFIX = "strata-"
_NAME = re.compile(r"^strata-(\d+)-\d+$")

#: The trace sets the readers know, by name: the events each one enables.
TRACE_SETS: dict[str, tuple[str, ...]] = {
    "sched": ("sched/sched_switch", "sched/sched_wakeup", "sched/sched_wakeup_new"),
    # mm_filemap_add_to_page_cache (one event per page read) is left out: paging a model
    # in at 58 MB/s wrote 14k events/s and overran a 64 MiB buffer in a 100-s window; the
    # block requests placed in the file's extents carry the same bytes (tests: >= 90%).
    "block": (
        "block/block_rq_issue",
        "block/block_rq_complete",
        "filemap/mm_filemap_fault",
    ),
}
#: Per-CPU buffer of the instance (KiB). Measured: a crowded 2-core decode window wrote
#: ~3,700 sched events/s and overran 16 MiB per CPU in 3 minutes; 64 MiB holds ~15 minutes
#: of that. The trace is read once, after the window, so reading never competes with the
#: traced server. Overruns are counted and reported, never hidden.
BUFFER_KB = 65536


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str = ""  # why not, in the user's terms
    root: Path | None = None


def _mounted(p: Path) -> bool:
    return (p / "instances").is_dir() and (p / "events").is_dir()


def tracefs_root(mount: bool = True) -> Path | None:
    """The mounted tracefs; mounts it at /sys/kernel/tracing when root and it is not."""
    for p in TRACEFS_PATHS:
        if _mounted(p):
            return p
    if mount and os.geteuid() == 0 and TRACEFS_PATHS[0].is_dir() and shutil.which("mount"):
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS_PATHS[0])],
                       capture_output=True, timeout=10, check=False)
        if _mounted(TRACEFS_PATHS[0]):
            return TRACEFS_PATHS[0]
    return None


def availability(events: tuple[str, ...]) -> Availability:
    """Whether this process can trace ``events`` here; the reason when it cannot."""
    root = tracefs_root()
    if root is None:
        why = ("tracefs is not mounted at /sys/kernel/tracing and this process is not root "
               "to mount it" if os.geteuid() != 0 else
               "tracefs cannot be mounted (kernel without CONFIG_TRACING, or no /sys/kernel)")
        return Availability(False, why)
    if not os.access(root / "instances", os.W_OK):
        return Availability(False, f"no write access to {root}/instances (needs root)", root)
    missing = [e for e in events if not (root / "events" / e / "enable").exists()]
    if missing:
        return Availability(False, f"kernel has no trace event {', '.join(missing)}", root)
    return Availability(True, "", root)


def strata_instances(root: Path | None = None) -> list[str]:
    """Names of the tracefs instances Strata created and that still exist."""
    root = root or tracefs_root(mount=False)
    if root is None:
        return []
    return sorted(p.name for p in (root / "instances").iterdir() if p.name.startswith(PREFIX))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ctl(path: Path, value: str) -> None:
    """Write one tracefs control file (a kernel switch, not a file of the run: written
    in place, as the kernel reads it; tests/test_atomic_writes.py allows only this)."""
    path.write_text(value)


def _remove_instance(d: Path) -> None:
    """Events off, tracing off, then the instance removed (the kernel frees its buffer)."""
    with contextlib.suppress(OSError):
        _ctl(d / "tracing_on", "0")
    with contextlib.suppress(OSError):
        _ctl(d / "events" / "enable", "0")
    for _ in range(3):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # EBUSY while a reader still holds a file open: retry briefly
            threading.Event().wait(0.05)
    d.rmdir()


def sweep_stale(root: Path) -> list[str]:
    """Remove instances left by a Strata process that no longer exists (SIGKILL)."""
    removed = []
    for name in strata_instances(root):
        m = _NAME.match(name)
        if m and not _pid_alive(int(m.group(1))):
            with contextlib.suppress(OSError):
                _remove_instance(root / "instances" / name)
                removed.append(name)
    return removed


_LIVE: dict[str, TraceCapture] = {}
_COUNTER = itertools.count(1)
_PREV_SIGTERM: list[object] = []


def _stop_live() -> None:
    for cap in list(_LIVE.values()):
        cap.abort()


atexit.register(_stop_live)


def _sigterm(signum: int, frame: object) -> None:
    _stop_live()
    _restore_sigterm()
    raise KeyboardInterrupt(f"signal {signum}")


def _guard_sigterm() -> None:
    """While a capture is live, SIGTERM removes it before anything else (main thread only,
    and only when SIGTERM has no handler: the run's own reaper handler raises
    KeyboardInterrupt, which reaches ``__exit__`` anyway)."""
    if threading.current_thread() is not threading.main_thread() or _PREV_SIGTERM:
        return
    prev = signal.getsignal(signal.SIGTERM)
    if prev in (signal.SIG_DFL, None):
        _PREV_SIGTERM.append(prev)
        signal.signal(signal.SIGTERM, _sigterm)


def _restore_sigterm() -> None:
    if _PREV_SIGTERM and threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGTERM) is _sigterm:
            signal.signal(signal.SIGTERM, _PREV_SIGTERM[0])  # type: ignore[arg-type]
        _PREV_SIGTERM.clear()


@dataclass
class CaptureResult:
    """What one capture left: the trace text file and the facts about its buffer."""

    path: Path
    start_mono_ns: int
    end_mono_ns: int
    events: tuple[str, ...]
    overruns: int  # events the kernel dropped because the buffer was full
    entries: int
    errors: list[str] = field(default_factory=list)


class TraceCapture:
    """One tracefs instance with ``events`` enabled between ``start()`` and ``stop()``.

    ``out`` is the file the trace text goes to when it stops (the instance's ``trace``
    file, read once). Use as a context manager; ``stop()`` is idempotent.
    """

    def __init__(self, events: tuple[str, ...], out: Path, *, buffer_kb: int = BUFFER_KB,
                 filters: dict[str, str] | None = None) -> None:
        self.events, self.out = tuple(events), Path(out)
        self.buffer_kb, self.filters = buffer_kb, dict(filters or {})
        self.name = f"{PREFIX}{os.getpid()}-{next(_COUNTER)}"
        self.dir: Path | None = None
        self.result: CaptureResult | None = None
        self._t0 = 0

    def start(self) -> TraceCapture:
        av = availability(self.events)
        if not av.ok:
            raise TraceUnavailable(av.reason)
        assert av.root is not None
        sweep_stale(av.root)
        self.dir = av.root / "instances" / self.name
        self.dir.mkdir()
        _LIVE[self.name] = self
        _guard_sigterm()
        try:
            _ctl(self.dir / "tracing_on", "0")
            _ctl(self.dir / "trace_clock", "mono")
            with contextlib.suppress(OSError):  # the TGID column: thread -> process
                _ctl(self.dir / "options" / "record-tgid", "1")
            _ctl(self.dir / "buffer_size_kb", str(self.buffer_kb))
            for ev in self.events:
                if ev in self.filters:
                    _ctl(self.dir / "events" / ev / "filter", self.filters[ev])
                _ctl(self.dir / "events" / ev / "enable", "1")
            self._t0 = _mono_ns()
            _ctl(self.dir / "tracing_on", "1")
        except BaseException:
            self.abort()
            raise
        return self

    def stop(self) -> CaptureResult | None:
        """Tracing off, the text saved to ``out``, events off, the instance removed."""
        if self.dir is None or self.name not in _LIVE:
            return self.result
        d, errors = self.dir, []
        try:
            # The end is read once the buffer has stopped recording, never before: an
            # event stamped between a clock read and the switch's write (a preempted
            # writer on a busy host: 190 ms once) would fall after the capture's end.
            _ctl(d / "tracing_on", "0")
            t1 = _mono_ns()
            overruns, entries = _buffer_stats(d)
            self.out.parent.mkdir(parents=True, exist_ok=True)
            with (d / "trace").open("rb") as src, atomic_open(self.out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            self.result = CaptureResult(self.out, self._t0, t1, self.events, overruns, entries,
                                        errors)
        finally:
            self.abort()
        return self.result

    def abort(self) -> None:
        """Remove the instance without saving anything (signal, exit, failed start)."""
        if self.dir is not None and _LIVE.pop(self.name, None) is not None:
            try:
                _remove_instance(self.dir)
            finally:
                if not _LIVE:
                    _restore_sigterm()

    def __enter__(self) -> TraceCapture:
        return self.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.stop()
        else:
            self.abort()


class TraceUnavailable(StrataError, RuntimeError):
    """This machine cannot capture the trace; the message says what is missing."""


def _mono_ns() -> int:
    import time

    return time.monotonic_ns()


def _buffer_stats(d: Path) -> tuple[int, int]:
    """(overrun, entries) summed over the instance's per-CPU buffers."""
    over = ent = 0
    for stats in sorted((d / "per_cpu").glob("cpu*/stats")):
        with contextlib.suppress(OSError, ValueError):
            for line in stats.read_text().splitlines():
                key, _, val = line.partition(":")
                if key.strip() == "overrun":
                    over += int(val)
                elif key.strip() == "entries":
                    ent += int(val)
    return over, ent

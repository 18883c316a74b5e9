"""Hardware counters of the server process through ``perf stat -I <ms> -x, -p <pids>``.

perf prints one CSV row per event per interval on stderr:
``time,value,unit,event,run_time,pct_running,...``; the value is
``<not supported>`` or ``<not counted>`` when the PMU refuses (common in VMs
and containers, or with kernel.perf_event_paranoid > 2 for non-root). Interval
values are summed into cumulative counters named after the event (device
``""``). perf starts once the server's PIDs are known and restarts when the
set of root PIDs changes. An event reported ``<not supported>`` is UNAVAILABLE
with that reason; when every event is, the whole collector is and perf is stopped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..targets import ProcessTargets
from .base import Collector, Emit, Unavailable, spawn_line_tool, stop_line_tool

if TYPE_CHECKING:
    import argparse

DEFAULT_EVENTS = ("cycles", "instructions", "cache-misses")


def perf_argv(
    perf: str, events: tuple[str, ...], pids: tuple[int, ...], interval_ms: int
) -> list[str]:
    return [
        perf,
        "stat",
        "-e",
        ",".join(events),
        "-p",
        ",".join(map(str, pids)),
        "-I",
        str(interval_ms),
        "-x",
        ",",
    ]


def parse_perf_line(line: str) -> tuple[str, float | None, str] | None:
    """(event, value or None, reason) of one interval row; None when not a data row."""
    parts = line.strip().split(",")
    if len(parts) < 4 or not parts[0].replace(".", "", 1).isdigit():
        return None
    value_text, event = parts[1], parts[3]
    if not event:
        return None
    if value_text.startswith("<"):
        return event, None, value_text
    try:
        return event, float(value_text), ""
    except ValueError:
        return None


class PerfCollector(Collector):
    source = "perf"
    follows_targets = True

    def __init__(
        self,
        targets: ProcessTargets,
        events: tuple[str, ...] = DEFAULT_EVENTS,
        interval_s: float = 0.5,
        perf: str = "perf",
        which: Callable[[str], str | None] = shutil.which,
    ) -> None:
        super().__init__()
        self.targets = targets
        self.events = tuple(events)
        self.interval_ms = max(10, round(interval_s * 1000))
        self.perf = perf
        self.which = which
        self.path: str | None = None
        self.totals: dict[str, float] = {}
        self._unsupported: dict[str, str] = {}
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._roots: tuple[int, ...] = ()
        self._queue: deque[Emit] = deque()
        self._lines: deque[str] = deque(maxlen=10)
        self._lock = threading.Lock()

    def probe(self) -> None:
        self.path = self.which(self.perf)
        if self.path is None:
            raise Unavailable(f"{self.perf} not found on PATH (install linux-tools)")
        if not self.targets.configured:
            raise Unavailable("no server process given (--pid, --pid-pattern or --container)")
        try:
            with open("/proc/sys/kernel/perf_event_paranoid") as fh:
                self.info(kind="perf", source=self.source, perf_event_paranoid=fh.read().strip())
        except OSError:
            pass

    def set_pids(self, pids: list[int]) -> None:
        self.targets.set_pids(pids)

    def _start(self, roots: tuple[int, ...]) -> None:
        self._stop_proc()
        self._roots = roots
        if not roots or self.path is None:
            return
        argv = perf_argv(self.path, self.events, roots, self.interval_ms)
        self.record_command("perf_stat", argv)
        try:
            self._proc = spawn_line_tool(argv, lines_on="stderr")
        except OSError as e:
            self.failed = f"cannot start perf: {e}"
            self.mark_unavailable("", self.failed)
            return
        self._reader = threading.Thread(
            target=self._read, args=(self._proc,), name="perf-stat", daemon=True
        )
        self._reader.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            wall = time.time_ns()
            row = parse_perf_line(line)
            if row is None:
                if line.strip():
                    self._lines.append(line.strip())
                continue
            event, value, reason = row
            with self._lock:
                if value is None:
                    self._unsupported[event] = reason
                    continue
                self.totals[event] = self.totals.get(event, 0.0) + value
                self._queue.append((wall, "", event, self.totals[event], "counter"))

    def sample(self, wall_ns: int) -> list[Emit]:
        if self.failed:
            return []
        self.targets.refresh()
        if self.targets.roots != self._roots:
            self._start(self.targets.roots)
        with self._lock:
            out = list(self._queue)
            self._queue.clear()
            unsupported = dict(self._unsupported)
        for event, reason in unsupported.items():
            self.mark_unavailable(event, f"perf stat: {event} {reason}")
        if unsupported and set(unsupported) >= set(self.events):
            self.failed = "perf stat: every event " + ", ".join(
                f"{e} {r}" for e, r in sorted(unsupported.items())
            )
            self.mark_unavailable("", self.failed)
            self._stop_proc()
            return out
        proc = self._proc
        if proc is not None and proc.poll() is not None:
            # perf ends by itself when its targets exit: then wait for new roots
            # (a restart happens when targets.roots changes); otherwise it failed.
            self._proc = None
            if self._reader is not None:
                self._reader.join(1.0)  # its last words may still be in the pipe
            if any(os.path.exists(f"/proc/{r}") for r in self._roots):
                tail = " | ".join(self._lines)[-300:]
                self.failed = f"perf stat exited {proc.returncode}: {tail}"
                self.mark_unavailable("", self.failed)
        return out

    def _stop_proc(self) -> None:
        proc, self._proc = self._proc, None
        stop_line_tool(proc)

    def close(self) -> None:
        self._stop_proc()


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory (``registry.py``): the agent's options -> this collector."""
    events = tuple(e for e in args.perf_events.split(",") if e)
    return PerfCollector(targets, events=events, interval_s=args.interval)

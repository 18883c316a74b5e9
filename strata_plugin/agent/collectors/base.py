"""What every collector offers the agent loop.

A collector probes once at start (raising :class:`Unavailable` with a reason
when it cannot run), then returns plain tuples from ``sample()`` each tick.
Tuples rather than dataclasses because a tick can emit hundreds of values and
the agent's own CPU cost is budgeted (benchmarks/test_agent_cost.py).
Per-metric problems (an NVML field NOT_SUPPORTED, an unreadable counter) are
queued with :meth:`Collector.mark_unavailable` and reported once each.
Each collector module also has ``from_args(args, targets)``, the factory its line in
``registry.py`` names.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any, Tuple, Union

#: (wall_ns, device, metric, value, kind) — kind is "gauge" or "counter".
Emit = Tuple[int, str, str, Union[float, int], str]


class Unavailable(Exception):
    """The collector (or one of its metrics) cannot run here; the message is the reason."""


def spawn_line_tool(argv: Sequence[str], *, lines_on: str = "stdout") -> subprocess.Popen[str]:
    """Start a tool that reports in text lines (dcgmi dmon on stdout, perf stat on stderr).

    Line-buffered text on one pipe, the other stream discarded or merged, no stdin: the
    reader thread sees each line as the tool writes it. Raises OSError if it cannot start.
    """
    if lines_on == "stdout":
        out, err = subprocess.PIPE, subprocess.STDOUT
    elif lines_on == "stderr":
        out, err = subprocess.DEVNULL, subprocess.PIPE
    else:
        raise ValueError(f"lines_on must be 'stdout' or 'stderr', not {lines_on!r}")
    return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                            text=True, bufsize=1)


def stop_line_tool(proc: subprocess.Popen[str] | None, grace_s: float = 2.0) -> None:
    """Stop a tool started by :func:`spawn_line_tool`: SIGTERM, SIGKILL after ``grace_s``."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace_s)


class Collector:
    """Base class: override ``probe`` and ``sample``; the rest is bookkeeping."""

    source = "base"
    #: follows the server's processes: ``pids`` lines from the harness reach it (and
    #: start it, when it was waiting for a target)
    follows_targets = False

    def __init__(self) -> None:
        self._unavailable: dict[str, str] = {}
        self._reported: set[str] = set()
        self._info: list[dict[str, Any]] = []
        self._commands: list[tuple[str, list[str]]] = []
        self._events: list[dict[str, Any]] = []
        self.failed: str | None = None  # set when the collector gave up mid-run

    # -- to override ---------------------------------------------------------
    def probe(self) -> None:
        """Check that the collector can run; raise Unavailable(reason) if not."""

    def sample(self, wall_ns: int) -> list[Emit]:
        """Read the current values; ``wall_ns`` is the node's wall clock at the read."""
        return []

    def close(self) -> None:
        """Release files and stop any tool the collector started."""

    def set_pids(self, pids: list[int]) -> None:
        """New server PIDs from the control channel (collectors that track processes)."""

    # -- bookkeeping ---------------------------------------------------------
    def mark_unavailable(self, key: str, reason: str) -> None:
        """Record that ``key`` (``metric``, ``device/metric``; ``""``: all of it) cannot be read."""
        if key not in self._reported:
            self._unavailable[key] = reason

    def info(self, **payload: Any) -> None:
        self._info.append(payload)

    def event(self, **payload: Any) -> None:
        self._events.append(payload)

    def record_command(self, name: str, argv: list[str]) -> None:
        self._commands.append((name, list(argv)))

    def drain(self) -> tuple[dict[str, str], list[dict[str, Any]], list, list[dict[str, Any]]]:
        """(new unavailable reasons, info payloads, commands, events) since the last drain."""
        unavailable, self._unavailable = self._unavailable, {}
        self._reported.update(unavailable)
        info, self._info = self._info, []
        commands, self._commands = self._commands, []
        events, self._events = self._events, []
        return unavailable, info, commands, events


class Missing(Collector):
    """Stands in for a collector that lacks its configuration, so it is reported, not skipped."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__()
        self.source = source
        self.reason = reason

    def probe(self) -> None:
        raise Unavailable(self.reason)

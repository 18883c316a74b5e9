"""Lines of a tracefs ``trace`` file -> events (the one parser the readers share).

The text format is the kernel's (``TASK-PID (TGID) [CPU] FLAGS TIMESTAMP: EVENT: BODY``,
the TGID column present when ``options/record-tgid`` was on). Timestamps are seconds on
the instance's ``trace_clock`` (``mono`` in Strata's captures); they are returned as
integer nanoseconds so they compare exactly with the harness's ``monotonic_ns``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

_LINE = re.compile(
    r"^\s*(?P<comm>.*?)-(?P<tid>\d+)\s+(?:\(\s*(?P<tgid>[\d-]+)\)\s+)?\[(?P<cpu>\d+)\]\s+"
    r"(?:\S+\s+)?(?P<sec>\d+)\.(?P<frac>\d+):\s+(?P<event>[\w]+):\s?(?P<body>.*)$"
)
_KV = re.compile(r"(\w+)=(\S*)")


@dataclass(frozen=True)
class TraceEvent:
    t_ns: int
    cpu: int
    comm: str  # the task that was current when the event fired
    tid: int
    tgid: int | None  # None when the trace has no TGID column or the kernel did not know
    event: str
    body: str

    def fields(self) -> dict[str, str]:
        """``key=value`` pairs of the body (sched events, filemap events)."""
        return dict(_KV.findall(self.body))


def parse_line(line: str) -> TraceEvent | None:
    if not line or line.startswith("#"):
        return None
    m = _LINE.match(line)
    if m is None:
        return None
    frac = m.group("frac")
    ns = int(m.group("sec")) * 1_000_000_000 + int(frac.ljust(9, "0")[:9])
    tg = m.group("tgid")
    return TraceEvent(ns, int(m.group("cpu")), m.group("comm"), int(m.group("tid")),
                      int(tg) if tg and tg.strip("-") else None, m.group("event"),
                      m.group("body"))


def parse(lines: Iterable[str], events: tuple[str, ...] = ()) -> Iterator[TraceEvent]:
    """Events in file order (per-CPU buffers are merged by the kernel in time order);
    only those named in ``events`` when given (a substring test skips the other lines
    before any regex: one file holds several readers' events)."""
    want = re.compile(" (?:" + "|".join(map(re.escape, events)) + "): ").search \
        if events else None
    for line in lines:
        if want is not None and want(line) is None:
            continue
        ev = parse_line(line.rstrip("\n"))
        if ev is not None:
            yield ev


def header_counts(lines: Iterable[str]) -> tuple[int, int] | None:
    """(entries in buffer, entries written) from the header: fewer in the buffer means
    the kernel overwrote events (the buffer was too small for the window)."""
    for line in lines:
        if not line.startswith("#"):
            return None
        m = re.search(r"entries-in-buffer/entries-written:\s*(\d+)/(\d+)", line)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None

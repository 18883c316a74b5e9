"""The engine's lifetime on the run's timeline: an engine that ended, one that took over.

Kept as ``event`` rows of ``markers.csv``, so the offline report rebuilds them from the
run folder with the other markers, and the run's timeline shows them. The row's
``name`` holds the event:

* ``engine_exit pid=1234 port=8080 how=signal SIGKILL``: the followed engine ended;
  ``how`` is ``exit code N`` or ``signal NAME`` where Strata started it (its parent
  knows), ``gone`` where not (its PID vanished) or ``gone (its PID now names another
  process)`` (its PID was given to a newer process);
* ``engine_new pid=1301 port=8080 how=listens``: a new process listens on the URL's port
  after the engine ended, and is followed as the engine from then on.

``port`` is 0 where the engine's port is not known. The row spans what the harness's
watch (``run/engine_lifetime.py``) knows of the change's time: from its last look that
did not see it (``since_ns``, the row's start) to the look that did (``wall_ns``, its
end); a watch delayed on a loaded host widens the span, it never misplaces the change.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from strata_plugin.formats.typed import FormatError
from strata_plugin.formats.windows import Marker

ENGINE_EXIT = "engine_exit"
ENGINE_NEW = "engine_new"
KINDS = (ENGINE_EXIT, ENGINE_NEW)

_NAME = re.compile(r"(engine_exit|engine_new) pid=([0-9]+) port=([0-9]+) how=(.+)")


@dataclass(frozen=True)
class EngineEvent:
    kind: str  # one of KINDS
    pid: int
    port: int
    how: str
    wall_ns: int  # when the watch saw it
    since_ns: int | None = None  # its last look before (None: the same as ``wall_ns``)

    @property
    def after_ns(self) -> int:
        """The earliest the change can have happened."""
        return self.wall_ns if self.since_ns is None else min(self.since_ns, self.wall_ns)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown engine event {self.kind!r}")
        if not self.how or "\n" in self.how:
            raise ValueError(f"engine event 'how' must be one non-empty line: {self.how!r}")

    @property
    def marker_name(self) -> str:
        return f"{self.kind} pid={self.pid} port={self.port} how={self.how}"


def from_marker(m: Marker) -> EngineEvent | None:
    """The engine event a marker holds; None for any other marker. An ``event`` row
    named like one but not holding one raises FormatError naming it."""
    if m.kind != "event" or not m.name.startswith(KINDS):
        return None
    got = _NAME.fullmatch(m.name)
    if got is None:
        raise FormatError(f"markers.csv: event {m.name!r} is not an engine event "
                          "(expected 'engine_exit|engine_new pid=N port=N how=...')")
    kind, pid, port, how = got.groups()
    return EngineEvent(kind, int(pid), int(port), how, m.end_wall_ns, m.start_wall_ns)


def engine_events(markers: Iterable[Marker]) -> list[EngineEvent]:
    """Every engine event among ``markers``, in time order."""
    found = (from_marker(m) for m in markers)
    return sorted((e for e in found if e is not None), key=lambda e: (e.wall_ns, e.kind))

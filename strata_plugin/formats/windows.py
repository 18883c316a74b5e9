"""Windows on the run's timeline: run, baseline, cooldown, case, phase, request.

Markers are written to ``markers.csv`` in wall-clock ns so that the offline
report can slice telemetry samples without any live state.
"""

from __future__ import annotations

import csv
from dataclasses import astuple, dataclass, fields
from pathlib import Path

MARKER_KINDS = ("run", "baseline", "cooldown", "case", "warmup", "measured", "request", "event")


@dataclass(frozen=True)
class Marker:
    kind: str  # one of MARKER_KINDS
    name: str  # e.g. the case id, "baseline", or a request id
    case_id: str  # "" for run-level windows
    start_wall_ns: int
    end_wall_ns: int

    def __post_init__(self) -> None:
        if self.kind not in MARKER_KINDS:
            raise ValueError(f"unknown marker kind {self.kind!r}")
        if self.end_wall_ns < self.start_wall_ns:
            raise ValueError(f"marker {self.name!r} ends before it starts")


MARKER_COLUMNS = tuple(f.name for f in fields(Marker))


def write_markers(path: Path, markers: list[Marker]) -> None:
    """Write all markers to a temporary file, then rename it over ``path``: a reader (or a
    full disk) never sees half a file, and a failed write leaves no temporary behind."""
    tmp = path.with_suffix(".csv.tmp")
    try:
        with tmp.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(MARKER_COLUMNS)
            for m in sorted(markers, key=lambda m: (m.start_wall_ns, m.kind, m.name)):
                w.writerow(astuple(m))
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_markers(path: Path) -> list[Marker]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [
        Marker(r["kind"], r["name"], r["case_id"], int(r["start_wall_ns"]), int(r["end_wall_ns"]))
        for r in rows
    ]

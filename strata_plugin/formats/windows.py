"""Windows on the run's timeline: run, baseline, cooldown, case, phase, request.

Markers are written to ``markers.csv`` in wall-clock ns so that the offline
report can slice telemetry samples without any live state.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from strata_plugin.formats.typed import FormatError, expected

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
    """Every marker of ``markers.csv``. A file that does not hold them (a missing column, a
    short row, a time that is not an integer, an unknown kind, a row that ends before it
    starts, bytes that are not UTF-8) raises FormatError naming ``path:line`` and the
    column, never a bare traceback: the offline report may read a damaged copy."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise FormatError(f"{path}:{line}: not UTF-8 (byte 0x{raw[exc.start]:02x})") from None
    rows = csv.reader(io.StringIO(text, newline=""))
    header = next(rows, None)
    if header is None:
        return []
    missing = [c for c in MARKER_COLUMNS if c not in header]
    if missing:
        raise FormatError(f"{path}:1: missing column(s) {', '.join(missing)} (expected "
                          f"{','.join(MARKER_COLUMNS)})")
    at = [header.index(c) for c in MARKER_COLUMNS]
    out = []
    for row in rows:
        n = rows.line_num
        if not row:
            continue
        if len(row) < len(header):
            raise FormatError(f"{path}:{n}: short row: {len(row)} of {len(header)} columns")
        kind, name, case_id, start, end = (row[i] for i in at)
        where = f"{path}:{n}"
        try:
            out.append(Marker(kind, name, case_id, _ns(start, where, "start_wall_ns"),
                              _ns(end, where, "end_wall_ns")))
        except ValueError as exc:
            if isinstance(exc, FormatError):
                raise
            raise FormatError(f"{where}: {exc}") from None
    return out


def _ns(v: str, where: str, key: str) -> int:
    if not _INT.fullmatch(v):
        raise expected(where, key, "an integer (wall-clock ns)", v)
    return int(v)


_INT = re.compile(r"-?[0-9]+")

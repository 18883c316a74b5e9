"""Block I/O and page-fault trace -> per file: faults, bytes read, request latency.

Why: a process's major-fault and read-byte counters say that it read from disk, not
what. "The weights were paged in from disk" is a claim about one file: this reader names
the file and the offset ranges, how many faults the server took on it, how many bytes the
kernel read into the page cache for it, and the latency distribution of the block
requests that carried them.

Events (``run/tracing.py`` trace set ``block``): ``filemap/mm_filemap_fault`` (a fault on
a file-backed page: device, inode, offset), ``block/block_rq_issue`` and
``block_rq_complete`` (a request's sector and size; the pair gives its latency), and, when
a trace has it, ``filemap/mm_filemap_add_to_page_cache`` (one event per page read: too
many to capture while a model pages in, so Strata's own captures leave it out). A
file is known by ``(device, inode)`` from the capture's ``meta.json``; a block request is
placed in a file through the file's extents (``FS_IOC_FIEMAP``); one outside every known
file's extents is "other".
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from strata_plugin.analysis.stats import percentiles
from strata_plugin.analysis.traces.ftrace_text import parse

NEEDS = ("root (tracefs instance)", "tracefs",
         "events block/block_rq_issue, block/block_rq_complete, filemap/mm_filemap_fault, "
         "filemap/mm_filemap_add_to_page_cache", "FIEMAP on the server's files (ext4, xfs)")

EVENTS = ("block_rq_issue", "block_rq_complete", "mm_filemap_fault",
          "mm_filemap_add_to_page_cache")
_RQ = re.compile(r"^(?P<maj>\d+),(?P<min>\d+) (?P<rwbs>\S+) (?:(?P<bytes>\d+) )?\(.*?\) "
                 r"(?P<sector>\d+) \+ (?P<nr>\d+)")
_FAULT = re.compile(r"dev=(?P<dev>\d+:\d+) ino=(?P<ino>[0-9a-f]+) ofs=(?P<ofs>\d+)")
_ADD = re.compile(r"dev (?P<dev>\d+:\d+) ino (?P<ino>[0-9a-f]+) .*?ofs=(?P<ofs>\d+)"
                  r"(?: order=(?P<order>\d+))?")
PAGE = 4096
OTHER = "(other: not a file the server maps)"


@dataclass(frozen=True)
class Latency:
    n: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, values_ms: list[float]) -> Latency | None:
        if not values_ms:
            return None
        p50, p90, p99 = percentiles(values_ms, (50, 90, 99))
        return cls(len(values_ms), p50, p90, p99, max(values_ms))


@dataclass(frozen=True)
class FileIO:
    """One file's share of the window's reads."""

    path: str
    server_faults: int  # faults the server's threads took on this file
    read_in_bytes: int  # bytes the kernel read into the page cache for it
    requests: int  # block requests placed in its extents (reads)
    request_bytes: int
    latency: Latency | None  # of those block requests
    ranges: tuple[tuple[int, int], ...]  # file offset ranges read in (merged, largest first)


@dataclass(frozen=True)
class BlockReport:
    window_s: float
    files: tuple[FileIO, ...]  # most read first; OTHER last when present
    reads: int  # all block read requests in the window
    read_bytes: int
    latency: Latency | None  # of all completed read requests
    unmatched: int  # issues without a completion in the trace
    notes: tuple[str, ...] = ()

    def file(self, suffix: str) -> FileIO | None:
        return next((f for f in self.files if f.path.endswith(suffix)), None)

    @property
    def top(self) -> FileIO | None:
        named = [f for f in self.files if f.path != OTHER]
        return named[0] if named else None

    def table(self, n: int = 6) -> list[dict[str, Any]]:
        """Top files by bytes read, with their block-request latency (report rows)."""
        rows = []
        for f in self.files[:n]:
            lat = f.latency
            rows.append({"file": f.path, "server_faults": f.server_faults,
                         "read_mb": round(max(f.read_in_bytes, f.request_bytes) / 1e6, 3),
                         "requests": f.requests,
                         "p50_ms": round(lat.p50_ms, 3) if lat else None,
                         "p90_ms": round(lat.p90_ms, 3) if lat else None,
                         "p99_ms": round(lat.p99_ms, 3) if lat else None,
                         "max_ms": round(lat.max_ms, 3) if lat else None,
                         "ranges": ", ".join(f"{a // 1024}-{b // 1024} KiB"
                                             for a, b in f.ranges[:3])})
        return rows

    def as_dict(self) -> dict[str, Any]:
        return {"window_s": round(self.window_s, 6), "reads": self.reads,
                "read_bytes": self.read_bytes, "unmatched": self.unmatched,
                "latency": self.latency.__dict__ if self.latency else None,
                "files": self.table(64), "notes": list(self.notes)}


class _Extents:
    """Sorted physical extents of the known files: disk byte -> (path, file offset)."""

    def __init__(self, meta: dict[str, Any]) -> None:
        rows = []
        for f in meta.get("files", []):
            for logical, physical, length in f.get("extents") or ():
                start = int(f.get("disk_offset", 0)) + int(physical)
                rows.append((f.get("disk", ""), start, start + int(length), int(logical),
                             f["path"]))
        rows.sort()
        self.rows = rows
        self.keys = [(r[0], r[1]) for r in rows]

    def find(self, disk: str, byte: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(self.keys, (disk, byte)) - 1
        if i >= 0:
            d, a, b, logical, path = self.rows[i]
            if d == disk and a <= byte < b:
                return path, logical + (byte - a)
        return None


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, size) spans -> merged (start, end) ranges, largest first."""
    out: list[list[int]] = []
    for o, size in sorted(spans):
        if out and o <= out[-1][1]:
            out[-1][1] = max(out[-1][1], o + size)
        else:
            out.append([o, o + size])
    return sorted(((a, b) for a, b in out), key=lambda r: (r[0] - r[1], r[0]))


def read(lines: Iterable[str], meta: dict[str, Any], window_ns: tuple[int, int]) -> BlockReport:
    """Reads and faults of ``window_ns`` (monotonic ns), per file the server maps."""
    w0, w1 = window_ns
    server_pids = {int(p) for p in meta.get("server_pids") or [meta["server_pid"]]}
    server_tids = {int(t) for t in meta.get("server_threads", {})}
    by_inode = {(f.get("dev"), int(f["ino"])): f["path"] for f in meta.get("files", [])
                if "ino" in f}
    ext = _Extents(meta)
    missing_ext = [f["path"] for f in meta.get("files", [])
                   if f.get("extents_error") and f["path"].endswith(".gguf")]
    faults: dict[str, int] = defaultdict(int)
    read_in: dict[str, list[tuple[int, int]]] = defaultdict(list)  # path -> (offset, size)
    read_in_bytes: dict[str, int] = defaultdict(int)
    pending: dict[tuple[str, int], int] = {}
    req_lat: dict[str, list[float]] = defaultdict(list)
    req_bytes: dict[str, int] = defaultdict(int)
    all_lat: list[float] = []
    reads = read_bytes = 0

    for ev in parse(lines, EVENTS):
        if ev.event == "block_rq_issue":
            m = _RQ.match(ev.body)
            if m and "R" in m["rwbs"]:
                pending[(f"{m['maj']},{m['min']}", int(m["sector"]))] = ev.t_ns
        elif ev.event == "block_rq_complete":
            m = _RQ.match(ev.body)
            if not m or "R" not in m["rwbs"]:
                continue
            disk, sector = f"{m['maj']},{m['min']}", int(m["sector"])
            t0 = pending.pop((disk, sector), None)
            if t0 is None or not (w0 <= ev.t_ns and t0 <= w1):
                continue
            nbytes = int(m["nr"]) * 512
            ms = (ev.t_ns - t0) / 1e6
            hit = ext.find(disk, sector * 512)
            path = hit[0] if hit else OTHER
            if hit:
                read_in[path].append((hit[1], nbytes))
            req_lat[path].append(ms)
            req_bytes[path] += nbytes
            all_lat.append(ms)
            reads += 1
            read_bytes += nbytes
        elif ev.event in ("mm_filemap_fault", "mm_filemap_add_to_page_cache"):
            if not (w0 <= ev.t_ns <= w1):
                continue
            m = (_FAULT if ev.event == "mm_filemap_fault" else _ADD).search(ev.body)
            if m is None:
                continue
            path = by_inode.get((m["dev"], int(m["ino"], 16))) or OTHER
            if ev.event == "mm_filemap_fault":
                if ev.tgid in server_pids or ev.tid in server_tids:
                    faults[path] += 1
            else:
                size = PAGE << int(m["order"] or 0)
                read_in[path].append((int(m["ofs"]), size))
                read_in_bytes[path] += size

    unmatched = sum(1 for t in pending.values() if w0 <= t <= w1)
    paths = set(faults) | set(read_in_bytes) | set(req_lat)
    files = [FileIO(p, faults.get(p, 0), read_in_bytes.get(p, 0), len(req_lat.get(p, [])),
                    req_bytes.get(p, 0), Latency.of(req_lat.get(p, [])),
                    tuple(_merge(read_in.get(p, [])))) for p in paths]
    files.sort(key=lambda f: (f.path == OTHER, -(f.read_in_bytes + f.request_bytes),
                              -f.server_faults, f.path))
    notes = []
    if meta.get("overruns"):
        notes.append(f"{meta['overruns']} events were lost to a full trace buffer")
    if missing_ext:
        notes.append("block requests not placed in " + ", ".join(missing_ext) + ": "
                     + "; ".join(f.get("extents_error", "") for f in meta.get("files", [])
                                 if f["path"] in missing_ext))
    if unmatched:
        notes.append(f"{unmatched} read requests issued in the window had no completion "
                     "in the trace")
    return BlockReport((w1 - w0) / 1e9, tuple(files), reads, read_bytes, Latency.of(all_lat),
                       unmatched, tuple(notes))

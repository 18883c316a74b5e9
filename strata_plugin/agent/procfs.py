"""Cheap readers of /proc for process trees and per-request counters.

Standard library only. The harness calls :func:`read_process_counters` right
before and after every request, so it reads just two small files per process;
the sampling collectors keep file descriptors open instead (:class:`PreadFile`)
and re-read them with ``os.pread(fd, n, 0)``, which makes the kernel regenerate
the text without an open/close per tick.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
PROC = "/proc"


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat (or task/TID/stat) that Strata uses."""

    pid: int
    comm: str
    state: str
    ppid: int
    minflt: int
    majflt: int
    utime_s: float
    stime_s: float
    num_threads: int
    rss_bytes: int
    processor: int


def parse_stat(data: bytes) -> ProcStat:
    """Parse /proc/PID/stat; ``comm`` may hold spaces and ')', so split after the last ')'."""
    lpar = data.index(b"(")
    rpar = data.rindex(b")")
    f = data[rpar + 2 :].split()
    # f[0] is field 3 (state) of proc(5); field n is f[n - 3].
    return ProcStat(
        pid=int(data[:lpar]),
        comm=data[lpar + 1 : rpar].decode(errors="replace"),
        state=f[0].decode(),
        ppid=int(f[1]),
        minflt=int(f[7]),
        majflt=int(f[9]),
        utime_s=int(f[11]) / CLK_TCK,
        stime_s=int(f[12]) / CLK_TCK,
        num_threads=int(f[17]),
        rss_bytes=int(f[21]) * PAGE_SIZE,
        processor=int(f[36]) if len(f) > 36 else -1,
    )


def parse_kv(data: bytes) -> dict[str, int]:
    """Parse ``key: number`` files (/proc/PID/io, cpu.stat-like); non-numeric lines are skipped."""
    out: dict[str, int] = {}
    for line in data.split(b"\n"):
        key, sep, val = line.partition(b":")
        if not sep:
            key, sep, val = line.partition(b" ")
        if not sep:
            continue
        parts = val.split()
        if parts:
            try:
                out[key.strip().decode()] = int(parts[0])
            except ValueError:
                pass
    return out


def parse_ctx_switches(status: bytes) -> tuple[int, int]:
    """(voluntary, involuntary) context switches from a /proc/.../status text."""
    vol = invol = 0
    i = status.find(b"voluntary_ctxt_switches:")
    if i >= 0:
        # "voluntary_ctxt_switches" also ends "nonvoluntary_ctxt_switches"; the
        # voluntary line always comes first, so the first hit is the right one.
        vol = int(status[i + 24 : status.index(b"\n", i)])
    j = status.find(b"nonvoluntary_ctxt_switches:")
    if j >= 0:
        end = status.find(b"\n", j)
        invol = int(status[j + 27 : end if end >= 0 else None])
    return vol, invol


def parse_schedstat(data: bytes) -> tuple[int, int, int]:
    """(on-cpu ns, run-queue wait ns, timeslices) from /proc/.../schedstat."""
    a, b, c = data.split()[:3]
    return int(a), int(b), int(c)


def read_bytes(path: str, size: int = 65536) -> bytes | None:
    """Whole small file, or None when it is gone or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


class PreadFile:
    """A file kept open and re-read from offset 0: the cheap way to poll /proc and /sys."""

    __slots__ = ("error", "fd", "path", "size")

    def __init__(self, path: str, size: int = 65536) -> None:
        self.path = path
        self.size = size
        self.error: str | None = None
        try:
            self.fd: int | None = os.open(path, os.O_RDONLY)
        except OSError as e:
            self.fd = None
            self.error = f"{type(e).__name__}: {e.strerror or e}"

    def read(self) -> bytes | None:
        if self.fd is None:
            return None
        try:
            data = os.pread(self.fd, self.size, 0)
        except OSError as e:
            self.error = f"{type(e).__name__}: {e.strerror or e}"
            self.close()
            return None
        if len(data) == self.size:  # rare: a file larger than the buffer
            self.size *= 4
            return self.read()
        return data

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None

    @property
    def ok(self) -> bool:
        return self.fd is not None


def list_pids() -> list[int]:
    return [int(n) for n in os.listdir(PROC) if n.isdigit()]


def ppid_map() -> dict[int, int]:
    """pid -> ppid for every live process (one /proc scan)."""
    out: dict[int, int] = {}
    for pid in list_pids():
        data = read_bytes(f"{PROC}/{pid}/stat", 4096)
        if not data:
            continue
        rpar = data.rfind(b")")
        parts = data[rpar + 2 : rpar + 40].split(None, 2)
        if len(parts) >= 2:
            out[pid] = int(parts[1])
    return out


_HAS_CHILDREN_FILE: bool | None = None


def _has_children_file() -> bool:
    """Whether /proc/PID/task/TID/children exists (kernel CONFIG_PROC_CHILDREN)."""
    global _HAS_CHILDREN_FILE
    if _HAS_CHILDREN_FILE is None:
        pid = os.getpid()
        _HAS_CHILDREN_FILE = os.path.exists(f"{PROC}/{pid}/task/{pid}/children")
    return _HAS_CHILDREN_FILE


def _tree_by_children(root_pid: int) -> list[int]:
    if not os.path.exists(f"{PROC}/{root_pid}/stat"):
        return []
    out = [root_pid]
    seen = {root_pid}
    i = 0
    while i < len(out):
        pid = out[i]
        i += 1
        try:
            tids = os.listdir(f"{PROC}/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            data = read_bytes(f"{PROC}/{pid}/task/{tid}/children", 1 << 16)
            for word in (data or b"").split():
                child = int(word)
                if child not in seen:
                    seen.add(child)
                    out.append(child)
    return out


def process_tree(root_pid: int, ppids: dict[int, int] | None = None) -> list[int]:
    """The root and all its live descendants, root first (breadth first).

    Returns ``[]`` when the root is gone. Uses the kernel's per-thread
    ``children`` lists when it has them (cost grows with the tree, not with
    the host), else one scan of every /proc/PID/stat; pass ``ppids`` to reuse
    one scan for several roots.
    """
    if ppids is None:
        if _has_children_file():
            return _tree_by_children(root_pid)
        ppids = ppid_map()
    if root_pid not in ppids:
        return []
    children: dict[int, list[int]] = {}
    for pid, ppid in ppids.items():
        children.setdefault(ppid, []).append(pid)
    out = [root_pid]
    seen = {root_pid}
    i = 0
    while i < len(out):
        for child in sorted(children.get(out[i], ())):
            if child not in seen:
                seen.add(child)
                out.append(child)
        i += 1
    return out


def cmdline(pid: int) -> str | None:
    data = read_bytes(f"{PROC}/{pid}/cmdline", 1 << 20)
    if data is None:
        return None
    return data.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")


def cmdline_argv(pid: int) -> list[str] | None:
    data = read_bytes(f"{PROC}/{pid}/cmdline", 1 << 20)
    if data is None:
        return None
    return [a.decode(errors="replace") for a in data.rstrip(b"\0").split(b"\0")]


def ancestors(pid: int) -> set[int]:
    """pid and its ancestors (to keep an agent from matching its own launcher)."""
    out = set()
    while pid > 0 and pid not in out:
        out.add(pid)
        data = read_bytes(f"{PROC}/{pid}/stat", 4096)
        if not data:
            break
        pid = int(data[data.rfind(b")") + 2 :].split()[1])
    return out


def match_pids(pattern: str, exclude: Iterable[int] = ()) -> list[int]:
    """PIDs whose command line (NULs read as spaces) matches the regex ``pattern``.

    The caller, its ancestors and kernel threads (empty command line) never match:
    an agent started as ``... --pid-pattern llama-server`` has the pattern in its
    own command line, and so does an ssh or shell that launched it.
    """
    rx = re.compile(pattern)
    skip = set(exclude) | ancestors(os.getpid())
    out = []
    for pid in list_pids():
        if pid in skip:
            continue
        text = cmdline(pid)
        if text and rx.search(text):
            out.append(pid)
    return sorted(out)


@dataclass(frozen=True)
class ProcessCounters:
    """Cumulative counters of a set of processes; subtract two readings for a delta.

    ``cpu_s`` is utime+stime of all threads; ``read_bytes`` is what the storage
    layer fetched for them (page-fault reads of mmap'ed weights included);
    ``rchar`` counts read()/pread() bytes, page-cache hits included.
    ``n_missing`` counts PIDs that were gone, ``io_denied`` PIDs whose /proc/PID/io
    could not be read (another user's process without ptrace rights).
    """

    cpu_s: float
    major_faults: int
    read_bytes: int
    minor_faults: int = 0
    rchar: int = 0
    n_pids: int = 0
    n_missing: int = 0
    io_denied: int = 0

    def __sub__(self, before: ProcessCounters) -> ProcessCounters:
        return ProcessCounters(
            cpu_s=self.cpu_s - before.cpu_s,
            major_faults=self.major_faults - before.major_faults,
            read_bytes=self.read_bytes - before.read_bytes,
            minor_faults=self.minor_faults - before.minor_faults,
            rchar=self.rchar - before.rchar,
            n_pids=self.n_pids,
            n_missing=max(self.n_missing, before.n_missing),
            io_denied=max(self.io_denied, before.io_denied),
        )


def read_process_counters(pids: Iterable[int]) -> ProcessCounters:
    """Sum CPU seconds, faults and I/O bytes over ``pids`` (pass :func:`process_tree`'s result).

    Two small reads per PID (about 20 µs each here), cheap enough around every
    request. Exited PIDs are counted in ``n_missing`` and contribute nothing.
    """
    return _sum_counters(
        (partial(read_bytes, f"{PROC}/{pid}/stat", 4096),
         partial(read_bytes, f"{PROC}/{pid}/io", 4096))
        for pid in pids
    )


Reader = Callable[[], Optional[bytes]]  # one /proc file, read whole


def _sum_counters(readers: Iterable[tuple[Reader, Reader]]) -> ProcessCounters:
    """Sum over processes given as (read stat, read io) pairs: plain reads or open files."""
    cpu = 0.0
    majflt = minflt = rbytes = rchar = 0
    n = missing = denied = 0
    for read_stat, read_io in readers:
        n += 1
        data = read_stat()
        if not data:
            missing += 1
            continue
        st = parse_stat(data)
        cpu += st.utime_s + st.stime_s
        majflt += st.majflt
        minflt += st.minflt
        io = read_io()
        if io is None:
            denied += 1
            continue
        kv = parse_kv(io)
        rbytes += kv.get("read_bytes", 0)
        rchar += kv.get("rchar", 0)
    return ProcessCounters(
        cpu_s=cpu,
        major_faults=majflt,
        read_bytes=rbytes,
        minor_faults=minflt,
        rchar=rchar,
        n_pids=n,
        n_missing=missing,
        io_denied=denied,
    )


class ProcessTreeCounters:
    """:func:`read_process_counters` for one server tree with files kept open.

    For per-request reads on a busy host: the tree is re-resolved at most every
    ``rescan_s`` seconds (a worker forked mid-run is picked up within that time)
    and each read is two ``pread`` calls per process, no open/close, no /proc scan.
    Exited processes drop out of the sum, so a delta spanning a process exit
    can be negative; ``n_missing`` tells.
    """

    def __init__(self, root_pid: int, rescan_s: float = 1.0) -> None:
        self.root_pid = root_pid
        self.rescan_s = rescan_s
        self._files: dict[int, tuple[PreadFile, PreadFile]] = {}
        self._next_scan = 0.0

    def _rescan(self) -> None:
        import time

        now = time.monotonic()
        if now < self._next_scan:
            return
        self._next_scan = now + self.rescan_s
        pids = process_tree(self.root_pid)
        for pid in list(self._files):
            if pid not in pids:
                for f in self._files.pop(pid):
                    f.close()
        for pid in pids:
            if pid not in self._files:
                self._files[pid] = (
                    PreadFile(f"{PROC}/{pid}/stat", 4096),
                    PreadFile(f"{PROC}/{pid}/io", 1024),
                )

    def read(self) -> ProcessCounters:
        self._rescan()
        return _sum_counters((s.read, i.read) for s, i in self._files.values())

    def close(self) -> None:
        for files in self._files.values():
            for f in files:
                f.close()
        self._files.clear()


class TreeCounters:
    """Per-request counters of a process tree: ``(cpu_s, major_faults, read_bytes)``.

    A plain object rather than a closure so that it pickles: the load generator's
    worker processes (load/pool.py) call it around each request they send. The tree is
    scanned once (milliseconds) and again only when one of its PIDs is gone.
    """

    def __init__(self, root_pid: int) -> None:
        self.root = root_pid
        self.tree = process_tree(root_pid)

    def __call__(self) -> "tuple[float, int, int]":
        c = read_process_counters(self.tree)
        if c.n_missing:
            self.tree = process_tree(self.root)
            c = read_process_counters(self.tree)
        return (c.cpu_s, c.major_faults, c.read_bytes)

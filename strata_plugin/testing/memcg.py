"""A memory cgroup limit that evicts the server's model pages without killing it.

Why: a container's memory limit set below the server's resident set plus its model's
file pages makes the kernel reclaim the model's page cache inside that group, over and
over, while the host has memory to spare (MemAvailable high, so the host-wide memory
rule stays quiet): every decode step reads weights back from disk. The rules were not
tuned on it (the fault suite's set-aside set); the classifier should see the major faults
and disk reads (``io_page_faults``).

:class:`MemcgEvict` moves the server's tree into a memory cgroup of its own (v1
``memory.limit_in_bytes``, admin-guide/cgroup-v1/memory.rst; v2 ``memory.max``,
admin-guide/cgroup-v2.rst "Memory") whose limit leaves room for ``keep_frac`` of the
model file plus ``headroom_bytes`` of new anonymous memory, above the anonymous (and
kernel) memory the group holds: the helper raises the limit as that grows. Anonymous
memory cannot be reclaimed without swap, and a server keeps touching pages it allocated
before the move for the first time (llama.cpp's KV cells as requests fill them, about
1 MiB a request of 112 tokens with the fault suite's model), each charged to the new
group: under a fixed limit that charge reaches it within some twenty requests and the
kernel OOM-kills the server, so the arm would measure a dead server, not eviction. The
limit follows it instead, so only the model's file pages are squeezed. Pages charged
before the move stay charged to the old group (the kernel no longer moves charges on migration,
``move_charge_at_immigrate`` is deprecated), so the helper pages the model's mapping out
once (``process_madvise``, as :class:`strata_plugin.testing.faults.PageOut`): the pages
read back are charged to the new group, which then keeps evicting them. This needs a
mapping only the server maps (the fault suite serves a private copy of the weights).

The helper owns the cgroup and undoes it on every exit (``max_s``, SIGTERM, the
harness's death): the server moved back, the cgroup removed. Facts: the limit, the
model's resident bytes before and at the end, pages the group gave back (evicted), its
major faults, the times the limit was hit, and OOM kills (must be 0).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from strata_plugin.testing.faults import (
    _SYS_PIDFD_OPEN,
    FaultUnavailable,
    Injector,
    _await_line,
    _close_pipes,
    _guard,
    _helper_argv,
    _kill,
    _last_json,
    _pidfd_pageout,
    _ranges,
    _rmdir_cgroup,
    _say,
    _spawn,
    file_mappers,
    mapping_rss_bytes,
    reload_file,
    sweep_cgroups,
)

_MODULE = "strata_plugin.testing.memcg"
PREFIX = "strata-memcg-"
_PR_SET_PDEATHSIG = 1
PAGE = os.sysconf("SC_PAGE_SIZE")


def memory_root() -> tuple[Path, str]:
    """(the memory controller's mount point, 'v1' or 'v2')."""
    mounts = Path("/proc/mounts").read_text().splitlines()
    for line in mounts:
        _dev, mnt, fstype, opts = line.split()[:4]
        if fstype == "cgroup" and "memory" in opts.split(","):
            return Path(mnt), "v1"
    for line in mounts:
        _dev, mnt, fstype, _ = line.split()[:4]
        ctl = Path(mnt) / "cgroup.controllers"
        if fstype == "cgroup2" and ctl.exists() and "memory" in ctl.read_text().split():
            return Path(mnt), "v2"
    raise FaultUnavailable("no cgroup memory controller mounted (v1 memory or v2 memory)")


def home_cgroup(pid: int, root: Path, version: str) -> Path:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if (version == "v1" and "memory" in ctrls.split(",")) or (
                version == "v2" and ctrls == ""):
            return root / path.lstrip("/")
    return root


def _kv(path: Path) -> dict[str, int]:
    from strata_plugin.agent.procfs import parse_kv

    with contextlib.suppress(OSError):
        return parse_kv(path.read_bytes())
    return {}


def group_figures(d: Path, version: str) -> dict[str, int]:
    """The group's usage, limit hits, OOM kills, major faults and pages given back."""
    stat = _kv(d / "memory.stat")
    if version == "v1":
        oom = _kv(d / "memory.oom_control")
        return {"usage_bytes": int(_read_int(d / "memory.usage_in_bytes")),
                "limit_hits": int(_read_int(d / "memory.failcnt")),
                "oom_kills": oom.get("oom_kill", 0),
                "major_faults": stat.get("pgmajfault", 0),
                "evicted_bytes": stat.get("pgpgout", 0) * PAGE,
                "file_bytes": stat.get("cache", 0)}
    ev = _kv(d / "memory.events")
    return {"usage_bytes": int(_read_int(d / "memory.current")),
            "limit_hits": ev.get("max", 0), "oom_kills": ev.get("oom_kill", 0),
            "major_faults": stat.get("pgmajfault", 0),
            "evicted_bytes": stat.get("workingset_refault_file", 0) * PAGE,
            "file_bytes": stat.get("file", 0)}


def limit_for(figures: dict[str, int], room: int) -> int:
    """The group's limit that leaves ``room`` bytes (the model's share plus the headroom)
    above what it holds that is not file pages (anonymous and kernel memory: reclaimable
    only by killing its owner, without swap)."""
    return room + max(0, figures["usage_bytes"] - figures["file_bytes"])


def _read_int(path: Path) -> int:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().split()[0])
    return 0


def _write(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _members(d: Path) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    return []


def undo_memcg(d: Path, home: Path) -> None:
    """Move every process in ``d`` back to ``home`` and remove ``d`` (retried)."""
    if not d.exists():
        return

    def move_back() -> None:
        for p in _members(d):
            with contextlib.suppress(OSError):  # a process that just ended
                _write(home / "cgroup.procs", str(p))

    move_back()
    _rmdir_cgroup(d, move_back)


class MemcgEvict(Injector):
    """The server tree in a memory cgroup too small for its model's pages."""

    name = "memcg_evict"
    expected_class = "io_page_faults"

    def __init__(self, pid: int, path: str, keep_frac: float = 0.5,
                 headroom_bytes: int = 48 * 2**20, max_s: float = 120.0) -> None:
        super().__init__()
        if not 0.0 < keep_frac < 1.0:
            raise ValueError("keep_frac is the share of the model the limit leaves room "
                             "for, in (0, 1)")
        self.pid, self.path = pid, os.path.realpath(path)
        self.keep_frac, self.headroom, self.max_s = keep_frac, headroom_bytes, max_s
        self.proc: Any = None
        self.dir: Path | None = None
        self.home: Path | None = None
        self.ready: dict[str, Any] = {}

    @property
    def limit_bytes(self) -> int:
        size = os.path.getsize(self.path)
        return self.headroom + int(size * self.keep_frac)

    def _start(self) -> None:
        others = file_mappers(self.path, exclude=self.pid)
        if others:
            raise FaultUnavailable(
                f"{self.path} is also mapped by {others}: its pages are charged to their "
                "groups and would not be evicted in the server's")
        root, version = memory_root()
        self.home = home_cgroup(self.pid, root, version)
        sweep_cgroups(self.home, PREFIX)
        self.dir = self.home / f"{PREFIX}{os.getpid()}"
        self.proc = _spawn(_helper_argv(
            "memcg", self.max_s, "--pid", str(self.pid), "--path", self.path,
            "--dir", str(self.dir), "--home", str(self.home), "--version", version,
            "--limit", str(self.limit_bytes), module=_MODULE))
        self.ready = _await_line(self.proc, "ready", 15.0)

    def _stop(self) -> dict[str, Any]:
        done: dict[str, Any] = {}
        if self.proc is not None:
            _kill(self.proc)
            done = _last_json(self.proc, "done")
            _close_pipes(self.proc)
        if self.dir is not None and self.home is not None:
            undo_memcg(self.dir, self.home)
        return {"path": self.path, "limit_bytes": self.limit_bytes,
                "model_bytes": os.path.getsize(self.path),
                **{f"ready_{k}": v for k, v in self.ready.items()}, **done,
                "reloaded_bytes": reload_file(self.path)}


# --- the helper process -------------------------------------------------------------------


def _main_memcg(a: argparse.Namespace, deadline: float) -> None:
    from strata_plugin.agent.procfs import process_tree

    d, home = Path(a.dir), Path(a.home)
    limit_file = d / ("memory.limit_in_bytes" if a.version == "v1" else "memory.max")
    pids = process_tree(a.pid)
    if not pids:
        raise FaultUnavailable(f"no process {a.pid}")
    try:
        d.mkdir()
        _write(limit_file, str(a.limit))
    except OSError as exc:
        with contextlib.suppress(OSError):
            d.rmdir()
        raise FaultUnavailable(f"cannot create a memory-limited cgroup {d}: {exc}") from None
    out: dict[str, Any] = {}
    first = group_figures(d, a.version)
    try:
        rss_before = mapping_rss_bytes(a.pid, a.path)
        for p in pids:
            with contextlib.suppress(OSError):
                _write(d / "cgroup.procs", str(p))
        if a.pid not in _members(d):
            raise FaultUnavailable(f"could not move {a.pid} into {d}")
        libc = ctypes.CDLL(None, use_errno=True)
        pidfd = libc.syscall(_SYS_PIDFD_OPEN, a.pid, 0)
        if pidfd < 0:
            raise FaultUnavailable(f"pidfd_open({a.pid}): {os.strerror(ctypes.get_errno())}")
        try:
            ranges = _ranges(a.pid, a.path)
            if not ranges:
                raise FaultUnavailable(f"pid {a.pid} does not map {a.path}")
            _pidfd_pageout(pidfd, ranges)  # read back from now on: charged to this group
        finally:
            os.close(pidfd)
        _say("ready", {"model_rss_before": rss_before,
                       "model_rss_after_pageout": mapping_rss_bytes(a.pid, a.path),
                       "pids": pids})
        low, limit, pinned_max = rss_before, a.limit, 0
        while time.monotonic() < deadline and os.getppid() == a.parent:
            time.sleep(0.1)
            low = min(low, mapping_rss_bytes(a.pid, a.path))
            out["model_rss_min"] = low
            now = group_figures(d, a.version)
            want = limit_for(now, a.limit)
            pinned_max = max(pinned_max, want - a.limit)
            if want > limit:  # raised only: the file pages' room stays, never the OOM
                with contextlib.suppress(OSError):
                    _write(limit_file, str(want))
                    limit = want
            out["limit_bytes_at_end"], out["pinned_bytes_max"] = limit, pinned_max
    finally:
        last = group_figures(d, a.version)
        out.update({k: last[k] - first.get(k, 0) for k in
                    ("limit_hits", "oom_kills", "major_faults", "evicted_bytes")})
        out["usage_bytes_at_end"] = last["usage_bytes"]
        out["model_rss_at_end"] = mapping_rss_bytes(a.pid, a.path)
        undo_memcg(d, home)
        out["removed"] = not d.exists()
        _say("done", out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {_MODULE}")
    p.add_argument("mode", choices=("memcg",))
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--max-s", type=float, default=60.0)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--home", required=True)
    p.add_argument("--version", default="v1")
    p.add_argument("--limit", type=int, required=True)
    a = p.parse_args(argv)
    deadline = _guard(a.parent, a.max_s)
    with contextlib.suppress(OSError, AttributeError):  # undo before going, also then
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    try:
        _main_memcg(a, deadline)
    except FaultUnavailable as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

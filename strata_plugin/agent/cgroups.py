"""The server's own cgroup: where its CPU quota, throttling and memory limit live.

A server in a container, a pod or a systemd slice is limited by its cgroup, not by the
host: a CPU quota throttles it on an idle machine, a memory limit reclaims or kills it
with the host's MemAvailable high. The agent reads the cgroup *of the server process*
(``pid:<N>``, or ``server``: the first process the agent tracks), not its own.

Both layouts are read (Linux kernel docs, admin-guide/cgroup-v2.rst; for v1,
scheduler/sched-bwc.rst and admin-guide/cgroup-v1/memory.rst): a v2 directory from the
``0::/path`` line of ``/proc/<pid>/cgroup`` (under the mount itself, or ``unified/`` on
a hybrid host), and the v1 ``cpu`` and ``memory`` hierarchies from their own lines.
Files that a layout lacks are skipped; the collector says which were found.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from . import procfs

CGROUP_ROOT = "/sys/fs/cgroup"
#: A v1 memory limit at or above this is "no limit" (the kernel prints PAGE_COUNTER_MAX
#: in bytes, 2^63 rounded down to a page).
V1_NO_LIMIT = 1 << 62


@dataclass(frozen=True)
class CgroupDirs:
    """The directories that hold one process's cgroup files (empty when absent)."""

    v2: str = ""
    v1_cpu: str = ""
    v1_memory: str = ""
    lines: tuple[str, ...] = field(default=(), compare=False)

    @property
    def found(self) -> bool:
        return bool(self.v2 or self.v1_cpu or self.v1_memory)


def cgroup_entries(lines: Iterable[str]) -> Iterator[tuple[str, str]]:
    """Each ``hierarchy-ID:controllers:path`` line of ``/proc/<pid>/cgroup`` (cgroups(7))
    as its controllers (``""``: the v2 hierarchy) and its path without the leading
    ``/``; a malformed line is skipped."""
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            yield parts[1], parts[2].lstrip("/")


def cgroup_dirs(pid: int | str = "self", root: str = CGROUP_ROOT) -> CgroupDirs:
    """Where ``pid``'s cgroup lives, for v2 and the v1 cpu and memory controllers."""
    data = procfs.read_bytes(f"{procfs.PROC}/{pid}/cgroup")
    if not data:
        return CgroupDirs()
    v2 = v1_cpu = v1_mem = ""
    lines = tuple(data.decode(errors="replace").splitlines())
    for controllers, path in cgroup_entries(lines):
        ctrls = controllers.split(",")
        if controllers == "":
            for base in (root, os.path.join(root, "unified")):
                d = os.path.join(base, path)
                if os.path.exists(os.path.join(d, "cgroup.controllers")):
                    v2 = d
                    break
        elif "cpu" in ctrls:
            v1_cpu = _first_dir(root, ("cpu", "cpu,cpuacct", "cpuacct,cpu"), path)
        elif "memory" in ctrls:
            v1_mem = _first_dir(root, ("memory",), path)
    return CgroupDirs(v2, v1_cpu, v1_mem, lines)


def _first_dir(root: str, mounts: tuple[str, ...], path: str) -> str:
    for m in mounts:
        d = os.path.join(root, m, path)
        if os.path.isdir(d):
            return d
    return ""


def cpu_stat_files(dirs: CgroupDirs) -> list[str]:
    """The cpu.stat that holds the group's CPU limit: the v1 cpu controller's when the
    controller lives on v1 (a hybrid host, whose v2 group is then not the one limited),
    else the v2 directory's."""
    for d in (dirs.v1_cpu, dirs.v2):
        if d and os.path.exists(os.path.join(d, "cpu.stat")):
            return [os.path.join(d, "cpu.stat")]
    return []


def _read_text(path: str) -> str | None:
    data = procfs.read_bytes(path, 4096)
    return None if data is None else data.decode(errors="replace").strip()


def cpu_quota_cores(dirs: CgroupDirs) -> float | None:
    """The CFS quota in cores (quota / period), or None when unlimited or unreadable.

    v2 ``cpu.max`` is "<quota|max> <period>"; v1 has ``cpu.cfs_quota_us`` (-1: none) and
    ``cpu.cfs_period_us``.
    """
    if dirs.v1_cpu:
        q = _read_text(os.path.join(dirs.v1_cpu, "cpu.cfs_quota_us"))
        p = _read_text(os.path.join(dirs.v1_cpu, "cpu.cfs_period_us"))
        if q and p and q.lstrip("-").isdigit() and p.isdigit() and int(q) > 0 and int(p) > 0:
            return int(q) / int(p)
    if dirs.v2:
        text = _read_text(os.path.join(dirs.v2, "cpu.max"))
        if text:
            words = text.split()
            if len(words) == 2 and words[0].isdigit() and words[1].isdigit() and int(words[1]):
                return int(words[0]) / int(words[1])
    return None


def _read_int(path: str) -> int | None:
    """A cgroup file holding one non-negative integer; None when absent or not a number
    (v2 writes "max" for no limit)."""
    text = _read_text(path)
    return int(text) if text and text.isdigit() else None


def memory_values(dirs: CgroupDirs) -> dict[str, tuple[float, str]]:
    """Memory limit, usage and limit events of the cgroup: metric -> (value, kind).

    ``cgroup_mem_limit_bytes`` (only when a limit is set), ``cgroup_mem_usage_bytes``,
    ``cgroup_mem_max_events`` (v2 memory.events "max": allocations that hit the limit;
    v1 memory.failcnt), ``cgroup_mem_oom_kills`` (v2 memory.events / v1 memory.oom_control
    "oom_kill").
    """
    out: dict[str, tuple[float, str]] = {}
    if dirs.v2 and os.path.exists(os.path.join(dirs.v2, "memory.current")):
        limit = _read_int(os.path.join(dirs.v2, "memory.max"))
        if limit is not None:
            out["cgroup_mem_limit_bytes"] = (limit, "gauge")
        cur = _read_int(os.path.join(dirs.v2, "memory.current"))
        if cur is not None:
            out["cgroup_mem_usage_bytes"] = (cur, "gauge")
        ev = procfs.read_bytes(os.path.join(dirs.v2, "memory.events"), 4096)
        kv = procfs.parse_kv(ev or b"")
        if "max" in kv:
            out["cgroup_mem_max_events"] = (kv["max"], "counter")
        if "oom_kill" in kv:
            out["cgroup_mem_oom_kills"] = (kv["oom_kill"], "counter")
    elif dirs.v1_memory:
        limit = _read_int(os.path.join(dirs.v1_memory, "memory.limit_in_bytes"))
        if limit is not None and limit < V1_NO_LIMIT:
            out["cgroup_mem_limit_bytes"] = (limit, "gauge")
        cur = _read_int(os.path.join(dirs.v1_memory, "memory.usage_in_bytes"))
        if cur is not None:
            out["cgroup_mem_usage_bytes"] = (cur, "gauge")
        fail = _read_int(os.path.join(dirs.v1_memory, "memory.failcnt"))
        if fail is not None:
            out["cgroup_mem_max_events"] = (fail, "counter")
        oom = procfs.read_bytes(os.path.join(dirs.v1_memory, "memory.oom_control"), 4096)
        kv = procfs.parse_kv(oom or b"")
        if "oom_kill" in kv:
            out["cgroup_mem_oom_kills"] = (kv["oom_kill"], "counter")
    return out


def resolve(spec: str, server_pid: int | None = None) -> tuple[CgroupDirs, str]:
    """The cgroup a ``--cgroup`` value names, and a description (or why it is absent).

    ``self`` (the agent's own), ``pid:<N>``, ``server`` (``server_pid``, the first process
    the agent tracks), a directory, or ``none``/"".
    """
    if spec in ("", "none"):
        return CgroupDirs(), "not asked for (--cgroup none)"
    if spec == "server":
        if server_pid is None:
            return CgroupDirs(), "no server process found when the agent started"
        spec = f"pid:{server_pid}"
    if spec == "self" or spec.startswith("pid:"):
        pid = "self" if spec == "self" else spec[4:]
        dirs = cgroup_dirs(pid)
        if not dirs.found:
            return dirs, f"no cgroup directory found for {spec}"
        return dirs, spec
    # a directory: the layout is told by its files (cgroup.controllers only exists in v2)
    if os.path.exists(os.path.join(spec, "cgroup.controllers")):
        return CgroupDirs(v2=spec), spec
    return CgroupDirs(v1_cpu=spec, v1_memory=spec), spec


@dataclass(frozen=True)
class FreezerFiles:
    """Where one process's freezer state is read (Linux kernel docs: admin-guide/cgroup-v1/
    freezer-subsystem.rst, ``freezer.state``; admin-guide/cgroup-v2.rst, ``cgroup.freeze``
    and ``cgroup.events`` "frozen").

    ``v1_state``: the v1 ``freezer.state`` file ("" when the process sits in the v1 root,
    which has none and can never be frozen); ``v2_events`` / ``v2_freeze``: the v2 files
    ("" in the v2 root, likewise). ``available`` is False when no freezer exists at all
    (no v1 freezer hierarchy mounted, no v2 hierarchy with the files).
    """

    v1_state: str = ""
    v2_events: str = ""
    v2_freeze: str = ""
    available: bool = False


def freezer_files(cgroup_text: bytes, root: str = CGROUP_ROOT) -> FreezerFiles:
    """The freezer files of the process whose ``/proc/<pid>/cgroup`` reads ``cgroup_text``."""
    v1 = v2e = v2f = ""
    available = False
    for controllers, path in cgroup_entries(cgroup_text.decode(errors="replace").splitlines()):
        if "freezer" in controllers.split(","):
            mount = os.path.join(root, "freezer")
            if os.path.isdir(mount):
                available = True
                f = os.path.join(mount, path, "freezer.state")
                v1 = f if path and os.path.exists(f) else ""
        elif controllers == "":
            for base in (root, os.path.join(root, "unified")):
                if not os.path.exists(os.path.join(base, "cgroup.controllers")):
                    continue
                d = os.path.join(base, path)
                if not path:
                    # the v2 root cannot be frozen; whether a child could tells the kernel
                    # has the v2 freezer (cgroup.freeze exists in every non-root group)
                    available = available or _v2_has_freezer(base)
                elif os.path.exists(os.path.join(d, "cgroup.freeze")):
                    available = True
                    v2e, v2f = os.path.join(d, "cgroup.events"), os.path.join(d, "cgroup.freeze")
                break
    return FreezerFiles(v1, v2e, v2f, available)


def _v2_has_freezer(base: str) -> bool:
    try:
        for name in os.listdir(base):
            if os.path.exists(os.path.join(base, name, "cgroup.freeze")):
                return True
    except OSError:
        pass
    return False


def is_frozen(v1_state: bytes | None, v2_events: bytes | None, v2_freeze: bytes | None) -> bool:
    """FROZEN or FREEZING (v1), ``frozen 1`` in cgroup.events or ``1`` in cgroup.freeze (v2)."""
    if v1_state and v1_state.strip() in (b"FROZEN", b"FREEZING"):
        return True
    if v2_freeze and v2_freeze.strip() == b"1":
        return True
    if v2_events:
        i = v2_events.find(b"frozen ")
        if i >= 0 and v2_events[i + 7 : i + 8] == b"1":
            return True
    return False


# --- the CPUs a process may use: its cpuset, and the CFS quota up its hierarchy -----------


def parse_cpulist(text: str | bytes | None) -> frozenset[int] | None:
    """A kernel CPU list ("0-3,6,8-9", Linux docs admin-guide/cgroup-v2.rst, cpuset.cpus
    format; the same as ``Cpus_allowed_list``) as a set; None when absent or malformed,
    an empty set for an empty file."""
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            return None
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            return None
        out.update(range(a, b + 1))
    return frozenset(out)


def format_cpulist(cpus) -> str:
    """A set of CPUs in the kernel's list form: {0, 1, 2, 5} -> "0-2,5"."""
    xs = sorted(cpus)
    parts: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts)


def cpuset_file(cgroup_text: bytes, root: str = CGROUP_ROOT) -> str:
    """The file holding the effective CPUs of the cpuset a process is in, from its
    ``/proc/<pid>/cgroup`` text; "" when no cpuset controller is mounted.

    v1 (Linux docs admin-guide/cgroup-v1/cpusets.rst): ``cpuset.effective_cpus`` of its
    group in the cpuset hierarchy (``cpuset.cpus`` on kernels without it). v2
    (admin-guide/cgroup-v2.rst, "Cpuset Interface Files"): ``cpuset.cpus.effective`` of
    its group, or of the nearest ancestor that has the controller enabled (a group
    without it uses its parent's CPUs)."""
    v2_path = None
    for controllers, path in cgroup_entries(cgroup_text.decode(errors="replace").splitlines()):
        path = path.strip().lstrip("/")
        if "cpuset" in controllers.split(","):
            d = os.path.join(root, "cpuset", path)
            for name in ("cpuset.effective_cpus", "cpuset.cpus"):
                f = os.path.join(d, name)
                if os.path.exists(f):
                    return f
        elif controllers == "":
            v2_path = path
    if v2_path is None:
        return ""
    for base in (root, os.path.join(root, "unified")):
        if not os.path.exists(os.path.join(base, "cgroup.controllers")):
            continue
        d = os.path.join(base, v2_path) if v2_path else base
        while True:
            f = os.path.join(d, "cpuset.cpus.effective")
            if os.path.exists(f):
                return f
            if len(d) <= len(base.rstrip("/")):
                break
            d = os.path.dirname(d)
    return ""


def cpu_quota_limit(dirs: CgroupDirs, root: str = CGROUP_ROOT) -> float | None:
    """The tightest CFS quota, in cores, of the process's cpu group and its ancestors (a
    quota on a parent slice limits every group under it: Linux docs
    scheduler/sched-bwc.rst, "Hierarchical considerations"); None when none is set."""
    best: float | None = None
    for d, kind in ((dirs.v1_cpu, "v1"), (dirs.v2, "v2")):
        if not d:
            continue
        while d.startswith(root) and len(d) > len(root):
            q = cpu_quota_cores(CgroupDirs(v1_cpu=d) if kind == "v1" else CgroupDirs(v2=d))
            if q is not None and (best is None or q < best):
                best = q
            parent = os.path.dirname(d)
            marker = "cpu.cfs_quota_us" if kind == "v1" else "cpu.max"
            if parent == d or not os.path.exists(os.path.join(parent, marker)):
                break
            d = parent
        if best is not None:
            break  # the controller lives in one layout; v1 first (as cpu_stat_files)
    return best


# --- the CPU weight: the share a group gets when the CPUs are contended -------------------

#: The weight files by layout (Linux docs scheduler/sched-design-CFS.rst, group
#: scheduling: v1 ``cpu.shares``, 1024 by default; admin-guide/cgroup-v2.rst, CPU
#: Interface Files: ``cpu.weight``, 1-10000, 100 by default).
WEIGHT_FILES = {"v1": "cpu.shares", "v2": "cpu.weight"}


@dataclass(frozen=True)
class CpuWeight:
    """One group's CPU weight: the file it was read from, its value, and the group's
    path under the controller's mount ("/" for the root)."""

    file: str
    value: int
    path: str

    def words(self) -> str:
        return f"{self.file} {self.value} ({self.path})"


def cpu_weight(dirs: CgroupDirs, root: str = CGROUP_ROOT) -> CpuWeight | None:
    """The CPU weight of the group ``dirs`` names: v1 ``cpu.shares`` where the cpu
    controller lives on v1 (as :func:`cpu_stat_files`), else v2 ``cpu.weight``; None
    where the file is absent (the v2 root has none) or unreadable."""
    for d, kind in ((dirs.v1_cpu, "v1"), (dirs.v2, "v2")):
        if not d:
            continue
        name = WEIGHT_FILES[kind]
        value = _read_int(os.path.join(d, name))
        if value is None:
            continue
        mount = _mount_of(d, root)
        rel = "/" + os.path.relpath(d, mount).replace(os.sep, "/") if mount else d
        return CpuWeight(name, value, "/" if rel in ("/.", "//") else rel)
    return None


def _mount_of(d: str, root: str) -> str:
    """The controller mount a group directory lies under: ``root/<first component>``
    for v1 (``cpu``, ``cpu,cpuacct``), ``root/unified`` or ``root`` itself for v2."""
    rel = os.path.relpath(d, root)
    if rel.startswith(".."):
        return ""
    first = rel.split(os.sep, 1)[0]
    if first in ("cpu", "cpu,cpuacct", "cpuacct,cpu", "unified"):
        return os.path.join(root, first)
    return root

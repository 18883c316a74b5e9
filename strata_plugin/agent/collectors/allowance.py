"""The CPUs the server may use, and who else used the CPUs: sampled every tick.

A server is limited by its *allowance*, not by the host: the affinity masks of its
threads (``sched_setaffinity``, ``taskset``), the cpuset of its cgroup (a pod's or a
container's CPU set) and its cgroup's CFS quota. Any of them can be smaller than the
threads the server keeps busy, on a host that is otherwise idle, and any of them can
change while it runs (a ``taskset -p``, a cpuset written by an orchestrator), so the
collector samples them every tick, not once.

Emits, for the followed server's process tree (gauges):

* ``allowed_cpus`` (device ``""``): the CPUs the tree may use now: the union over its
  threads of (the thread's affinity mask ∩ its process's cpuset's effective CPUs),
  counted, and no more than the CFS quota in cores where one is set;
* ``affinity_cpus`` (device ``affinity <list>``, e.g. ``affinity 0-1``): the union of
  its threads' affinity masks (``sched_getaffinity``, the kernel's ``Cpus_allowed``);
* ``cpuset_cpus`` (device ``cpuset <list>``): the union of its processes' cpuset
  effective CPUs (v1 ``cpuset.effective_cpus``, v2 ``cpuset.cpus.effective``:
  ``agent/cgroups.py``), where a cpuset controller is mounted;
* ``quota_cores`` (device ``""``): the tightest CFS quota of the server's cgroup and its
  ancestors, in cores (quota / period), only while one is set;
* ``cpu_weight`` (device ``<file> <group>``, e.g. ``cpu.shares /batch``): the CPU weight
  of the server's cpu cgroup (v1 ``cpu.shares``, v2 ``cpu.weight``: ``agent/cgroups.py``),
  what decides its share when the CPUs are contended, where the file exists;
* ``nice_min`` / ``nice_max`` (device ``""``): the least and the greatest nice value of
  its threads (``getpriority`` per thread), the weight of each thread within its group.

Where the server is several engines (the replicas behind a router, each its own root
process, each in a cgroup of its own), the rows above read the first engine's cgroup
only; each engine's own then comes under device ``pid<N>`` (its root process): gauge
``engine_quota_cores`` (the tightest CFS quota of its cgroup and its ancestors, in cores,
while one is set) and, from its cgroup's ``cpu.stat``, counters ``engine_nr_periods``,
``engine_nr_throttled`` and ``engine_throttled_s``. Metrics of their own, so the whole
server's allowance above is not taken for one replica's.

The CPU lists travel in the device names, so a window that saw the allowance change has
one series per list; ``analysis/signals.py`` names the one that bound.

And the other processes that used the CPUs most since the last tick (at most ``top``,
each at ``min_cores`` or more; the server's tree excluded), device ``pid<N> <command>``
(the command line, its program without its directory, URL credentials and the values of
secret-looking options hidden by ``agent/redact.py``, cut to ``COMMAND_CHARS``; a kernel
thread's ``[name]``): counter ``cpu_s`` (utime + stime of all its threads), gauge
``strata_own`` (1 for Strata's own processes: this agent, the process that started it
(the harness, locally), the load generator's workers; 0 otherwise) and gauge
``allowed_share`` (the share of its CPUs, by its affinity mask, that the server may use
too: they are ranked by their cores times it, so a process pinned to the server's only
CPU is named before a busier one elsewhere), gauge ``nice`` (its nice value, from the
same stat read) and gauge ``cpu_weight`` under its own device ``pid<N> <file> <group>``
(its cpu cgroup's weight, read when it enters the list: the server's weight beside its
competitors'). A process that enters the list also gets
its reading of the tick before, at that tick's time, and one that leaves it one more
reading, so the counter's growth over any window is its CPU in that window.

Work done by short-lived processes (a shell loop calling tools, a build, a cron storm)
has no process that lives long enough to be read twice; what lives on is the parent that
started and reaped them. So each named process also carries counter ``children_cpu_s``:
the CPU of its children that ended and were reaped, as the kernel adds it to the
parent's ``cutime`` + ``cstime`` (/proc/<pid>/stat fields 16-17, proc(5); a child's own
reaped children come with it), less what of it was already counted under another name
(a child's growth while it was named itself, or while it was the server's or a path
proxy's), so that no CPU is counted twice. Its growth over a window is the CPU of the
children that ended in it, nearly all of it used in it where they live shorter than a
tick (a shell loop calling tools, a build). Where a named child is reaped between its
parent's reading and its own in one tick, the parent's figure waits for the next tick
rather than step back. The list is ranked by both: ``cpu_s`` plus ``children_cpu_s``, times
``allowed_share``. The host's rate of process starts is the ``cpu`` collector's ``forks``.

Cost: one ``sched_getaffinity`` per server thread and one or two small cgroup reads per
server process; one ``pread`` of ``/proc/<pid>/stat`` per process on the host (the files
kept open, up to ``MAX_OPEN``) and one ``/proc`` listing: 1.9 ms of CPU a tick with 129
processes on the host (the 2-core development VM; the collector's thread CPU time over
20 samples), 0.4% of a core at the 0.5 s grid (docs/agent.md).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from .. import procfs
from ..cgroups import (
    CGROUP_ROOT,
    CpuWeight,
    cgroup_dirs,
    cpu_quota_limit,
    cpu_stat_files,
    cpu_weight,
    cpuset_file,
    format_cpulist,
    parse_cpulist,
)
from ..procfs import PreadFile, parse_kv
from ..redact import redact_argv
from ..targets import ProcessTargets
from .base import Collector, Emit, Unavailable

if TYPE_CHECKING:
    import argparse

#: Other processes named per tick, and the least CPU (cores over the tick) to be named.
TOP_OTHERS = 5
MIN_OTHER_CORES = 0.01
#: A named process's command, cut to this many characters (after redaction).
COMMAND_CHARS = 120
#: Most /proc/<pid>/stat files kept open for the scan (beyond: opened per read).
MAX_OPEN = 4096
#: Strata's own processes by command line: the agent (``-m strata_plugin.agent``,
#: ``-m strata_plugin agent``) and the load generator's workers (``strata_plugin.load.*``).
_OWN_CMD = re.compile(r"strata_plugin(?:\.agent\b|\.load\.|\s+agent\b)")
_TICK = float(procfs.CLK_TCK)
#: An engine's cpu.stat keys (v2 and v1) -> (metric, scale to its unit).
_ENGINE_CPU_STAT = (
    ("nr_periods", "engine_nr_periods", 1),
    ("nr_throttled", "engine_nr_throttled", 1),
    ("throttled_usec", "engine_throttled_s", 1e-6),
    ("throttled_time", "engine_throttled_s", 1e-9),  # cgroup v1, ns
)


class _Other:
    __slots__ = ("counted", "cpu_s", "device", "file", "kids", "kids_raw", "nice", "own",
                 "ppid", "prev_cpu", "prev_kids", "prev_wall", "seen", "start", "top",
                 "wall", "weight")

    def __init__(self, file: PreadFile | None) -> None:
        self.file = file
        self.start = -1
        self.cpu_s = -1.0
        self.wall = 0
        self.device = ""
        self.own = 0
        self.top = False
        self.prev_wall = 0
        self.prev_cpu = -1.0
        self.nice = 0
        self.weight: CpuWeight | None = None
        self.ppid = 0
        # children_cpu_s (module docstring): cutime + cstime as read, what of it was
        # counted under its reaped descendants' own names, and the value emitted
        self.kids_raw = 0.0
        self.seen = 0.0
        self.kids = -1.0
        self.prev_kids = -1.0
        # cpu_s + children_cpu_s at its first and last reading counted under its own name
        # (emitted while named; every reading for the server's tree and the excluded)
        self.counted = (-1.0, -1.0)


def _count(o: _Other, total: float) -> None:
    """A reading of ``o`` (cpu_s + children_cpu_s) counted under its own name."""
    o.counted = (o.counted[0] if o.counted[0] >= 0 else total, total)


def _stat_fields(data: bytes) -> tuple[float, int, int, float, int]:
    """(utime + stime in seconds, starttime in ticks, nice, cutime + cstime in seconds,
    the parent's PID) from a /proc/<pid>/stat text (proc(5): fields 14, 15, 22, 19, 16,
    17 and 4)."""
    rpar = data.rfind(b")")
    f = data[rpar + 2 :].split(None, 20)
    return ((int(f[11]) + int(f[12])) / _TICK, int(f[19]), int(f[16]),
            (int(f[13]) + int(f[14])) / _TICK, int(f[1]))


class AllowanceCollector(Collector):
    """The server's CPU allowance and the busiest other processes, every tick."""

    source = "allowance"
    follows_targets = True

    def __init__(
        self,
        targets: ProcessTargets,
        top: int = TOP_OTHERS,
        min_cores: float = MIN_OTHER_CORES,
        cgroup_root: str = CGROUP_ROOT,
        exclude: tuple[int, ...] = (),
        own: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__()
        self.targets = targets
        self.top = top
        self.min_cores = min_cores
        self.cgroup_root = cgroup_root
        self.exclude = set(exclude)
        #: PIDs that are Strata's own whatever their command: this agent and its parent
        #: (the harness that started it, locally; a shell over ssh, which uses no CPU)
        self.own_pids = set(own) if own is not None else {os.getpid(), os.getppid()}
        self._cg_files: dict[int, PreadFile] = {}
        self._others: dict[int, _Other] = {}
        self._last_wall = 0
        self._said: set[str] = set()
        self._allowed: frozenset[int] = frozenset()  # the server's CPUs at the last tick

    def probe(self) -> None:
        try:
            self.targets.probe()
        except ValueError as e:
            raise Unavailable(str(e)) from None
        self.targets.commands.clear()  # the proc collector records them
        if not hasattr(os, "sched_getaffinity"):
            raise Unavailable("no sched_getaffinity on this platform")

    def set_pids(self, pids: list[int]) -> None:
        self.targets.set_pids(pids)

    def close(self) -> None:
        for f in self._cg_files.values():
            f.close()
        self._cg_files.clear()
        for o in self._others.values():
            if o.file is not None:
                o.file.close()
        self._others.clear()

    def sample(self, wall_ns: int) -> list[Emit]:
        self.targets.refresh()
        tree = self.targets.tree
        out: list[Emit] = []
        self._allowed = frozenset()
        if tree:
            self._allowance(wall_ns, tree, out)
        if len(self.targets.roots) > 1:
            self._engines(wall_ns, self.targets.roots, out)
        self._other_processes(wall_ns, set(tree), out)
        return out

    # -- the allowance -----------------------------------------------------------------
    def _cpuset(self, pid: int) -> frozenset[int] | None:
        f = self._cg_files.get(pid)
        if f is None:
            f = self._cg_files[pid] = PreadFile(f"{procfs.PROC}/{pid}/cgroup", 4096)
        text = f.read()
        if text is None:
            return None
        path = cpuset_file(text, self.cgroup_root)
        if not path:
            self._say_once("cpuset_cpus", "no cpuset controller mounted (neither the v1 "
                                          "cpuset hierarchy nor a v2 cpuset.cpus.effective)")
            return None
        return parse_cpulist(procfs.read_bytes(path, 65536))

    def _allowance(self, wall: int, tree: tuple[int, ...], out: list[Emit]) -> None:
        affinity: set[int] = set()
        allowed: set[int] = set()
        cpusets: set[int] = set()
        nices: set[int] = set()
        any_cpuset = False
        for pid in tree:
            cs = self._cpuset(pid)
            if cs is not None:
                any_cpuset = True
                cpusets |= cs
            try:
                tids = os.listdir(f"{procfs.PROC}/{pid}/task")
            except OSError:
                continue
            masks: set[frozenset[int]] = set()
            for tid in tids:
                try:
                    masks.add(frozenset(os.sched_getaffinity(int(tid))))
                    # a thread's nice: PRIO_PROCESS with a thread ID is that thread's
                    # (setpriority(2), Linux notes)
                    nices.add(os.getpriority(os.PRIO_PROCESS, int(tid)))
                except OSError:  # a thread that just ended
                    continue
            for m in masks:
                affinity |= m
                allowed |= (m & cs) if cs is not None else m
        for pid in [p for p in self._cg_files if p not in tree]:
            self._cg_files.pop(pid).close()
        self._allowed = frozenset(allowed)
        if not affinity:
            return  # the tree ended between the scan and the reads
        n: float = float(len(allowed))
        dirs = cgroup_dirs(tree[0], self.cgroup_root)
        quota = cpu_quota_limit(dirs, self.cgroup_root)
        if quota is not None:
            n = min(n, quota)
            out.append((wall, "", "quota_cores", quota, "gauge"))
        out.append((wall, "", "allowed_cpus", n, "gauge"))
        weight = cpu_weight(dirs, self.cgroup_root)
        if weight is not None:
            out.append((wall, f"{weight.file} {weight.path}", "cpu_weight", weight.value,
                        "gauge"))
        if nices:
            out.append((wall, "", "nice_min", min(nices), "gauge"))
            out.append((wall, "", "nice_max", max(nices), "gauge"))
        out.append((wall, f"affinity {format_cpulist(affinity)}", "affinity_cpus",
                    len(affinity), "gauge"))
        if any_cpuset:
            out.append((wall, f"cpuset {format_cpulist(cpusets)}", "cpuset_cpus",
                        len(cpusets), "gauge"))

    def _engines(self, wall: int, roots: tuple[int, ...], out: list[Emit]) -> None:
        """Each engine's own cgroup: its quota and its throttling (module docstring)."""
        for root in roots:
            dirs = cgroup_dirs(root, self.cgroup_root)
            if not dirs.found:
                continue  # it ended, or its cgroup is not readable
            dev = f"pid{root}"
            quota = cpu_quota_limit(dirs, self.cgroup_root)
            if quota is not None:
                out.append((wall, dev, "engine_quota_cores", quota, "gauge"))
            kv: dict[str, int] = {}
            for path in cpu_stat_files(dirs):
                kv.update(parse_kv(procfs.read_bytes(path, 4096) or b""))
            for key, name, scale in _ENGINE_CPU_STAT:
                if key in kv:
                    out.append((wall, dev, name, kv[key] * scale, "counter"))

    # -- the other processes -------------------------------------------------------------
    def _other_processes(self, wall: int, tree: set[int], out: list[Emit]) -> None:
        try:
            pids = [int(n) for n in os.listdir(procfs.PROC) if n.isdigit()]
        except OSError:
            return
        dt = (wall - self._last_wall) / 1e9 if self._last_wall else 0.0
        skip = tree | self.exclude
        seen: dict[int, _Other] = {}
        ranked: list[tuple[float, int]] = []
        others = self._others
        for pid in pids:
            # The server's tree and the excluded are read too (never ranked): a parent
            # reaps them like any child, and what was read of them must not be counted
            # again in its children_cpu_s.
            o = others.get(pid)
            if o is None:
                o = _Other(PreadFile(f"{procfs.PROC}/{pid}/stat", 1024)
                           if len(others) < MAX_OPEN else None)
            data = o.file.read() if o.file is not None else procfs.read_bytes(
                f"{procfs.PROC}/{pid}/stat", 1024)
            if not data:
                if o.file is not None:
                    o.file.close()
                continue
            try:
                cpu, start, nice, kids, ppid = _stat_fields(data)
            except (IndexError, ValueError):
                continue
            if start != o.start:  # a new process (or a PID reused): no previous reading
                if o.start >= 0:
                    self._reaped(o)
                o.start, o.cpu_s, o.wall, o.device, o.top = start, -1.0, 0, "", False
                o.kids, o.seen, o.weight, o.counted = -1.0, 0.0, None, (-1.0, -1.0)
            seen[pid] = o
            o.ppid, o.nice = ppid, nice
            o.prev_wall, o.prev_cpu, o.prev_kids = o.wall, o.cpu_s, o.kids
            o.wall, o.cpu_s, o.kids_raw = wall, cpu, kids
        for pid, o in others.items():
            if pid not in seen:
                self._reaped(o, seen)
                if o.file is not None:
                    o.file.close()
        for pid, o in seen.items():
            # never stepped back: a child reaped after its parent was read this tick is
            # taken off before its CPU is in the parent's cutime (the next tick has both)
            o.kids = max(o.kids, o.kids_raw - o.seen, 0.0)
            if pid in skip:  # counted as the server's or its path's
                _count(o, o.cpu_s + o.kids)
            elif o.prev_cpu >= 0 and dt > 0:
                ranked.append(((o.cpu_s - o.prev_cpu + o.kids - o.prev_kids) / dt, pid))
        # Ranked by the CPU each could have taken from the server: its cores times the
        # share of its own CPUs that the server may use too (a process pinned to the
        # server's only CPU before a busier one that runs anywhere).
        share: dict[int, float] = {}
        weighted = []
        for cores, pid in ranked:
            if cores >= self.min_cores:
                share[pid] = self._overlap(pid)
                weighted.append((cores * share[pid], cores, pid))
        weighted.sort(reverse=True)
        top = {pid for _w, _c, pid in weighted[: self.top]}
        for pid, o in seen.items():
            if pid in skip:
                continue
            if pid in top or o.top:
                if not o.device:
                    o.device, o.own = self._describe(pid)
                    o.weight = cpu_weight(cgroup_dirs(pid, self.cgroup_root),
                                          self.cgroup_root)
                if not o.top:  # entering the list: its reading of the tick before too
                    if o.prev_wall and o.prev_cpu >= 0:
                        out.append((o.prev_wall, o.device, "cpu_s", o.prev_cpu, "counter"))
                        out.append((o.prev_wall, o.device, "children_cpu_s", o.prev_kids,
                                    "counter"))
                        _count(o, o.prev_cpu + o.prev_kids)
                out.append((wall, o.device, "cpu_s", o.cpu_s, "counter"))
                out.append((wall, o.device, "children_cpu_s", o.kids, "counter"))
                _count(o, o.cpu_s + o.kids)
                out.append((wall, o.device, "strata_own", o.own, "gauge"))
                out.append((wall, o.device, "nice", o.nice, "gauge"))
                if o.weight is not None:
                    out.append((wall, f"pid{pid} {o.weight.file} {o.weight.path}",
                                "cpu_weight", o.weight.value, "gauge"))
                out.append((wall, o.device, "allowed_share",
                            share[pid] if pid in share else self._overlap(pid), "gauge"))
            o.top = pid in top
        self._others = seen
        self._last_wall = wall

    def _reaped(self, child: _Other, live: dict[int, _Other] | None = None) -> None:
        """A process read before has ended, and its parent reaps it: the kernel adds all
        its CPU, its own reaped children's included, to the parent's cutime + cstime.
        What of it was already counted under a name (its own while it was named, its
        descendants' under theirs) is the parent's to take off children_cpu_s."""
        parent = (live if live is not None else self._others).get(child.ppid)
        if parent is not None:
            first, last = child.counted
            parent.seen += child.seen + (last - first if first >= 0 else 0.0)

    def _overlap(self, pid: int) -> float:
        """The share of ``pid``'s CPUs (its main thread's mask) that the server may use
        too; 1.0 where either is unknown."""
        allowed = self._allowed
        if not allowed:
            return 1.0
        try:
            mask = os.sched_getaffinity(pid)
        except OSError:
            return 1.0
        return len(mask & allowed) / len(mask) if mask else 1.0

    def _describe(self, pid: int) -> tuple[str, int]:
        """(device name ``pid<N> <command>``, 1 when it is Strata's own, else 0)."""
        argv = procfs.cmdline_argv(pid) or [""]
        # the program's name without its directory: the words after it say more; another
        # user's secrets in its options hidden (redact_argv)
        cmd = " ".join([os.path.basename(argv[0]), *redact_argv(argv[1:])]).strip()
        if not cmd:  # a kernel thread, or one that just ended: its name
            data = procfs.read_bytes(f"{procfs.PROC}/{pid}/stat", 1024) or b""
            comm = data[data.find(b"(") + 1 : data.rfind(b")")].decode(errors="replace")
            cmd = f"[{comm}]"
        cmd = " ".join(cmd.split())[:COMMAND_CHARS]
        own = 1 if pid in self.own_pids or _OWN_CMD.search(cmd) else 0
        return f"pid{pid} {cmd}", own

    def _say_once(self, key: str, reason: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.mark_unavailable(key, reason)


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory (``registry.py``): the agent's options -> this collector."""
    return AllowanceCollector(targets, exclude=tuple(getattr(args, "path_pid", ()) or ()))

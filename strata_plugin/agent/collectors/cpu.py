"""Host CPU: per-core time, load, pressure stall (PSI) and cgroup CPU throttling.

Everything time-like is emitted as a *counter of seconds* (not a utilisation
fraction): the report divides the delta over any window by the window length,
which is exact for any window and needs no state in the agent.

* per core (device ``cpu<N>``) and host-wide (device ``""``): ``busy_s``
  (user+nice+system+irq+softirq), ``iowait_s``, ``steal_s``, ``idle_s``; the
  host line adds ``user_s``, ``system_s``, ``irq_s``, ``softirq_s``;
* host counters ``ctxt``, ``intr``, ``forks`` (the ``processes`` line: processes and
  threads started since boot, its rate the host's rate of starts); gauges
  ``procs_running``, ``procs_blocked``, ``load1``, ``load5``, ``load15``, ``runnable``
  (from /proc/loadavg);
* PSI (/proc/pressure/*, when present): ``psi_<cpu|io|memory>_<some|full>_s``;
* cgroup (v2 cpu.stat, or the v1 cpu controller's) of the server process
  (``--cgroup server`` / ``pid:<N>``; ``self`` is the agent's own): ``cgroup_usage_s``,
  ``cgroup_user_s``, ``cgroup_system_s``, ``cgroup_nr_periods``,
  ``cgroup_nr_throttled``, ``cgroup_throttled_s``; gauge ``cgroup_quota_cores`` (the
  CFS quota over its period) when a quota is set. See ``agent/cgroups.py``. The server
  can change cgroup while it runs (moved into a slice, restarted in a container): with
  ``--cgroup server`` its ``/proc/<pid>/cgroup`` is re-read every sample (one small read)
  and the files are reopened when it changed. The counters restart with the new group;
  the analysis reads a decrease as a reset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import cgroups, procfs
from ..procfs import PreadFile, parse_kv
from .base import Collector, Emit, Unavailable

if TYPE_CHECKING:
    import argparse

    from ..targets import ProcessTargets

_TICK = float(procfs.CLK_TCK)
CGROUP_ROOT = "/sys/fs/cgroup"


def cgroup_cpu_stat_files(pid: int | str = "self", root: str = CGROUP_ROOT) -> list[str]:
    """cpu.stat files that describe ``pid``'s cgroup: the v2 one and/or the v1 cpu controller's."""
    return cgroups.cpu_stat_files(cgroups.cgroup_dirs(pid, root))


def _psi(data: bytes) -> dict[str, float]:
    """{"some": seconds, "full": seconds} from a pressure file (total= is in µs)."""
    out = {}
    for line in data.split(b"\n"):
        if not line:
            continue
        kind, _, rest = line.partition(b" ")
        i = rest.find(b"total=")
        if i >= 0:
            out[kind.decode()] = int(rest[i + 6 :].split()[0]) / 1e6
    return out


class CpuCollector(Collector):
    source = "cpu"

    def __init__(
        self,
        cgroup: str = "self",
        per_core: bool = True,
        proc_root: str | None = None,
        targets=None,
    ) -> None:
        super().__init__()
        self.cgroup = cgroup
        self.targets = targets  # ProcessTargets, for --cgroup server
        self._cg_dirs = cgroups.CgroupDirs()
        self.per_core = per_core
        # proc_root lets tests and the cost benchmark read a saved /proc (e.g. a 192-core stat)
        self.proc_root = proc_root or procfs.PROC
        self._stat = PreadFile(f"{self.proc_root}/stat", 1 << 16)
        self._loadavg = PreadFile(f"{self.proc_root}/loadavg", 256)
        self._psi: dict[str, PreadFile] = {}
        self._cg: list[PreadFile] = []
        self._cg_pid: int | None = None  # the server process whose cgroup is read
        self._cg_lines: tuple[str, ...] = ()

    def probe(self) -> None:
        if not self._stat.ok:
            raise Unavailable(f"/proc/stat unreadable: {self._stat.error}")
        for res in ("cpu", "io", "memory"):
            f = PreadFile(f"{self.proc_root}/pressure/{res}", 512)
            if f.ok and f.read() is not None:
                self._psi[res] = f
            else:
                self.mark_unavailable(f"psi_{res}", f"{f.path}: {f.error or 'empty'}")
        self._cg_pid = server_pid(self.targets) if self.cgroup == "server" else None
        what = self._open_cgroup()
        seen: dict[str, int] = {}
        for f in self._cg:
            seen.update(parse_kv(f.read() or b""))
        if not self._cg:
            self.mark_unavailable(
                "cgroup", f"no readable cgroup cpu.stat for {self.cgroup!r} ({what})"
            )
        elif "nr_throttled" not in seen:
            self.mark_unavailable(
                "cgroup_nr_throttled",
                "cgroup cpu.stat has no nr_throttled (cpu controller not enabled)",
            )
        self.info(
            kind="cgroup",
            source=self.source,
            cgroup=what,
            files=[f.path for f in self._cg],
            quota_cores=cgroups.cpu_quota_cores(self._cg_dirs),
        )

    def _open_cgroup(self) -> str:
        """(Re)open the cpu.stat of the cgroup ``--cgroup`` names; its description."""
        for f in self._cg:
            f.close()
        self._cg = []
        self._cg_dirs, what = cgroups.resolve(self.cgroup, self._cg_pid)
        self._cg_lines = self._cg_dirs.lines
        for path in cgroups.cpu_stat_files(self._cg_dirs):
            f = PreadFile(path, 4096)
            if f.ok:
                self._cg.append(f)
        return what

    def _follow_server_cgroup(self) -> None:
        """Reopen the files when the tracked server moved to another cgroup (or was
        replaced by a new process, which the harness's track command announces)."""
        if self.cgroup != "server":
            return
        pid = self._cg_pid
        roots = getattr(self.targets, "roots", ()) or getattr(self.targets, "pids", ())
        if roots and roots[0] != pid:
            pid = roots[0]
        if pid is None:
            return
        data = procfs.read_bytes(f"{procfs.PROC}/{pid}/cgroup")
        if data is None:
            return  # gone: keep reading the last group until the harness says otherwise
        lines = tuple(data.decode(errors="replace").splitlines())
        if pid != self._cg_pid or lines != self._cg_lines:
            self._cg_pid = pid
            what = self._open_cgroup()
            self.info(kind="cgroup", source=self.source, cgroup=what, moved=True,
                      files=[f.path for f in self._cg],
                      quota_cores=cgroups.cpu_quota_cores(self._cg_dirs))

    def close(self) -> None:
        for f in [self._stat, self._loadavg, *self._psi.values(), *self._cg]:
            f.close()

    def sample(self, wall_ns: int) -> list[Emit]:
        out: list[Emit] = []
        data = self._stat.read()
        if data is None:
            raise OSError(f"/proc/stat: {self._stat.error}")
        for line in data.split(b"\n"):
            if line.startswith(b"cpu"):
                f = line.split()
                name = f[0].decode()
                user, nice, system, idle, iowait, irq, softirq = map(int, f[1:8])
                steal = int(f[8]) if len(f) > 8 else 0
                busy = (user + nice + system + irq + softirq) / _TICK
                if name == "cpu":
                    dev = ""
                    out.append((wall_ns, dev, "user_s", (user + nice) / _TICK, "counter"))
                    out.append((wall_ns, dev, "system_s", system / _TICK, "counter"))
                    out.append((wall_ns, dev, "irq_s", irq / _TICK, "counter"))
                    out.append((wall_ns, dev, "softirq_s", softirq / _TICK, "counter"))
                elif not self.per_core:
                    continue
                else:
                    dev = name
                out.append((wall_ns, dev, "busy_s", busy, "counter"))
                out.append((wall_ns, dev, "iowait_s", iowait / _TICK, "counter"))
                out.append((wall_ns, dev, "steal_s", steal / _TICK, "counter"))
                out.append((wall_ns, dev, "idle_s", idle / _TICK, "counter"))
            elif line.startswith(b"ctxt ") or line.startswith(b"intr "):
                key, val = line.split(None, 2)[:2]
                out.append((wall_ns, "", key.decode(), int(val), "counter"))
            elif line.startswith(b"processes "):
                out.append((wall_ns, "", "forks", int(line.split()[1]), "counter"))
            elif line.startswith(b"procs_"):
                key, val = line.split()
                out.append((wall_ns, "", key.decode(), int(val), "gauge"))
        la = self._loadavg.read()
        if la:
            f = la.split()
            out.append((wall_ns, "", "load1", float(f[0]), "gauge"))
            out.append((wall_ns, "", "load5", float(f[1]), "gauge"))
            out.append((wall_ns, "", "load15", float(f[2]), "gauge"))
            out.append((wall_ns, "", "runnable", int(f[3].split(b"/")[0]), "gauge"))
        for res, pf in self._psi.items():
            d = pf.read()
            if d:
                for kind, secs in _psi(d).items():
                    out.append((wall_ns, "", f"psi_{res}_{kind}_s", secs, "counter"))
        self._follow_server_cgroup()
        if self._cg:
            kv: dict[str, int] = {}
            for pf in self._cg:
                kv.update(parse_kv(pf.read() or b""))
            for cg_key, name, scale in (
                ("usage_usec", "cgroup_usage_s", 1e-6),
                ("user_usec", "cgroup_user_s", 1e-6),
                ("system_usec", "cgroup_system_s", 1e-6),
                ("nr_periods", "cgroup_nr_periods", 1),
                ("nr_throttled", "cgroup_nr_throttled", 1),
                ("throttled_usec", "cgroup_throttled_s", 1e-6),
                ("throttled_time", "cgroup_throttled_s", 1e-9),  # cgroup v1, ns
            ):
                if cg_key in kv:
                    cg_val = kv[cg_key] * scale if scale != 1 else kv[cg_key]
                    out.append((wall_ns, "", name, cg_val, "counter"))
            quota = cgroups.cpu_quota_cores(self._cg_dirs)
            if quota is not None:
                out.append((wall_ns, "", "cgroup_quota_cores", quota, "gauge"))
        return out


def server_pid(targets) -> int | None:
    """The first process the agent tracks (for ``--cgroup server``), or None."""
    if targets is None:
        return None
    try:
        targets.refresh(force=True)
    except Exception:
        return None
    roots = getattr(targets, "roots", ()) or getattr(targets, "pids", ())
    return roots[0] if roots else None


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory (``registry.py``): the agent's options -> this collector."""
    return CpuCollector(cgroup=args.cgroup, targets=targets)

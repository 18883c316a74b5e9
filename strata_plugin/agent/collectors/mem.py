"""Host memory from /proc/meminfo (gauges, bytes) and paging from /proc/vmstat (counters).

MemAvailable rather than MemFree is the "could still be allocated" figure;
Cached and Mlocked say how much of it is page cache a weight file lives in or
memory pinned by the server.

The server's own cgroup (``--cgroup``, as for the cpu collector) adds its memory
limit and usage (gauges ``cgroup_mem_limit_bytes``, only when a limit is set, and
``cgroup_mem_usage_bytes``) and the times it hit the limit or was OOM-killed
(counters ``cgroup_mem_max_events``, ``cgroup_mem_oom_kills``): a server limited by its
container runs short of memory while the host's MemAvailable stays high.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import cgroups, procfs
from ..procfs import PreadFile
from .base import Collector, Emit, Unavailable

if TYPE_CHECKING:
    import argparse

    from ..targets import ProcessTargets

MEMINFO = {
    b"MemTotal": "mem_total_bytes",
    b"MemFree": "mem_free_bytes",
    b"MemAvailable": "mem_available_bytes",
    b"Buffers": "buffers_bytes",
    b"Cached": "cached_bytes",
    b"SwapCached": "swap_cached_bytes",
    b"Mlocked": "mlocked_bytes",
    b"Dirty": "dirty_bytes",
    b"Writeback": "writeback_bytes",
    b"AnonPages": "anon_bytes",
    b"Shmem": "shmem_bytes",
    b"SwapTotal": "swap_total_bytes",
    b"SwapFree": "swap_free_bytes",
    b"HugePages_Total": "hugepages_total",
    b"HugePages_Free": "hugepages_free",
}
VMSTAT = {
    b"pgmajfault": "pgmajfault",
    b"pgfault": "pgfault",
    b"pswpin": "pswpin",
    b"pswpout": "pswpout",
    b"pgpgin": "pgpgin_kib",
    b"pgpgout": "pgpgout_kib",
}


class MemCollector(Collector):
    source = "mem"

    def __init__(self, cgroup: str = "none", targets=None) -> None:
        super().__init__()
        self._meminfo = PreadFile(f"{procfs.PROC}/meminfo", 1 << 14)
        self._vmstat = PreadFile(f"{procfs.PROC}/vmstat", 1 << 16)
        self.cgroup = cgroup
        self.targets = targets
        self._cg_dirs = cgroups.CgroupDirs()

    def probe(self) -> None:
        if not self._meminfo.ok:
            raise Unavailable(f"/proc/meminfo unreadable: {self._meminfo.error}")
        if not self._vmstat.ok:
            self.mark_unavailable("vmstat", f"/proc/vmstat unreadable: {self._vmstat.error}")
        from .cpu import server_pid

        self._cg_dirs, what = cgroups.resolve(self.cgroup, server_pid(self.targets))
        found = cgroups.memory_values(self._cg_dirs)
        if not found:
            self.mark_unavailable("cgroup", f"no cgroup memory files for {self.cgroup!r} ({what})")
        self.info(kind="cgroup_memory", source=self.source, cgroup=what, metrics=sorted(found))

    def close(self) -> None:
        self._meminfo.close()
        self._vmstat.close()

    def sample(self, wall_ns: int) -> list[Emit]:
        out: list[Emit] = []
        data = self._meminfo.read()
        if data is None:
            raise OSError(f"/proc/meminfo: {self._meminfo.error}")
        for line in data.split(b"\n"):
            key, _, rest = line.partition(b":")
            name = MEMINFO.get(key)
            if name:
                f = rest.split()
                val = int(f[0]) * (1024 if len(f) > 1 and f[1] == b"kB" else 1)
                out.append((wall_ns, "", name, val, "gauge"))
        vm = self._vmstat.read()
        if vm:
            for line in vm.split(b"\n"):
                key, _, count = line.partition(b" ")
                name = VMSTAT.get(key)
                if name:
                    out.append((wall_ns, "", name, int(count), "counter"))
        if self._cg_dirs.found:
            for name, (cg_val, kind) in cgroups.memory_values(self._cg_dirs).items():
                out.append((wall_ns, "", name, cg_val, kind))
        return out


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory (``registry.py``): the agent's options -> this collector."""
    return MemCollector(cgroup=args.cgroup, targets=targets)

"""NUMA nodes and where the server may run.

Per node (device ``node<N>``) from /sys/devices/system/node: gauges
``mem_total_bytes``, ``mem_free_bytes``, ``mem_used_bytes``, ``file_pages_bytes``,
``anon_pages_bytes``; counters ``numa_hit``, ``numa_miss``, ``numa_foreign``,
``local_node``, ``other_node`` (a rising miss/other_node share means memory
allocated away from the CPU using it).
Per server root process (device ``pid<N>``): gauge ``affinity_ncpus`` (size of
its CPU affinity mask); the mask itself goes out as an ``info`` line whenever it
changes.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..procfs import PreadFile
from ..targets import ProcessTargets
from .base import Collector, Emit, Unavailable

if TYPE_CHECKING:
    import argparse

NODE_ROOT = "/sys/devices/system/node"
MEMINFO = {
    b"MemTotal": "mem_total_bytes",
    b"MemFree": "mem_free_bytes",
    b"MemUsed": "mem_used_bytes",
    b"FilePages": "file_pages_bytes",
    b"AnonPages": "anon_pages_bytes",
}
NUMASTAT = {b"numa_hit", b"numa_miss", b"numa_foreign", b"local_node", b"other_node"}


def cpulist(cpus: set[int]) -> str:
    """{0,1,2,5} -> "0-2,5"."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


class NumaCollector(Collector):
    source = "numa"
    follows_targets = True

    def __init__(self, targets: ProcessTargets | None = None, root: str = NODE_ROOT) -> None:
        super().__init__()
        self.targets = targets
        self.root = root
        self._nodes: list[tuple[str, PreadFile, PreadFile]] = []
        self._affinity: dict[int, frozenset[int]] = {}

    def probe(self) -> None:
        try:
            names = sorted(
                n for n in os.listdir(self.root) if n.startswith("node") and n[4:].isdigit()
            )
        except OSError as e:
            raise Unavailable(f"{self.root}: {e.strerror or e}") from None
        if not names:
            raise Unavailable(f"no NUMA nodes under {self.root}")
        layout = {}
        for n in names:
            d = os.path.join(self.root, n)
            self._nodes.append(
                (n, PreadFile(d + "/meminfo", 8192), PreadFile(d + "/numastat", 1024))
            )
            try:
                with open(d + "/cpulist") as fh:
                    layout[n] = fh.read().strip()
            except OSError:
                layout[n] = ""
        self.info(kind="numa", source=self.source, nodes=layout)
        if self.targets is None or not self.targets.configured:
            self.mark_unavailable("affinity_ncpus", "no server process given")

    def close(self) -> None:
        for _, a, b in self._nodes:
            a.close()
            b.close()

    def sample(self, wall_ns: int) -> list[Emit]:
        out: list[Emit] = []
        for name, meminfo, numastat in self._nodes:
            data = meminfo.read()
            if data:
                for line in data.split(b"\n"):
                    # "Node 0 MemTotal:       5728472 kB"
                    f = line.split()
                    if len(f) >= 4:
                        metric = MEMINFO.get(f[2].rstrip(b":"))
                        if metric:
                            scale = 1024 if len(f) > 4 and f[4] == b"kB" else 1
                            out.append((wall_ns, name, metric, int(f[3]) * scale, "gauge"))
            stat = numastat.read()
            if stat:
                for line in stat.split(b"\n"):
                    key, _, val = line.partition(b" ")
                    if key in NUMASTAT:
                        out.append((wall_ns, name, key.decode(), int(val), "counter"))
        if self.targets is not None and self.targets.configured:
            self.targets.refresh()
            for pid in self.targets.roots:
                try:
                    cpus = frozenset(os.sched_getaffinity(pid))
                except OSError:
                    continue
                if self._affinity.get(pid) != cpus:
                    self._affinity[pid] = cpus
                    self.info(
                        kind="affinity",
                        source=self.source,
                        device=f"pid{pid}",
                        cpus=cpulist(set(cpus)),
                    )
                out.append((wall_ns, f"pid{pid}", "affinity_ncpus", len(cpus), "gauge"))
        return out


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory (``registry.py``): the agent's options -> this collector."""
    return NumaCollector(targets)

"""Block devices from /proc/diskstats: bytes, operations and busy time per whole disk.

Only whole disks (names present in /sys/block) are kept, minus loop and ram
devices: partitions would double-count their disk. Counters per device:
``read_bytes``, ``write_bytes`` (sectors are always 512 B here), ``reads``,
``writes``, ``read_time_s``, ``write_time_s``, ``busy_s`` (io_ticks:
utilisation = Δbusy_s / Δt), ``weighted_io_s`` (Δ/Δt = average queue depth);
gauge ``in_flight``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .. import procfs
from ..procfs import PreadFile
from .base import Collector, Emit, Unavailable

if TYPE_CHECKING:
    import argparse

    from ..targets import ProcessTargets

SYS_BLOCK = "/sys/block"


class DiskCollector(Collector):
    source = "disk"

    def __init__(self, include_virtual: bool = False) -> None:
        super().__init__()
        self.include_virtual = include_virtual
        self._file = PreadFile(f"{procfs.PROC}/diskstats", 1 << 16)
        self._disks: set[bytes] = set()

    def probe(self) -> None:
        if not self._file.ok:
            raise Unavailable(f"/proc/diskstats unreadable: {self._file.error}")
        try:
            names = os.listdir(SYS_BLOCK)
        except OSError:
            names = []
        for n in names:
            if not self.include_virtual and n.startswith(("loop", "ram")):
                continue
            self._disks.add(n.encode())
        if not self._disks:
            raise Unavailable("no block devices in /sys/block")

    def close(self) -> None:
        self._file.close()

    def sample(self, wall_ns: int) -> list[Emit]:
        out: list[Emit] = []
        data = self._file.read()
        if data is None:
            raise OSError(f"/proc/diskstats: {self._file.error}")
        for line in data.split(b"\n"):
            f = line.split()
            if len(f) < 14 or f[2] not in self._disks:
                continue
            dev = f[2].decode()
            reads, _rm, rsect, rms, writes, _wm, wsect, wms, inflight, io_ms, wio_ms = (
                int(x) for x in f[3:14]
            )
            out.append((wall_ns, dev, "read_bytes", rsect * 512, "counter"))
            out.append((wall_ns, dev, "write_bytes", wsect * 512, "counter"))
            out.append((wall_ns, dev, "reads", reads, "counter"))
            out.append((wall_ns, dev, "writes", writes, "counter"))
            out.append((wall_ns, dev, "read_time_s", rms / 1e3, "counter"))
            out.append((wall_ns, dev, "write_time_s", wms / 1e3, "counter"))
            out.append((wall_ns, dev, "busy_s", io_ms / 1e3, "counter"))
            out.append((wall_ns, dev, "weighted_io_s", wio_ms / 1e3, "counter"))
            out.append((wall_ns, dev, "in_flight", inflight, "gauge"))
        return out


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory (``registry.py``): the agent's options -> this collector."""
    return DiskCollector()

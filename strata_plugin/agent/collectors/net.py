"""Network interfaces from /proc/net/dev (counters per interface).

RDMA (RoCE/InfiniBand) traffic bypasses the kernel and never shows here; see
the ``rdma`` collector. Bytes growing here during a multi-node run mean NCCL
fell back to sockets. ``lo`` is kept: it carries the local client's HTTP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import procfs
from ..procfs import PreadFile
from .base import Collector, Emit, Unavailable

if TYPE_CHECKING:
    import argparse

    from ..targets import ProcessTargets

# /proc/net/dev columns after "iface:": 8 receive then 8 transmit fields.
_FIELDS = (
    (0, "rx_bytes"),
    (1, "rx_packets"),
    (2, "rx_errs"),
    (3, "rx_drop"),
    (8, "tx_bytes"),
    (9, "tx_packets"),
    (10, "tx_errs"),
    (11, "tx_drop"),
)


class NetCollector(Collector):
    source = "net"

    def __init__(self, sys_class_net: str = "/sys/class/net") -> None:
        super().__init__()
        self._file = PreadFile(f"{procfs.PROC}/net/dev", 1 << 16)
        self._sys = sys_class_net
        self._speed: dict[str, int | None] = {}  # read once per interface

    def _link_speed_mbps(self, dev: str) -> int | None:
        """The negotiated link rate from sysfs; None for interfaces without one (lo)."""
        if dev not in self._speed:
            try:
                with open(f"{self._sys}/{dev}/speed") as fh:
                    value = int(fh.read().strip())
                self._speed[dev] = value if value > 0 else None
            except (OSError, ValueError):
                self._speed[dev] = None
        return self._speed[dev]

    def probe(self) -> None:
        if not self._file.ok:
            raise Unavailable(f"/proc/net/dev unreadable: {self._file.error}")

    def close(self) -> None:
        self._file.close()

    def sample(self, wall_ns: int) -> list[Emit]:
        out: list[Emit] = []
        data = self._file.read()
        if data is None:
            raise OSError(f"/proc/net/dev: {self._file.error}")
        for line in data.split(b"\n")[2:]:
            name, sep, rest = line.partition(b":")
            if not sep:
                continue
            dev = name.strip().decode()
            f = rest.split()
            for i, metric in _FIELDS:
                out.append((wall_ns, dev, metric, int(f[i]), "counter"))
            speed = self._link_speed_mbps(dev)
            if speed is not None:
                out.append((wall_ns, dev, "link_speed_mbps", speed, "gauge"))
        return out


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory (``registry.py``): the agent's options -> this collector."""
    return NetCollector()

"""RDMA ports from sysfs: traffic, congestion and retransmit counters per device/port (a rail).

Reads ``<root>/<ibdev>/ports/<n>/counters/*`` (IB PortCounters) and
``.../hw_counters/*`` (driver counters, e.g. mlx5), device ``<ibdev>/<port>``.
``port_xmit_data`` and ``port_rcv_data`` count 4-byte words: they are emitted
as ``xmit_bytes`` / ``rcv_bytes`` already multiplied by 4. Every other counter
keeps its sysfs name (``np_cnp_sent``, ``rp_cnp_handled``,
``np_ecn_marked_roce_packets``, ``local_ack_timeout_err``, ``out_of_sequence``,
``port_xmit_wait``...). Gauges: ``rate_gbps`` and ``state`` (4 = ACTIVE).
The root is configurable (``--ib-root``) so tests can point it at saved files.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..procfs import PreadFile
from .base import Collector, Emit, Unavailable

if TYPE_CHECKING:
    import argparse

    from ..targets import ProcessTargets

IB_ROOT = "/sys/class/infiniband"
WORD_COUNTERS = {"port_xmit_data": "xmit_bytes", "port_rcv_data": "rcv_bytes"}
#: hw_counters entries that are settings, not counters.
NOT_COUNTERS = {"lifespan"}


def parse_rate_gbps(text: str) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` -> 400.0."""
    parts = text.split()
    try:
        return float(parts[0])
    except (IndexError, ValueError):
        return None


class RdmaCollector(Collector):
    source = "rdma"

    def __init__(self, root: str = IB_ROOT) -> None:
        super().__init__()
        self.root = root
        # (device label, metric, scale, file)
        self._counters: list[tuple[str, str, int, PreadFile]] = []
        self._gauges: list[tuple[str, str, PreadFile]] = []

    def probe(self) -> None:
        try:
            devs = sorted(os.listdir(self.root))
        except OSError as e:
            raise Unavailable(f"no RDMA devices: {self.root}: {e.strerror or e}") from None
        if not devs:
            raise Unavailable(f"no RDMA devices under {self.root}")
        for dev in devs:
            ports_dir = os.path.join(self.root, dev, "ports")
            try:
                ports = sorted(os.listdir(ports_dir), key=lambda p: int(p) if p.isdigit() else 0)
            except OSError:
                continue
            for port in ports:
                label = f"{dev}/{port}"
                pdir = os.path.join(ports_dir, port)
                for sub in ("counters", "hw_counters"):
                    cdir = os.path.join(pdir, sub)
                    try:
                        names = sorted(os.listdir(cdir))
                    except OSError:
                        if sub == "hw_counters":
                            self.mark_unavailable(
                                f"{label}/hw_counters", f"{cdir} absent (driver exposes none)"
                            )
                        continue
                    for name in names:
                        if name in NOT_COUNTERS:
                            continue
                        f = PreadFile(os.path.join(cdir, name), 64)
                        if not f.ok or f.read() is None:
                            self.mark_unavailable(f"{label}/{name}", f"{f.path}: {f.error}")
                            f.close()
                            continue
                        if sub == "counters" and name in WORD_COUNTERS:
                            self._counters.append((label, WORD_COUNTERS[name], 4, f))
                        else:
                            self._counters.append((label, name, 1, f))
                for name in ("rate", "state"):
                    f = PreadFile(os.path.join(pdir, name), 128)
                    if f.ok:
                        self._gauges.append((label, name, f))
                link_layer = _read_text(os.path.join(pdir, "link_layer"))
                self.info(
                    kind="device",
                    source=self.source,
                    device=label,
                    link_layer=link_layer,
                    rate=_read_text(os.path.join(pdir, "rate")),
                )
        if not self._counters:
            raise Unavailable(f"no readable RDMA port counters under {self.root}")

    def close(self) -> None:
        for *_, f in self._counters:
            f.close()
        for *_, f in self._gauges:
            f.close()

    def sample(self, wall_ns: int) -> list[Emit]:
        out: list[Emit] = []
        for label, metric, scale, f in self._counters:
            data = f.read()
            if data is None:
                self.mark_unavailable(f"{label}/{metric}", f"{f.path}: {f.error}")
                continue
            try:
                out.append((wall_ns, label, metric, int(data) * scale, "counter"))
            except ValueError:
                self.mark_unavailable(f"{label}/{metric}", f"not a number: {data[:40]!r}")
        for label, name, f in self._gauges:
            data = f.read()
            if not data:
                continue
            text = data.decode(errors="replace").strip()
            if name == "rate":
                val = parse_rate_gbps(text)
                if val is not None:
                    out.append((wall_ns, label, "rate_gbps", val, "gauge"))
            else:  # "4: ACTIVE"
                head = text.split(":")[0]
                if head.isdigit():
                    out.append((wall_ns, label, "state", int(head), "gauge"))
        return out


def _read_text(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory (``registry.py``): the agent's options -> this collector."""
    return RdmaCollector(root=args.ib_root)

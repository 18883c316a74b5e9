"""``ss -ti`` samples of the server's port -> per-connection RTT, retransmits, queues.

Why: settles "the network path" against "the server" for the connections that carried
the benchmark: a path that delays or drops shows a long smoothed RTT and retransmitted
segments; a server that is slow to produce shows neither (its sockets sit idle with
short RTTs and empty send queues). Reads the file ``run/socket_sampler.py`` writes: a
``# t_ns=<monotonic ns>`` line, then one line per established socket
(``Recv-Q Send-Q Local Peer`` then ``key:value`` TCP info tokens).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from strata_plugin.analysis.stats import percentiles

NEEDS = ("ss (iproute2)",)
_RTT = re.compile(r"\brtt:([\d.]+)/([\d.]+)")
_RETRANS = re.compile(r"\bretrans:(\d+)/(\d+)")
_LOST = re.compile(r"\blost:(\d+)")


@dataclass(frozen=True)
class SocketReport:
    window_s: float
    samples: int
    connections: int  # distinct (local, peer) pairs seen
    rtt_p50_ms: float | None  # over every socket sample in the window
    rtt_p99_ms: float | None
    retransmits: int  # segments retransmitted, summed over connections (max per conn)
    lost: int
    max_send_q: int
    max_recv_q: int

    @property
    def retrans_per_s(self) -> float:
        return self.retransmits / self.window_s if self.window_s > 0 else 0.0

    def table(self) -> list[dict[str, Any]]:
        return [{"connections": self.connections, "samples": self.samples,
                 "rtt_p50_ms": self.rtt_p50_ms, "rtt_p99_ms": self.rtt_p99_ms,
                 "retransmits": self.retransmits, "lost": self.lost,
                 "max_send_q": self.max_send_q, "max_recv_q": self.max_recv_q}]


def read(lines: Iterable[str], window_ns: tuple[int, int]) -> SocketReport:
    """The samples taken inside ``window_ns`` (monotonic ns)."""
    w0, w1 = window_ns
    t: int | None = None
    samples = 0
    rtts: list[float] = []
    retrans: dict[tuple[str, str], int] = {}
    lost: dict[tuple[str, str], int] = {}
    send_q = recv_q = 0
    for line in lines:
        if line.startswith("# t_ns="):
            t = int(line.split("=", 1)[1])
            samples += w0 <= t <= w1
            continue
        if t is None or not (w0 <= t <= w1):
            continue
        parts = line.split()
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        key = (parts[2], parts[3])
        recv_q, send_q = max(recv_q, int(parts[0])), max(send_q, int(parts[1]))
        m = _RTT.search(line)
        if m:
            rtts.append(float(m.group(1)))
        m = _RETRANS.search(line)
        if m:
            retrans[key] = max(retrans.get(key, 0), int(m.group(2)))
        m = _LOST.search(line)
        if m:
            lost[key] = max(lost.get(key, 0), int(m.group(1)))
        retrans.setdefault(key, retrans.get(key, 0))
    p50, p99 = percentiles(rtts, (50, 99)) if rtts else (None, None)
    return SocketReport((w1 - w0) / 1e9, samples, len(retrans), p50, p99,
                        sum(retrans.values()), sum(lost.values()), send_q, recv_q)

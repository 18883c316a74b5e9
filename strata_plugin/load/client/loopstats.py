"""What the loop measures about itself: how late it runs, and how much waits unread.

Two figures that a client's stamps cannot show by themselves. A stamp is taken
when a read returns, so bytes that waited in the socket because the loop was
busy elsewhere are stamped late, and the stamps alone look fine. The loop
therefore samples (1) its own lag: how late a periodic timer fires, as
event-loop-lag monitors do; a byte that arrives while the loop is busy waits
about that long; and (2) the bytes already waiting in a socket when it is read
(FIONREAD / SIOCINQ): a loop that keeps up finds only what just arrived.
Samples are merged across worker processes (same CLOCK_MONOTONIC, plain sums).
"""

from __future__ import annotations

from dataclasses import dataclass

from strata_plugin.analysis.stats import percentile

#: How often the loop's lag probe fires (and so how many samples a run gets).
PROBE_S = 0.005


@dataclass(frozen=True)
class LoopStats:
    lag_ns: tuple[int, ...] = ()  # lateness of each probe firing
    backlog_hist: tuple[int, ...] = ()  # reads by bytes waiting: bucket b = bit_length b
    backlog_max: int = 0  # most bytes found waiting at one read
    reads: int = 0

    def merged(self, other: LoopStats) -> LoopStats:
        n = max(len(self.backlog_hist), len(other.backlog_hist))
        a = self.backlog_hist + (0,) * (n - len(self.backlog_hist))
        b = other.backlog_hist + (0,) * (n - len(other.backlog_hist))
        return LoopStats(
            self.lag_ns + other.lag_ns,
            tuple(x + y for x, y in zip(a, b, strict=True)),
            max(self.backlog_max, other.backlog_max),
            self.reads + other.reads,
        )

    def lag_p99_ms(self) -> float:
        return percentile([x / 1e6 for x in self.lag_ns], 99) if self.lag_ns else 0.0

    def lag_max_ms(self) -> float:
        return max(self.lag_ns, default=0) / 1e6

    def backlog_p99_bytes(self) -> int:
        """Upper bound of the 99th percentile of bytes waiting at a read (power-of-2 buckets)."""
        total = sum(self.backlog_hist)
        if not total:
            return 0
        need, seen = 0.99 * total, 0
        for b, n in enumerate(self.backlog_hist):
            seen += n
            if seen >= need:
                return (1 << b) - 1 if b else 0
        return self.backlog_max


class LoopProbe:
    """Collects samples in the loop thread; ``take`` hands them over and starts afresh."""

    __slots__ = ("hist", "lag", "max", "reads")

    def __init__(self) -> None:
        self.lag: list[int] = []
        self.hist = [0] * 33
        self.max = 0
        self.reads = 0

    def backlog(self, n: int) -> None:
        self.hist[min(32, n.bit_length())] += 1
        self.reads += 1
        if n > self.max:
            self.max = n

    def take(self) -> LoopStats:
        lag, hist, mx, reads = self.lag, self.hist, self.max, self.reads
        self.lag, self.hist, self.max, self.reads = [], [0] * 33, 0, 0
        while hist and not hist[-1]:
            hist.pop()
        return LoopStats(tuple(lag), tuple(hist), mx, reads)

"""What the loop measures about itself: how late it runs, and how much waits unread.

Two figures that a client's stamps cannot show by themselves. A stamp is taken
when a read returns, so bytes that waited in the socket because the loop was
busy elsewhere are stamped late, and the stamps alone look fine. The loop
therefore samples (1) its own lag: how late a periodic timer fires, as
event-loop-lag monitors do; a byte that arrives while the loop is busy waits
about that long. Each sample is split in two: the late wake-up from ``select``
(the thread was runnable but the host did not run it: other tenants) and the
rest, the loop's own work (parsing other streams); and (2) the bytes already
waiting in a socket when it is read (FIONREAD / SIOCINQ): a loop that keeps up
finds only what just arrived (asked at one read in 8: the ioctl is a syscall).
Samples are merged across worker processes (same CLOCK_MONOTONIC, plain sums).
"""

from __future__ import annotations

from dataclasses import dataclass

from strata_plugin.analysis.stats import percentile

#: How often the loop's lag probe fires while requests are in flight: 50 samples a
#: second. Each firing that wakes an idle loop costs it 10-30 us (two syscalls on this
#: host), a fixed cost per second that at low token rates (C=4 against one
#: llama-server: ~100 events/s) was a fifth of the loop's CPU per event at 100 Hz.
PROBE_S = 0.02


@dataclass(frozen=True)
class LoopStats:
    lag_ns: tuple[int, ...] = ()  # lateness of each probe firing
    own_ns: tuple[int, ...] = ()  # the part of each that the loop's own work caused
    backlog_hist: tuple[int, ...] = ()  # reads by bytes waiting: bucket b = bit_length b
    backlog_max: int = 0  # most bytes found waiting at one read
    reads: int = 0

    def merged(self, other: LoopStats) -> LoopStats:
        n = max(len(self.backlog_hist), len(other.backlog_hist))
        a = self.backlog_hist + (0,) * (n - len(self.backlog_hist))
        b = other.backlog_hist + (0,) * (n - len(other.backlog_hist))
        return LoopStats(
            self.lag_ns + other.lag_ns,
            self.own_ns + other.own_ns,
            tuple(x + y for x, y in zip(a, b, strict=True)),
            max(self.backlog_max, other.backlog_max),
            self.reads + other.reads,
        )

    def lag_p99_ms(self) -> float:
        return percentile([x / 1e6 for x in self.lag_ns], 99) if self.lag_ns else 0.0

    def own_p99_ms(self) -> float:
        return percentile([x / 1e6 for x in self.own_ns], 99) if self.own_ns else 0.0

    def own_over_frac(self, ms: float) -> float:
        """Share of the probes whose own part was over ``ms``: how often, not how much."""
        if not self.own_ns:
            return 0.0
        cut = ms * 1e6
        return sum(x > cut for x in self.own_ns) / len(self.own_ns)

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
                return min((1 << b) - 1, self.backlog_max) if b else 0
        return self.backlog_max


class LoopProbe:
    """Collects samples in the loop thread; ``take`` hands them over and starts afresh."""

    __slots__ = ("hist", "lag", "max", "own", "reads")

    def __init__(self) -> None:
        self.lag: list[int] = []
        self.own: list[int] = []
        self.hist = [0] * 33
        self.max = 0
        self.reads = 0

    def sample(self, lag_ns: int, own_ns: int) -> None:
        self.lag.append(lag_ns)
        self.own.append(own_ns)

    def backlog(self, n: int) -> None:
        self.hist[min(32, n.bit_length())] += 1
        self.reads += 1
        if n > self.max:
            self.max = n

    def take(self) -> LoopStats:
        lag, own, hist, mx, reads = self.lag, self.own, self.hist, self.max, self.reads
        self.lag, self.own, self.hist, self.max, self.reads = [], [], [0] * 33, 0, 0
        while hist and not hist[-1]:
            hist.pop()
        return LoopStats(tuple(lag), tuple(own), tuple(hist), mx, reads)

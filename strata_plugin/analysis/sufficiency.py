"""Is a percentile supported by the number of requests it rests on?

A p99 from 40 requests is close to the maximum of 40 draws, and says little about
the 99th percentile of the server. The test here is distribution-free, from order
statistics, in the spirit of MLPerf LoadGen's early stopping (loadgen/early_stopping.cc
and the "Early stopping" section of the MLPerf Inference rules): among ``n`` independent
requests, the number that fall below the true q-quantile is Binomial(n, q), so the
j-th smallest value is at or above that quantile with probability
``P(Binomial(n, q) <= j - 1)``. The percentile is *supported* at confidence ``c``
when some order statistic of the sample is such an upper bound, i.e. when
``P(Binomial(n, q) <= n - 1) = 1 - q**n >= c``: ``n >= ln(1 - c) / ln(q)``.

At LoadGen's 99% confidence that is 7 requests for p50, 44 for p90, 90 for p95 and
459 for p99 (LoadGen's figure for p99 with no over-latency query). The lower bound is
the mirror image; each bound is one-sided at ``c``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: LoadGen's early-stopping confidence.
SUPPORT_CONFIDENCE = 0.99
#: The percentiles the report shows (analysis/stats.py DISTRIBUTION_QUANTILES).
REPORTED_PERCENTILES = (50.0, 90.0, 95.0, 99.0)
#: The request metrics whose percentiles the report and the CI files show.
SUFFICIENCY_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")
#: Distributions whose values are one per request (independent draws); chunk gaps are
#: many per stream and not independent, so their percentiles are never marked.
PER_REQUEST_DISTRIBUTIONS = ("ttft", "ttfo", "ttfb", "tpot", "e2e", "queue")


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k), summed in log space (n in the tens of thousands is fine)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                          + i * lp + (n - i) * lq)
    return min(total, 1.0)


def min_count(q_pct: float, confidence: float = SUPPORT_CONFIDENCE) -> int:
    """The fewest requests whose maximum bounds the q-th percentile at ``confidence``."""
    q = q_pct / 100.0
    if not 0.0 < q < 1.0 or not 0.0 < confidence < 1.0:
        raise ValueError(f"percentile {q_pct} and confidence {confidence} must be in (0, 100)"
                         " and (0, 1)")
    n = math.ceil(math.log1p(-confidence) / math.log(q))
    while 1.0 - q ** n < confidence:  # float rounding at the boundary
        n += 1
    while n > 1 and 1.0 - q ** (n - 1) >= confidence:
        n -= 1
    return n


def supported(n: int, q_pct: float, confidence: float = SUPPORT_CONFIDENCE) -> bool:
    """Whether ``n`` requests support the q-th percentile (``n >= min_count``)."""
    return n >= min_count(q_pct, confidence)


def percentile_of_stat(stat: str) -> float | None:
    """``p99`` -> 99.0, ``p99.9`` -> 99.9; None for ``mean``, ``max`` and the like."""
    if not stat.startswith("p"):
        return None
    try:
        q = float(stat[1:])
    except ValueError:
        return None
    return q if 0 < q < 100 else None


def upper_rank(n: int, q_pct: float, confidence: float = SUPPORT_CONFIDENCE) -> int | None:
    """Smallest 1-based rank j with P(X_(j) >= q-quantile) >= confidence; None if none."""
    q = q_pct / 100.0
    if n < 1:
        return None
    lo, hi = 1, n
    if binom_cdf(n - 1, n, q) < confidence:
        return None
    while lo < hi:  # P(Bin <= j - 1) grows with j
        mid = (lo + hi) // 2
        if binom_cdf(mid - 1, n, q) >= confidence:
            hi = mid
        else:
            lo = mid + 1
    return lo


def lower_rank(n: int, q_pct: float, confidence: float = SUPPORT_CONFIDENCE) -> int | None:
    """Largest 1-based rank j with P(X_(j) <= q-quantile) >= confidence; None if none."""
    if n < 1:
        return None
    # X_(j) <= quantile  <=>  at least j draws below it: P(Bin(n, q) >= j) >= c.
    q = q_pct / 100.0
    if 1.0 - binom_cdf(0, n, q) < confidence:
        return None
    lo, hi = 1, n
    while lo < hi:  # P(Bin >= j) falls with j
        mid = (lo + hi + 1) // 2
        if 1.0 - binom_cdf(mid - 1, n, q) >= confidence:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class PercentileSupport:
    """One percentile of one metric, with the count it rests on."""

    metric: str
    percentile: float
    n: int
    needed: int  # min_count at this confidence
    confidence: float
    supported: bool
    lower: float | None  # one-sided bounds at `confidence` (order statistics); None if none
    upper: float | None

    def label(self) -> str:
        """``p99`` for 99.0, ``p99.9`` for 99.9."""
        return f"p{self.percentile:g}"

    def describe(self) -> str:
        if self.supported:
            return f"{self.label()}: supported by {self.n} (needs {self.needed})"
        return f"{self.label()}: too few ({self.n}, needs {self.needed})"


def support(metric: str, values: Iterable[float], percentiles: Sequence[float] =
            REPORTED_PERCENTILES, confidence: float = SUPPORT_CONFIDENCE
            ) -> tuple[PercentileSupport, ...]:
    """Each percentile of ``values`` with its count, verdict and bounds."""
    xs = sorted(v for v in values if v is not None and math.isfinite(v))
    n = len(xs)
    out = []
    for q in percentiles:
        hi_rank = upper_rank(n, q, confidence)
        lo_rank = lower_rank(n, q, confidence)
        out.append(PercentileSupport(
            metric=metric, percentile=q, n=n, needed=min_count(q, confidence),
            confidence=confidence, supported=hi_rank is not None,
            lower=xs[lo_rank - 1] if lo_rank is not None else None,
            upper=xs[hi_rank - 1] if hi_rank is not None else None))
    return tuple(out)


@dataclass(frozen=True)
class SampleTarget:
    """Run a case until these percentiles are supported (``strata.run(..., until=...)``).

    The case runs its stated requests first, then more in batches until every
    successful-request count supports the highest percentile asked for, or until
    ``max_requests`` measured requests or ``max_s`` seconds of measured load.
    """

    percentiles: tuple[float, ...] = (99.0,)
    confidence: float = SUPPORT_CONFIDENCE
    max_requests: int = 2000
    max_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.percentiles or not all(0 < q < 100 for q in self.percentiles):
            raise ValueError("SampleTarget: percentiles must be in (0, 100)")
        if not 0 < self.confidence < 1:
            raise ValueError("SampleTarget: confidence must be in (0, 1)")
        if self.max_requests < 1 or self.max_s <= 0:
            raise ValueError("SampleTarget: max_requests >= 1 and max_s > 0")

    @property
    def needed(self) -> int:
        """Successful requests that support every percentile asked for."""
        return max(min_count(q, self.confidence) for q in self.percentiles)

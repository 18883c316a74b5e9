"""Summary statistics and A/B tests for benchmark samples.

One percentile method everywhere: linear interpolation between order statistics
(Hyndman-Fan type 7, numpy's default ``"linear"``), so a Strata p99 can be
recomputed by anyone with ``numpy.percentile``. Everything here is pure Python
and deterministic; numpy is imported lazily, only to speed up the bootstrap.
No scipy: the Student t quantile is computed from the regularized incomplete
beta function, so ``mean_ci`` works on a bare install.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

#: The percentile method, recorded in reports next to every percentile.
PERCENTILE_METHOD = "linear (Hyndman-Fan type 7, numpy default)"

#: Percentiles every :class:`Distribution` carries.
DISTRIBUTION_QUANTILES = (50.0, 90.0, 95.0, 99.0)


def defined(values: Iterable[float | None]) -> list[float]:
    """Floats without the ``None`` entries (undefined per-request metrics)."""
    out = [float(v) for v in values if v is not None]
    if any(math.isnan(v) for v in out):
        raise ValueError("NaN in sample; drop undefined values as None instead")
    return out


def _lerp(a: float, b: float, t: float) -> float:
    # numpy's formulation: interpolating from the nearer end keeps exact
    # endpoints and monotonicity, so results match numpy.percentile to the ulp.
    d = b - a
    return b - d * (1.0 - t) if t >= 0.5 else a + d * t


def _percentile_sorted(xs: Sequence[float], q: float) -> float:
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    n = len(xs)
    if n == 0:
        raise ValueError("percentile of an empty sample")
    h = (n - 1) * (q / 100.0)
    lo = math.floor(h)
    hi = min(lo + 1, n - 1)
    return _lerp(xs[lo], xs[hi], h - lo)


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation (numpy ``"linear"``)."""
    return _percentile_sorted(sorted(defined(values)), q)


def percentiles(values: Iterable[float], qs: Iterable[float]) -> tuple[float, ...]:
    """Several percentiles with one sort."""
    xs = sorted(defined(values))
    return tuple(_percentile_sorted(xs, q) for q in qs)


def median(values: Iterable[float]) -> float:
    """The 50th percentile (equal to the usual median for type 7)."""
    return percentile(values, 50.0)


def mean(values: Iterable[float]) -> float:
    xs = defined(values)
    if not xs:
        raise ValueError("mean of an empty sample")
    return math.fsum(xs) / len(xs)


@dataclass(frozen=True)
class Distribution:
    """Summary of one metric over a group. Every field is None when ``n == 0``."""

    n: int
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None
    min: float | None = None


def distribution(values: Iterable[float | None]) -> Distribution:
    """Summarize a sample; ``None`` entries (undefined metrics) are dropped."""
    xs = sorted(defined(values))
    if not xs:
        return Distribution(n=0)
    p50, p90, p95, p99 = (_percentile_sorted(xs, q) for q in DISTRIBUTION_QUANTILES)
    return Distribution(
        n=len(xs),
        mean=math.fsum(xs) / len(xs),
        p50=p50,
        p90=p90,
        p95=p95,
        p99=p99,
        max=xs[-1],
        min=xs[0],
    )


# --- Student t quantile, without scipy ---------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """CDF of Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError("df must be positive")
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(p: float, df: float) -> float:
    """Quantile of Student's t (bisection on :func:`t_cdf`; ~1e-12 relative)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return 0.5 * (lo + hi)


def _norm_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


# --- Confidence intervals and tests -----------------------------------------


def mean_ci(
    values: Iterable[float], conf: float = 0.95
) -> tuple[float, float | None, float | None]:
    """(mean, lo, hi): a Student-t interval for the mean of repeated runs.

    Meant for a handful of repetitions of one case (e.g. per-run p50s), where a
    normal interval would be too narrow. ``lo``/``hi`` are None for n < 2.
    """
    if not 0.0 < conf < 1.0:
        raise ValueError("conf must be in (0, 1)")
    xs = defined(values)
    n = len(xs)
    if n == 0:
        raise ValueError("mean_ci of an empty sample")
    m = math.fsum(xs) / n
    if n < 2:
        return m, None, None
    var = math.fsum((x - m) ** 2 for x in xs) / (n - 1)
    half = t_ppf(0.5 + conf / 2.0, n - 1) * math.sqrt(var / n)
    return m, m - half, m + half


def _delta(sa: float, sb: float, relative: bool) -> float:
    if not relative:
        return sb - sa
    if sa == 0:
        return math.inf if sb > 0 else (-math.inf if sb < 0 else 0.0)
    return sb / sa - 1.0


def bootstrap_ci(
    a: Iterable[float],
    b: Iterable[float],
    stat: Callable[[Sequence[float]], float] = median,
    n_boot: int = 2000,
    seed: int = 0,
    conf: float = 0.95,
    *,
    relative: bool = False,
) -> tuple[float, float, float]:
    """(delta, lo, hi) for ``stat(b) - stat(a)`` (or ``stat(b)/stat(a) - 1``).

    ``a`` is the baseline, ``b`` the candidate. Percentile bootstrap: both
    samples are resampled independently, ``n_boot`` times, from a generator
    seeded with ``seed``, so the same inputs always give the same interval.
    ``delta`` is the statistic on the original samples, not a bootstrap mean.
    """
    if not 0.0 < conf < 1.0:
        raise ValueError("conf must be in (0, 1)")
    if n_boot < 1:
        raise ValueError("n_boot must be >= 1")
    xa, xb = defined(a), defined(b)
    if not xa or not xb:
        raise ValueError("bootstrap_ci needs two non-empty samples")
    if relative and stat(xa) == 0:
        raise ValueError("relative difference is undefined when stat(a) == 0")
    delta = _delta(stat(xa), stat(xb), relative)

    import numpy as np  # lazy: only the bootstrap needs vectorized resampling

    rng = np.random.default_rng(seed)
    na, nb = np.asarray(xa), np.asarray(xb)
    # Resample in blocks of rows so memory stays bounded for long samples
    # (pooled chunk gaps can run to 1e5 values); the block size depends only
    # on the inputs, so the result is still a pure function of (a, b, seed).
    rows = max(1, 2_000_000 // max(len(xa), len(xb)))
    parts_a, parts_b = [], []
    for start in range(0, n_boot, rows):
        k = min(rows, n_boot - start)
        ra = na[rng.integers(0, len(xa), size=(k, len(xa)))]
        rb = nb[rng.integers(0, len(xb), size=(k, len(xb)))]
        if stat is median:
            parts_a.append(np.median(ra, axis=1))
            parts_b.append(np.median(rb, axis=1))
        elif stat is mean:
            parts_a.append(ra.mean(axis=1))
            parts_b.append(rb.mean(axis=1))
        else:
            parts_a.append(np.array([stat(row.tolist()) for row in ra]))
            parts_b.append(np.array([stat(row.tolist()) for row in rb]))
    sa, sb = np.concatenate(parts_a), np.concatenate(parts_b)
    deltas = [_delta(float(x), float(y), relative) for x, y in zip(sa, sb, strict=True)]
    finite = sorted(d for d in deltas if math.isfinite(d))
    if not finite:
        return delta, math.nan, math.nan
    alpha = (1.0 - conf) / 2.0
    lo = _percentile_sorted(finite, 100.0 * alpha)
    hi = _percentile_sorted(finite, 100.0 * (1.0 - alpha))
    return delta, lo, hi


def _ranks(xs: Sequence[float]) -> tuple[list[float], float]:
    """Mid-ranks (1-based) and the tie term sum(t^3 - t)."""
    order = sorted(range(len(xs)), key=xs.__getitem__)
    ranks = [0.0] * len(xs)
    ties = 0.0
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        r = (i + j) / 2.0 + 1.0
        for k in range(i, j + 1):
            ranks[order[k]] = r
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    return ranks, ties


def mann_whitney_u(
    a: Iterable[float],
    b: Iterable[float],
    alternative: Literal["two-sided", "greater", "less"] = "two-sided",
) -> float:
    """p-value of the Mann-Whitney U test (normal approximation).

    Rank-based, so a few huge outliers (a stalled request) cannot swamp it the
    way they swamp a t-test. Tie-corrected variance and a 0.5 continuity
    correction, as scipy's ``method="asymptotic"``. ``"greater"`` means *a*
    tends to be larger than *b* (scipy's convention). Returns 1.0 when every
    value is tied (no evidence either way).
    """
    xa, xb = defined(a), defined(b)
    n1, n2 = len(xa), len(xb)
    if n1 == 0 or n2 == 0:
        raise ValueError("mann_whitney_u needs two non-empty samples")
    ranks, ties = _ranks(xa + xb)
    u1 = math.fsum(ranks[:n1]) - n1 * (n1 + 1) / 2.0
    u2 = n1 * n2 - u1
    n = n1 + n2
    mu = n1 * n2 / 2.0
    var = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    sd = math.sqrt(var)
    if alternative == "two-sided":
        p = 2.0 * _norm_sf((max(u1, u2) - mu - 0.5) / sd)
    elif alternative == "greater":
        p = _norm_sf((u1 - mu - 0.5) / sd)
    elif alternative == "less":
        p = _norm_sf((u2 - mu - 0.5) / sd)
    else:
        raise ValueError(f"unknown alternative {alternative!r}")
    return min(1.0, max(0.0, p))

"""Two-sample effects: the one recipe every comparison in Strata uses.

An effect is the relative change of a statistic from a control (or baseline) sample
to a treatment (or candidate) sample, with an interval that states its level and its
unit of resampling. The unit matters more than the method: requests of one repetition
share a server state (a stall hits every stream at once), so a percentile pooled over
requests and resampled request by request claims far more certainty than the data
holds. Where repetitions exist they are the unit:

* ``unit="repetition"``: one value per repetition (its output tok/s, its TPOT p95...).
  Changes are ratios, and a slow repetition is slow by a factor, so the arm's value is
  the geometric mean over its repetitions and the change is the ratio of the two
  geometric means, minus 1. With at least ``MIN_BOOTSTRAP_UNITS`` repetitions on each
  side the interval is a percentile bootstrap over repetitions (cluster bootstrap:
  each resample draws whole repetitions); with fewer, where a bootstrap has too few
  distinct resamples to have percentiles, it is a Welch t-interval on the logarithms
  of the per-repetition values (so it never reaches below -100%). A metric with a
  zero or negative repetition falls back to arithmetic means and the delta method.
* ``unit="request"``: one value per request, for comparisons with a single
  repetition per side (run against run, the baseline gate). The statistic (median by
  default) is bootstrapped over requests, and a Mann-Whitney test gives the p-value.

``analysis/ab_groups.py`` (A/B tables), ``analysis/run_compare.py`` (run against run)
and ``analysis/regression.py`` (the baseline gate) all build on this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from strata_plugin.analysis.stats import (
    bootstrap_ci,
    defined,
    mann_whitney_u,
    mean,
    median,
    t_ppf,
)

#: Every interval in every output is at this level unless it says otherwise.
LEVEL = 0.95
#: Fewer units per side than this: a t-interval instead of a bootstrap.
MIN_BOOTSTRAP_UNITS = 8
N_BOOT = 2000
SEED = 0

Unit = Literal["repetition", "request"]
Stat = Callable[[Sequence[float]], float]


@dataclass(frozen=True)
class Effect:
    """``treatment`` against ``control`` for one metric: change and interval, in %."""

    metric: str
    control: float
    treatment: float
    change_pct: float | None  # 100 * (treatment / control - 1)
    ci_lo_pct: float | None  # None: too few units for an interval
    ci_hi_pct: float | None
    n_control: int  # units (repetitions or requests) on each side
    n_treatment: int
    unit: str = "repetition"  # the unit of resampling
    method: str = ""  # "t-interval" | "bootstrap"
    level: float = LEVEL
    p_value: float | None = None  # two-sided Mann-Whitney (request unit only)

    @property
    def interval_label(self) -> str:
        """E.g. ``95% t-interval, 3/3 repetitions``: level, method and unit, always."""
        if self.ci_lo_pct is None:
            return f"no interval ({self.n_control}/{self.n_treatment} {self.unit}s)"
        return (f"{self.level * 100:g}% {self.method}, "
                f"{self.n_control}/{self.n_treatment} {self.unit}s")

    @property
    def interval(self) -> str:
        if self.ci_lo_pct is None or self.ci_hi_pct is None:
            return "-"
        return f"{self.ci_lo_pct:+.1f}% .. {self.ci_hi_pct:+.1f}%"

    def excludes_zero(self) -> bool:
        return (self.ci_lo_pct is not None and self.ci_hi_pct is not None
                and (self.ci_lo_pct > 0 or self.ci_hi_pct < 0))

    def line(self) -> str:
        change = "-" if self.change_pct is None else f"{self.change_pct:+.2f}%"
        return (f"{self.metric}: {self.control:.4g} -> {self.treatment:.4g} "
                f"({change}, {self.interval}; {self.interval_label})")


def _rel(c: float, t: float) -> float | None:
    return None if c == 0 else 100.0 * (t / c - 1.0)


def geometric_mean(values: Sequence[float]) -> float:
    return math.exp(math.fsum(math.log(x) for x in values) / len(values))


def _welch_log(xc: list[float], xt: list[float], level: float) -> tuple[float, float]:
    """Interval of 100 * (gmean(t) / gmean(c) - 1): Welch t on the logarithms."""
    lc, lt = [math.log(x) for x in xc], [math.log(x) for x in xt]
    nc, nt = len(lc), len(lt)
    mc, mt = mean(lc), mean(lt)
    a = math.fsum((x - mc) ** 2 for x in lc) / (nc - 1) / nc
    b = math.fsum((x - mt) ** 2 for x in lt) / (nt - 1) / nt
    d = mt - mc
    if a + b == 0:
        return 100.0 * math.expm1(d), 100.0 * math.expm1(d)
    df = (a + b) ** 2 / (a * a / (nc - 1) + b * b / (nt - 1))
    half = t_ppf(0.5 + level / 2.0, df) * math.sqrt(a + b)
    return 100.0 * math.expm1(d - half), 100.0 * math.expm1(d + half)


def _welch_ratio(xc: list[float], xt: list[float], level: float) -> tuple[float, float] | None:
    """Interval of 100 * (mean(t) / mean(c) - 1): Fieller's, Welch df.

    The set of ratios rho with (mean(t) - rho mean(c))^2 <= t^2 (se_t^2 + rho^2 se_c^2).
    Bounded only when the control's mean is itself told from zero at ``level``; a
    control whose repetitions are 0.35, 0 and 0.92 ms of stall is not, and the ratio
    then has no upper bound (None: no interval), where the delta method printed
    -11245% .. +24056%.
    """
    mc, mt = mean(xc), mean(xt)
    if mc == 0 or mt == 0:
        return None
    nc, nt = len(xc), len(xt)
    sc2 = math.fsum((x - mc) ** 2 for x in xc) / (nc - 1) / nc  # squared standard errors
    st2 = math.fsum((x - mt) ** 2 for x in xt) / (nt - 1) / nt
    r = mt / mc
    if sc2 + st2 == 0:
        return 100.0 * (r - 1.0), 100.0 * (r - 1.0)
    a, b = sc2 / (mc * mc), st2 / (mt * mt)  # squared relative standard errors
    df = (a + b) ** 2 / (a * a / (nc - 1) + b * b / (nt - 1))
    t2 = t_ppf(0.5 + level / 2.0, df) ** 2
    qa = mc * mc - t2 * sc2
    if qa <= 0:
        return None  # the control's mean is not told from zero: unbounded
    qb = -2.0 * mt * mc
    qc = mt * mt - t2 * st2
    disc = qb * qb - 4.0 * qa * qc
    if disc < 0:
        return None
    root = math.sqrt(disc)
    lo, hi = (-qb - root) / (2.0 * qa), (-qb + root) / (2.0 * qa)
    return 100.0 * (lo - 1.0), 100.0 * (hi - 1.0)


def effect(metric: str, control: Iterable[float], treatment: Iterable[float], *,
           unit: Unit = "repetition", stat: Stat | None = None,
           level: float = LEVEL) -> Effect:
    """The effect of one metric from values per unit (see the module docstring).

    ``stat`` defaults to the geometric mean for repetitions (the arithmetic mean when a
    value is not positive) and the median for requests. Raises ValueError for an empty
    side.
    """
    xc, xt = defined(control), defined(treatment)
    if not xc or not xt:
        raise ValueError(f"{metric}: an effect needs values on both sides")
    positive = min(xc + xt) > 0
    if stat is None:
        stat = median if unit == "request" else geometric_mean if positive else mean
    c, t = stat(xc), stat(xt)
    base: dict[str, Any]  # the fields of every Effect
    base = dict(metric=metric, control=c, treatment=t, change_pct=_rel(c, t),
                n_control=len(xc), n_treatment=len(xt), unit=unit, level=level)
    lo = hi = None
    method = ""
    p = None
    few = min(len(xc), len(xt))
    if unit == "repetition" and few < MIN_BOOTSTRAP_UNITS:
        iv = None
        if few >= 2 and stat is geometric_mean:
            iv = _welch_log(xc, xt, level)
        elif few >= 2 and stat is mean:
            iv = _welch_ratio(xc, xt, level)
        if iv is not None:
            lo, hi = iv
            method = "t-interval"
    elif few >= 2 and c != 0:
        _, lo, hi = bootstrap_ci(xc, xt, stat=stat, n_boot=N_BOOT, seed=SEED, conf=level,
                                 relative=True)
        lo, hi, method = 100.0 * lo, 100.0 * hi, "bootstrap"
        if unit == "request":
            p = mann_whitney_u(xc, xt)
    return Effect(**base, ci_lo_pct=lo, ci_hi_pct=hi, method=method, p_value=p)


@dataclass(frozen=True)
class Comparison:
    """The gate's call on a baseline and a candidate sample of requests."""

    effect: Effect
    p_worse: float  # one-sided Mann-Whitney, in the "worse" direction
    worse: bool  # worse by more than the margin, with statistical support
    better: bool  # better by more than the margin, with statistical support

    @property
    def delta_rel(self) -> float:
        return (self.effect.change_pct or 0.0) / 100.0

    @property
    def lo(self) -> float:
        return (self.effect.ci_lo_pct if self.effect.ci_lo_pct is not None else math.nan) / 100

    @property
    def hi(self) -> float:
        return (self.effect.ci_hi_pct if self.effect.ci_hi_pct is not None else math.nan) / 100


def compare(baseline: Iterable[float], candidate: Iterable[float], *, metric: str = "",
            max_worse: float = 0.05, higher_is_worse: bool = True, stat: Stat = median,
            alpha: float = 0.05, level: float = LEVEL) -> Comparison:
    """A "worse by more than ``max_worse`` with statistical support" gate over requests.

    ``worse`` needs both: the whole ``level`` bootstrap interval of the relative change
    lies past ``max_worse``, and a one-sided Mann-Whitney test rejects "no shift" at
    ``alpha``. Requiring both keeps a gate from failing on a tiny but significant
    shift, or on a large but noisy one. ``better`` is the mirror image.
    """
    xa, xb = defined(baseline), defined(candidate)
    e = effect(metric, xa, xb, unit="request", stat=stat, level=level)
    lo = math.nan if e.ci_lo_pct is None else e.ci_lo_pct / 100
    hi = math.nan if e.ci_hi_pct is None else e.ci_hi_pct / 100
    if higher_is_worse:
        p_worse = mann_whitney_u(xb, xa, alternative="greater")
        p_better = mann_whitney_u(xb, xa, alternative="less")
        worse = lo > max_worse and p_worse < alpha
        better = hi < -max_worse and p_better < alpha
    else:
        p_worse = mann_whitney_u(xb, xa, alternative="less")
        p_better = mann_whitney_u(xb, xa, alternative="greater")
        worse = hi < -max_worse and p_worse < alpha
        better = lo > max_worse and p_better < alpha
    return Comparison(effect=e, p_worse=p_worse, worse=worse, better=better)

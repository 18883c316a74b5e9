"""Percentiles, confidence intervals and the rank test, checked against known values."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from strata_plugin.analysis.effects import compare
from strata_plugin.analysis.stats import (
    Distribution,
    bootstrap_ci,
    distribution,
    mann_whitney_u,
    mean,
    mean_ci,
    median,
    percentile,
    percentiles,
    t_cdf,
    t_ppf,
)


def _normal(seed: int, n: int, mu: float = 100.0, sd: float = 10.0) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(mu, sd) for _ in range(n)]


# --- percentiles --------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
def test_percentile_matches_numpy_linear(n):
    rng = np.random.default_rng(n)
    data = rng.lognormal(3.0, 1.0, size=n).tolist()
    qs = [0, 1, 25, 50, 90, 95, 99, 99.9, 100]
    want = np.percentile(data, qs, method="linear")
    assert percentiles(data, qs) == pytest.approx(want.tolist(), rel=1e-12, abs=0)
    for q, w in zip(qs, want, strict=True):
        assert percentile(data, q) == pytest.approx(float(w), rel=1e-12, abs=0)


def test_percentile_small_exact_values():
    xs = [1.0, 2.0, 3.0, 4.0]
    assert percentile(xs, 50) == 2.5
    assert percentile(xs, 90) == pytest.approx(3.7)
    assert percentile([7.0], 99) == 7.0
    assert median([5.0, 1.0, 3.0]) == 3.0
    with pytest.raises(ValueError):
        percentile(xs, 101)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_distribution_fields():
    data = _normal(3, 500)
    d = distribution(data)
    assert d.n == 500
    assert d.mean == pytest.approx(float(np.mean(data)))
    for name, q in (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99)):
        assert getattr(d, name) == pytest.approx(float(np.percentile(data, q)), rel=1e-12)
    assert (d.min, d.max) == (min(data), max(data))
    assert distribution([]) == Distribution(n=0)
    assert distribution([None, 2.0, None]).n == 1  # undefined values are dropped
    with pytest.raises(ValueError):
        distribution([1.0, float("nan")])


# --- Student t -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "df", "want"),
    [
        (0.975, 1, 12.706204736174698),
        (0.975, 2, 4.302652729749464),
        (0.975, 4, 2.7764451051977934),
        (0.975, 10, 2.2281388519862744),
        (0.95, 5, 2.0150483733330233),
        (0.995, 30, 2.749995653567098),
        (0.975, 1000, 1.9623390808264078),
        (0.025, 3, -3.182446305284263),
    ],
)
def test_t_ppf_table(p, df, want):
    assert t_ppf(p, df) == pytest.approx(want, rel=1e-9)
    assert t_cdf(want, df) == pytest.approx(p, rel=1e-10)


def test_t_ppf_matches_scipy_when_present():
    st = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 7, 19, 49, 200):
        for p in (0.6, 0.9, 0.975, 0.999):
            assert t_ppf(p, df) == pytest.approx(float(st.t.ppf(p, df)), rel=1e-9)


def test_mean_ci():
    m, lo, hi = mean_ci([1, 2, 3, 4, 5], conf=0.95)
    half = 2.7764451051977934 * (2.5**0.5) / (5**0.5)
    assert m == 3.0
    assert lo == pytest.approx(3.0 - half)
    assert hi == pytest.approx(3.0 + half)
    assert mean_ci([4.0]) == (4.0, None, None)
    assert mean_ci([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError):
        mean_ci([])


# --- bootstrap -----------------------------------------------------------------


def test_bootstrap_exact_shift_is_covered():
    a = _normal(1, 200)
    b = [x + 20.0 for x in a]
    delta, lo, hi = bootstrap_ci(a, b)
    assert delta == pytest.approx(20.0)
    assert lo < 20.0 < hi
    assert lo > 0  # the shift is clearly resolved
    rel, rlo, rhi = bootstrap_ci(a, b, relative=True)
    assert rel == pytest.approx(median(b) / median(a) - 1)
    assert rlo < rel < rhi


def test_bootstrap_is_deterministic_for_a_seed():
    a, b = _normal(1, 150), _normal(2, 150, mu=105)
    assert bootstrap_ci(a, b, seed=7) == bootstrap_ci(a, b, seed=7)
    assert bootstrap_ci(a, b, seed=7) != bootstrap_ci(a, b, seed=8)
    assert bootstrap_ci(a, b, stat=mean, seed=3) == bootstrap_ci(a, b, stat=mean, seed=3)


def test_bootstrap_custom_stat_agrees_with_builtin_path():
    a, b = _normal(4, 60), _normal(5, 60, mu=110)
    fast = bootstrap_ci(a, b, stat=median, n_boot=300, seed=1)
    slow = bootstrap_ci(a, b, stat=lambda xs: float(np.median(xs)), n_boot=300, seed=1)
    assert slow == pytest.approx(fast)


def test_bootstrap_coverage_on_a_known_shift():
    """Over many independent samples the 95% interval covers the true shift ~95%."""
    shift, covered, trials = 5.0, 0, 200
    for i in range(trials):
        a = _normal(1000 + i, 80)
        b = _normal(5000 + i, 80, mu=100.0 + shift)
        _, lo, hi = bootstrap_ci(a, b, stat=mean, n_boot=1000, seed=i)
        covered += lo <= shift <= hi
    assert 0.88 <= covered / trials <= 0.99


def test_bootstrap_rejects_bad_input():
    with pytest.raises(ValueError):
        bootstrap_ci([], [1.0])
    with pytest.raises(ValueError):
        bootstrap_ci([0.0, 0.0], [1.0], relative=True)


# --- Mann-Whitney ------------------------------------------------------------------


def test_mann_whitney_clear_shift_is_significant():
    a, b = _normal(1, 100), _normal(2, 100, mu=115)
    assert mann_whitney_u(a, b) < 1e-6
    assert mann_whitney_u(b, a, alternative="greater") < 1e-6
    assert mann_whitney_u(b, a, alternative="less") > 0.99


def test_mann_whitney_same_distribution_is_not():
    a = _normal(1, 100)
    assert mann_whitney_u(a, list(a)) == 1.0
    assert mann_whitney_u(a, _normal(2, 100)) > 0.05
    assert mann_whitney_u([3.0] * 5, [3.0] * 7) == 1.0


def test_mann_whitney_matches_scipy_asymptotic_with_ties():
    st = pytest.importorskip("scipy.stats")
    a = [round(x) for x in _normal(11, 40)]
    b = [round(x) for x in _normal(12, 55, mu=104)]
    for alt in ("two-sided", "greater", "less"):
        want = st.mannwhitneyu(a, b, alternative=alt, method="asymptotic").pvalue
        assert mann_whitney_u(a, b, alternative=alt) == pytest.approx(float(want), rel=1e-9)


# --- the regression gate ---------------------------------------------------------


def test_compare_flags_a_real_regression_only():
    base = _normal(1, 200)
    assert compare(base, [x * 1.2 for x in _normal(2, 200)], max_worse=0.05).worse
    same = compare(base, _normal(3, 200), max_worse=0.05)
    assert not same.worse and not same.better
    small = compare(base, [x * 1.02 for x in _normal(4, 200)], max_worse=0.05)
    assert not small.worse  # real but under the threshold
    faster = compare(base, [x * 0.8 for x in _normal(5, 200)], max_worse=0.05)
    assert faster.better and not faster.worse
    # throughput: lower is worse
    tput = compare(base, [x * 0.8 for x in _normal(6, 200)], higher_is_worse=False)
    assert tput.worse and tput.delta_rel < 0


# --- boundaries found by mutation testing (docs/validation.md, "Mutation testing") ----------


def test_percentile_interpolates_from_the_nearer_end_exactly_as_numpy():
    # a + (b - a) t and b - (b - a)(1 - t) differ in the last bit for these pairs; numpy
    # takes the upper form from t = 0.5 on, so a Strata percentile equals numpy's exactly.
    for xs, q, want in (
        ([0.1, 0.5], 50, 0.3),  # t == 0.5: the upper form (the lower gives 0.30000000000000004)
        ([0.1, 0.3], 90, 0.27999999999999997),  # t > 0.5: upper form (lower gives 0.28)
        ([0.1, 0.2], 10, 0.11000000000000001),  # t < 0.5: lower form (upper gives 0.11)
    ):
        assert percentile(xs, q) == want == float(np.percentile(xs, q))


def test_errors_name_the_bad_input():
    with pytest.raises(ValueError, match=r"^NaN in sample; drop undefined values as None instead$"):
        percentile([1.0, float("nan")], 50)
    with pytest.raises(ValueError, match=r"^percentile q must be in \[0, 100\], got 101$"):
        percentile([1.0], 101)
    with pytest.raises(ValueError, match=r"^percentile of an empty sample$"):
        percentile([None], 50)
    with pytest.raises(ValueError, match=r"^mean of an empty sample$"):
        mean([])
    with pytest.raises(ValueError, match=r"^df must be positive$"):
        t_cdf(1.0, 0)
    for p in (0.0, 1.0):
        with pytest.raises(ValueError, match=r"^p must be in \(0, 1\)$"):
            t_ppf(p, 5)
    for conf in (0.0, 1.0):  # conf, not the p it becomes inside
        with pytest.raises(ValueError, match=r"^conf must be in \(0, 1\)$"):
            mean_ci([1.0, 2.0], conf=conf)
        with pytest.raises(ValueError, match=r"^conf must be in \(0, 1\)$"):
            bootstrap_ci([1.0, 2.0], [3.0], conf=conf)
    with pytest.raises(ValueError, match=r"^mean_ci of an empty sample$"):
        mean_ci([None])
    with pytest.raises(ValueError, match=r"^n_boot must be >= 1$"):
        bootstrap_ci([1.0], [2.0], n_boot=0)
    for a, b in (([], [1.0]), ([1.0], [])):
        with pytest.raises(ValueError, match=r"^bootstrap_ci needs two non-empty samples$"):
            bootstrap_ci(a, b)
        with pytest.raises(ValueError, match=r"^mann_whitney_u needs two non-empty samples$"):
            mann_whitney_u(a, b)
    with pytest.raises(ValueError, match=r"^relative difference is undefined when stat\(a\) == 0$"):
        bootstrap_ci([0.0, 0.0], [1.0], relative=True)
    with pytest.raises(ValueError, match=r"^unknown alternative 'both'$"):
        mann_whitney_u([1.0], [2.0], alternative="both")


# Closed forms of Student's t for 1 and 2 degrees of freedom (Wikipedia, "Student's
# t-distribution", section "Special cases"): nu = 1 is the Cauchy distribution.
def _cdf1(t: float) -> float:
    return 0.5 + math.atan(t) / math.pi


def _cdf2(t: float) -> float:
    return 0.5 + t / (2.0 * math.sqrt(2.0 + t * t))


def _ppf1(p: float) -> float:
    return math.tan(math.pi * (p - 0.5))


def _ppf2(p: float) -> float:
    return (2.0 * p - 1.0) / math.sqrt(2.0 * p * (1.0 - p))


@pytest.mark.parametrize("t", [1e-4, 1e-3, 0.05, 0.5, 1.0, 1.5, 3.0, 30.0, 1e4])
def test_t_cdf_matches_the_closed_forms_from_tiny_to_huge_t(t):
    # Small t takes the continued fraction's symmetric branch (x near 1), large t the direct
    # one. (Below t ~ 1e-8 * sqrt(df), df / (df + t * t) rounds to 1 and the CDF to 0.5.)
    assert t_cdf(t, 1) == pytest.approx(_cdf1(t), rel=1e-12)
    assert t_cdf(t, 2) == pytest.approx(_cdf2(t), rel=1e-12)
    assert t_cdf(-t, 1) == pytest.approx(1.0 - _cdf1(t), rel=1e-10)


def test_t_cdf_at_zero_and_beyond_overflow():
    for df in (1, 2.5, 10, 1e6):
        assert t_cdf(0.0, df) == 0.5  # x = df / df = 1: I_1 = 1 exactly
        assert t_cdf(1e200, df) == 1.0  # t * t overflows to inf: x = 0, I_0 = 0
        assert t_cdf(-1e200, df) == 0.0
        assert t_cdf(math.inf, df) == 1.0


@pytest.mark.parametrize("p", [0.501, 0.55, 0.9, 0.975, 0.9999])
def test_t_ppf_matches_the_closed_forms(p):
    # 0.501 has a quantile near 0.003: the bisection's stop is relative to it, not absolute.
    assert t_ppf(p, 1) == pytest.approx(_ppf1(p), rel=1e-10)
    assert t_ppf(p, 2) == pytest.approx(_ppf2(p), rel=1e-10)
    assert t_ppf(1.0 - p, 2) == pytest.approx(-_ppf2(p), rel=1e-10)


def test_t_ppf_median_is_exactly_zero():
    for df in (1, 3, 29.5):
        assert t_ppf(0.5, df) == 0.0


def test_mean_ci_of_two_runs_is_the_df1_interval():
    # n = 2 is the smallest sample with an interval: mean 2, sd sqrt(2), se 1, t_{0.975,1}.
    m, lo, hi = mean_ci([1.0, 3.0])
    assert m == 2.0
    assert lo == pytest.approx(2.0 - 12.706204736174698, rel=1e-12)
    assert hi == pytest.approx(2.0 + 12.706204736174698, rel=1e-12)


def test_bootstrap_interval_is_the_stated_percentiles_of_the_resampled_differences():
    """The interval is the (1-conf)/2 and (1+conf)/2 percentiles of stat(b*) - stat(a*)."""
    a = [x / 1000.0 for x in _normal(4, 60)]  # ~0.1: tells a's resamples from b's below
    b = _normal(5, 60, mu=1000.0)
    for conf in (0.95, 0.90):
        seen: list[float] = []

        def stat(xs, seen=seen):
            seen.append(float(np.mean(xs)))
            return seen[-1]

        delta, lo, hi = bootstrap_ci(a, b, stat=stat, n_boot=400, seed=2, conf=conf)
        assert len(seen) == 2 + 2 * 400  # the two originals, then n_boot of each
        sa = [v for v in seen[2:] if v < 500.0]
        sb = [v for v in seen[2:] if v >= 500.0]
        diffs = np.subtract(sb, sa)
        alpha = 100.0 * (1.0 - conf) / 2.0
        assert delta == pytest.approx(np.mean(b) - np.mean(a))
        assert lo == pytest.approx(float(np.percentile(diffs, alpha)), rel=1e-9)
        assert hi == pytest.approx(float(np.percentile(diffs, 100.0 - alpha)), rel=1e-9)


def test_bootstrap_draws_n_boot_resamples_across_blocks():
    # 100001 values: resampled 19 rows at a time, so 20 resamples take two blocks (19 + 1).
    a, calls = [float(i % 7) for i in range(100_001)], []

    def stat(xs):
        calls.append(len(xs))
        return float(xs[0])

    bootstrap_ci(a, [1.0, 2.0], stat=stat, n_boot=20)
    assert calls.count(100_001) == 1 + 20 and calls.count(2) == 1 + 20


def test_bootstrap_with_a_single_resample():
    delta, lo, hi = bootstrap_ci([1.0, 2.0], [3.0, 5.0], n_boot=1)
    assert delta == 2.5 and lo == hi


def test_bootstrap_defaults_are_2000_resamples_seed_0():
    a, b = _normal(1, 40), _normal(2, 40, mu=103)
    assert bootstrap_ci(a, b) == bootstrap_ci(a, b, n_boot=2000, seed=0, conf=0.95)


def test_bootstrap_can_draw_every_value():
    # Two 2-value samples: resample medians are 0, 5 or 10 each, so the differences run
    # from -10 to 10, each end with probability 1/16 > 2.5%.
    assert bootstrap_ci([0.0, 10.0], [0.0, 10.0]) == (0.0, -10.0, 10.0)


@pytest.mark.parametrize(
    ("b", "want"),
    [
        # a's resample median is 0 in ~32% of resamples (3+ zeros of 5); there the relative
        # change is undefined and left out, unless b's is 0 too: 0 -> 0 is no change (0.0).
        (0.0, (-1.0, -1.0, 0.0)),
        (0.5, (-0.5, -0.5, -0.5)),
        (-0.5, (-1.5, -1.5, -1.5)),
    ],
)
def test_bootstrap_relative_leaves_out_resamples_with_a_zero_baseline(b, want):
    assert bootstrap_ci([0.0, 0.0, 1.0, 1.0, 1.0], [b] * 5, relative=True) == want


def test_bootstrap_resamples_the_stat_it_is_given():
    # b = four zeros and a 10: 67% of resamples hold a 10, so max and mean move; median rarely.
    a, b = [0.0] * 5, [0.0, 0.0, 0.0, 0.0, 10.0]
    assert bootstrap_ci(a, b, stat=max, conf=0.5) == (10.0, 0.0, 10.0)
    d, lo, hi = bootstrap_ci(a, b, stat=mean, conf=0.5)
    assert (d, lo) == (2.0, 0.0) and hi >= 2.0
    assert bootstrap_ci(a, b, stat=median, conf=0.5) == (0.0, 0.0, 0.0)


def test_mann_whitney_single_value_samples_hand_computed():
    # a = [1], b = [2, 3]: U1 = 0, U2 = 2, mu = 1, var = 1*2/12 * (3 + 1) = 2/3.
    # two-sided: 2 * sf((2 - 1 - 0.5) / sqrt(2/3)) = 0.5402913746074199 (scipy asymptotic agrees)
    assert mann_whitney_u([1.0], [2.0, 3.0]) == pytest.approx(0.5402913746074199, rel=1e-12)
    assert mann_whitney_u([2.0, 3.0], [1.0]) == pytest.approx(0.5402913746074199, rel=1e-12)
    # greater: sf((0 - 1 - 0.5) / sqrt(2/3)); less: sf((2 - 1 - 0.5) / sqrt(2/3))
    assert mann_whitney_u([1.0], [2.0, 3.0], "greater") == pytest.approx(0.9669037101389033)
    assert mann_whitney_u([1.0], [2.0, 3.0], "less") == pytest.approx(0.27014568730370997)


@pytest.mark.parametrize(
    ("n", "n_boot", "order"),
    [
        # 666,667 values: 2 rows (1,333,334 values) fit in 2,000,000, 3 rows would not.
        (666_667, 4, "aabbaabb"),
        # 1,000,001 values: not even 2 rows fit; one row per block (never zero).
        (1_000_001, 2, "abab"),
    ],
)
def test_bootstrap_blocks_hold_at_most_two_million_resampled_values(n, n_boot, order):
    """Long samples are resampled a block of rows at a time: a's rows, then b's."""
    calls: list[str] = []

    def stat(xs):
        calls.append("a" if len(xs) == n else "b")
        return float(xs[0])

    bootstrap_ci(np.zeros(n).tolist(), [1.0, 2.0], stat=stat, n_boot=n_boot)
    assert "".join(calls[2:]) == order


def test_t_ppf_stops_once_the_bracket_is_within_1e13(monkeypatch):
    # Bracketing 2.228 takes 3 CDF calls ([2, 4]); halving 2 to 1e-13 * 2.2 takes 43 more.
    # The 200-step cap is only a backstop: a mean_ci must not cost 200 CDF evaluations.
    import strata_plugin.analysis.stats as stats

    calls = []
    cdf = stats.t_cdf
    monkeypatch.setattr(stats, "t_cdf", lambda t, df: calls.append(t) or cdf(t, df))
    assert stats.t_ppf(0.975, 10) == pytest.approx(2.2281388519862744, rel=1e-12)
    assert 40 <= len(calls) <= 50

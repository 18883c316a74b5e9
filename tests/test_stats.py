"""Percentiles, confidence intervals and the rank test, checked against known values."""

from __future__ import annotations

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

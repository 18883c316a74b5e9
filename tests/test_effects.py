"""The one two-sample effect recipe: unit of resampling, level and method, checked."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest
from scipy import stats as st
from scipy.stats import t as scipy_t

from strata_plugin.analysis.effects import MIN_BOOTSTRAP_UNITS, compare, effect


def test_few_repetitions_give_a_welch_interval_of_the_log_ratio():
    # The smoke figures: TPOT p95 per repetition, 3 control and 3 treatment.
    c, t = [4.4, 4.6, 4.8], [17.6, 17.8, 17.9]
    e = effect("tpot_p95_ms", c, t)
    assert (e.unit, e.method, e.level, e.n_control, e.n_treatment) == (
        "repetition", "t-interval", 0.95, 3, 3)
    assert e.control == pytest.approx(st.gmean(c)) and e.treatment == pytest.approx(st.gmean(t))
    assert e.change_pct == pytest.approx(100 * (st.gmean(t) / st.gmean(c) - 1))
    # scipy's Welch t-test on the logarithms gives the same interval
    ci = st.ttest_ind(np.log(t), np.log(c), equal_var=False).confidence_interval(0.95)
    assert e.ci_lo_pct == pytest.approx(100 * math.expm1(ci.low), rel=1e-6)
    assert e.ci_hi_pct == pytest.approx(100 * math.expm1(ci.high), rel=1e-6)
    assert e.ci_lo_pct > 200 and e.excludes_zero()
    assert e.interval_label == "95% t-interval, 3/3 repetitions"


def test_a_ratio_interval_never_passes_minus_100_percent():
    # throughput that varies 6x between repetitions (a loaded machine) and drops
    e = effect("output_tok_s", [903.4, 459.8, 144.5], [38.7, 36.5, 151.6])
    assert -100 < e.ci_lo_pct < e.change_pct < 0
    # a non-positive value: arithmetic means, the delta method
    z = effect("stall_ms", [0.0, 1.0, 2.0], [10.0, 12.0, 11.0])
    assert z.control == pytest.approx(1.0) and z.change_pct == pytest.approx(1000.0)
    # the control's mean (1.0, se 0.58, 3 repetitions) is not told from zero: a ratio to
    # it has no upper bound, so no interval is given (Fieller)
    assert z.ci_lo_pct is None and z.interval == "-"


def test_fieller_interval_is_the_set_of_ratios_the_t_test_does_not_reject():
    # a zero among the values: arithmetic means; the control is clearly away from zero
    xc, xt = [9.0, 10.0, 11.0, 10.0], [0.0, 40.0, 20.0, 25.0]
    e = effect("stall_ms", xc, xt)
    assert e.method == "t-interval" and e.ci_lo_pct is not None
    # brute force: rho is inside when |mean(t) - rho mean(c)| <= t * se(mean(t) - rho mean(c))
    mc, mt = statistics.fmean(xc), statistics.fmean(xt)
    sc2, st2 = statistics.variance(xc) / 4, statistics.variance(xt) / 4
    a, b = sc2 / mc**2, st2 / mt**2
    df = (a + b) ** 2 / (a * a / 3 + b * b / 3)
    t = scipy_t.ppf(0.975, df)
    inside = [r / 1000 for r in range(-5000, 5000)
              if (mt - r / 1000 * mc) ** 2 <= t * t * (st2 + (r / 1000) ** 2 * sc2)]
    assert e.ci_lo_pct == pytest.approx(100 * (inside[0] - 1), abs=0.2)
    assert e.ci_hi_pct == pytest.approx(100 * (inside[-1] - 1), abs=0.2)


def test_one_repetition_a_side_has_no_interval_and_says_so():
    e = effect("output_tok_s", [100.0], [75.0])
    assert e.change_pct == pytest.approx(-25.0)
    assert e.ci_lo_pct is None and e.interval == "-"
    assert e.interval_label == "no interval (1/1 repetitions)"


def test_many_repetitions_are_bootstrapped_as_units():
    rng = random.Random(3)
    n = MIN_BOOTSTRAP_UNITS
    c = [rng.gauss(100, 5) for _ in range(n)]
    t = [x * 0.75 for x in (rng.gauss(100, 5) for _ in range(n))]
    e = effect("output_tok_s", c, t)
    assert e.method == "bootstrap" and e.unit == "repetition"
    assert e.ci_lo_pct < e.change_pct < e.ci_hi_pct < -15
    assert effect("output_tok_s", c, t) == e  # seeded: same inputs, same interval
    fewer = effect("output_tok_s", c[: n - 1], t[: n - 1])
    assert fewer.method == "t-interval"  # just under the boundary


def test_request_unit_is_a_median_bootstrap_with_a_rank_test():
    rng = random.Random(5)
    c = [rng.gauss(50, 5) for _ in range(200)]
    t = [rng.gauss(60, 5) for _ in range(200)]
    e = effect("ttft_ms", c, t, unit="request")
    assert e.unit == "request" and e.method == "bootstrap"
    assert e.control == pytest.approx(st.scoreatpercentile(c, 50))
    assert 15 < e.ci_lo_pct < e.change_pct < e.ci_hi_pct < 25
    assert e.p_value < 1e-6
    assert "95% bootstrap, 200/200 requests" in e.line()
    with pytest.raises(ValueError, match="both sides"):
        effect("ttft_ms", [], t)


def test_gate_uses_the_stated_level():
    rng = random.Random(1)
    base = [rng.gauss(100, 10) for _ in range(200)]
    worse = compare(base, [x * 1.2 for x in base], max_worse=0.05)
    assert worse.worse and worse.effect.level == 0.95 and worse.effect.unit == "request"
    assert worse.lo == pytest.approx(worse.effect.ci_lo_pct / 100)
    # the margin just above the interval's lower end: not worse; just below: worse
    lo = worse.lo
    assert not compare(base, [x * 1.2 for x in base], max_worse=lo + 0.001).worse
    assert compare(base, [x * 1.2 for x in base], max_worse=lo - 0.001).worse

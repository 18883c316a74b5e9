"""report/fmt.py's percent formatters: each one's input unit, rounding, sign and None.

The halves used here (0.125, 6.25, ...) are exact in binary, so they test the rounding
rule itself (half to even) and not a representation error next to it.
"""

from __future__ import annotations

import pytest

from strata_plugin.report.fmt import (
    share_pct,
    share_pct_sig,
    signed_pct_of_fraction,
    signed_pct_of_points,
)


@pytest.mark.parametrize(("share", "decimals", "text"), [
    (0.125, 0, "12%"),      # half: to even, down
    (0.375, 0, "38%"),      # half: to even, up
    (0.1251, 0, "13%"),     # just above the half
    (0.995, 0, "100%"),
    (0.0625, 1, "6.2%"),    # half at one decimal: to even
    (0.0626, 1, "6.3%"),
    (-0.05, 0, "-5%"),
    (-0.05, 1, "-5.0%"),
    (0.0, 0, "0%"),
    (0.0, 1, "0.0%"),
    (1.5, 0, "150%"),       # a share over the whole is shown as it is, not capped
    (None, 0, "-"),
    (None, 1, "-"),
])
def test_share_pct_fixed_decimals(share: float | None, decimals: int, text: str) -> None:
    assert share_pct(share, decimals) == text


def test_share_pct_defaults_to_whole_percent() -> None:
    assert share_pct(0.423) == "42%"


@pytest.mark.parametrize(("share", "text"), [
    (0.123456, "12.35%"),       # four significant digits, rounded up at the fifth
    (0.123449, "12.34%"),
    (0.004231, "0.4231%"),      # a small share keeps its digits
    (1e-5, "0.001%"),           # the smallest percent md_num writes without an exponent
    (1e-6, "1.000e-04%"),       # below it, md_num's exponent form
    (-0.5, "-50%"),
    (0.0, "0%"),
    (None, "-"),
])
def test_share_pct_sig_significant_digits(share: float | None, text: str) -> None:
    assert share_pct_sig(share) == text


@pytest.mark.parametrize(("change", "text"), [
    (0.042, "+4.2%"),
    (0.0625, "+6.2%"),      # half: to even
    (0.0626, "+6.3%"),
    (-0.005, "-0.5%"),
    (0.00049, "+0.0%"),     # rounds to zero, still signed
    (-0.0004, "-0.0%"),
    (0.0, "+0.0%"),
    (None, "-"),
])
def test_signed_pct_of_fraction(change: float | None, text: str) -> None:
    assert signed_pct_of_fraction(change) == text


@pytest.mark.parametrize(("change", "text"), [
    (4.2, "+4.2%"),
    (6.25, "+6.2%"),        # half: to even
    (4.75, "+4.8%"),
    (-0.25, "-0.2%"),
    (-0.04, "-0.0%"),
    (0, "+0.0%"),           # an int from JSON formats like a float
    (0.0, "+0.0%"),
    (None, "-"),
])
def test_signed_pct_of_points(change: float | None, text: str) -> None:
    assert signed_pct_of_points(change) == text


@pytest.mark.parametrize("fraction", [0.042, 0.0625, -0.005, 0.0, 1.234])
def test_fraction_and_points_agree_on_the_same_change(fraction: float) -> None:
    """The two signed forms differ only in their input's unit."""
    assert signed_pct_of_fraction(fraction) == signed_pct_of_points(fraction * 100)

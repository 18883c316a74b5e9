"""Fixed number formatting, so the same inputs always give the same bytes.

Every derived file goes through these helpers: CSV cells, markdown cells and JSON
values. Floats are cut to a fixed number of significant digits, NaN and infinity
become empty (CSV), "-" (markdown) or null (JSON), and -0.0 is written as 0.
"""

from __future__ import annotations

import json
import math
from typing import Any

from strata_plugin.formats.printable import printable

CSV_DIGITS = 10
JSON_DIGITS = 12
MD_DIGITS = 4


def _finite(x: Any) -> bool:
    return isinstance(x, float) and math.isfinite(x)


def _sig(x: float, digits: int) -> float:
    if x == 0.0:
        return 0.0
    return float(f"{x:.{digits}g}")


def csv_cell(x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, bool):
        return "1" if x else "0"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            return ""
        return f"{_sig(x, CSV_DIGITS):.{CSV_DIGITS}g}"
    return str(x)


def md_num(x: Any, digits: int = MD_DIGITS) -> str:
    """A number for a markdown cell: 4 significant digits, no exponent below 1e7."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            return "-"
        v = _sig(x, digits)
        if v == 0:
            return "0"
        if abs(v) >= 1e7 or abs(v) < 1e-3:
            return f"{v:.{digits - 1}e}"
        s = f"{v:.{max(0, digits - 1 - math.floor(math.log10(abs(v))))}f}"
        return s.rstrip("0").rstrip(".") if "." in s else s
    return str(x)


# Percentages. Each input unit and rounding has one function, so that the same share is
# the same text in every section; None (not measured, no baseline) is "-" in all of them.


def share_pct(share: float | None, decimals: int = 0) -> str:
    """A share given as a fraction (0.423) as a percent with fixed decimals: "42%",
    "42.3%" (``decimals=1``); half rounds to even, as Python's format does."""
    return "-" if share is None else f"{share:.{decimals}%}"


def share_pct_sig(share: float | None) -> str:
    """A share given as a fraction as a percent with :func:`md_num`'s significant
    digits, so that a small share keeps its size: 0.004231 -> "0.4231%"."""
    return "-" if share is None else f"{md_num(100 * share)}%"


def signed_pct_of_fraction(change: float | None) -> str:
    """A relative change given as a fraction (0.042) as a signed percent, one decimal:
    "+4.2%", "-0.5%"."""
    return "-" if change is None else f"{change * 100:+.1f}%"


def signed_pct_of_points(change: float | None) -> str:
    """A relative change already in percent (4.2) as a signed percent, one decimal:
    "+4.2%", "-0.5%"."""
    return "-" if change is None else f"{change:+.1f}%"


def md_cell(x: Any) -> str:
    """Any value as a markdown table cell: one line (a line feed is a space, every other
    control shown as its escape: formats/printable.py), pipes escaped, so that text from
    a server or a file stays in its cell."""
    s = md_num(x) if isinstance(x, (int, float, bool)) or x is None else str(x)
    return printable(s.replace("\n", " ")).replace("|", "\\|")


def json_clean(obj: Any) -> Any:
    """Plain JSON types with floats cut to 12 significant digits; NaN/inf -> None."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return _sig(obj, JSON_DIGITS) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_clean(v) for v in obj]
    if hasattr(obj, "item"):  # numpy scalar
        return json_clean(obj.item())
    return str(obj)


def json_text(obj: Any) -> str:
    return json.dumps(json_clean(obj), indent=2, sort_keys=True, allow_nan=False) + "\n"

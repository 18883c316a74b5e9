"""The regression gate: worse than a baseline run by more than a margin, with support.

A single noisy sample must not fail a build, and neither must a shift too small to
matter. ``effects.compare`` asks for both: the whole 95% bootstrap interval (requests
resampled) of the relative change of the median lies past the margin, and a one-sided
Mann-Whitney test rejects "no shift" at ``alpha``. The plugin wires this to ``--strata-baseline DIR
--strata-max-regression PCT``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from strata_plugin.analysis.effects import compare
from strata_plugin.analysis.request_values import check_metric, higher_is_worse, unit, values
from strata_plugin.analysis.run_folder import read_records
from strata_plugin.analysis.stats import median
from strata_plugin.formats.records import RequestRecord

MIN_SAMPLES = 3  # fewer requests per side cannot support a verdict either way


@dataclass(frozen=True)
class Regression:
    case_id: str
    metric: str
    unit: str
    baseline_median: float
    current_median: float
    delta_pct: float  # + means worse, whichever direction the metric improves in
    ci_lo_pct: float  # interval of the relative change of the median, in %
    ci_hi_pct: float
    p_value: float  # one-sided Mann-Whitney, "worse" direction
    n_baseline: int
    n_current: int
    max_worse_pct: float

    def message(self) -> str:
        return (
            f"{self.case_id}: {self.metric} median {self.baseline_median:.4g} -> "
            f"{self.current_median:.4g} {self.unit} ({self.delta_pct:+.1f}%, 95% interval "
            f"{self.ci_lo_pct:+.1f}%..{self.ci_hi_pct:+.1f}% over requests, "
            f"p={self.p_value:.2g}; "
            f"allowed {self.max_worse_pct:g}%; n={self.n_baseline}/{self.n_current})"
        )


def regression_check(
    current_records_by_case: Mapping[str, Iterable[RequestRecord]],
    baseline_bundle_dir: Path | str,
    metric: str = "ttft_ms",
    max_worse_pct: float = 5.0,
    alpha: float = 0.05,
) -> list[Regression]:
    """Cases whose ``metric`` got worse than in the baseline run by over ``max_worse_pct``.

    Cases are matched by case id; a case missing from either side, or with fewer than
    3 successful measured requests on a side, is not judged. Raises ValueError for an
    unknown metric and FileNotFoundError when the baseline has no requests.jsonl.
    """
    check_metric(metric)
    path = Path(baseline_bundle_dir) / "requests.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"baseline {baseline_bundle_dir} has no requests.jsonl")
    baseline, _ = read_records(path)
    worse_up = higher_is_worse(metric)
    out = []
    for case_id in sorted(current_records_by_case):
        cur = values(current_records_by_case[case_id], metric)
        base = values(baseline.get(case_id, []), metric)
        if len(cur) < MIN_SAMPLES or len(base) < MIN_SAMPLES:
            continue
        try:
            c = compare(
                base,
                cur,
                metric=metric,
                max_worse=max_worse_pct / 100.0,
                higher_is_worse=worse_up,
                alpha=alpha,
            )
        except ValueError:  # e.g. a zero baseline median: a relative change is undefined
            continue
        if not c.worse:
            continue
        sign = 1.0 if worse_up else -1.0
        lo, hi = sorted((sign * c.lo * 100, sign * c.hi * 100))
        out.append(
            Regression(
                case_id=case_id,
                metric=metric,
                unit=unit(metric),
                baseline_median=median(base),
                current_median=median(cur),
                delta_pct=sign * c.delta_rel * 100,
                ci_lo_pct=lo,
                ci_hi_pct=hi,
                p_value=c.p_worse,
                n_baseline=len(base),
                n_current=len(cur),
                max_worse_pct=max_worse_pct,
            )
        )
    return out

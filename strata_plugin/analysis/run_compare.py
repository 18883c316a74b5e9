"""Run against run: per-case deltas of request metrics, with intervals and a call.

``python -m strata_plugin compare RUN_A RUN_B`` prints this table; RUN_A is the
baseline. Cases are matched by case id. One repetition per case and run, so the unit
of resampling is the request; the interval and the call come from ``effects.compare``
(95% bootstrap over requests, one-sided Mann-Whitney at ``alpha``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata_plugin.analysis.effects import LEVEL, compare
from strata_plugin.analysis.metrics import REQUEST_COMPARED as DEFAULT_METRICS
from strata_plugin.analysis.request_values import higher_is_worse, unit, values
from strata_plugin.analysis.run_folder import read_records
from strata_plugin.analysis.stats import median


@dataclass(frozen=True)
class RunDelta:
    case_id: str
    metric: str
    unit: str
    n_a: int
    n_b: int
    median_a: float | None
    median_b: float | None
    delta_rel: float | None  # median(B)/median(A) - 1
    lo: float | None  # interval of delta_rel, at ``level``, requests resampled
    hi: float | None
    p_value: float | None  # one-sided Mann-Whitney in the "worse" direction
    call: str  # "worse" | "better" | "same" | "only in A" | "only in B" | "too few"
    level: float = LEVEL
    unit_of_resampling: str = "request"


def compare_runs(
    run_a: Path,
    run_b: Path,
    metrics: Sequence[str] = DEFAULT_METRICS,
    threshold_pct: float = 5.0,
    alpha: float = 0.05,
) -> list[RunDelta]:
    a_recs, _ = read_records(Path(run_a) / "requests.jsonl")
    b_recs, _ = read_records(Path(run_b) / "requests.jsonl")
    out = []
    for cid in sorted(set(a_recs) | set(b_recs)):
        for metric in metrics:
            a = values(a_recs.get(cid, []), metric)
            b = values(b_recs.get(cid, []), metric)
            ma = median(a) if a else None
            mb = median(b) if b else None
            base: dict[str, Any] = dict(  # RunDelta's fields common to every call
                case_id=cid,
                metric=metric,
                unit=unit(metric),
                n_a=len(a),
                n_b=len(b),
                median_a=ma,
                median_b=mb,
            )
            if not a and not b:
                continue
            if not a or not b:
                out.append(
                    RunDelta(
                        **base,
                        delta_rel=None,
                        lo=None,
                        hi=None,
                        p_value=None,
                        call="only in B" if b else "only in A",
                    )
                )
                continue
            if len(a) < 2 or len(b) < 2 or not ma:
                rel = (mb / ma - 1.0) if ma and mb is not None else None
                out.append(
                    RunDelta(**base, delta_rel=rel, lo=None, hi=None, p_value=None, call="too few")
                )
                continue
            c = compare(
                a,
                b,
                metric=metric,
                max_worse=threshold_pct / 100.0,
                higher_is_worse=higher_is_worse(metric),
                alpha=alpha,
            )
            call = "worse" if c.worse else "better" if c.better else "same"
            out.append(
                RunDelta(
                    **base, delta_rel=c.delta_rel, lo=c.lo, hi=c.hi, p_value=c.p_worse, call=call
                )
            )
    return out

"""A/B effects with confidence intervals, for the cases that compare two arms.

Throughputs are one value per repetition (a window), so their interval comes
from resampling repetitions; latency percentiles pool the requests of all
repetitions of an arm and resample requests. Both use the seeded percentile
bootstrap of ``stats.bootstrap_ci`` and report relative changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from strata_plugin.analysis.metrics import request_metrics
from strata_plugin.analysis.stats import bootstrap_ci, percentile


@dataclass(frozen=True)
class Effect:
    metric: str
    control: float
    treatment: float
    change_pct: float
    ci_lo_pct: float
    ci_hi_pct: float
    n_control: int
    n_treatment: int

    def line(self) -> str:
        return (f"{self.metric}: {self.control:.4g} -> {self.treatment:.4g} "
                f"({self.change_pct:+.2f}%, 95% CI {self.ci_lo_pct:+.2f}% .. "
                f"{self.ci_hi_pct:+.2f}%; n={self.n_control}/{self.n_treatment})")


def _p95(values: Sequence[float]) -> float:
    return percentile(values, 95)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def effect(metric: str, control: Sequence[float], treatment: Sequence[float], *,
           stat=_mean) -> Effect:
    delta, lo, hi = bootstrap_ci(control, treatment, stat=stat, relative=True)
    return Effect(metric, stat(list(control)), stat(list(treatment)), 100 * delta, 100 * lo,
                  100 * hi, len(control), len(treatment))


def mixed_effects(control_runs, treatment_runs) -> list[Effect]:
    """Output tok/s (per repetition) and TPOT p95 (pooled requests) of two arms."""
    tput_c = [r.metrics.output_tok_s for r in control_runs]
    tput_t = [r.metrics.output_tok_s for r in treatment_runs]
    tpot_c = [m.tpot_ms for r in control_runs for m in map(request_metrics, r.records)
              if m.tpot_ms is not None]
    tpot_t = [m.tpot_ms for r in treatment_runs for m in map(request_metrics, r.records)
              if m.tpot_ms is not None]
    return [effect("output_tok_s", tput_c, tput_t),
            effect("tpot_p95_ms", tpot_c, tpot_t, stat=_p95)]


def outputs_identical(runs_a, runs_b) -> bool | None:
    """Whether the same prompts gave the same output text (SHA-256) in both arms."""
    def shas(runs):
        return {r.request_id.rsplit("/", 1)[-1]: r.output_sha256
                for run in runs for r in run.records if r.ok}

    a, b = shas(runs_a), shas(runs_b)
    common = set(a) & set(b)
    if not common:
        return None
    return all(a[k] == b[k] for k in common)

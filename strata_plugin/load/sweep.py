"""A capacity sweep: open-loop steps of rising offered rate until the server saturates,
then bisection around the knee; goodput at an SLO per step (analysis/capacity.py).

Each step is an ordinary case (``<case_id>/rate-<r>``) in the run folder, so the
report analyses it like any other (verdict included) and draws the sweep from the
steps' requests alone. Steps overload the server on purpose: their failed requests
count against goodput instead of failing the test.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from strata_plugin.analysis.capacity import (
    GOOD_FRACTION,
    SweepStep,
    capacity_at_slo,
    knee,
    next_rate,
    step_figures,
)
from strata_plugin.analysis.metrics import Slo
from strata_plugin.load.workload import Workload


@dataclass(frozen=True)
class CapacitySweep:
    """``strata.sweep(CapacitySweep(Workload(...), Slo(ttft_ms=500, tpot_ms=50)))``.

    The workload gives the request shape (isl, osl, seed, prefix); each step replaces
    its arrival with Poisson at the step's rate and its count with enough requests to
    offer ``step_s`` seconds of load (at least ``min_requests``).
    """

    workload: Workload
    slo: Slo
    start_rate: float = 0.5
    factor: float = 2.0
    max_steps: int = 6  # rising (or falling, while even the lowest saturates) steps
    refine: int = 2  # bisections between the knee and the first saturated rate
    step_s: float = 10.0
    min_requests: int = 12
    good_fraction: float = GOOD_FRACTION
    name: str = ""

    def __post_init__(self) -> None:
        if self.start_rate <= 0 or self.factor <= 1 or self.step_s <= 0:
            raise ValueError("CapacitySweep: start_rate > 0, factor > 1 and step_s > 0")
        if self.max_steps < 1 or self.refine < 0 or self.min_requests < 3:
            raise ValueError("CapacitySweep: max_steps >= 1, refine >= 0, min_requests >= 3")
        if not self.slo.is_set():
            raise ValueError("CapacitySweep: goodput needs an SLO (e.g. Slo(ttft_ms=500))")
        if not 0 < self.good_fraction <= 1:
            raise ValueError("CapacitySweep: good_fraction in (0, 1]")

    def step_workload(self, rate: float) -> Workload:
        n = max(self.min_requests, round(rate * self.step_s))
        return replace(self.workload, arrival="poisson", rate=rate, requests=n, warmups=0)


@dataclass(frozen=True)
class SweepResult:
    steps: tuple[SweepStep, ...]  # in the order run
    knee: SweepStep | None
    capacity: SweepStep | None  # highest offered rate meeting the SLO target
    case_ids: tuple[str, ...]

    def summary(self) -> str:
        k = f"{self.knee.offered_rate:.3g} req/s" if self.knee else "not found"
        c = f"{self.capacity.offered_rate:.3g} req/s" if self.capacity else "none"
        return f"knee {k}; capacity at SLO {c}; {len(self.steps)} steps"


def run_sweep(runner: Any, sweep: CapacitySweep, case_id: str) -> SweepResult:
    """Run the steps through ``runner.run`` (a CaseRunner)."""
    name = sweep.name or case_id
    steps: list[SweepStep] = []
    ids: list[str] = []

    def one(rate: float) -> None:
        cid = f"{case_id}/rate-{rate:.4g}"
        res = runner.run(sweep.step_workload(rate), case_id=cid, scale=False,
                         allow_errors=True,
                         extra={"sweep": name, "offered_rate": rate,
                                "slo": sweep.slo.describe(),
                                "good_fraction": sweep.good_fraction})
        steps.append(step_figures(res.records, rate, sweep.slo))
        ids.append(cid)

    rate = sweep.start_rate
    for _ in range(sweep.max_steps):
        one(rate)
        if knee(steps) is not None:
            break
        rate = next_rate(steps, factor=sweep.factor)
    for _ in range(sweep.refine):
        if knee(steps) is None:
            break
        one(next_rate(steps, factor=sweep.factor))
    return SweepResult(tuple(steps), knee(steps), capacity_at_slo(steps, sweep.good_fraction),
                       tuple(ids))

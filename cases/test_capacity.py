"""Capacity at an SLO on the target: a Poisson rate sweep to saturation, refined at the knee.

The report's "Capacity" section gives each step (offered and achieved rate, latency,
goodput, saturation, verdict), the knee, the capacity at the SLO and the plot.
"""

import pytest

from strata_plugin import CapacitySweep, Slo, Workload

SWEEP = CapacitySweep(
    Workload("capacity", isl=128, osl=16, seed=11),
    Slo(ttft_ms=2000, tpot_ms=200),
    start_rate=0.5, factor=2.0, max_steps=8, refine=2, step_s=12.0, min_requests=12,
)


@pytest.mark.capacity
def test_capacity_sweep(strata):
    result = strata.sweep(SWEEP, case_id="capacity")
    print(result.summary())
    assert result.knee is not None, [(s.offered_rate, s.reason) for s in result.steps]

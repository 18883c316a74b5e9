"""The engine-metric signals read the engines' own counters, not look-alike names."""

from __future__ import annotations

import pytest

from strata_plugin.analysis.signals import HwView, _prom_signals
from strata_plugin.analysis.timeline import HwStat


def _counter(metric: str, delta: float, device: str = "engine=0") -> HwStat:
    return HwStat(window="w", node="n", source="prom", device=device, metric=metric,
                  kind="counter", n=10, coverage=1.0, delta=delta, rate=delta / 5)


# What vLLM 0.32's /metrics gave over a case window with 23 requests finished and none
# preempted: its per-request histogram of preemptions counts every finished request.
HISTOGRAM = [_counter("vllm:request_num_preemptions_count", 23.0),
             _counter("vllm:request_num_preemptions_bucket", 23.0, "engine=0;le=+Inf"),
             _counter("vllm:request_num_preemptions_sum", 0.0)]


@pytest.mark.parametrize(("counter", "delta"), [("preemptions_total", 0.0),
                                                ("preemptions_total", 1.0),
                                                ("retracted_requests_total", 1.0)])
def test_preemptions_are_the_engine_counter_and_not_the_per_request_histogram(counter, delta):
    got = _prom_signals(HwView([*HISTOGRAM, _counter(counter, delta)]))
    assert got["preemptions"] == delta


def test_no_preemption_counter_is_no_value():
    assert _prom_signals(HwView(HISTOGRAM))["preemptions"] is None

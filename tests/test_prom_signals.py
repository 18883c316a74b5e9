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


def test_engine_queue_time_over_ttft_and_prefix_cache_hits_come_from_the_histograms():
    rows = [_counter("queue_time_seconds_sum", 3.0), _counter("ttft_seconds_sum", 4.0),
            _counter("prefix_cache_hits_total", 256.0),
            _counter("prefix_cache_queries_total", 1024.0)]
    got = _prom_signals(HwView(rows))
    assert got["engine_queue_frac"] == 0.75 and got["prefix_cache_hit_frac"] == 0.25
    # a TTFT sum that did not grow (no request finished in the window): no ratio
    idle = _prom_signals(HwView([_counter("queue_time_seconds_sum", 0.0),
                                 _counter("ttft_seconds_sum", 0.0)]))
    assert idle["engine_queue_frac"] is None and idle["prefix_cache_hit_frac"] is None


def test_the_report_shows_the_engine_histograms_as_means_per_window():
    from strata_plugin.report.tables import key_hw_rows

    rows = key_hw_rows([_counter("queue_time_seconds_sum", 0.5),
                        _counter("queue_time_seconds_count", 10.0),
                        _counter("decode_time_seconds_sum", 2.0),
                        _counter("decode_time_seconds_count", 10.0),
                        _counter("prefix_cache_hits_total", 0.0),
                        _counter("prefix_cache_queries_total", 512.0),
                        _counter("prefill_time_seconds_sum", 1.0),
                        _counter("prefill_time_seconds_count", 0.0)])  # none finished
    got = {r[2]: (r[3], r[4]) for r in rows}
    assert got == {"engine queue time (mean)": (50.0, "ms"),
                   "engine decode time (mean)": (200.0, "ms"),
                   "prefix-cache hits": (0.0, "% of lookups")}

"""Contracts of the rules' helpers that no window's verdict shows on its own.

Mutation testing (docs/validation.md) found these unread by every verdict test: which
collector a missing signal's "unavailable" reason is attached to, what a comparison of
an unmeasured signal records, and how a rule's score is put together where two classes
share a window.
"""

from __future__ import annotations

import dataclasses

import pytest

from strata_plugin.analysis.rules import (
    SIGNAL_SOURCES,
    RuleCheck,
    WindowSignals,
    classify,
    margin,
    rule_gpu_memory_bandwidth,
    signal_margin,
)
from strata_plugin.analysis.rules.verdict import _missing_text
from strata_plugin.analysis.thresholds import value
from tests.test_attribution import CPU_CLEAN, GPU_CLEAN

UNMEASURED = WindowSignals(window="w", duration_s=60.0)


def _reason(signal: str, *unavailable: tuple[str, str]) -> str:
    return _missing_text(signal, dataclasses.replace(UNMEASURED, unavailable=unavailable))


@pytest.mark.parametrize(
    ("signal", "where", "attached"),
    [
        # the collector named exactly (the part before the source's first colon)
        ("net_util", "node0/net", True),
        ("gpu_util", "node0/nvml", True),
        ("gpu_util", "node0/nvm", False),  # a prefix of the collector's name is not it
        # a device/metric entry names the metric after the first colon
        ("gpu_util", "node0/nvml/0/gpu_util_pct", True),
        ("gpu_util", "node0/gpu/0/gpu_util_pct", True),
        ("gpu_util", "node0/dcgm/0/gpu_util_pct", True),  # another collector, same metric
        ("gpu_util", "node0/dcgm/0/sm_clock", False),
        # the metric part of a source that names a second collector after its own
        ("socket_fallback_bytes_s", "node0/rdma", True),
        ("socket_fallback_bytes_s", "node0/net", True),
        ("cgroup_quota_used", "node0/proc", True),
        ("cgroup_quota_used", "node0/nvml", False),
    ],
)
def test_an_unavailable_collector_is_named_beside_the_signals_it_feeds(
    signal: str, where: str, attached: bool
) -> None:
    text = _reason(signal, (where, "not running"))
    assert text.startswith(f"{signal} <- {SIGNAL_SOURCES[signal]} ")
    assert (f"(unavailable: {where}: not running)" in text) is attached, text
    if not attached:
        assert text.endswith("(no samples in the window)"), text


def test_every_reason_for_one_signal_is_listed() -> None:
    text = _reason("gpu_util", ("node0/nvml", "no driver"), ("node1/nvml", "no driver"))
    assert text.endswith("(unavailable: node0/nvml: no driver; node1/nvml: no driver)"), text


def test_every_signal_a_rule_can_miss_has_a_collector_and_metric_source() -> None:
    """The nothing-measured window, with GPUs and two nodes expected, reaches every rule's
    first ``need``; each signal it names has a ``collector:metric`` source to show."""
    everything = dataclasses.replace(UNMEASURED, gpu_expected=True, multi_node=True, n_gpus=8)
    missing = classify(everything).missing_signals
    assert len(missing) >= 15, missing
    for text in missing:
        signal = text.split(" <- ", 1)[0]
        assert ":" in SIGNAL_SOURCES[signal], signal
    assert all(":" in src for src in SIGNAL_SOURCES.values())


def test_an_unmeasured_signal_is_not_compared_and_adds_no_margin() -> None:
    w = dataclasses.replace(CPU_CLEAN, steal_frac=None)
    r = RuleCheck("cpu_contention", w)
    assert r.cmp("steal_frac", ">=", "steal_frac") is False
    assert r.o.evidence == []  # nothing was measured, so nothing is shown as "not met"
    assert signal_margin(w, "steal_frac", "steal_frac") == 0.0


def test_dram_bound_beside_busy_tensor_pipes_scores_half_its_margin() -> None:
    """Compute leads where the tensor pipes are busy too: DRAM is a second, balanced load,
    its score half what the same DRAM activity earns alone."""
    dram = 0.6
    full = (dram - value("dram_active_bound")) / value("dram_active_bound") / value("full_margin")
    busy = dict(gpu_util=0.99, sm_active=0.7, dram_active=dram)
    alone = rule_gpu_memory_bandwidth(dataclasses.replace(GPU_CLEAN, **busy, tensor_active=0.1))
    beside = rule_gpu_memory_bandwidth(dataclasses.replace(GPU_CLEAN, **busy, tensor_active=0.7))
    assert alone.fired and beside.fired
    assert alone.score == pytest.approx(full, rel=1e-3)
    assert beside.score == pytest.approx(full / 2, rel=1e-3)


@pytest.mark.parametrize("op", ["<=", ">", "XX<XX", None])
def test_a_margin_for_a_comparison_the_rules_do_not_make_is_an_error(op) -> None:
    """Only ">=" and "<" get a margin; anything else once read as "below" and reversed
    the score of a rule that passed it."""
    with pytest.raises(ValueError, match=f"unknown comparison {op!r}"):
        margin(1.0, 2.0, op)
    assert margin(2.1, 2.0, ">=") == pytest.approx(margin(1.9, 2.0, "<"))
    assert margin(2.1, 2.0, ">=") == pytest.approx(0.05 / value("full_margin"))

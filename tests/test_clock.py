"""Clock alignment on recorded data with a known offset and drift."""

from __future__ import annotations

import numpy as np
import pytest

from strata_plugin.agent.handle import ClockOffset
from strata_plugin.analysis import clocks as clock
from strata_plugin.analysis.clocks import NodeClock, node_clocks
from strata_plugin.analysis.timeline import load_samples

T0 = 1_800_000_000_000_000_000  # harness wall ns at the start measurement
SPAN = 60_000_000_000  # 60 s between the start and end measurements
OFFSET = 250_000_000  # the node runs 250 ms ahead...
DRIFT_PPM = 40.0  # ...and gains 40 µs per second


def true_offset(harness_ns):
    return OFFSET + (np.asarray(harness_ns, dtype=np.int64) - T0) * DRIFT_PPM * 1e-6


def measured(harness_mid: int, error_ns: int, rtt_ns: int = 2_000_000) -> ClockOffset:
    """What the handle's ping would report: the true offset, off by at most rtt/2."""
    off = int(true_offset(harness_mid)) + error_ns
    return ClockOffset(off, rtt_ns, rtt_ns // 2, 8, harness_mid)


def recorded_samples(n: int = 601):
    """Samples every 100 ms on the harness clock, stamped by the drifting node clock."""
    harness = T0 + np.arange(n, dtype=np.int64) * 100_000_000
    node = harness + true_offset(harness).astype(np.int64)
    return harness, node


def test_align_recovers_a_250ms_offset_with_drift():
    harness, node = recorded_samples()
    start = measured(T0, +400_000)  # within ±1 ms (rtt 2 ms)
    end = measured(T0 + SPAN, -300_000)
    fit = clock.fit("gpu-b", start, end)
    assert fit.start_wall_ns == T0 + start.offset_ns  # anchors are on the node clock
    # measurement errors of +0.4 / -0.3 ms over 60 s move the fitted drift by <= 12 ppm
    assert fit.drift_ppm == pytest.approx(DRIFT_PPM, abs=12)
    exact = clock.fit("gpu-b", measured(T0, 0), measured(T0 + SPAN, 0))
    assert exact.drift_ppm == pytest.approx(DRIFT_PPM, abs=0.01)
    aligned = clock.align(
        node, fit.offset_start_ns, fit.offset_end_ns, fit.start_wall_ns, fit.end_wall_ns
    )
    err = aligned - harness
    assert np.abs(err).max() <= fit.uncertainty_ns  # the stated bound holds
    assert np.all(np.diff(aligned) > 0)  # order kept
    # without the drift term the end is 2 ms off (2x the bound): the interpolation matters
    flat = clock.align(node, fit.offset_start_ns, fit.offset_start_ns, 0, 0)
    assert np.abs(flat - harness).max() >= 2 * fit.uncertainty_ns


def test_align_holds_the_offset_outside_the_measured_span():
    off = clock.offset_at([0, 50, 100, 150, 200], 10, 20, 50, 150)
    assert off.tolist() == [10, 10, 15, 20, 20]
    assert clock.align([5], 7, 7, 0, 0).tolist() == [-2]
    assert clock.offset_at([], 1, 2, 0, 10).tolist() == []


def test_the_timeline_applies_the_same_numbers_from_the_manifest(tmp_path):
    """fit().manifest() uses the names clocks.node_clocks reads, and the timeline's
    NodeClock gives exactly what align() gives."""
    harness, node = recorded_samples()
    fit = clock.fit("gpu-b", measured(T0, 700_000), measured(T0 + SPAN, -900_000))
    entry = fit.manifest()
    assert set(clock.MANIFEST_KEYS) <= set(entry)
    clocks = node_clocks({"nodes": {"gpu-b": entry}})
    nc = clocks["gpu-b"]
    assert isinstance(nc, NodeClock) and nc.measured
    assert (nc.offset_start_ns, nc.offset_end_ns) == (fit.offset_start_ns, fit.offset_end_ns)
    assert (nc.start_wall_ns, nc.end_wall_ns) == (fit.start_wall_ns, fit.end_wall_ns)
    assert nc.uncertainty_ns == fit.uncertainty_ns
    expected = clock.align(
        node, fit.offset_start_ns, fit.offset_end_ns, fit.start_wall_ns, fit.end_wall_ns
    )
    assert np.array_equal(nc.to_harness(node), expected)
    # and through the files: a recorded samples/net.csv lands on the harness clock
    sdir = tmp_path / "nodes" / "gpu-b" / "samples"
    sdir.mkdir(parents=True)
    lines = ["wall_ns,node,source,device,metric,value,kind"]
    lines += [f"{t},gpu-b,net,eth0,rx_bytes,{i * 1000},counter" for i, t in enumerate(node)]
    (sdir / "net.csv").write_text("\n".join(lines) + "\n")
    store = load_samples(tmp_path, clocks)
    (i,) = store.find(node="gpu-b", metric="rx_bytes")
    t, _ = store.series(i)
    assert np.array_equal(t, expected)
    assert np.abs(t - harness).max() <= fit.uncertainty_ns


def test_warning_when_uncertainty_exceeds_the_interval():
    assert clock.clock_warning("a", 40_000_000, 0.5) is None
    w = clock.clock_warning("b", 600_000_000, 0.5)
    assert w is not None and "node b" in w and "600.0 ms" in w and "500 ms" in w
    assert clock.clock_warning("c", None, 0.5) is None
    nodes = {
        "nodes": {
            "fine": {"clock_uncertainty_ns": 1_000, "offset_start_ns": 0, "offset_end_ns": 10},
            "slow": {"clock_uncertainty_ns": 700_000_000},
            "jumpy": {
                "clock_uncertainty_ns": 1,
                "offset_start_ns": 0,
                "offset_end_ns": 900_000_000,
            },
        }
    }
    warnings = clock.clock_warnings(nodes, 0.5)
    assert len(warnings) == 2
    assert any("node slow" in w for w in warnings) and any("node jumpy" in w for w in warnings)


def test_a_start_only_fit_has_no_drift():
    fit = clock.fit("x", ClockOffset(5, 10, 5, 8, T0))
    assert fit.offset_end_ns == 5 and fit.drift_ppm is None and fit.end_wall_ns is None
    assert clock.align([T0 + 10], 5, 5, fit.start_wall_ns or 0, 0).tolist() == [T0 + 5]

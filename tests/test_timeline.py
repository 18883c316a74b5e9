"""The timeline: clock offsets, sample loading, counters, gauges, fractions, windows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from strata_plugin.analysis.clocks import NodeClock, node_clocks
from strata_plugin.analysis.timeline import (
    Window,
    case_windows,
    inflight_fraction,
    load_samples,
    merge_intervals,
    run_windows,
    summarize_series,
    summarize_window,
)
from strata_plugin.formats.windows import Marker

S = 1_000_000_000
T0 = 1_700_000_000 * S
HEADER = "wall_ns,node,source,device,metric,value,kind\n"


def write_samples(run: Path, node: str, source: str, rows: list[tuple], unavailable=None) -> None:
    d = run / "nodes" / node / "samples"
    d.mkdir(parents=True, exist_ok=True)
    text = HEADER + "".join(
        f"{t},{node},{source},{dev},{metric},{value},{kind}\n"
        for t, dev, metric, value, kind in rows
    )
    (d / f"{source}.csv").write_text(text)
    if unavailable is not None:
        (run / "nodes" / node / "unavailable.json").write_text(json.dumps(unavailable))


def by_metric(stats, metric, device=""):
    return next(s for s in stats if s.metric == metric and s.device == device)


def test_node_clock_interpolates_drift_and_clips():
    c = NodeClock("n", offset_start_ns=1000, offset_end_ns=3000, start_wall_ns=0, end_wall_ns=100)
    t = np.array([-50, 0, 50, 100, 200], dtype=np.int64)
    assert c.offsets(t).tolist() == [1000, 1000, 2000, 3000, 3000]
    assert c.to_harness(t).tolist() == [-1050, -1000, -1950, -2900, -2800]


def test_node_clocks_from_manifest_defaults():
    clocks = node_clocks(
        {
            "nodes": {
                "a": {"clock_offset_ns": 5, "clock_uncertainty_ns": 2},
                "b": {"offset_start_ns": 1, "offset_end_ns": 9},
                "c": {},
            }
        }
    )
    assert clocks["a"].offset_start_ns == clocks["a"].offset_end_ns == 5
    assert clocks["a"].uncertainty_ns == 2 and clocks["a"].measured
    assert (clocks["b"].offset_start_ns, clocks["b"].offset_end_ns) == (1, 9)
    assert clocks["c"].offset_start_ns == 0 and not clocks["c"].measured


def test_offset_moves_a_step_into_the_right_window(tmp_path):
    """The node's clock is 2 s ahead: its step at node time 12 s is harness time 10 s."""
    rows = [
        (T0 + k * S // 4 + 2 * S, "gpu0", "gpu_util_pct", 90 if k >= 40 else 0, "gauge")
        for k in range(80)
    ]
    write_samples(tmp_path, "n0", "nvml", rows)
    store = load_samples(tmp_path, {"n0": NodeClock("n0", 2 * S, 2 * S)})
    busy = summarize_window(store, Window("case", "busy", "busy", T0 + 10 * S, T0 + 19 * S))
    idle = summarize_window(store, Window("case", "idle", "idle", T0, T0 + 9 * S))
    assert by_metric(busy, "gpu_util_pct", "gpu0").min == 90
    assert by_metric(idle, "gpu_util_pct", "gpu0").max == 0
    # Without the offset the busy window would start 2 s early and mix in idle samples.
    raw = load_samples(tmp_path)
    mixed = summarize_window(raw, Window("case", "busy", "busy", T0 + 10 * S, T0 + 19 * S))
    assert by_metric(mixed, "gpu_util_pct", "gpu0").min == 0


def test_counter_delta_rate_and_reset(tmp_path):
    # 10 units/s, restarting from 0 at t=5 s (a process restart).
    rows = []
    for k in range(11):
        v = 1000 + 10 * k if k < 5 else 10 * (k - 5) + 10
        rows.append((T0 + k * S, "", "major_faults", v, "counter"))
    write_samples(tmp_path, "n0", "proc", rows)
    store = load_samples(tmp_path)
    st = summarize_window(store, Window("case", "w", "w", T0, T0 + 10 * S))
    s = by_metric(st, "major_faults")
    assert s.kind == "counter"
    assert s.delta == pytest.approx(100.0)
    assert s.rate == pytest.approx(10.0)
    assert s.p50 == pytest.approx(10.0)


def test_counter_edges_are_interpolated(tmp_path):
    rows = [(T0 + k * S, "", "read_bytes", 100.0 * k, "counter") for k in range(10)]
    write_samples(tmp_path, "n0", "proc", rows)
    store = load_samples(tmp_path)
    st = summarize_series(store, 0, Window("case", "w", "w", T0 + S // 2, T0 + 3 * S // 2))
    assert st.delta == pytest.approx(100.0)
    assert st.coverage == pytest.approx(1.0)


def test_gauge_stats_and_fraction_rules(tmp_path):
    rows = []
    for k in range(10):
        t = T0 + k * S
        rows.append((t, "gpu0", "sm_clock_mhz", 1500 if k < 4 else 1980, "gauge"))
        rows.append((t, "gpu0", "sm_clock_max_mhz", 1980, "gauge"))
        rows.append((t, "gpu0", "throttle_reasons", 4 if k < 2 else 1, "gauge"))
    write_samples(tmp_path, "n0", "nvml", rows)
    st = summarize_window(load_samples(tmp_path), Window("case", "w", "w", T0, T0 + 9 * S))
    clock = by_metric(st, "sm_clock_mhz", "gpu0")
    assert (clock.min, clock.max, clock.n) == (1500, 1980, 10)
    assert clock.mean == pytest.approx((4 * 1500 + 6 * 1980) / 10)
    assert by_metric(st, "frac_sm_clock_below_90pct_max", "gpu0").mean == pytest.approx(0.4)
    # 0x1 (GPU idle) is not a slowdown; 0x4 (SW power cap) is.
    assert by_metric(st, "frac_throttled", "gpu0").mean == pytest.approx(0.2)


@pytest.mark.parametrize(("source", "start_s", "end_s", "held"), [
    ("allowance", 2.2, 2.8, 1.0),  # between two ticks: the reading before the window
    ("allowance", 3.0, 3.8, 2.0),  # a tick inside: its own reading, n 1
    ("allowance", 9.2, 9.8, None),  # after the last tick: nothing says it held
    ("allowance", -0.8, -0.2, None),  # before the first
    ("nvml", 2.2, 2.8, None),  # a measured gauge is not a state: none without a sample
])
def test_a_state_gauge_holds_between_ticks_for_a_window_shorter_than_one(
        tmp_path, source, start_s, end_s, held):
    rows = [(T0 + k * S, "", "allowed_cpus", 1.0 if k < 3 else 2.0, "gauge") for k in range(10)]
    write_samples(tmp_path, "n0", source, rows)
    w = Window("case", "w", "w", T0 + int(start_s * S), T0 + int(end_s * S))
    st = summarize_series(load_samples(tmp_path), 0, w)
    if held is None:
        assert st is None
    else:
        assert st is not None and (st.min, st.max) == (held, held)
        assert (st.n, st.coverage) == ((0, 0.0) if start_s % 1 else (1, st.coverage))


def test_loader_tolerates_live_files(tmp_path):
    """A torn last line, empty values, out-of-order rows, and an empty file."""
    d = tmp_path / "nodes" / "n0" / "samples"
    d.mkdir(parents=True)
    (d / "mem.csv").write_text(
        HEADER
        + f"{T0 + 2 * S},n0,mem,,mem_available_bytes,3,gauge\n"
        + f"{T0},n0,mem,,mem_available_bytes,1,gauge\n"
        + f"{T0 + S},n0,mem,,mem_available_bytes,,gauge\n"
        + f"{T0 + S},n0,mem,,mem_available_bytes,2,gauge\n"
        + f"{T0 + 3 * S},n0,mem,,mem_avail"
    )
    (d / "disk.csv").write_text(HEADER)
    (d / "net.csv").write_text("")
    store = load_samples(tmp_path)
    assert len(store.keys) == 1 and store.keys[0].device == ""
    t, v = store.series(0)
    assert v.tolist() == [1.0, 2.0, 3.0]
    assert t.tolist() == sorted(t.tolist())


def test_unavailable_is_read_and_missing_source_is_absent(tmp_path):
    write_samples(
        tmp_path, "n0", "cpu", [(T0, "", "load1", 1.0, "gauge")], unavailable={"nvml": "no driver"}
    )
    store = load_samples(tmp_path)
    assert store.unavailable == {"n0": {"nvml": "no driver"}}
    assert store.sources() == {("n0", "cpu")}
    assert summarize_window(store, Window("case", "w", "w", T0 + S, T0 + 2 * S)) == []


def test_no_nodes_folder_gives_an_empty_store(tmp_path):
    store = load_samples(tmp_path)
    assert len(store) == 0 and store.keys == ()


def test_case_windows_prefer_the_measured_phase():
    ms = [
        Marker("case", "c1", "c1", 0, 100),
        Marker("warmup", "c1", "c1", 0, 30),
        Marker("measured", "c1", "c1", 30, 100),
        Marker("case", "c2", "c2", 200, 300),
        Marker("baseline", "baseline:x", "", -50, 0),
        Marker("run", "run", "", -50, 300),
    ]
    wins = case_windows(ms)
    assert (wins["c1"].start_ns, wins["c1"].end_ns) == (30, 100)
    assert (wins["c2"].start_ns, wins["c2"].end_ns) == (200, 300)
    names = [w.name for w in run_windows(ms)]
    assert names == ["baseline:x", "run", "c1", "c2"]


def test_inflight_fraction_and_merge():
    assert inflight_fraction([(0, 10), (5, 20), (30, 40)], 0, 50) == pytest.approx(0.6)
    assert inflight_fraction([(-10, 100)], 0, 50) == 1.0
    assert inflight_fraction([], 0, 50) == 0.0
    assert inflight_fraction([(0, 1)], 5, 5) is None
    assert merge_intervals([(0, 10), (12, 20), (5, 11)]) == [(0, 11), (12, 20)]
    assert merge_intervals([(0, 10), (12, 20)], gap=2) == [(0, 20)]


def test_agent_metric_names_are_converted_on_load(tmp_path):
    """The agent's own spellings and units land under the names the report reads."""
    gpu = [(T0 + k * S, "gpu0", "util_gpu_pct", 50, "gauge") for k in range(3)]
    gpu += [(T0 + k * S, "gpu0", "power_mw", 300_000, "gauge") for k in range(3)]
    gpu += [(T0 + k * S, "gpu0", "gpm_pcie_rx_mibps", 1000, "gauge") for k in range(3)]
    write_samples(tmp_path, "n0", "nvml", gpu)
    write_samples(
        tmp_path, "n0", "dcgm", [(T0 + k * S, "gpu1", "sm_active", 0.7, "gauge") for k in range(3)]
    )
    write_samples(
        tmp_path,
        "n0",
        "proc",
        [(T0 + k * S, "", "run_delay_s", 0.5 * k, "counter") for k in range(3)],
    )
    write_samples(
        tmp_path,
        "n0",
        "disk",
        [(T0 + k * S, "sda", "busy_s", 0.25 * k, "counter") for k in range(3)],
    )
    st = summarize_window(load_samples(tmp_path), Window("case", "w", "w", T0, T0 + 2 * S))
    assert by_metric(st, "gpu_util_pct", "gpu0").mean == 50
    assert by_metric(st, "power_w", "gpu0").mean == pytest.approx(300.0)
    assert by_metric(st, "gpm_pcie_rx_bytes_s", "gpu0").mean == pytest.approx(1000 * 2**20)
    assert by_metric(st, "gpm_sm_activity_pct", "gpu1").mean == pytest.approx(70.0)
    assert by_metric(st, "runqueue_delay_ns").rate == pytest.approx(0.5e9)
    assert by_metric(st, "busy_ms", "sda").rate == pytest.approx(250.0)

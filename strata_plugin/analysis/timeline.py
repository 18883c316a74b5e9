"""The run's one timeline: windows, node clocks, and samples summarized per window.

Why this module exists: telemetry comes from several nodes, each stamping samples
with its own wall clock, while markers and requests are on the harness clock.
Every sample is moved onto the harness wall clock here, once, and stored as one
sorted run of rows per series, so slicing a window is two ``searchsorted`` calls
per series. That keeps a 30-minute, 16-GPU run (millions of samples) to seconds.

pandas and numpy are imported inside functions: the plugin imports this module
when pytest starts, and ``pytest --help`` must stay fast.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strata_plugin.analysis.clocks import NodeClock
from strata_plugin.formats.windows import Marker, read_markers

if TYPE_CHECKING:
    import numpy as np

#: Bits of NVML's clock-event mask that mean "slowed down", not "idle" or "app clocks":
#: SwPowerCap 0x4, HwSlowdown 0x8, SwThermal 0x20, HwThermal 0x40, HwPowerBrake 0x80.
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80

#: Sources whose gauges are states that hold from one tick to the next (the server's CPU
#: allowance, whether a process is Strata's own): a window shorter than a tick, with a
#: reading before it and one after, takes the reading before it (n 0, coverage 0). A
#: code-check case of the smoke matrix (a fraction of a second at 0.5 s ticks) otherwise
#: had no allowance ("allowance not observed") and named the harness and its own agent
#: "not Strata's", while their CPU counters, interpolated across the window, were there.
HELD_GAUGE_SOURCES = frozenset({"allowance"})

#: Names the sampling agent writes -> (the name the report reads, factor to its unit).
#: The report's names are listed in docs/formats.md ("Metric names"); the agent's own
#: names (docs/agent.md) are converted here, once, as the samples are loaded, so either
#: spelling works and no other module needs to know both.
METRIC_ALIASES: dict[tuple[str, str], tuple[str, float]] = {
    ("proc", "run_delay_s"): ("runqueue_delay_ns", 1e9),
    ("proc", "cpu_s"): ("thread_cpu_s", 1.0),  # per thread (tid<N>)
    ("path", "run_delay_s"): ("runqueue_delay_ns", 1e9),  # the proxies, as the server
    ("cpu", "psi_cpu_some_s"): ("psi_cpu_some_total_us", 1e6),
    ("cpu", "psi_io_some_s"): ("psi_io_some_total_us", 1e6),
    ("cpu", "psi_memory_some_s"): ("psi_memory_some_total_us", 1e6),
    ("cpu", "psi_cpu_full_s"): ("psi_cpu_full_total_us", 1e6),
    ("cpu", "psi_io_full_s"): ("psi_io_full_total_us", 1e6),
    ("cpu", "psi_memory_full_s"): ("psi_memory_full_total_us", 1e6),
    ("cpu", "cgroup_throttled_s"): ("cgroup_throttled_us", 1e6),
    ("disk", "busy_s"): ("busy_ms", 1e3),
    ("net", "rx_errs"): ("rx_errors", 1.0),
    ("net", "tx_errs"): ("tx_errors", 1.0),
    ("net", "rx_drop"): ("rx_dropped", 1.0),
    ("net", "tx_drop"): ("tx_dropped", 1.0),
    ("rdma", "rate_gbps"): ("link_rate_gbps", 1.0),
    ("nvml", "util_gpu_pct"): ("gpu_util_pct", 1.0),
    ("nvml", "util_mem_pct"): ("mem_util_pct", 1.0),
    ("nvml", "power_mw"): ("power_w", 1e-3),
    ("nvml", "power_limit_mw"): ("power_limit_w", 1e-3),
    ("nvml", "clock_event_reasons"): ("throttle_reasons", 1.0),
    ("nvml", "pcie_tx_kbps"): ("pcie_tx_bytes_s", 1024.0),  # NVML: KB/s, a 20 ms snapshot
    ("nvml", "pcie_rx_kbps"): ("pcie_rx_bytes_s", 1024.0),
    ("nvml", "pcie_tx_bytes"): ("pcie_tx_bytes_total", 1.0),  # counter (field 197)
    ("nvml", "pcie_rx_bytes"): ("pcie_rx_bytes_total", 1.0),
    ("nvml", "nvlink_data_tx_kib"): ("nvlink_tx_bytes_total", 1024.0),
    ("nvml", "nvlink_data_rx_kib"): ("nvlink_rx_bytes_total", 1024.0),
    ("nvml", "gpm_sm_util_pct"): ("gpm_sm_activity_pct", 1.0),
    ("nvml", "gpm_tensor_util_pct"): ("gpm_tensor_activity_pct", 1.0),
    ("nvml", "gpm_pcie_tx_mibps"): ("gpm_pcie_tx_bytes_s", 1048576.0),
    ("nvml", "gpm_pcie_rx_mibps"): ("gpm_pcie_rx_bytes_s", 1048576.0),
    ("nvml", "gpm_nvlink_tx_mibps"): ("gpm_nvlink_tx_bytes_s", 1048576.0),
    ("nvml", "gpm_nvlink_rx_mibps"): ("gpm_nvlink_rx_bytes_s", 1048576.0),
    ("dcgm", "sm_active"): ("gpm_sm_activity_pct", 100.0),
    ("dcgm", "sm_occupancy"): ("gpm_sm_occupancy_pct", 100.0),
    ("dcgm", "tensor_active"): ("gpm_tensor_activity_pct", 100.0),
    ("dcgm", "dram_active"): ("gpm_dram_bw_util_pct", 100.0),
    ("dcgm", "pcie_tx_bytes_per_s"): ("gpm_pcie_tx_bytes_s", 1.0),
    ("dcgm", "pcie_rx_bytes_per_s"): ("gpm_pcie_rx_bytes_s", 1.0),
    ("dcgm", "nvlink_tx_bytes_per_s"): ("gpm_nvlink_tx_bytes_s", 1.0),
    ("dcgm", "nvlink_rx_bytes_per_s"): ("gpm_nvlink_rx_bytes_s", 1.0),
}


# --- windows -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """A span of the harness wall clock that gets its own summary."""

    kind: str  # "case" (its measured phase when marked), "baseline", "cooldown", "run"
    name: str  # the case id, or the marker's name ("baseline:<config>", "run")
    case_id: str
    start_ns: int
    end_ns: int

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def case_windows(markers: Iterable[Marker]) -> dict[str, Window]:
    """One window per case: its measured phase when marked, else the whole case.

    Warm-ups are excluded from the measured window, so the hardware summary and the
    request metrics describe the same requests.
    """
    whole: dict[str, Marker] = {}
    measured: dict[str, Marker] = {}
    for m in markers:
        if m.kind == "case":
            whole[m.case_id or m.name] = m
        elif m.kind == "measured":
            measured[m.case_id or m.name] = m
    out = {}
    for cid in sorted(set(whole) | set(measured)):
        m = measured.get(cid) or whole[cid]
        out[cid] = Window("case", cid, cid, m.start_wall_ns, m.end_wall_ns)
    return out


def run_windows(markers: Sequence[Marker]) -> list[Window]:
    """Every window the report summarizes: baselines, cases, cooldowns, the run."""
    out = [
        Window(m.kind, m.name, m.case_id, m.start_wall_ns, m.end_wall_ns)
        for m in markers
        if m.kind in ("baseline", "cooldown")
    ]
    out.extend(case_windows(markers).values())
    runs = [m for m in markers if m.kind == "run"]
    if runs:
        r = runs[-1]
        out.append(Window("run", "run", "", r.start_wall_ns, r.end_wall_ns))
    elif markers:
        out.append(
            Window(
                "run",
                "run",
                "",
                min(m.start_wall_ns for m in markers),
                max(m.end_wall_ns for m in markers),
            )
        )
    return sorted(out, key=lambda w: (w.start_ns, w.kind, w.name))


def load_markers(run_dir: Path) -> list[Marker]:
    path = run_dir / "markers.csv"
    return read_markers(path) if path.exists() else []


# --- samples -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SeriesKey:
    node: str
    source: str
    device: str
    metric: str
    kind: str  # "gauge" | "counter"


class SampleStore:
    """Every sample of a run on the harness clock: one sorted run of rows per series.

    ``t`` (int64 ns) and ``v`` (float64) hold all rows; series ``i`` owns rows
    ``bounds[i]:bounds[i+1]``, sorted by time. ``acc`` is the reset-corrected
    running total of counter series (a counter that drops restarted from zero), so a
    window's increase is the difference of two interpolated points.
    """

    __slots__ = ("acc", "bounds", "keys", "t", "unavailable", "v")

    def __init__(
        self,
        keys: Sequence[SeriesKey],
        bounds: np.ndarray,
        t: np.ndarray,
        v: np.ndarray,
        acc: np.ndarray,
        unavailable: dict[str, dict[str, str]],
    ) -> None:
        self.keys = tuple(keys)
        self.bounds, self.t, self.v, self.acc = bounds, t, v, acc
        self.unavailable = unavailable

    def __len__(self) -> int:
        return len(self.t)

    def series(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = int(self.bounds[i]), int(self.bounds[i + 1])
        return self.t[a:b], self.v[a:b]

    def find(
        self,
        *,
        node: str | None = None,
        source: str | None = None,
        metric: str | None = None,
        device: str | None = None,
    ) -> list[int]:
        return [
            i
            for i, k in enumerate(self.keys)
            if (node is None or k.node == node)
            and (source is None or k.source == source)
            and (metric is None or k.metric == metric)
            and (device is None or k.device == device)
        ]

    def sources(self) -> set[tuple[str, str]]:
        """(node, source) pairs that delivered at least one sample."""
        return {(k.node, k.source) for k in self.keys}

    def nodes(self) -> list[str]:
        return sorted({k.node for k in self.keys} | set(self.unavailable))


def _complete_lines(path: Path) -> io.BytesIO | Path:
    """The file, minus a last line the agent is still writing (live runs)."""
    with path.open("rb") as fh:
        fh.seek(0, 2)
        size = fh.tell()
        if size == 0:
            return path
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return path
        fh.seek(0)
        data = fh.read()
    return io.BytesIO(data[: data.rfind(b"\n") + 1])


def _read_sample_csv(path: Path):  # -> pandas.DataFrame
    import numpy as np
    import pandas as pd

    src = _complete_lines(path)
    dtype: dict[str, Any] = {
        "wall_ns": np.int64,
        "device": "category",
        "metric": "category",
        "value": np.float64,
        "kind": "category",
    }
    try:
        return pd.read_csv(
            src,
            usecols=["wall_ns", "device", "metric", "value", "kind"],
            dtype=dtype,
            keep_default_na=False,
            na_values={"value": ["", "nan", "NaN", "None", "null"]},
            engine="c",
        )
    except (pd.errors.EmptyDataError, ValueError):
        # A header-only file, or a collector that wrote nothing usable: no samples.
        return None


def _node_unavailable(node_dir: Path) -> dict[str, str]:
    path = node_dir / "unavailable.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return {"unavailable.json": f"unreadable: {exc}"}
    return {str(k): str(v) for k, v in sorted(data.items())} if isinstance(data, dict) else {}


def load_samples(run_dir: Path, clocks: dict[str, NodeClock] | None = None) -> SampleStore:
    """Read ``nodes/<node>/samples/<source>.csv`` of a run onto the harness clock.

    The node comes from the folder name and the source from the file name (the
    ``node``/``source`` columns repeat them and are not parsed: a third of the
    parse time). Rows with no value are dropped. A series' kind is the kind of its
    first row.
    """
    import numpy as np

    clocks = clocks or {}
    keys: list[SeriesKey] = []
    bounds = [0]
    ts, vs, accs = [], [], []
    unavailable: dict[str, dict[str, str]] = {}
    offset = 0
    nodes_dir = run_dir / "nodes"
    node_dirs = sorted(p for p in nodes_dir.iterdir() if p.is_dir()) if nodes_dir.is_dir() else []
    for node_dir in node_dirs:
        node = node_dir.name
        unavailable[node] = _node_unavailable(node_dir)
        clock = clocks.get(node, NodeClock(node))
        sample_dir = node_dir / "samples"
        files = sorted(sample_dir.glob("*.csv")) if sample_dir.is_dir() else []
        for path in files:
            df = _read_sample_csv(path)
            if df is None or len(df) == 0:
                continue
            part = _file_series(df, node, path.stem, clock)
            if part is None:
                continue
            fkeys, fbounds, t, v, acc = part
            keys.extend(fkeys)
            bounds.extend((fbounds[1:] + offset).tolist())
            offset += len(t)
            ts.append(t)
            vs.append(v)
            accs.append(acc)
    if ts:
        t_all, v_all, a_all = np.concatenate(ts), np.concatenate(vs), np.concatenate(accs)
    else:
        t_all = np.empty(0, np.int64)
        v_all = np.empty(0, np.float64)
        a_all = np.empty(0, np.float64)
    return SampleStore(keys, np.asarray(bounds, np.int64), t_all, v_all, a_all, unavailable)


def _file_series(df, node: str, source: str, clock: NodeClock):
    """One file's rows grouped into sorted series; counters get their running total."""
    import numpy as np

    value = df["value"].to_numpy(np.float64)
    dev_cat, met_cat, kind_cat = df["device"], df["metric"], df["kind"]
    dev = dev_cat.cat.codes.to_numpy()
    met = met_cat.cat.codes.to_numpy()
    kind_codes = kind_cat.cat.codes.to_numpy()
    wall = df["wall_ns"].to_numpy(np.int64)
    nan = np.isnan(value)
    if nan.any():
        keep = ~nan
        value, dev, met, kind_codes, wall = (
            value[keep],
            dev[keep],
            met[keep],
            kind_codes[keep],
            wall[keep],
        )
    if len(value) == 0:
        return None
    n_met = len(met_cat.cat.categories) + 1
    n_series_max = (len(dev_cat.cat.categories) + 1) * n_met
    # +1: a code of -1 (missing) stays distinct. A 16-bit key sorts by radix: O(n).
    key_dtype = np.uint16 if n_series_max < 2**16 else np.int64
    sid = ((dev.astype(np.int64) + 1) * n_met + (met.astype(np.int64) + 1)).astype(key_dtype)
    order = np.argsort(sid, kind="stable")  # rows arrive in time order; stable keeps it
    sid, wall, value, kind_codes = sid[order], wall[order], value[order], kind_codes[order]
    starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
    # Out-of-order rows inside a series (a collector that writes late): sort properly.
    back = np.flatnonzero(wall[1:] < wall[:-1]) + 1
    if len(np.setdiff1d(back, starts, assume_unique=True)):
        order = np.lexsort((wall, sid))
        sid, wall, value, kind_codes = sid[order], wall[order], value[order], kind_codes[order]
    t = clock.to_harness(wall) if (clock.offset_start_ns or clock.offset_end_ns) else wall
    dev_names = [str(c) for c in dev_cat.cat.categories]
    met_names = [str(c) for c in met_cat.cat.categories]
    kind_names = [str(c) for c in kind_cat.cat.categories]
    keys = []
    counter_series = np.zeros(len(starts), bool)
    bounds_list = [*starts.tolist(), len(t)]
    for j, st in enumerate(starts.tolist()):
        code = int(sid[st])
        d, m = code // n_met - 1, code % n_met - 1
        k = int(kind_codes[st])
        kind = kind_names[k] if k >= 0 else "gauge"
        metric = met_names[m] if m >= 0 else ""
        if (source, metric) in METRIC_ALIASES:
            metric, scale = METRIC_ALIASES[(source, metric)]
            if scale != 1.0:
                value[st : bounds_list[j + 1]] *= scale
        counter_series[j] = kind == "counter"
        keys.append(SeriesKey(node, source, dev_names[d] if d >= 0 else "", metric, kind))
    bounds = np.r_[starts, len(t)].astype(np.int64)
    acc = _running_totals(value, bounds, counter_series)
    return keys, bounds, t, value, acc


def _running_totals(value: np.ndarray, bounds: np.ndarray, is_counter: np.ndarray) -> np.ndarray:
    """Reset-corrected cumulative increase of counter series (0 at each series' start).

    A drop means the counter restarted (process or driver restart): the increase
    since the restart is the new value itself, as Prometheus's ``rate()`` takes it
    ("Breaks in monotonicity (such as counter resets due to target restarts) are
    automatically adjusted for", Prometheus docs, Query functions, rate()), and never
    less than zero: a counter only counts up from zero, so a negative value after a
    drop adds nothing. The running total therefore never falls, and a window's delta
    and rate are never negative, whatever the series does (a counter that only
    decreases shows as one restart per sample). Gauge rows keep their own values, so
    only counter series are touched (a few of a GPU's twenty metrics).
    """
    import numpy as np

    acc = value.copy()
    for j in np.flatnonzero(is_counter).tolist():
        a, b = int(bounds[j]), int(bounds[j + 1])
        v = value[a:b]
        d = np.empty_like(v)
        d[0] = 0.0
        d[1:] = np.diff(v)
        reset = d < 0
        d[reset] = np.maximum(v[reset], 0.0)
        acc[a:b] = np.cumsum(d)
    return acc


# --- summaries ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FractionRule:
    """'Fraction of the window's samples where <metric> <op> <value>' for one series.

    ``ref_metric`` makes the bound relative to another series of the same device
    (its window maximum), e.g. SM clock below 0.9 x the max SM clock.
    """

    name: str
    source: str
    metric: str
    op: str  # "<" | ">=" | "&" (bitmask test: any bit of value set)
    value: float
    ref_metric: str = ""
    threshold: str = ""  # the attribution threshold the value comes from


def fraction_rules() -> tuple[FractionRule, ...]:
    """The window fractions worth reporting; their numbers come from the one table."""
    from strata_plugin.analysis.thresholds import threshold

    return (
        FractionRule(
            "frac_sm_clock_below_90pct_max",
            "nvml",
            "sm_clock_mhz",
            "<",
            threshold("sm_clock_ratio_min").value,
            "sm_clock_max_mhz",
            "sm_clock_ratio_min",
        ),
        FractionRule("frac_throttled", "nvml", "throttle_reasons", "&", float(THROTTLE_MASK)),
        FractionRule(
            "frac_gpu_idle",
            "nvml",
            "gpu_util_pct",
            "<",
            threshold("gpu_idle_util_pct").value,
            "",
            "gpu_idle_util_pct",
        ),
        FractionRule(
            "frac_sm_active_below_50pct",
            "nvml",
            "gpm_sm_activity_pct",
            "<",
            100 * threshold("sm_active_busy").value,
            "",
            "sm_active_busy",
        ),
        FractionRule(
            "frac_kv_cache_above_95pct",
            "prom",
            "kv_cache_usage",
            ">=",
            threshold("kv_usage_high").value,
            "",
            "kv_usage_high",
        ),
        FractionRule("frac_queue_nonempty", "prom", "waiting_requests", ">=", 1.0),
        FractionRule(
            "frac_mem_available_below_10pct",
            "mem",
            "mem_available_bytes",
            "<",
            threshold("mem_available_frac_min").value,
            "mem_total_bytes",
            "mem_available_frac_min",
        ),
    )


@dataclass(frozen=True)
class HwStat:
    """One series (or one fraction rule) summarized over one window.

    Gauges: ``mean/p50/p95/min/max`` of the samples inside the window. Counters:
    ``delta`` is the reset-corrected increase over the window (interpolated at its
    edges), ``rate`` = delta / covered seconds, and ``mean/p50/p95/min/max`` describe
    the per-interval rates. Fractions (kind ``fraction``): ``mean`` is the share of
    samples meeting the rule. ``coverage`` is the share of the window that samples
    span; a low value says the series started or stopped inside the window.
    """

    window: str
    node: str
    source: str
    device: str
    metric: str
    kind: str
    n: int
    coverage: float
    mean: float | None = None
    p50: float | None = None
    p95: float | None = None
    min: float | None = None
    max: float | None = None
    delta: float | None = None
    rate: float | None = None


HW_COLUMNS = (
    "window",
    "node",
    "source",
    "device",
    "metric",
    "kind",
    "n",
    "coverage",
    "mean",
    "p50",
    "p95",
    "min",
    "max",
    "delta",
    "rate",
)


def _stats(x: np.ndarray) -> tuple[float, float, float, float, float]:
    """mean, p50, p95, min, max; percentiles linear (type 7, as stats.percentile).

    One sort and two lookups: np.percentile's generic path costs ~5x more, and this
    runs once per series per window.
    """
    import numpy as np

    s = np.sort(x)
    n = len(s)

    def q(p: float) -> float:
        h = (n - 1) * p
        lo = int(h)
        hi = min(lo + 1, n - 1)
        a, b = float(s[lo]), float(s[hi])
        t = h - lo
        return b - (b - a) * (1.0 - t) if t >= 0.5 else a + (b - a) * t

    return float(s.mean()), q(0.5), q(0.95), float(s[0]), float(s[-1])


def _coverage(t: np.ndarray, start: int, end: int) -> float:
    if len(t) == 0 or end <= start:
        return 0.0
    lo, hi = max(int(t[0]), start), min(int(t[-1]), end)
    return max(0.0, (hi - lo) / (end - start))


def summarize_series(store: SampleStore, i: int, w: Window) -> HwStat | None:
    """One series over one window, or None when it has no sample near the window."""
    import numpy as np

    key = store.keys[i]
    a, b = int(store.bounds[i]), int(store.bounds[i + 1])
    t = store.t[a:b]
    lo = int(np.searchsorted(t, w.start_ns, "left"))
    hi = int(np.searchsorted(t, w.end_ns, "right"))
    base: dict[str, Any] = dict(
        window=w.name,
        node=key.node,
        source=key.source,
        device=key.device,
        metric=key.metric,
        kind=key.kind,
    )
    if key.kind != "counter":
        if hi <= lo:
            if key.source not in HELD_GAUGE_SOURCES or lo == 0 or hi >= len(t):
                return None
            x = store.v[a + lo - 1 : a + lo]  # held since the tick before the window
            v = float(x[0])
            return HwStat(**base, n=0, coverage=0.0, mean=v, p50=v, p95=v, min=v, max=v)
        x = store.v[a + lo : a + hi]
        mean, p50, p95, mn, mx = _stats(x)
        return HwStat(
            **base,
            n=hi - lo,
            coverage=_coverage(t[lo:hi], w.start_ns, w.end_ns),
            mean=mean,
            p50=p50,
            p95=p95,
            min=mn,
            max=mx,
        )
    # Counter: one sample on each side of the window lets its edges be interpolated.
    j0, j1 = max(lo - 1, 0), min(hi + 1, len(t))
    tt = t[j0:j1]
    if len(tt) < 2:
        return None
    acc = store.acc[a + j0 : a + j1]
    s, e = max(w.start_ns, int(tt[0])), min(w.end_ns, int(tt[-1]))
    if e <= s:
        return None
    tf = (tt - tt[0]).astype(np.float64)
    c0, c1 = np.interp([s - int(tt[0]), e - int(tt[0])], tf, acc)
    delta = float(c1 - c0)
    covered_s = (e - s) / 1e9
    dt = np.diff(tf) / 1e9
    rates = np.diff(acc)[dt > 0] / dt[dt > 0]
    stats: tuple[float | None, ...] = _stats(rates) if len(rates) else (None,) * 5
    return HwStat(
        **base,
        n=hi - lo,
        coverage=(e - s) / (w.end_ns - w.start_ns),
        mean=stats[0],
        p50=stats[1],
        p95=stats[2],
        min=stats[3],
        max=stats[4],
        delta=delta,
        rate=delta / covered_s,
    )


@dataclass(frozen=True)
class _RuleTarget:
    rule: FractionRule
    series: int
    ref: int | None


def _rule_targets(store: SampleStore, rules: Sequence[FractionRule]) -> list[_RuleTarget]:
    """Which series each rule applies to, and its reference series: once per store."""
    index = {(k.node, k.source, k.device, k.metric): i for i, k in enumerate(store.keys)}
    out = []
    for r in rules:
        for i, k in enumerate(store.keys):
            if k.source != r.source or k.metric != r.metric:
                continue
            ref = index.get((k.node, k.source, k.device, r.ref_metric)) if r.ref_metric else None
            if r.ref_metric and ref is None:
                continue  # no reference series: the fraction cannot be computed
            out.append(_RuleTarget(r, i, ref))
    return out


def _window(store: SampleStore, i: int, w: Window) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    t, v = store.series(i)
    lo = int(np.searchsorted(t, w.start_ns, "left"))
    hi = int(np.searchsorted(t, w.end_ns, "right"))
    return t[lo:hi], v[lo:hi]


def _fraction_stats(store: SampleStore, w: Window, targets: Sequence[_RuleTarget]) -> list[HwStat]:
    import numpy as np

    out = []
    for tg in targets:
        r, k = tg.rule, store.keys[tg.series]
        t, x = _window(store, tg.series, w)
        if len(x) == 0:
            continue
        bound = r.value
        if tg.ref is not None:
            _, ref = _window(store, tg.ref, w)
            if len(ref) == 0:
                ref = store.series(tg.ref)[1][-1:]
            if len(ref) == 0 or float(ref.max()) <= 0:
                continue
            bound = r.value * float(ref.max())
        if r.op == "<":
            hit = x < bound
        elif r.op == ">=":
            hit = x >= bound
        else:
            hit = (x.astype(np.int64) & int(bound)) != 0
        out.append(
            HwStat(
                window=w.name,
                node=k.node,
                source=k.source,
                device=k.device,
                metric=r.name,
                kind="fraction",
                n=len(x),
                coverage=_coverage(t, w.start_ns, w.end_ns),
                mean=float(hit.mean()),
            )
        )
    return out


def summarize_window(
    store: SampleStore,
    w: Window,
    rules: Sequence[FractionRule] | None = None,
    targets: Sequence[_RuleTarget] | None = None,
) -> list[HwStat]:
    """Every series of the store over one window, plus the fraction rules."""
    if targets is None:
        targets = _rule_targets(store, fraction_rules() if rules is None else rules)
    out = []
    for i in range(len(store.keys)):
        s = summarize_series(store, i, w)
        if s is not None:
            out.append(s)
    out.extend(_fraction_stats(store, w, targets))
    return sorted(out, key=lambda s: (s.node, s.source, s.device, s.metric, s.kind))


def summarize_windows(store: SampleStore, windows: Iterable[Window]) -> dict[str, list[HwStat]]:
    targets = _rule_targets(store, fraction_rules())
    return {w.name: summarize_window(store, w, targets=targets) for w in windows}


# --- request windows ---------------------------------------------------------------------


def inflight_fraction(intervals: Sequence[tuple[int, int]], start: int, end: int) -> float | None:
    """Share of [start, end] with at least one request in flight (union of intervals)."""
    if end <= start:
        return None
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals if b > start and a < end)
    covered = 0
    cur_a, cur_b = 0, None  # the interval being merged (cur_a is set with cur_b)
    for a, b in clipped:
        if b <= a:
            continue
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                covered += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        covered += cur_b - cur_a
    return covered / (end - start)


def merge_intervals(intervals: Iterable[tuple[int, int]], gap: int = 0) -> list[tuple[int, int]]:
    """Overlapping (or nearer than ``gap``) intervals merged: fewer shapes to draw."""
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]

"""Tables: markdown text, CSV files, and the rows of each derived CSV.

Every cell passes through ``fmt`` so the same numbers always print the same way.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from typing import Any

from strata_plugin.analysis.case_summary import CaseAnalysis
from strata_plugin.analysis.metrics import (
    HEADLINE_DISTRIBUTIONS,
    HEADLINE_SCALARS,
    HEADLINE_STATS,
    CaseMetrics,
)
from strata_plugin.analysis.sufficiency import (
    PER_REQUEST_DISTRIBUTIONS,
    min_count,
    percentile_of_stat,
    supported,
)
from strata_plugin.analysis.timeline import HW_COLUMNS, HwStat
from strata_plugin.report.fmt import csv_cell, md_cell, md_num


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = [
        "| " + " | ".join(md_cell(h) for h in headers) + " |",
        "|" + "|".join(" --- " for _ in headers) + "|",
    ]
    for r in rows:
        lines.append("| " + " | ".join(md_cell(c) for c in r) + " |")
    return "\n".join(lines) + "\n"


def csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in rows:
        w.writerow([csv_cell(c) for c in r])
    return buf.getvalue()


# --- case_summary.csv --------------------------------------------------------------------

CASE_ID_COLUMNS = (
    "case_id",
    "name",
    "config_id",
    "outcome",
    "ab_group",
    "ab_arm",
    "isl",
    "osl",
    "concurrency",
    "params_json",
)
CASE_TAIL_COLUMNS = (
    "verdict",
    "verdict_classes",
    "verdict_confidence",
    "verdict_inconclusive",
    "modifiers",
    "finer_trace",
    "energy_j",
    "energy_j_per_output_token",
    "energy_j_per_request",
    "window_start_wall_ns",
    "window_end_wall_ns",
)


def headline_columns(analyses: Sequence[CaseAnalysis]) -> list[str]:
    """The metrics module's headline keys in its own order, then any others sorted."""
    known = list(HEADLINE_SCALARS) + [
        f"{d}_{s}_ms" for d in HEADLINE_DISTRIBUTIONS for s in HEADLINE_STATS
    ]
    present = set().union(*(a.headline.keys() for a in analyses)) if analyses else set()
    return [k for k in known if k in present] + sorted(present - set(known))


def case_summary_rows(analyses: Sequence[CaseAnalysis]) -> tuple[list[str], list[list[Any]]]:
    metric_cols = headline_columns(analyses)
    header = list(CASE_ID_COLUMNS) + metric_cols + list(CASE_TAIL_COLUMNS)
    rows = []
    for a in analyses:
        p = a.params
        info = a.info
        v, e, w = a.verdict, a.energy, a.window
        rows.append(
            [
                a.case_id,
                a.name,
                a.config_id,
                info.outcome or "",
                info.ab_group or "",
                info.ab_arm or "",
                p.get("isl"),
                p.get("osl"),
                p.get("concurrency"),
                json.dumps(p, sort_keys=True, default=str),
                *[a.headline.get(k) for k in metric_cols],
                v.summary(),
                ";".join(v.classes),
                v.confidence,
                v.inconclusive,
                ";".join(v.modifiers),
                " | ".join(v.finer_trace),
                e.joules if e else None,
                e.j_per_output_token if e else None,
                e.j_per_request if e else None,
                w.start_ns if w else None,
                w.end_ns if w else None,
            ]
        )
    return header, rows


def hw_rows(stats: Iterable[HwStat]) -> list[list[Any]]:
    return [[getattr(s, c) for c in HW_COLUMNS] for s in stats]


# --- the key hardware table of a case ----------------------------------------------------

#: (source, metric, statistic, label, scale, unit): what the report shows per device.
KEY_METRICS = (
    ("nvml", "gpu_util_pct", "mean", "GPU util (mean)", 1.0, "%"),
    ("nvml", "gpm_sm_activity_pct", "mean", "SM active (mean)", 1.0, "%"),
    ("nvml", "gpm_tensor_activity_pct", "mean", "tensor active (mean)", 1.0, "%"),
    ("nvml", "gpm_dram_bw_util_pct", "mean", "DRAM bandwidth (mean)", 1.0, "%"),
    ("nvml", "power_w", "mean", "power (mean)", 1.0, "W"),
    ("nvml", "power_w", "max", "power (max)", 1.0, "W"),
    ("nvml", "sm_clock_mhz", "mean", "SM clock (mean)", 1.0, "MHz"),
    ("nvml", "frac_sm_clock_below_90pct_max", "mean", "SM clock < 90% max", 100.0, "% of window"),
    ("nvml", "frac_throttled", "mean", "throttled", 100.0, "% of window"),
    ("nvml", "temp_c", "max", "temperature (max)", 1.0, "C"),
    ("nvml", "energy_mj", "delta", "energy", 1e-3, "J"),
    ("nvml", "mem_used_bytes", "max", "memory used (max)", 2**-30, "GiB"),
    ("nvml", "pcie_rx_bytes_s", "mean", "PCIe rx (mean)", 1e-9, "GB/s"),
    ("nvml", "pcie_tx_bytes_s", "mean", "PCIe tx (mean)", 1e-9, "GB/s"),
    ("cpu", "busy_s", "rate", "CPU busy", 1.0, "cores"),
    ("cpu", "iowait_s", "rate", "CPU iowait", 1.0, "cores"),
    ("cpu", "psi_cpu_some_total_us", "rate", "PSI cpu some", 1e-4, "%"),
    ("cpu", "psi_io_some_total_us", "rate", "PSI io some", 1e-4, "%"),
    ("cpu", "psi_memory_some_total_us", "rate", "PSI memory some", 1e-4, "%"),
    ("proc", "cpu_user_s", "rate", "server CPU user", 1.0, "cores"),
    ("proc", "cpu_system_s", "rate", "server CPU system", 1.0, "cores"),
    ("proc", "major_faults", "rate", "server major faults", 1.0, "1/s"),
    ("proc", "major_faults", "delta", "server major faults", 1.0, "count"),
    ("proc", "read_bytes", "rate", "server read", 1e-6, "MB/s"),
    ("proc", "read_bytes", "delta", "server read", 1e-6, "MB"),
    ("proc", "runqueue_delay_ns", "rate", "server run-queue delay", 1e-9, "s/s"),
    ("proc", "ctx_involuntary", "rate", "server involuntary switches", 1.0, "1/s"),
    ("proc", "rss_bytes", "max", "server RSS (max)", 2**-30, "GiB"),
    ("path", "cpu_user_s", "rate", "proxies CPU user", 1.0, "cores"),
    ("path", "cpu_system_s", "rate", "proxies CPU system", 1.0, "cores"),
    ("path", "runqueue_delay_ns", "rate", "proxies run-queue delay", 1e-9, "s/s"),
    ("mem", "mem_available_bytes", "min", "MemAvailable (min)", 2**-30, "GiB"),
    ("mem", "swap_used_bytes", "max", "swap used (max)", 2**-30, "GiB"),
    ("disk", "read_bytes", "rate", "disk read", 1e-6, "MB/s"),
    ("disk", "write_bytes", "rate", "disk write", 1e-6, "MB/s"),
    ("disk", "busy_ms", "rate", "disk busy", 0.1, "%"),
    ("net", "rx_bytes", "rate", "net rx", 1e-6, "MB/s"),
    ("net", "tx_bytes", "rate", "net tx", 1e-6, "MB/s"),
    ("rdma", "xmit_bytes", "rate", "RDMA xmit", 1e-9, "GB/s"),
    ("rdma", "rcv_bytes", "rate", "RDMA rcv", 1e-9, "GB/s"),
    ("prom", "running_requests", "mean", "running requests (mean)", 1.0, ""),
    ("prom", "waiting_requests", "mean", "waiting requests (mean)", 1.0, ""),
    ("prom", "kv_cache_usage", "max", "KV cache usage (max)", 100.0, "%"),
)


def key_hw_rows(hw: Sequence[HwStat]) -> list[list[Any]]:
    """node | device | metric | value | unit, for the metrics worth a glance.

    Per-core and per-thread series are left to case_hw_summary.csv (there can be
    hundreds); their totals are here.
    """
    by: dict[tuple[str, str], list[HwStat]] = {}
    for r in hw:
        if r.device.startswith("tid") or (r.source == "cpu" and r.device.startswith("cpu")):
            continue
        if r.source in ("proc", "path") and r.device.startswith("pid"):
            continue  # the tree ("") sums its processes
        by.setdefault((r.source, r.metric), []).append(r)
    rows = []
    for source, metric, stat, label, scale, unit in KEY_METRICS:
        srcs = ("nvml", "dcgm") if source == "nvml" else (source,)
        for s in srcs:
            for r in sorted(by.get((s, metric), []), key=lambda r: (r.node, r.device)):
                v = getattr(r, stat)
                if v is None:
                    continue
                rows.append([r.node, r.device or "(host)", label, v * scale, unit])
    rows += _engine_ratio_rows(hw)
    return sorted(rows, key=lambda row: (row[0], row[1] != "(host)", row[1]))


#: Follows a percentile whose request count does not support it (sufficiency_md says so).
TOO_FEW = "\u2020"


def pct_cell(value: float | None, n: int, stat: str) -> Any:
    """A percentile cell, marked :data:`TOO_FEW` when ``n`` requests do not support it."""
    q = percentile_of_stat(stat)
    if value is None or q is None or supported(n, q):
        return value
    return f"{md_num(value)}{TOO_FEW}"


def short_percentiles(cms: Iterable[CaseMetrics], keys: Iterable[str]
                      ) -> dict[str, tuple[int, int]]:
    """Headline keys (``tpot_p95_ms``) that some case's request count does not support:
    key -> (the smallest count, the count the percentile needs)."""
    cms = list(cms)
    out = {}
    for key in keys:
        dist, _, rest = key.partition("_")
        q = percentile_of_stat(rest.removesuffix("_ms"))
        if q is None or dist not in PER_REQUEST_DISTRIBUTIONS:
            continue
        counts = [getattr(cm, dist).n for cm in cms if getattr(cm, dist).n]
        if counts and not supported(min(counts), q):
            out[key] = (min(counts), min_count(q))
    return out


#: The engine's histograms and counters as one number per window: growth of the first
#: series over the second (prom collector common names), label, scale, unit.
ENGINE_RATIOS = (
    ("queue_time_seconds_sum", "queue_time_seconds_count", "engine queue time (mean)", 1e3,
     "ms"),
    ("prefill_time_seconds_sum", "prefill_time_seconds_count", "engine prefill time (mean)",
     1e3, "ms"),
    ("decode_time_seconds_sum", "decode_time_seconds_count", "engine decode time (mean)",
     1e3, "ms"),
    ("prefix_cache_hits_total", "prefix_cache_queries_total", "prefix-cache hits", 100.0,
     "% of lookups"),
)


def _engine_ratio_rows(hw: Sequence[HwStat]) -> list[list[Any]]:
    delta = {(r.node, r.device, r.metric): r.delta for r in hw
             if r.source == "prom" and r.delta is not None}
    rows = []
    for num, den, label, scale, unit in ENGINE_RATIOS:
        for (node, device, metric), d in sorted(delta.items()):
            n = delta.get((node, device, num))
            if metric == den and d and n is not None:
                rows.append([node, device or "(host)", label, n / d * scale, unit])
    return rows


def dist_rows(a: CaseAnalysis) -> list[list[Any]]:
    """The request-metric table; a per-request percentile its count does not support is
    marked with :data:`TOO_FEW` (chunk gaps are not independent draws: never marked)."""
    cm = a.metrics
    rows = []
    for name in ("ttft", "ttfo", "tpot", "e2e", "queue", "chunk_gap"):
        d = getattr(cm, name)
        if not d.n:
            continue
        stats = ("p50", "p90", "p95", "p99")
        cells = ([pct_cell(getattr(d, s), d.n, s) for s in stats]
                 if name in PER_REQUEST_DISTRIBUTIONS else [getattr(d, s) for s in stats])
        rows.append([f"{name} (ms)", d.n, d.mean, *cells, d.max])
    return rows


def fmt_pair(a: float | None, b: float | None) -> str:
    return f"{md_num(a)} -> {md_num(b)}"

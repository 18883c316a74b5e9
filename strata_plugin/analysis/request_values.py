"""Per-request values of one metric, for A/B tables, run comparisons and the gate.

A metric is any float field of ``metrics.RequestMetrics`` (``ttft_ms``, ``tpot_ms``,
``e2e_ms``, ``server_decode_tok_s`` ...) or one of the server-process deltas recorded
around each request (``RequestRecord.proc``): ``proc_cpu_s``, ``proc_major_faults``,
``proc_read_mb``. Only measured, successful requests count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import fields

from strata_plugin.analysis.metrics import (
    RequestMetrics,
    higher_is_worse,
    metric_unit,
    request_metrics,
)
from strata_plugin.formats.records import RequestRecord

PROC_METRICS = {"proc_cpu_s": "s", "proc_major_faults": "faults", "proc_read_mb": "MB"}
#: one number per request: ``chunk_gaps_ms`` (a tuple of gaps) is not a per-request value
_REQUEST_FLOATS = tuple(
    f.name
    for f in fields(RequestMetrics)
    if (f.name.endswith(("_ms", "_tok_s")) or f.name in ("n_out", "spec_acceptance"))
    and "tuple" not in str(f.type)
)
METRICS = _REQUEST_FLOATS + tuple(PROC_METRICS)


__all__ = ["METRICS", "PROC_METRICS", "check_metric", "higher_is_worse", "proc_value", "unit",
           "values"]


def unit(metric: str) -> str:
    return PROC_METRICS.get(metric) or metric_unit(metric)


def check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise ValueError(f"unknown request metric {metric!r}; one of: {', '.join(METRICS)}")


def proc_value(rec: RequestRecord, metric: str) -> float | None:
    p = rec.proc
    if p is None:
        return None
    if metric == "proc_cpu_s":
        return float(p.cpu_s)
    if metric == "proc_major_faults":
        return float(p.major_faults)
    return p.read_bytes / 1e6


def values(
    records: Iterable[RequestRecord],
    metric: str,
    metrics_of: Callable[[RequestRecord], RequestMetrics] = request_metrics,
) -> list[float]:
    """The metric for every measured, successful request that defines it.

    ``metrics_of`` lets a caller pass a memoized ``request_metrics`` (a run's bundle).
    """
    check_metric(metric)
    out = []
    for r in records:
        if r.phase != "measured" or not r.ok:
            continue
        if metric in PROC_METRICS:
            v = proc_value(r, metric)
        else:
            v = getattr(metrics_of(r), metric)
        if v is not None:
            out.append(float(v))
    return out

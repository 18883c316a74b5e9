"""Rails and imbalance: per-window facts about RDMA rails, Ethernet links and GPU peers.

Why it exists: a multi-node engine is as fast as its slowest rail and its slowest GPU.
The classifier (``strata_plugin.analysis.rules``) reads a few scalars (``rdma_util``,
``rdma_rail_max_min``, ``net_util``, ``sm_active_cv``...); this module computes them
from one window's summary rows (``timeline.HwStat``) *with the evidence behind each*:
which rail, which counter, which GPU, against which threshold. Pure functions over the
rows; nothing is read from disk.

What it finds (:class:`Finding` ``kind`` -> the attribution class it supports):

* ``rail_saturated`` (gpu_communication): a rail's busier direction at or above
  ``rdma_link_frac`` of its link rate;
* ``rail_errors`` / ``rail_congestion`` (network): error counters that moved, CNP/ECN
  and transmit-wait counters above a rate;
* ``rail_imbalance`` (waiting_on_peer): max/min of the active rails' throughput, or
  their coefficient of variation, past the imbalance thresholds;
* ``socket_fallback`` (network): bytes on an Ethernet interface where RDMA should
  carry them (NCCL fell back to sockets);
* ``net_saturated`` / ``net_round_trip_bound`` / ``net_errors`` (network): an interface
  near its capacity in one direction, or in both together (request/response traffic
  never fills one direction of the link that bounds it), or dropping and erroring;
* ``gpu_straggler`` / ``node_straggler`` (waiting_on_peer): a GPU (or a node's GPUs)
  whose utilization, SM activity or power deviates from its peers'.

:meth:`RailsReport.signals` turns the findings into the ``WindowSignals`` fields the
classifier's rules read (``rdma_rail_max_min``/``rdma_rail_cv`` and
``straggler_rel_dev`` -> waiting_on_peer; ``rdma_error_events``,
``rdma_congestion_per_s``, ``socket_fallback_bytes_s``, ``net_util`` and
``net_wire_busy`` -> network; ``rdma_util`` -> gpu_communication), compared against the
same rows of ``thresholds.THRESHOLDS``.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strata_plugin.analysis.thresholds import Threshold, threshold
from strata_plugin.analysis.timeline import HwStat

#: The names of the numbers only this module compares against. The table itself is
#: thresholds.THRESHOLDS (one table, each number with its source); the shared ones
#: (rdma_link_frac, net_link_frac, imbalance_cv, imbalance_max_min) are there too.
RAIL_THRESHOLD_NAMES = (
    "rail_error_events",
    "rail_congestion_per_s",
    "rail_active_bytes_s",
    "socket_fallback_bytes_s",
    "net_wire_busy",
    "net_drop_events",
    "straggler_rel_dev",
)
RAIL_THRESHOLDS: tuple[Threshold, ...] = tuple(threshold(n) for n in RAIL_THRESHOLD_NAMES)

#: RDMA counters that are errors (any increase matters) and ones that are congestion.
RDMA_ERRORS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_rcv_constraint_errors",
    "port_xmit_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "rnr_nak_retry_err",
    "req_transport_retries_exceeded",
    "duplicate_request",
)
RDMA_CONGESTION = (
    "port_xmit_wait",
    "np_cnp_sent",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
)
NET_ERRORS = ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped")
GPU_SOURCES = ("nvml", "dcgm")
#: Per-GPU metrics compared across peers: (report name, how to read it).
GPU_METRICS = ("gpu_util_pct", "gpm_sm_activity_pct", "power_w")


def rule(name: str) -> Threshold:
    """A threshold by name, from ``thresholds.THRESHOLDS``."""
    return threshold(name)


# --- outputs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """One comparison: ``metric op threshold`` with the measured value and where it came from.

    ``source`` names the rows (``node/source:device/metric``) so a reader can find them
    in case_hw_summary.csv.
    """

    metric: str
    value: float
    op: str
    threshold: float
    threshold_name: str
    unit: str
    source: str
    met: bool


@dataclass(frozen=True)
class RailStat:
    """One RDMA port (a rail) over the window."""

    node: str
    device: str  # <ibdev>/<port>
    tx_bytes_s: float | None
    rx_bytes_s: float | None
    link_bytes_s: float | None  # from the port's rate, per direction
    util: float | None  # busier direction / link rate
    errors: tuple[tuple[str, float], ...]  # counters that moved, with their delta
    congestion: tuple[tuple[str, float], ...]  # counter, rate per s

    @property
    def bytes_s(self) -> float:
        return max(self.tx_bytes_s or 0.0, self.rx_bytes_s or 0.0)


@dataclass(frozen=True)
class LinkStat:
    """One kernel network interface (not RDMA) over the window."""

    node: str
    device: str
    tx_bytes_s: float | None
    rx_bytes_s: float | None
    link_bytes_s: float | None  # link_speed_mbps, or the capacity the caller gave
    link_source: str  # where link_bytes_s came from
    util: float | None  # busier direction / capacity
    errors: tuple[tuple[str, float], ...]
    wire_busy: float | None = None  # (tx + rx) / capacity: occupancy for alternating traffic

    @property
    def bytes_s(self) -> float:
        return max(self.tx_bytes_s or 0.0, self.rx_bytes_s or 0.0)


@dataclass(frozen=True)
class Deviation:
    """One GPU (or one node's GPUs) against its peers, for one metric."""

    node: str
    device: str  # gpu<N>, or "" for a node
    metric: str
    value: float
    median: float
    rel_dev: float  # (value - median) / median
    straggler: bool


@dataclass(frozen=True)
class Finding:
    kind: str
    cls: str  # the attribution class it supports
    node: str
    device: str
    summary: str
    evidence: tuple[Evidence, ...]


@dataclass(frozen=True)
class RailsReport:
    window: str
    rails: tuple[RailStat, ...]
    links: tuple[LinkStat, ...]
    gpus: tuple[Deviation, ...]
    nodes: tuple[Deviation, ...]
    findings: tuple[Finding, ...]
    rail_max_min: float | None
    rail_cv: float | None
    #: Ethernet bytes/s on a node, where it exceeds what RDMA carried there (0 when
    #: nothing did); None when RDMA is neither expected nor seen.
    fallback_bytes_s: float | None = None

    def signals(self) -> dict[str, float]:
        """The ``attribution.WindowSignals`` fields this report can fill (None left out)."""
        devs = self.gpus + self.nodes
        out: dict[str, float | None] = {
            "rdma_util": _max(r.util for r in self.rails),
            "rdma_rail_max_min": self.rail_max_min,
            "rdma_rail_cv": self.rail_cv,
            "rdma_error_events": (
                sum(d for r in self.rails for _, d in r.errors) if self.rails else None
            ),
            "rdma_congestion_per_s": (
                max((x for r in self.rails for _, x in r.congestion), default=0.0)
                if self.rails
                else None
            ),
            "net_util": _max(x.util for x in self.links),
            "net_wire_busy": _max(x.wire_busy for x in self.links),
            "socket_fallback_bytes_s": self.fallback_bytes_s,
            "straggler_rel_dev": (
                max((abs(d.rel_dev) for d in devs if d.straggler), default=0.0) if devs else None
            ),
            "sm_active_cv": _cv([d.value for d in self.gpus if d.metric == "gpm_sm_activity_pct"]),
            "gpu_util_max_min": _max_min(
                [d.value for d in self.gpus if d.metric == "gpu_util_pct"], 1.0
            ),
        }
        return {k: v for k, v in out.items() if v is not None}

    def by_class(self, cls: str) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.cls == cls)


# --- helpers -----------------------------------------------------------------------------


def _max(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return max(vals) if vals else None


def _cv(xs: Sequence[float]) -> float | None:
    if len(xs) < 2:
        return None
    m = statistics.fmean(xs)
    if m <= 0:
        return None
    return statistics.stdev(xs) / m


def _max_min(xs: Sequence[float], floor: float) -> float | None:
    if len(xs) < 2 or max(xs) <= floor:
        return None
    return max(xs) / max(min(xs), floor)


def _ref(r: HwStat) -> str:
    return f"{r.node}/{r.source}:{r.device}/{r.metric}"


def _ev(name: str, metric: str, value: float, op: str, source: str, scale: float = 1.0) -> Evidence:
    t = rule(name)
    thr = t.value * scale
    met = {">=": value >= thr, ">": value > thr, "<": value < thr}[op]
    return Evidence(metric, float(value), op, float(thr), t.name, t.unit, source, met)


class _Rows:
    """The window's rows by (source, metric), with (node, device) lookup."""

    def __init__(self, rows: Iterable[HwStat]) -> None:
        self.by: dict[tuple[str, str], dict[tuple[str, str], HwStat]] = defaultdict(dict)
        for r in rows:
            self.by[(r.source, r.metric)][(r.node, r.device)] = r

    def get(self, source: str, metric: str) -> dict[tuple[str, str], HwStat]:
        return self.by.get((source, metric), {})


def _rate(r: HwStat | None) -> float | None:
    if r is None:
        return None
    return r.rate if r.kind == "counter" else r.mean


# --- RDMA rails --------------------------------------------------------------------------


def rail_stats(rows: Iterable[HwStat]) -> tuple[RailStat, ...]:
    """Per RDMA port: throughput each way, link rate, utilization, errors, congestion."""
    v = _Rows(rows)
    tx, rx = v.get("rdma", "xmit_bytes"), v.get("rdma", "rcv_bytes")
    rate = v.get("rdma", "link_rate_gbps") or v.get("rdma", "rate_gbps")
    keys = sorted(set(tx) | set(rx))
    out = []
    for k in keys:
        t, r = _rate(tx.get(k)), _rate(rx.get(k))
        gbps = rate.get(k)
        link = gbps.mean * 1e9 / 8 if gbps is not None and gbps.mean else None
        busy = max(t or 0.0, r or 0.0)
        errors = tuple(
            (m, float(row.delta))
            for m in RDMA_ERRORS
            if (row := v.get("rdma", m).get(k)) is not None and row.delta
        )
        congestion = tuple(
            (m, float(row.rate))
            for m in RDMA_CONGESTION
            if (row := v.get("rdma", m).get(k)) is not None and row.rate
        )
        out.append(
            RailStat(k[0], k[1], t, r, link, busy / link if link else None, errors, congestion)
        )
    return tuple(out)


def rail_imbalance(rails: Sequence[RailStat]) -> tuple[float | None, float | None]:
    """(max/min, coefficient of variation) of the active rails' throughput."""
    floor = rule("rail_active_bytes_s").value
    busy = [r.bytes_s for r in rails]
    if len(busy) < 2 or max(busy) <= floor:
        return None, None
    return _max_min(busy, floor), _cv(busy)


def _rail_findings(
    rails: Sequence[RailStat], max_min: float | None, cv: float | None
) -> list[Finding]:
    out = []
    for r in rails:
        src = f"{r.node}/rdma:{r.device}"
        if r.util is not None:
            e = _ev("rdma_link_frac", "rdma_util", r.util, ">=", f"{src}/xmit_bytes,rcv_bytes")
            if e.met:
                out.append(
                    Finding(
                        "rail_saturated",
                        "gpu_communication",
                        r.node,
                        r.device,
                        f"rail {r.node}:{r.device} at {r.util:.0%} of its link rate",
                        (e,),
                    )
                )
        errs = tuple(_ev("rail_error_events", m, d, ">=", f"{src}/{m}") for m, d in r.errors)
        if any(e.met for e in errs):
            names = ", ".join(f"{m} +{d:g}" for m, d in r.errors)
            out.append(
                Finding(
                    "rail_errors",
                    "network",
                    r.node,
                    r.device,
                    f"rail {r.node}:{r.device} error counters moved: {names}",
                    errs,
                )
            )
        cong = tuple(
            _ev("rail_congestion_per_s", m, x, ">=", f"{src}/{m}") for m, x in r.congestion
        )
        if any(e.met for e in cong):
            out.append(
                Finding(
                    "rail_congestion",
                    "network",
                    r.node,
                    r.device,
                    f"rail {r.node}:{r.device} congestion signals: "
                    + ", ".join(f"{m} {x:.0f}/s" for m, x in r.congestion),
                    tuple(e for e in cong if e.met),
                )
            )
    ev = []
    if max_min is not None:
        ev.append(_ev("imbalance_max_min", "rdma_rail_max_min", max_min, ">=", "rdma:*"))
    if cv is not None:
        ev.append(_ev("imbalance_cv", "rdma_rail_cv", cv, ">=", "rdma:*"))
    if any(e.met for e in ev):
        lo = min(rails, key=lambda r: r.bytes_s)
        hi = max(rails, key=lambda r: r.bytes_s)
        out.append(
            Finding(
                "rail_imbalance",
                "waiting_on_peer",
                lo.node,
                lo.device,
                f"rails unbalanced: {hi.node}:{hi.device} {hi.bytes_s / 1e9:.3g} GB/s vs "
                f"{lo.node}:{lo.device} {lo.bytes_s / 1e9:.3g} GB/s",
                tuple(ev),
            )
        )
    return out


# --- Ethernet links ----------------------------------------------------------------------


def link_stats(
    rows: Iterable[HwStat],
    link_caps: Mapping[tuple[str, str], float] | None = None,
    ignore: Sequence[str] = ("lo",),
) -> tuple[LinkStat, ...]:
    """Per kernel interface: throughput, capacity, utilization, drops and errors.

    The capacity is ``link_caps[(node, iface)]`` (bytes/s per direction) when given: a
    shaped or oversubscribed link's real limit, which no counter shows. Otherwise the
    ``link_speed_mbps`` gauge of the interface, when some source sampled it.
    """
    v = _Rows(rows)
    tx, rx = v.get("net", "tx_bytes"), v.get("net", "rx_bytes")
    speed = v.get("net", "link_speed_mbps")
    caps = dict(link_caps or {})
    out = []
    for k in sorted(set(tx) | set(rx)):
        if k[1] in ignore:
            continue
        t, r = _rate(tx.get(k)), _rate(rx.get(k))
        if k in caps:
            link, how = float(caps[k]), "given capacity"
        elif (s := speed.get(k)) is not None and s.mean and s.mean > 0:
            link, how = s.mean * 1e6 / 8, "link_speed_mbps"
        else:
            link, how = None, ""
        busy = max(t or 0.0, r or 0.0)
        errors = tuple(
            (m, float(row.delta))
            for m in NET_ERRORS
            if (row := v.get("net", m).get(k)) is not None and row.delta
        )
        both = (t or 0.0) + (r or 0.0)
        out.append(
            LinkStat(
                k[0],
                k[1],
                t,
                r,
                link,
                how,
                busy / link if link else None,
                errors,
                both / link if link else None,
            )
        )
    return tuple(out)


def _rdma_by_node(rails: Sequence[RailStat]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for r in rails:
        out[r.node] += r.bytes_s
    return out


def fallback_bytes_s(
    links: Sequence[LinkStat], rails: Sequence[RailStat], expect_rdma: bool
) -> float | None:
    """The most Ethernet bytes/s on one interface beyond what RDMA carried on its node
    (0.0 when none exceeded it); None when RDMA is neither expected nor seen."""
    if not (expect_rdma or rails):
        return None
    rdma = _rdma_by_node(rails)
    return max((x.bytes_s for x in links if x.bytes_s > rdma.get(x.node, 0.0)), default=0.0)


def _link_findings(
    links: Sequence[LinkStat], rails: Sequence[RailStat], expect_rdma: bool
) -> list[Finding]:
    out = []
    for x in links:
        src = f"{x.node}/net:{x.device}/tx_bytes,rx_bytes"
        if x.util is not None and x.link_bytes_s is not None:  # util is over the link
            e = _ev("net_link_frac", "net_util", x.util, ">=", f"{src} / {x.link_source}")
            if e.met:
                out.append(
                    Finding(
                        "net_saturated",
                        "network",
                        x.node,
                        x.device,
                        f"{x.node}:{x.device} at {x.util:.0%} of {x.link_bytes_s / 1e6:.3g} MB/s "
                        f"({x.link_source})",
                        (e,),
                    )
                )
            elif x.wire_busy is not None:
                e2 = _ev(
                    "net_wire_busy", "net_wire_busy", x.wire_busy, ">=", f"{src} / {x.link_source}"
                )
                if e2.met:
                    out.append(
                        Finding(
                            "net_round_trip_bound",
                            "network",
                            x.node,
                            x.device,
                            f"{x.node}:{x.device} both directions together at {x.wire_busy:.0%} "
                            f"of {x.link_bytes_s / 1e6:.3g} MB/s ({x.link_source}), the busier at "
                            f"{x.util:.0%}: request/response traffic bound by the link",
                            (e, e2),
                        )
                    )
        errs = tuple(
            _ev("net_drop_events", m, d, ">=", f"{x.node}/net:{x.device}/{m}") for m, d in x.errors
        )
        if any(e.met for e in errs):
            out.append(
                Finding(
                    "net_errors",
                    "network",
                    x.node,
                    x.device,
                    f"{x.node}:{x.device} " + ", ".join(f"{m} +{d:g}" for m, d in x.errors),
                    errs,
                )
            )
    if not (expect_rdma or rails):
        return out
    rdma_by_node = _rdma_by_node(rails)
    for x in links:
        e = _ev(
            "socket_fallback_bytes_s",
            "net_bytes_s",
            x.bytes_s,
            ">=",
            f"{x.node}/net:{x.device}/tx_bytes,rx_bytes",
        )
        rdma = rdma_by_node.get(x.node, 0.0)
        if e.met and x.bytes_s > rdma:
            why = (
                "no RDMA counters on this node"
                if not rails
                else (f"RDMA carried {rdma / 1e6:.3g} MB/s")
            )
            out.append(
                Finding(
                    "socket_fallback",
                    "network",
                    x.node,
                    x.device,
                    f"{x.bytes_s / 1e6:.3g} MB/s on {x.node}:{x.device} where RDMA should carry "
                    f"the traffic ({why}): NCCL may have fallen back to sockets "
                    f"(check NCCL_IB_HCA, NCCL_DEBUG=INFO 'NET/Socket')",
                    (e,),
                )
            )
    return out


# --- GPU and node peers ------------------------------------------------------------------


def _gpu_values(v: _Rows) -> dict[str, dict[tuple[str, str], float]]:
    out: dict[str, dict[tuple[str, str], float]] = {}
    for metric in GPU_METRICS:
        vals: dict[tuple[str, str], float] = {}
        for src in reversed(GPU_SOURCES):  # nvml wins over dcgm for the same device
            for k, row in v.get(src, metric).items():
                x = _rate(row)
                if x is not None and k[1].startswith("gpu") and "/" not in k[1]:
                    vals[k] = x
        if metric == "power_w" and not vals:  # the energy counter: mJ/s = mW
            for k, row in v.get("nvml", "energy_mj").items():
                if row.rate is not None and k[1].startswith("gpu"):
                    vals[k] = row.rate / 1e3
        if vals:
            out[metric] = vals
    return out


def _deviations(
    vals: Mapping[tuple[str, str], float], metric: str, floor: float
) -> list[Deviation]:
    if len(vals) < 2:
        return []
    xs = [vals[k] for k in sorted(vals)]
    med = statistics.median(xs)
    if med <= floor:
        return []
    imbalanced = (_cv(xs) or 0.0) >= rule("imbalance_cv").value or (
        _max_min(xs, floor) or 0.0
    ) >= rule("imbalance_max_min").value
    lim = rule("straggler_rel_dev").value
    out = []
    for k in sorted(vals):
        rel = (vals[k] - med) / med
        out.append(Deviation(k[0], k[1], metric, vals[k], med, rel, imbalanced and abs(rel) >= lim))
    return out


def peer_deviations(rows: Iterable[HwStat]) -> tuple[tuple[Deviation, ...], tuple[Deviation, ...]]:
    """(per GPU, per node) deviations of utilization, SM activity and power from the peers."""
    per_metric = _gpu_values(_Rows(rows))
    gpus: list[Deviation] = []
    nodes: list[Deviation] = []
    for metric, vals in per_metric.items():
        gpus += _deviations(vals, metric, 1.0)
        by_node: dict[str, list[float]] = defaultdict(list)
        for (node, _), x in vals.items():
            by_node[node].append(x)
        means = {(n, ""): statistics.fmean(xs) for n, xs in by_node.items()}
        nodes += _deviations(means, metric, 1.0)
    return tuple(gpus), tuple(nodes)


def _peer_findings(devs: Sequence[Deviation], kind: str) -> list[Finding]:
    out = []
    flagged: dict[tuple[str, str], list[Deviation]] = defaultdict(list)
    for d in devs:
        if d.straggler:
            flagged[(d.node, d.device)].append(d)
    for (node, dev), ds in sorted(flagged.items()):
        ev = tuple(
            _ev(
                "straggler_rel_dev",
                f"{d.metric}_rel_dev",
                abs(d.rel_dev),
                ">=",
                f"{node}/{'|'.join(GPU_SOURCES)}:{dev or '*'}/{d.metric}",
            )
            for d in ds
        )
        what = ", ".join(f"{d.metric} {d.value:.3g} vs median {d.median:.3g}" for d in ds)
        name = f"{node}:{dev}" if dev else f"node {node}"
        out.append(Finding(kind, "waiting_on_peer", node, dev, f"{name} off its peers: {what}", ev))
    return out


# --- the whole window --------------------------------------------------------------------


def analyze(
    rows: Iterable[HwStat],
    *,
    window: str = "",
    link_caps: Mapping[tuple[str, str], float] | None = None,
    expect_rdma: bool = False,
    ignore_links: Sequence[str] = ("lo",),
) -> RailsReport:
    """Every rail, link and GPU peer fact of one window, with the findings.

    ``expect_rdma``: the deployment should move its collectives over RDMA (the profile
    samples ``rdma`` or sets ``NCCL_IB_HCA``), so Ethernet bytes are suspicious even
    when no RDMA counter was read.
    """
    rows = list(rows)
    rails = rail_stats(rows)
    mm, cv = rail_imbalance(rails)
    links = link_stats(rows, link_caps, ignore_links)
    gpus, nodes = peer_deviations(rows)
    findings = _rail_findings(rails, mm, cv)
    findings += _link_findings(links, rails, expect_rdma)
    findings += _peer_findings(gpus, "gpu_straggler")
    findings += _peer_findings(nodes, "node_straggler")
    return RailsReport(
        window,
        rails,
        links,
        gpus,
        nodes,
        tuple(findings),
        mm,
        cv,
        fallback_bytes_s(links, rails, expect_rdma),
    )


def merge_signals(fields: Mapping[str, object], report: RailsReport) -> dict[str, Any]:
    """``fields`` with this report's signals filling the ones still None (never overriding).

    Only names ``attribution.WindowSignals`` has are merged, so the result can be passed
    to it as is.
    """
    from dataclasses import fields as dc_fields

    from strata_plugin.analysis.rules import WindowSignals

    known = {f.name for f in dc_fields(WindowSignals)}
    out = dict(fields)
    for k, v in report.signals().items():
        if k in known and out.get(k) is None and not (isinstance(v, float) and math.isnan(v)):
            out[k] = v
    return out

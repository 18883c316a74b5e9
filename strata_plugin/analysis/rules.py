"""Rules that turn one window's signals into a verdict: what the hardware waited on.

Shaped like top-down analysis: first "is the GPU busy or waiting?", then which
kind of busy (compute, memory bandwidth, communication, PCIe copies, latency /
low occupancy) or which kind of waiting (host CPU / launch, input-starved, disk
I/O and page faults, waiting on a peer). Throttling is a modifier on any of them.
Serving classes (queueing, KV-cache capacity, prefill-decode interference, the
client itself) sit beside. A server without a GPU (llama.cpp on the CPU) gets the
host classes from proc/cpu/mem/disk/net samples alone.

Three promises, each tested:

* every number a rule compares against is in the one table
  (:mod:`strata_plugin.analysis.thresholds`), with its source;
* a rule whose signal was not measured does not fire and does not clear: it is
  "unassessable", and the verdict names the missing signal and why it is missing;
* when the evidence cannot separate two classes, or contradicts itself, the
  verdict is inconclusive and names the finer trace that would settle it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from strata_plugin.analysis.thresholds import threshold
from strata_plugin.analysis.thresholds import value as _v

# --- traces that settle what counters cannot ---------------------------------------------

TRACE_CUDA = (
    "CUDA timeline of copies and kernels: nsys profile --trace=cuda,nvtx,osrt "
    "(H2D/D2H memcpy, kernels, launch gaps, event waits)"
)
TRACE_GPM = "SM / DRAM / tensor activity: NVML GPM or dcgmi dmon -e 1002,1003,1004,1005 -d 100"
TRACE_NCCL = (
    "per-rank NCCL timeline: nsys --trace=cuda,nvtx (NCCL NVTX ranges) on every node, "
    "aligned by the measured clock offsets"
)
TRACE_SCHED = (
    "per-thread scheduling trace: perf sched record / bpftrace runqlat + offcputime "
    "(on-CPU vs runnable vs blocked, per thread)"
)
TRACE_BLOCK = (
    "per-file block I/O trace: biosnoop / blktrace with filetop, and fault addresses "
    "(perf trace -F maj)"
)
TRACE_MEM = "memory reclaim trace: perf trace -e 'vmscan:*' or bpftrace on direct reclaim"
TRACE_NET = (
    "per-connection network trace: ss -ti (RTT, retransmits) and ethtool -S during the window"
)
TRACE_SERVER = "server scheduler metrics: the engine's /metrics (waiting/running, KV usage)"
TRACE_CLOCK = (
    "clock alignment check: re-measure node offsets and compare request markers with "
    "the server log timestamps"
)

# --- inputs ------------------------------------------------------------------------------

#: Which collector and metric each signal comes from (for "missing" messages).
SIGNAL_SOURCES: dict[str, str] = {
    "gpu_util": "nvml:gpu_util_pct",
    "sm_active": "nvml:gpm_sm_activity_pct",
    "tensor_active": "nvml:gpm_tensor_activity_pct",
    "dram_active": "nvml:gpm_dram_bw_util_pct",
    "sm_occupancy": "nvml:gpm_sm_occupancy_pct",
    "sm_active_cv": "nvml:gpm_sm_activity_pct",
    "gpu_util_max_min": "nvml:gpu_util_pct",
    "pcie_bytes_s": "nvml:pcie_rx_bytes_s/pcie_tx_bytes_s",
    "nvlink_bytes_s": "nvml:gpm_nvlink_tx_bytes_s/gpm_nvlink_rx_bytes_s",
    "throttle_frac": "nvml:violation_power_ns/violation_thermal_ns/throttle_reasons",
    "sm_clock_low_frac": "nvml:sm_clock_mhz/sm_clock_max_mhz",
    "rdma_util": "rdma:xmit_bytes/rcv_bytes/link_rate_gbps",
    "host_busy_cores": "cpu:busy_s",
    "n_cores": "cpu:busy_s (per core)",
    "iowait_frac": "cpu:iowait_s",
    "steal_frac": "cpu:steal_s",
    "psi_cpu_some": "cpu:psi_cpu_some_total_us",
    "psi_io_some": "cpu:psi_io_some_total_us",
    "psi_mem_some": "cpu:psi_memory_some_total_us",
    "cgroup_throttled_frac": "cpu:cgroup_nr_throttled/cgroup_nr_periods (the server's cgroup)",
    "cgroup_quota_used": "cpu:cgroup_usage_s (or proc:cpu_user_s+cpu_system_s)/cgroup_quota_cores",
    "server_cpu_cores": "proc:cpu_user_s/cpu_system_s",
    "server_threads": "proc:num_threads (or thread_cpu_s devices)",
    "server_max_thread_cores": "proc:thread_cpu_s",
    "runq_delay_per_cpu_s": "proc:runqueue_delay_ns",
    "ctx_involuntary_per_cpu_s": "proc:ctx_involuntary",
    "major_faults_per_s": "proc:major_faults",
    "read_bytes_s": "proc:read_bytes",
    "disk_busy_frac": "disk:busy_ms",
    "mem_available_frac": "mem:mem_available_bytes/mem_total_bytes (and cgroup_mem_*)",
    "cgroup_mem_events": "mem:cgroup_mem_max_events+cgroup_mem_oom_kills (the server's cgroup)",
    "net_util": "net:rx_bytes/tx_bytes/link_speed_mbps (or profile telemetry.link_caps)",
    "net_wire_busy": "net:rx_bytes+tx_bytes/link_speed_mbps (or profile telemetry.link_caps)",
    "rdma_rail_max_min": "rdma:xmit_bytes/rcv_bytes",
    "rdma_rail_cv": "rdma:xmit_bytes/rcv_bytes",
    "rdma_error_events": "rdma:symbol_error/port_rcv_errors/... (error counters)",
    "rdma_congestion_per_s": "rdma:np_cnp_sent/rp_cnp_handled/port_xmit_wait/...",
    "socket_fallback_bytes_s": "net:rx_bytes/tx_bytes (beside rdma:xmit_bytes/rcv_bytes)",
    "straggler_rel_dev": "nvml:gpu_util_pct/gpm_sm_activity_pct/power_w (per GPU, per node)",
    "waiting_mean": "prom:waiting_requests",
    "kv_usage_max": "prom:kv_cache_usage",
    "preemptions": "prom:preemptions_total/retracted_requests_total",
    "server_queue_frac": "requests: ttft - timings.prompt_ms (llama.cpp)",
    "engine_queue_frac": "prom:queue_time_seconds_sum/ttft_seconds_sum",
    "prefix_cache_hit_frac": "prom:prefix_cache_hits_total/prefix_cache_queries_total",
    "outside_server_frac": "requests: e2e - timings.prompt_ms - timings.predicted_ms",
    "chunk_gap_p99_p50": "requests: chunk gaps",
    "prefill_stall_frac": "requests: token events against dispatch..first token of prefills",
    "prefill_stall_share": "requests: token events against dispatch..first token of prefills",
    "ab_prefill_stall_ratio": "requests: this arm's stalls against its A/B control's",
    "ab_tail_pace_rise": "requests: TPOT p95 against the A/B control's repetitions",
    "injected_pace_factor": "requests: decode pace inside the injected prefill against outside",
    "inflight_frac": "requests: dispatched..done windows",
    "client_bound": "cases.jsonl: client_bound (load generator self-check)",
}


@dataclass(frozen=True)
class WindowSignals:
    """One window, reduced to the numbers the rules read. None = not measured.

    Built by ``strata_plugin.analysis.signals`` from the timeline summary and the case
    metrics. GPU values are means over the GPUs of the window (ratios 0-1); byte
    rates are the busiest device's; CPU values are for the node that runs the server.
    """

    window: str
    duration_s: float
    gpu_present: bool = False  # some GPU telemetry was measured
    gpu_expected: bool = False  # the run says the server uses GPUs
    multi_node: bool = False
    unavailable: tuple[tuple[str, str], ...] = ()  # ("node/collector", reason)
    # GPU
    n_gpus: int = 0
    gpu_util: float | None = None
    sm_active: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    sm_occupancy: float | None = None
    sm_active_cv: float | None = None
    gpu_util_max_min: float | None = None
    pcie_bytes_s: float | None = None
    nvlink_bytes_s: float | None = None
    throttle_frac: float | None = None
    sm_clock_low_frac: float | None = None
    rdma_util: float | None = None
    rdma_rail_max_min: float | None = None
    rdma_rail_cv: float | None = None  # CV of the active rails' throughput
    rdma_error_events: float | None = None  # error counter increases, all rails
    rdma_congestion_per_s: float | None = None  # CNP/ECN/xmit-wait, busiest counter's rate
    # the largest deviation from the peers' median of a GPU or node rails.py flagged as a
    # straggler (0 when peers were compared and none was)
    straggler_rel_dev: float | None = None
    # host
    n_cores: int | None = None
    host_busy_cores: float | None = None
    iowait_frac: float | None = None
    steal_frac: float | None = None
    psi_cpu_some: float | None = None
    psi_io_some: float | None = None
    psi_mem_some: float | None = None
    cgroup_throttled_frac: float | None = None
    # the server's CPU (its cgroup's usage where the kernel reports it) over the cgroup's
    # CFS quota in cores; None without a quota
    cgroup_quota_used: float | None = None
    server_cpu_cores: float | None = None
    server_threads: int | None = None
    server_max_thread_cores: float | None = None
    runq_delay_per_cpu_s: float | None = None
    ctx_involuntary_per_cpu_s: float | None = None
    major_faults_per_s: float | None = None
    read_bytes_s: float | None = None
    disk_busy_frac: float | None = None
    mem_available_frac: float | None = None
    # the server cgroup's memory-limit events in the window (v2 memory.events max +
    # oom_kill; v1 memory.failcnt + oom_kill); None when its cgroup has no memory files
    cgroup_mem_events: float | None = None
    net_util: float | None = None  # busier direction / capacity, busiest interface
    net_wire_busy: float | None = None  # (tx + rx) / capacity, busiest interface
    # Ethernet bytes/s on a node that should use RDMA, where it exceeds what RDMA carried
    # (0 when RDMA is expected and nothing fell back; None when RDMA is not expected)
    socket_fallback_bytes_s: float | None = None
    # serving
    waiting_mean: float | None = None
    kv_usage_max: float | None = None
    preemptions: float | None = None
    server_queue_frac: float | None = None
    # the engine's own queue time over its TTFT, from its histograms (vLLM
    # request_queue_time_seconds / time_to_first_token_seconds): server-measured
    engine_queue_frac: float | None = None
    # prefix-cache hits over lookups, in tokens (vLLM prefix_cache_hits/queries)
    prefix_cache_hit_frac: float | None = None
    # median share of a request's time no server clock accounts for (network, proxy,
    # client; and the server's queue, which the waiting count tells apart)
    outside_server_frac: float | None = None
    chunk_gap_p99_p50: float | None = None
    # prefill-decode interference (analysis/interference.py); ab_*: against the A/B
    # control, only for a treatment arm
    prefill_stall_frac: float | None = None
    prefill_stall_share: float | None = None
    ab_prefill_stall_ratio: float | None = None
    ab_tail_pace_rise: float | None = None
    # the same window: decode time per token while the injected prefill was in flight
    # over the time outside it, minus 1 (interference.Interference.interference_factor)
    injected_pace_factor: float | None = None
    concurrency: int | None = None
    inflight_frac: float | None = None
    client_bound: bool | None = None
    client_lateness_p99_ms: float | None = None
    client_cpu_fraction: float | None = None


# --- outputs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """One comparison a rule made: ``metric op threshold`` with the measured value."""

    cls: str
    metric: str
    value: float
    op: str  # ">=" | "<" | "==" ...
    threshold: str  # name in thresholds.THRESHOLDS
    threshold_value: float
    unit: str
    source: str  # where the threshold comes from
    met: bool


@dataclass(frozen=True)
class Verdict:
    classes: tuple[str, ...]  # one or two; ("headroom",) when nothing binds
    evidence: tuple[Evidence, ...]
    confidence: float  # 0..1
    inconclusive: bool
    finer_trace: tuple[str, ...]
    missing_signals: tuple[str, ...]
    modifiers: tuple[str, ...] = ()  # e.g. ("throttling",)
    also_flagged: tuple[str, ...] = ()  # classes past threshold beyond the top two
    notes: tuple[str, ...] = ()
    # of the classes past threshold, those past it in the idle baseline too (host
    # background, there before the load); set by the case analysis, which has the baseline
    background: tuple[str, ...] = ()

    @property
    def past_threshold(self) -> tuple[str, ...]:
        """Every class past threshold, ranked: the named ones, then the rest."""
        return (*self.classes, *self.also_flagged)

    @property
    def appeared_with_load(self) -> tuple[str, ...]:
        return tuple(c for c in self.past_threshold if c not in self.background)

    @property
    def confidence_label(self) -> str:
        return "high" if self.confidence >= 0.75 else "medium" if self.confidence >= 0.5 else "low"

    def summary(self) -> str:
        if self.inconclusive and not self.classes:
            return "inconclusive"
        head = "inconclusive: " if self.inconclusive else ""
        mods = f" (+{', '.join(self.modifiers)})" if self.modifiers else ""
        return f"{head}{' + '.join(self.classes)}{mods}"


#: Every class the rules can name, in the order used to break score ties.
CLASSES = (
    "gpu_compute",
    "gpu_memory_bandwidth",
    "gpu_communication",
    "gpu_pcie_copy",
    "gpu_latency_low_occupancy",
    "host_cpu_launch",
    "input_starved",
    "io_page_faults",
    "waiting_on_peer",
    "cpu_compute",
    "cpu_contention",
    "cpu_limited",
    "memory_pressure",
    "network",
    "queueing",
    "kv_cache_capacity",
    "prefill_decode_interference",
    "outside_server",
    "client_bound",
    "throttling",
    "headroom",
)
MODIFIERS = ("throttling",)
#: Classes that describe a symptom of load rather than a resource; they accompany
#: a resource class and never make a window "contradictory" on their own.
SERVING = (
    "queueing",
    "kv_cache_capacity",
    "prefill_decode_interference",
    "outside_server",
    "client_bound",
)
#: Signals the load generator itself measures (its clock, its reads of the stream). When
#: its self-check flags it, they describe the client's delays as much as the server's,
#: so they are not trusted for that window: the rules that need them are unassessable.
CLIENT_MEASURED = (
    "server_queue_frac",
    "inflight_frac",
    "chunk_gap_p99_p50",
    "prefill_stall_frac",
    "prefill_stall_share",
    "ab_prefill_stall_ratio",
    "injected_pace_factor",
    "outside_server_frac",
)

#: Pairs the coarse counters cannot tell apart: when both fire and neither leads by
#: ``dominance_margin``, the verdict is inconclusive and names the trace that would.
AMBIGUOUS: tuple[tuple[str, str, str, str], ...] = (
    (
        "host_cpu_launch",
        "gpu_latency_low_occupancy",
        TRACE_CUDA,
        "low DRAM and tensor activity fit both slow launches and small kernels",
    ),
    (
        "gpu_pcie_copy",
        "gpu_compute",
        TRACE_CUDA,
        "copies and kernels may overlap or serialize; only a timeline shows which",
    ),
    (
        "gpu_pcie_copy",
        "gpu_memory_bandwidth",
        TRACE_CUDA,
        "copies and kernels may overlap or serialize; only a timeline shows which",
    ),
    (
        "gpu_communication",
        "waiting_on_peer",
        TRACE_NCCL,
        "collective time is where imbalance shows up, not where it is caused",
    ),
    (
        "cpu_compute",
        "io_page_faults",
        f"{TRACE_SCHED}; {TRACE_BLOCK}",
        "CPU seconds may be computing or servicing faults; on-CPU vs blocked time settles it",
    ),
    (
        "cpu_compute",
        "cpu_contention",
        TRACE_SCHED,
        "a saturated server and a crowded node look alike in per-process counters",
    ),
)
#: Pairs that cannot both hold: when both fire the signals contradict each other, and
#: the verdict is inconclusive whatever the scores.
CONTRADICTIONS: tuple[tuple[str, str, str, str], ...] = (
    (
        "gpu_compute",
        "input_starved",
        TRACE_CUDA,
        "a busy GPU with no request in flight: another process, or misaligned windows",
    ),
    (
        "gpu_memory_bandwidth",
        "input_starved",
        TRACE_CUDA,
        "a busy GPU with no request in flight: another process, or misaligned windows",
    ),
    (
        "cpu_compute",
        "input_starved",
        TRACE_SCHED,
        "a busy server CPU with no request in flight: background work, or misaligned windows",
    ),
    (
        "queueing",
        "input_starved",
        TRACE_CLOCK,
        "a server queue while the client had nothing in flight: the clocks disagree",
    ),
)


# --- rule machinery ----------------------------------------------------------------------


@dataclass
class _Outcome:
    cls: str
    fired: bool = False
    assessable: bool = True
    score: float = 0.0
    evidence: list[Evidence] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    trace: str = ""  # the trace that would assess it, when unassessable


def _margin(value: float, thr: float, op: str) -> float:
    """How far past its threshold a value is: 0 at the threshold, 1 at ``full_margin``.

    ``op`` is the comparison's: ">=" (fires at or above) or "<" (fires below), the two
    that a margin is taken for; any other is a caller's error, not "below" (a typo
    would silently reverse a score)."""
    if op == ">=":
        m = (value - thr) / abs(thr) if thr else value
    elif op == "<":
        m = (thr - value) / abs(thr) if thr else -value
    else:
        raise ValueError(f"unknown comparison {op!r}")
    return max(0.0, min(1.0, m / _v("full_margin")))


class _Rule:
    """Helper that records every comparison a rule makes."""

    def __init__(self, cls: str, s: WindowSignals) -> None:
        self.o = _Outcome(cls)
        self.s = s

    def need(self, *names: str) -> bool:
        """True when every named signal was measured; else mark unassessable."""
        missing = [n for n in names if getattr(self.s, n) is None]
        for n in missing:
            if n not in self.o.missing:
                self.o.missing.append(n)
        if missing:
            self.o.assessable = False
        return not missing

    def cmp(
        self,
        signal: str,
        op: str,
        thr_name: str,
        *,
        scale: float = 1.0,
        value: float | None = None,
        label: str | None = None,
    ) -> bool:
        v = getattr(self.s, signal) if value is None else value
        if v is None:
            return False
        t = threshold(thr_name)
        thr = t.value * scale
        met = _compare(float(v), op, thr)
        self.o.evidence.append(
            Evidence(
                self.o.cls,
                label or signal,
                _round(float(v)),
                op,
                t.name,
                _round(thr),
                t.unit,
                t.source,
                met,
            )
        )
        return met

    def fire(self, margin: float, *more: float) -> _Outcome:
        """The class fired; its score is the mean of its margins (each 0..1)."""
        self.o.fired = True
        self.o.assessable = True
        self.o.score = _round((margin + sum(more)) / (1 + len(more)))
        return self.o

    def unassessable(self, trace: str) -> _Outcome:
        self.o.assessable = False
        self.o.trace = trace
        return self.o


def _compare(v: float, op: str, thr: float) -> bool:
    return {">=": v >= thr, ">": v > thr, "<": v < thr, "==": v == thr}[op]


def _round(x: float) -> float:
    """Four significant digits (0, inf and nan pass through the format unchanged)."""
    return float(f"{x:.4g}")


def _m(s: WindowSignals, signal: str, thr: str, op: str = ">=", scale: float = 1.0) -> float:
    v = getattr(s, signal)
    return _margin(float(v), _v(thr) * scale, op) if v is not None else 0.0


# --- the rules: GPU busy -----------------------------------------------------------------


def _gpu_busy(s: WindowSignals) -> bool | None:
    """Level 1: SM activity when measured, else NVML utilization; None if neither."""
    if s.sm_active is not None:
        return s.sm_active >= _v("sm_active_busy")
    if s.gpu_util is not None:
        return s.gpu_util >= _v("gpu_util_busy")
    return None


def rule_gpu_compute(s: WindowSignals) -> _Outcome:
    r = _Rule("gpu_compute", s)
    if not r.need("sm_active"):
        return r.unassessable(TRACE_GPM)
    if s.tensor_active is None and s.dram_active is None:
        r.need("tensor_active", "dram_active")
        return r.unassessable(TRACE_GPM)
    tensor = (
        s.tensor_active is not None
        and r.cmp("sm_active", ">=", "sm_active_compute")
        and r.cmp("tensor_active", ">=", "tensor_active_compute")
    )
    if tensor:
        return r.fire(
            _m(s, "sm_active", "sm_active_compute"), _m(s, "tensor_active", "tensor_active_compute")
        )
    sm_hi = (
        s.dram_active is not None
        and r.cmp("sm_active", ">=", "sm_active_high")
        and r.cmp("dram_active", "<", "dram_active_bound")
    )
    if sm_hi:
        return r.fire(_m(s, "sm_active", "sm_active_high"))
    return r.o


def rule_gpu_memory_bandwidth(s: WindowSignals) -> _Outcome:
    r = _Rule("gpu_memory_bandwidth", s)
    if not r.need("dram_active"):
        return r.unassessable(TRACE_GPM)
    if r.cmp("dram_active", ">=", "dram_active_bound"):
        if s.tensor_active is not None and not r.cmp("tensor_active", "<", "tensor_active_compute"):
            # Tensor pipes busy too: compute leads, DRAM is a second, balanced load.
            return r.fire(_m(s, "dram_active", "dram_active_bound") / 2)
        return r.fire(_m(s, "dram_active", "dram_active_bound"))
    return r.o


def rule_gpu_communication(s: WindowSignals) -> _Outcome:
    r = _Rule("gpu_communication", s)
    if s.multi_node and not r.need("rdma_util"):
        return r.unassessable(TRACE_NCCL)
    link = s.rdma_util is not None and r.cmp("rdma_util", ">=", "rdma_link_frac")
    nvl = s.nvlink_bytes_s is not None and r.cmp("nvlink_bytes_s", ">=", "nvlink_bytes_s")
    if not r.need("gpu_util", "sm_active"):
        if link:
            return r.fire(_m(s, "rdma_util", "rdma_link_frac"))
        return r.unassessable(TRACE_NCCL)
    busy_not_computing = (
        r.cmp("gpu_util", ">=", "gpu_util_busy")
        and r.cmp("sm_active", "<", "comm_sm_max")
        and (s.tensor_active is None or r.cmp("tensor_active", "<", "comm_tensor_max"))
    )
    if (link or nvl) and (busy_not_computing or (s.sm_active or 0) < _v("sm_active_busy")):
        m = (
            _m(s, "rdma_util", "rdma_link_frac")
            if link
            else _m(s, "nvlink_bytes_s", "nvlink_bytes_s")
        )
        return r.fire(m)
    return r.o


def rule_gpu_pcie_copy(s: WindowSignals) -> _Outcome:
    r = _Rule("gpu_pcie_copy", s)
    if not r.need("pcie_bytes_s"):
        return r.unassessable(TRACE_CUDA)
    cap = _v("pcie_bytes_s_cap")
    if r.cmp("pcie_bytes_s", ">=", "pcie_link_frac", scale=cap):
        return r.fire(_m(s, "pcie_bytes_s", "pcie_link_frac", scale=cap))
    if (
        s.sm_active is not None
        and r.cmp("pcie_bytes_s", ">=", "pcie_active_bytes_s")
        and r.cmp("sm_active", "<", "pcie_sm_max")
    ):
        return r.fire(_m(s, "sm_active", "pcie_sm_max", "<"))
    return r.o


def rule_gpu_latency(s: WindowSignals) -> _Outcome:
    r = _Rule("gpu_latency_low_occupancy", s)
    if not r.need("sm_active", "dram_active", "tensor_active"):
        return r.unassessable(TRACE_GPM)
    if (
        r.cmp("sm_active", ">=", "sm_active_busy")
        and r.cmp("dram_active", "<", "dram_active_low")
        and r.cmp("tensor_active", "<", "tensor_active_low")
    ):
        occ_low = s.sm_occupancy is None or r.cmp("sm_occupancy", "<", "occupancy_low")
        if occ_low:
            return r.fire(
                _m(s, "dram_active", "dram_active_low", "<"),
                _m(s, "tensor_active", "tensor_active_low", "<"),
            )
    return r.o


# --- the rules: GPU waiting --------------------------------------------------------------


def rule_host_cpu_launch(s: WindowSignals) -> _Outcome:
    """GPU under-fed while work is in flight, and a host CPU signal says why.

    Under-fed: SM activity under 0.5, or SMs "active" but moving neither DRAM nor tensor
    work (tiny kernels between slow launches look like that too: hence the conflict
    with gpu_latency_low_occupancy, which only a CUDA timeline separates).
    """
    r = _Rule("host_cpu_launch", s)
    busy = _gpu_busy(s)
    if busy is None:
        r.need("sm_active")
        return r.unassessable(TRACE_GPM)
    idle_pipes = (
        busy
        and s.dram_active is not None
        and s.tensor_active is not None
        and s.dram_active < _v("dram_active_low")
        and s.tensor_active < _v("tensor_active_low")
    )
    if busy and not idle_pipes:
        return r.o
    if not r.need("inflight_frac") or not r.cmp("inflight_frac", ">=", "inflight_frac_min"):
        return r.o
    host = [
        n
        for n in ("server_max_thread_cores", "runq_delay_per_cpu_s", "psi_cpu_some")
        if getattr(s, n) is not None
    ]
    if not host:
        r.need("server_max_thread_cores", "runq_delay_per_cpu_s")
        return r.unassessable(TRACE_SCHED)
    margins = []
    if s.server_max_thread_cores is not None and r.cmp(
        "server_max_thread_cores", ">=", "thread_core_saturated"
    ):
        margins.append(_m(s, "server_max_thread_cores", "thread_core_saturated"))
    if s.runq_delay_per_cpu_s is not None and r.cmp(
        "runq_delay_per_cpu_s", ">=", "runq_delay_per_cpu_s"
    ):
        margins.append(_m(s, "runq_delay_per_cpu_s", "runq_delay_per_cpu_s"))
    if s.psi_cpu_some is not None and r.cmp("psi_cpu_some", ">=", "psi_some_frac"):
        margins.append(_m(s, "psi_cpu_some", "psi_some_frac"))
    if not margins:
        return r.o
    if idle_pipes:
        underfed = (
            _m(s, "dram_active", "dram_active_low", "<")
            + _m(s, "tensor_active", "tensor_active_low", "<")
        ) / 2
    elif s.sm_active is not None:
        underfed = _m(s, "sm_active", "sm_active_busy", "<")
    else:
        underfed = _m(s, "gpu_util", "gpu_util_busy", "<")
    return r.fire(*margins, underfed)


def rule_input_starved(s: WindowSignals) -> _Outcome:
    """The server sat idle for lack of requests (GPU or CPU alike)."""
    r = _Rule("input_starved", s)
    if not r.need("inflight_frac"):
        return r.unassessable("request windows (requests.jsonl)")
    if r.cmp("inflight_frac", "<", "inflight_frac_min"):
        return r.fire(_m(s, "inflight_frac", "inflight_frac_min", "<"))
    return r.o


def rule_waiting_on_peer(s: WindowSignals) -> _Outcome:
    r = _Rule("waiting_on_peer", s)
    if s.n_gpus < 2 and not s.multi_node:
        return r.o  # nothing to be imbalanced against
    peer = ("sm_active_cv", "gpu_util_max_min", "rdma_rail_max_min", "rdma_rail_cv")
    if all(getattr(s, n) is None for n in (*peer, "straggler_rel_dev")):
        r.need("sm_active_cv")
        return r.unassessable(TRACE_NCCL)
    margins = []
    for signal, thr in (
        ("sm_active_cv", "imbalance_cv"),
        ("gpu_util_max_min", "imbalance_max_min"),
        ("rdma_rail_max_min", "imbalance_max_min"),  # rails.py rail_imbalance
        ("rdma_rail_cv", "imbalance_cv"),  # rails.py rail_imbalance
        ("straggler_rel_dev", "straggler_rel_dev"),  # rails.py gpu_/node_straggler
    ):
        if getattr(s, signal) is not None and r.cmp(signal, ">=", thr):
            margins.append(_m(s, signal, thr))
    return r.fire(*margins) if margins else r.o


def rule_throttling(s: WindowSignals) -> _Outcome:
    r = _Rule("throttling", s)
    if s.throttle_frac is None and s.sm_clock_low_frac is None:
        r.need("throttle_frac")
        return r.unassessable("NVML clock-event reasons and violation counters")
    if s.throttle_frac is not None and r.cmp("throttle_frac", ">=", "throttle_frac"):
        return r.fire(_m(s, "throttle_frac", "throttle_frac"))
    if (
        s.sm_clock_low_frac is not None
        and _gpu_busy(s)
        and r.cmp("sm_clock_low_frac", ">=", "sm_clock_low_frac")
    ):
        return r.fire(_m(s, "sm_clock_low_frac", "sm_clock_low_frac"))
    return r.o


# --- the rules: host (with or without a GPU) ---------------------------------------------


def rule_cpu_compute(s: WindowSignals) -> _Outcome:
    """The server's own threads use the CPU it can use (CPU-only servers)."""
    r = _Rule("cpu_compute", s)
    if not r.need("server_cpu_cores", "n_cores"):
        return r.unassessable(TRACE_SCHED)
    usable = float(min(s.server_threads, s.n_cores) if s.server_threads else s.n_cores)
    if r.cmp("server_cpu_cores", ">=", "server_cores_of_threads", scale=usable):
        return r.fire(_m(s, "server_cpu_cores", "server_cores_of_threads", scale=usable))
    if (
        s.host_busy_cores is not None
        and r.cmp("host_busy_cores", ">=", "cores_busy_frac", scale=float(s.n_cores))
        and r.cmp(
            "server_cpu_cores",
            ">=",
            "cpu_compute_server_share",
            value=s.server_cpu_cores / max(s.host_busy_cores, 1e-9),
            label="server_share_of_busy_cores",
        )
    ):
        return r.fire(_m(s, "host_busy_cores", "cores_busy_frac", scale=float(s.n_cores)))
    return r.o


def rule_cpu_limited(s: WindowSignals) -> _Outcome:
    """The server's own cgroup quota keeps its threads from the CPU (a container, a pod,
    a systemd slice): CFS throttled the group in its enforcement periods, however idle
    the host. Other processes taking the cores are ``cpu_contention``'s, not this."""
    r = _Rule("cpu_limited", s)
    if not r.need("cgroup_throttled_frac"):
        return r.unassessable(TRACE_SCHED)
    if not r.cmp("cgroup_throttled_frac", ">=", "cgroup_throttled_frac"):
        return r.o
    score = _m(s, "cgroup_throttled_frac", "cgroup_throttled_frac")
    # Corroboration: a group throttled in most periods uses nearly all of its quota. It
    # adds a second met row (confidence) and never lowers the score.
    if s.cgroup_quota_used is not None and r.cmp("cgroup_quota_used", ">=", "cgroup_quota_used"):
        score = max(score, _m(s, "cgroup_quota_used", "cgroup_quota_used"))
    return r.fire(score)


def _at_own_quota(s: WindowSignals) -> bool:
    """The server's cgroup throttled it and it used (nearly) all of its quota."""
    return (
        s.cgroup_throttled_frac is not None
        and s.cgroup_quota_used is not None
        and s.cgroup_throttled_frac >= _v("cgroup_throttled_frac")
        and s.cgroup_quota_used >= _v("cgroup_quota_used")
    )


def rule_cpu_contention(s: WindowSignals) -> _Outcome:
    """Other work on the same cores, or the hypervisor (steal), keeps the server's threads
    from the CPU. (Its own cgroup's quota is ``cpu_limited``.)"""
    r = _Rule("cpu_contention", s)
    margins = []
    if s.steal_frac is not None and r.cmp("steal_frac", ">=", "steal_frac"):
        margins.append(_m(s, "steal_frac", "steal_frac"))
    if not r.need("host_busy_cores", "server_cpu_cores", "n_cores"):
        return r.fire(*margins) if margins else r.unassessable(TRACE_SCHED)
    other = max(0.0, s.host_busy_cores - s.server_cpu_cores) / max(s.n_cores, 1)
    crowded = r.cmp(
        "host_busy_cores", ">=", "other_cpu_frac", value=other, label="other_processes_cores_frac"
    )
    delayed = []
    if s.runq_delay_per_cpu_s is not None and r.cmp(
        "runq_delay_per_cpu_s", ">=", "runq_delay_per_cpu_s"
    ):
        delayed.append(_m(s, "runq_delay_per_cpu_s", "runq_delay_per_cpu_s"))
    if s.ctx_involuntary_per_cpu_s is not None and r.cmp(
        "ctx_involuntary_per_cpu_s", ">=", "involuntary_ctx_per_cpu_s"
    ):
        delayed.append(_m(s, "ctx_involuntary_per_cpu_s", "involuntary_ctx_per_cpu_s"))
    if crowded and delayed and _at_own_quota(s):
        # CFS throttling is run-queue delay and preemption too: a server that used its
        # whole quota got all its cgroup allows, so its waits are the quota's
        # (cpu_limited), not the other processes'.
        r.cmp("cgroup_quota_used", "<", "cgroup_quota_used", label="quota_used_not_binding")
    elif crowded and delayed:
        margins.append(sum(delayed) / len(delayed))
        margins.append(_margin(other, _v("other_cpu_frac"), ">="))
    if (
        crowded
        and s.runq_delay_per_cpu_s is None
        and s.ctx_involuntary_per_cpu_s is None
        and not margins
    ):
        # others hold the cores, but whether the server waited for them is unmeasured
        # (a host that is not crowded is cleared without them)
        r.need("runq_delay_per_cpu_s")
    return r.fire(*margins) if margins else r.o


def rule_io_page_faults(s: WindowSignals) -> _Outcome:
    r = _Rule("io_page_faults", s)
    if s.major_faults_per_s is None and s.read_bytes_s is None and s.disk_busy_frac is None:
        r.need("major_faults_per_s", "read_bytes_s")
        return r.unassessable(TRACE_BLOCK)
    margins = []
    if s.major_faults_per_s is not None and r.cmp("major_faults_per_s", ">=", "major_faults_per_s"):
        margins.append(_m(s, "major_faults_per_s", "major_faults_per_s"))
    if s.read_bytes_s is not None and r.cmp("read_bytes_s", ">=", "read_bytes_s"):
        margins.append(_m(s, "read_bytes_s", "read_bytes_s"))
    # A busy device is the server's only when nothing says otherwise: with its own fault
    # and read counters measured and quiet, the reads are another process's.
    own_measured = s.major_faults_per_s is not None or s.read_bytes_s is not None
    if (
        s.disk_busy_frac is not None
        and r.cmp("disk_busy_frac", ">=", "disk_busy_frac")
        and (margins or not own_measured)
    ):
        margins.append(_m(s, "disk_busy_frac", "disk_busy_frac"))
    # Corroboration raises the score but never fires the rule alone.
    extra = []
    if s.psi_io_some is not None and r.cmp("psi_io_some", ">=", "psi_some_frac"):
        extra.append(_m(s, "psi_io_some", "psi_some_frac"))
    if s.iowait_frac is not None and r.cmp("iowait_frac", ">=", "iowait_frac"):
        extra.append(_m(s, "iowait_frac", "iowait_frac"))
    if margins:
        return r.fire(*margins, *extra)
    if s.major_faults_per_s is None:
        r.need("major_faults_per_s")
    return r.o


def rule_memory_pressure(s: WindowSignals) -> _Outcome:
    r = _Rule("memory_pressure", s)
    if s.psi_mem_some is None and s.mem_available_frac is None and s.cgroup_mem_events is None:
        r.need("psi_mem_some", "mem_available_frac")
        return r.unassessable(TRACE_MEM)
    margins = []
    # The server's own memory limit: reclaim or OOM kills at the limit, on a host with
    # plenty free (a container, a pod). Counts: one event is past, a tenth more scores.
    if s.cgroup_mem_events is not None and r.cmp("cgroup_mem_events", ">=", "cgroup_mem_events"):
        margins.append(_m(s, "cgroup_mem_events", "cgroup_mem_events"))
    if s.psi_mem_some is not None and r.cmp("psi_mem_some", ">=", "psi_some_frac"):
        margins.append(_m(s, "psi_mem_some", "psi_some_frac"))
    if s.mem_available_frac is not None and r.cmp(
        "mem_available_frac", "<", "mem_available_frac_min"
    ):
        margins.append(_m(s, "mem_available_frac", "mem_available_frac_min", "<"))
    return r.fire(*margins) if margins else r.o


def rule_network(s: WindowSignals) -> _Outcome:
    """An interface near its capacity (one direction, or both together for request/response
    traffic), or the RDMA fabric erroring, congested, or bypassed (NCCL over sockets)."""
    r = _Rule("network", s)
    checks = (
        ("net_util", "net_link_frac"),
        # request/response traffic (llama.cpp RPC) alternates directions: one direction
        # never fills the link that limits it, both together do
        ("net_wire_busy", "net_wire_busy"),
        ("rdma_error_events", "rail_error_events"),  # rails.py rail_errors
        ("rdma_congestion_per_s", "rail_congestion_per_s"),  # rails.py rail_congestion
        ("socket_fallback_bytes_s", "socket_fallback_bytes_s"),  # rails.py socket_fallback
    )
    if all(getattr(s, n) is None for n, _ in checks):
        r.need("net_util")
        return r.unassessable(TRACE_NET)
    margins = [
        _m(s, signal, thr)
        for signal, thr in checks
        if getattr(s, signal) is not None and r.cmp(signal, ">=", thr)
    ]
    if margins:
        return r.fire(*margins)
    if not r.need("net_util"):  # a link nobody measured is not cleared by rail counters
        return r.unassessable(TRACE_NET)
    return r.o


# --- the rules: serving ------------------------------------------------------------------


def rule_queueing(s: WindowSignals) -> _Outcome:
    """Requests waited in the server's own queue.

    The server's waiting count decides where it is measured: TTFT outside prefill
    (``server_queue_frac``, seen from the client) grows for any delay between client and
    server as well, so alone it only decides where the server reports no queue. The
    engine's own queue time over its TTFT (``engine_queue_frac``, vLLM's histograms) is
    the server's clock and decides alone.
    """
    r = _Rule("queueing", s)
    if s.waiting_mean is None and s.server_queue_frac is None and s.engine_queue_frac is None:
        r.need("waiting_mean")
        return r.unassessable(TRACE_SERVER)
    margins = []
    queued = s.waiting_mean is not None and r.cmp(
        "waiting_mean", ">=", "waiting_requests_mean"
    )
    if queued:
        margins.append(_m(s, "waiting_mean", "waiting_requests_mean"))
    # The engine's own clock of its queue (its histograms): no client delay in it.
    if s.engine_queue_frac is not None and r.cmp("engine_queue_frac", ">=",
                                                  "server_queue_frac"):
        margins.append(_m(s, "engine_queue_frac", "server_queue_frac"))
    if s.server_queue_frac is not None and r.cmp("server_queue_frac", ">=", "server_queue_frac"):
        if queued or s.waiting_mean is None:
            margins.append(_m(s, "server_queue_frac", "server_queue_frac"))
    return r.fire(*margins) if margins else r.o


def rule_outside_server(s: WindowSignals) -> _Outcome:
    """Time no server clock accounts for, while the server reports no queue: the network
    path, a proxy or the client. Needs the waiting count to tell it from queueing."""
    r = _Rule("outside_server", s)
    if not r.need("outside_server_frac"):
        return r.unassessable("llama.cpp timings (prompt_ms, predicted_ms) per request")
    if not r.cmp("outside_server_frac", ">=", "outside_server_frac"):
        return r.o
    if not r.need("waiting_mean"):
        return r.unassessable(TRACE_SERVER)
    if r.cmp("waiting_mean", "<", "waiting_requests_mean"):
        return r.fire(_m(s, "outside_server_frac", "outside_server_frac"))
    return r.o


def rule_kv_cache(s: WindowSignals) -> _Outcome:
    r = _Rule("kv_cache_capacity", s)
    if s.kv_usage_max is None and s.preemptions is None:
        r.need("kv_usage_max")
        return r.unassessable(TRACE_SERVER)
    margins = []
    if s.kv_usage_max is not None and r.cmp("kv_usage_max", ">=", "kv_usage_high"):
        margins.append(max(0.5, _m(s, "kv_usage_max", "kv_usage_high")))
    if s.preemptions is not None and r.cmp("preemptions", ">", "preemptions_max"):
        margins.append(1.0)
    return r.fire(*margins) if margins else r.o


def rule_interference(s: WindowSignals) -> _Outcome:
    """Decode streams stalled while a prefill was in flight.

    A treatment of an A/B group is judged against its control: its stall time with a
    prefill in flight must be a multiple of the control's and its tail pace must rise.
    Or within its own window: decode slowed by a factor while the injected prefill was
    in flight, against its pace outside it. That comparison is immune to what the host
    did between repetitions minutes apart (a control run while another tenant held a
    core had its own tail 8x slower, and hid a treatment's stalls from the first test).
    A case without a control must show that its stalls coincide with prefills: a stall
    with no prefill in flight (a busy host, a slow client) is not interference.
    """
    r = _Rule("prefill_decode_interference", s)
    if (s.concurrency or 1) < 2:
        return r.o  # one request at a time: no prompt can arrive mid-decode
    if not r.need("prefill_stall_frac", "prefill_stall_share"):
        return r.unassessable("per-request token events (requests.jsonl events)")
    frac = r.cmp("prefill_stall_frac", ">=", "prefill_stall_frac")
    if s.ab_prefill_stall_ratio is not None:
        ratio = r.cmp("ab_prefill_stall_ratio", ">=", "ab_prefill_stall_ratio")
        tail = s.ab_tail_pace_rise is not None and r.cmp(
            "ab_tail_pace_rise", ">=", "ab_tail_pace_rise"
        )
        if frac and ratio and tail:
            return r.fire(
                _m(s, "prefill_stall_frac", "prefill_stall_frac"),
                _m(s, "ab_prefill_stall_ratio", "ab_prefill_stall_ratio"),
                _m(s, "ab_tail_pace_rise", "ab_tail_pace_rise"),
            )
        pace = s.injected_pace_factor is not None and r.cmp(
            "injected_pace_factor", ">=", "injected_pace_factor"
        )
        if frac and pace:
            return r.fire(
                _m(s, "prefill_stall_frac", "prefill_stall_frac"),
                _m(s, "injected_pace_factor", "injected_pace_factor"),
            )
        return r.o
    share = r.cmp("prefill_stall_share", ">=", "prefill_stall_share")
    if frac and share:
        return r.fire(
            _m(s, "prefill_stall_frac", "prefill_stall_frac"),
            _m(s, "prefill_stall_share", "prefill_stall_share"),
        )
    return r.o


def rule_client_bound(s: WindowSignals) -> _Outcome:
    r = _Rule("client_bound", s)
    if not r.need("client_bound"):
        return r.unassessable("the load generator's self-check (cases.jsonl client_bound)")
    if r.cmp("client_bound", "==", "client_bound", value=1.0 if s.client_bound else 0.0):
        return r.fire(1.0)
    return r.o


GPU_RULES: tuple[Callable[[WindowSignals], _Outcome], ...] = (
    rule_gpu_compute,
    rule_gpu_memory_bandwidth,
    rule_gpu_communication,
    rule_gpu_pcie_copy,
    rule_gpu_latency,
    rule_host_cpu_launch,
    rule_waiting_on_peer,
    rule_throttling,
)
HOST_RULES = (
    rule_input_starved,
    rule_io_page_faults,
    rule_memory_pressure,
    rule_network,
    rule_cpu_contention,
    rule_cpu_limited,
)
CPU_SERVER_RULES = (rule_cpu_compute,)
SERVING_RULES = (
    rule_queueing,
    rule_kv_cache,
    rule_interference,
    rule_outside_server,
    rule_client_bound,
)
#: Rules that must be assessable before a window can be called clean ("headroom").
CORE_GPU = (
    "host_cpu_launch",
    "gpu_compute",
    "gpu_memory_bandwidth",
    "io_page_faults",
    "memory_pressure",
)
CORE_CPU = ("cpu_compute", "cpu_contention", "io_page_faults", "memory_pressure")


# --- the verdict -------------------------------------------------------------------------


def _missing_text(signal: str, s: WindowSignals, distrusted: tuple[str, ...] = ()) -> str:
    src = SIGNAL_SOURCES.get(signal, signal)
    if signal in distrusted:
        return f"{signal} <- {src} (not trusted: the load generator's self-check flagged it)"
    collector = src.split(":", 1)[0]
    metric = src.split(":", 1)[-1]

    def concerns(where: str) -> bool:
        # where: "<node>/<collector>" or "<node>/<collector>/<device>/<metric>" (one metric)
        parts = where.split("/")[1:] or [where]
        return parts[0] == collector or parts[0] in metric or parts[-1] in metric

    reasons = [f"{where}: {why}" for where, why in s.unavailable if concerns(where)]
    if reasons:
        why = f" (unavailable: {'; '.join(reasons)})"
    elif collector in ("requests", "cases.jsonl"):
        why = " (not recorded for this case)"
    else:
        why = " (no samples in the window)"
    return f"{signal} <- {src}{why}"


def classify(s: WindowSignals, background: frozenset[str] | set[str] = frozenset()) -> Verdict:
    """Every rule over one window, then the verdict: top classes, evidence, confidence.

    ``background``: classes past threshold in the idle baseline before the load (host
    background, from the case analysis). They rank after the classes that appeared
    with the load, so a busy host's standing contention does not push the cause of
    this window out of the named slots; they stay in the verdict, marked background.
    """
    v = _classify(s, frozenset(background))
    if not background:
        return v
    return replace(v, background=tuple(c for c in v.past_threshold if c in background))


def _classify(s: WindowSignals, background: frozenset[str]) -> Verdict:
    gpu_mode = s.gpu_present or s.gpu_expected
    notes: list[str] = []
    distrusted: tuple[str, ...] = ()
    if s.client_bound:
        distrusted = tuple(n for n in CLIENT_MEASURED if getattr(s, n) is not None)
        s = replace(s, **dict.fromkeys(CLIENT_MEASURED))
        notes.append(
            "the load generator fell behind its own schedule: the server did not get the "
            "load asked for, and request-side signals ("
            + ", ".join(CLIENT_MEASURED)
            + ") are not trusted for this window"
        )
    rules = list(HOST_RULES) + list(SERVING_RULES)
    rules = (list(GPU_RULES) if gpu_mode else list(CPU_SERVER_RULES)) + rules
    outcomes = {o.cls: o for o in (rule(s) for rule in rules)}
    if not gpu_mode:
        notes.append("no GPU telemetry and none expected: GPU classes not assessed")

    fired = [o for o in outcomes.values() if o.fired]
    modifiers = tuple(o.cls for o in fired if o.cls in MODIFIERS)
    ordered = _rank([o for o in fired if o.cls not in MODIFIERS], background)

    missing_signals = sorted({m for o in outcomes.values() for m in o.missing} | set(distrusted))
    unassessed = [o for o in outcomes.values() if not o.assessable]
    missing_text = tuple(_missing_text(m, s, distrusted) for m in missing_signals)
    penalty = threshold("missing_penalty").value ** len(
        {SIGNAL_SOURCES.get(m, m).split(":", 1)[0] for m in missing_signals}
    )

    # Signals that contradict each other: the server used more CPU than the whole node.
    if (
        s.server_cpu_cores is not None
        and s.host_busy_cores is not None
        and s.server_cpu_cores
        > _v("cpu_samples_disagree_factor") * s.host_busy_cores
        + _v("cpu_samples_disagree_slack_cores")
    ):
        return Verdict(
            classes=tuple(o.cls for o in ordered[:2]),
            evidence=_evidence(ordered[:2]),
            confidence=0.2,
            inconclusive=True,
            finer_trace=(TRACE_SCHED, TRACE_CLOCK),
            missing_signals=missing_text,
            modifiers=modifiers,
            notes=(
                *notes,
                f"server CPU {s.server_cpu_cores:.3g} cores exceeds the node's busy "
                f"{s.host_busy_cores:.3g} cores: proc and cpu samples disagree",
            ),
        )

    conflict = _conflict(ordered)
    if conflict is not None:
        a, b, trace, why = conflict
        pair = [outcomes[a], outcomes[b]]
        return Verdict(
            classes=(a, b),
            evidence=_evidence(pair + [o for o in ordered if o.cls not in (a, b)]),
            confidence=_round(min(0.4, 0.4 * penalty)),
            inconclusive=True,
            finer_trace=(trace,),
            missing_signals=missing_text,
            modifiers=modifiers,
            also_flagged=tuple(o.cls for o in ordered if o.cls not in (a, b)),
            notes=(*notes, f"{a} and {b} both past threshold: {why}"),
        )

    if ordered:
        top = ordered[:2]
        conf = max(_class_confidence(o) for o in top[:1]) * penalty
        traces = _in_question(unassessed, s)
        return Verdict(
            classes=tuple(o.cls for o in top),
            evidence=_evidence(ordered + [outcomes[c] for c in modifiers]),
            confidence=_round(max(0.1, conf)),
            inconclusive=False,
            finer_trace=traces if missing_signals else (),
            missing_signals=missing_text,
            modifiers=modifiers,
            also_flagged=tuple(o.cls for o in ordered[2:]),
            notes=(*notes, *_second_slot_notes(ordered)),
        )

    if modifiers:
        mod = outcomes[modifiers[0]]
        return Verdict(
            classes=modifiers,
            evidence=_evidence([mod]),
            confidence=_round(_class_confidence(mod) * penalty),
            inconclusive=False,
            finer_trace=(),
            missing_signals=missing_text,
            modifiers=(),
            notes=tuple(notes),
        )

    core = CORE_GPU if gpu_mode else CORE_CPU
    blind = [c for c in core if c in outcomes and not outcomes[c].assessable]
    if blind:
        traces = tuple(sorted({outcomes[c].trace for c in blind if outcomes[c].trace}))
        return Verdict(
            classes=(),
            evidence=_evidence(list(outcomes.values())),
            confidence=0.0,
            inconclusive=True,
            finer_trace=traces,
            missing_signals=missing_text,
            notes=(*notes, "nothing past threshold, but not measured: " + ", ".join(blind)),
        )

    clear = [o for o in outcomes.values() if o.assessable and o.evidence]
    headroom_margin = _headroom_margin(clear)
    conf = (0.5 + 0.4 * headroom_margin) * penalty
    return Verdict(
        classes=("headroom",),
        evidence=_evidence(clear),
        confidence=_round(conf),
        inconclusive=False,
        finer_trace=_in_question(unassessed, s),
        missing_signals=missing_text,
        notes=(*notes, "no dominant bottleneck: no rule had all its conditions met"),
    )


def _in_question(unassessed: list[_Outcome], s: WindowSignals) -> tuple[str, ...]:
    """Finer traces for the unassessed classes that could matter in this window: a
    one-node run serves over loopback, so no network class is in question there."""
    return tuple(sorted({
        o.trace for o in unassessed
        if o.trace and not (o.cls == "network" and not s.multi_node)
    }))


def _rank(fired: list[_Outcome], background: frozenset[str] | set[str] = frozenset()
          ) -> list[_Outcome]:
    """The order classes are named in: the client, a resource, a serving symptom, the rest.

    A client that fell behind leads: nothing below it was measured under the load asked
    for. Then the strongest resource class (what the hardware waited on), then the
    strongest serving symptom (what a user of the server saw), so a queue or a full KV
    cache is not pushed out by a second resource class; then the rest, by kind and
    score. Score ties break by ``CLASSES`` order. Within each kind, classes already past
    threshold in the idle baseline (``background``) come after those that appeared with
    the load.
    """
    ranked = sorted(fired, key=lambda o: (o.cls in background, -o.score, CLASSES.index(o.cls)))
    client = [o for o in ranked if o.cls == "client_bound"]
    resource = [o for o in ranked if o.cls not in SERVING]
    serving = [o for o in ranked if o.cls in SERVING and o.cls != "client_bound"]
    return client + resource[:1] + serving[:1] + resource[1:] + serving[1:]


def _close_pairs(ordered: list[_Outcome], cls: str):
    """AMBIGUOUS pairs of ``cls`` with another fired class it does not lead by the margin."""
    names = {o.cls: o for o in ordered}
    margin = _v("dominance_margin")
    for a, b, trace, why in AMBIGUOUS:
        if cls in (a, b) and a in names and b in names:
            if abs(names[a].score - names[b].score) < margin:
                yield a, b, trace, why


def _conflict(ordered: list[_Outcome]) -> tuple[str, str, str, str] | None:
    """A contradiction anywhere, or an ambiguous pair that puts the leading class in doubt.

    An ambiguous pair further down (two weak classes the counters cannot separate,
    beside a clear leader) does not make the verdict inconclusive: see
    :func:`_second_slot_notes`.
    """
    names = {o.cls for o in ordered}
    for a, b, trace, why in CONTRADICTIONS:
        if a in names and b in names:
            return a, b, trace, f"contradictory signals: {why}"
    if ordered:
        return next(_close_pairs(ordered, ordered[0].cls), None)
    return None


def _second_slot_notes(ordered: list[_Outcome]) -> list[str]:
    if len(ordered) < 2:
        return []
    return [
        f"{ordered[1].cls} could equally be {b if a == ordered[1].cls else a}: {why} ({trace})"
        for a, b, trace, why in _close_pairs(ordered, ordered[1].cls)
    ]


def _class_confidence(o: _Outcome) -> float:
    """0.5 at the threshold, up to 0.9 far past it; +0.1 when two signals agree."""
    met = sum(1 for e in o.evidence if e.met)
    return min(1.0, 0.5 + 0.4 * o.score + (0.1 if met >= 2 else 0.0))


def _headroom_margin(clear: list[_Outcome]) -> float:
    """How far the assessed comparisons stayed from firing (0..1, the closest).

    Each row not met is measured on the other side of its threshold: a ">=" row by how
    far under, a "<" row by how far over. A zero threshold has no relative distance
    (``preemptions > 0`` with none is not "at" its threshold), so such rows are left out;
    so is ``==`` (the client-bound flag)."""
    other_side = {">=": "<", ">": "<", "<": ">="}
    margins = [
        _margin(e.value, e.threshold_value, other_side[e.op])
        for o in clear
        for e in o.evidence
        if not e.met and e.op in other_side and e.threshold_value
    ]
    return min(margins) if margins else 0.5


def _evidence(outcomes: list[_Outcome]) -> tuple[Evidence, ...]:
    return tuple(e for o in outcomes for e in o.evidence)

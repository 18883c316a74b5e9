"""The rule table, declared once: each rule's class, group and signals, with their sources.

Everything the machinery needs about the rules is derived from :data:`RULES`: the class
vocabulary (:data:`CLASSES`, whose order breaks score ties), the groups (which rules run
for a GPU server, a CPU server, every host, the serving layer; which classes are
modifiers or serving symptoms), and where each signal comes from
(:data:`SIGNAL_SOURCES`, for "missing" messages). A new class is one entry here plus its
rule function in the family module (``gpu.py``, ``host.py``, ``serving.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from strata_plugin.analysis.rules import gpu, host, serving
from strata_plugin.analysis.rules.outcome import Outcome
from strata_plugin.analysis.rules.traces import (
    TRACE_BLOCK,
    TRACE_CLOCK,
    TRACE_CUDA,
    TRACE_NCCL,
    TRACE_SCHED,
)
from strata_plugin.analysis.rules.window import WindowSignals

#: The groups a rule can belong to. ``gpu`` and ``modifier`` run when the server has (or
#: should have) GPUs, ``cpu_server`` when it has none; ``host`` and ``serving`` always.
#: ``serving`` classes are symptoms of load, not resources: they rank beside a resource
#: class and never make a window contradictory on their own. ``modifier`` classes are
#: reported beside the class they slow.
GROUPS = ("gpu", "modifier", "cpu_server", "host", "serving")


@dataclass(frozen=True)
class Rule:
    """One class, its group, the rule that decides it and the signals that rule reads
    (name -> "collector:metric ..." where each comes from)."""

    cls: str
    group: str
    fn: Callable[[WindowSignals], Outcome]
    signals: tuple[tuple[str, str], ...]
    #: must be assessable before a window with nothing past threshold is called clear,
    #: per server kind
    core: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"rule {self.cls!r}: unknown group {self.group!r}")


# Sources read by more than one rule, named once.
GPU_UTIL = ("gpu_util", "nvml:gpu_util_pct")
SM = ("sm_active", "nvml:gpm_sm_activity_pct")
TENSOR = ("tensor_active", "nvml:gpm_tensor_activity_pct")
DRAM = ("dram_active", "nvml:gpm_dram_bw_util_pct")
INFLIGHT = ("inflight_frac", "requests: dispatched..done windows")
HOST_BUSY = ("host_busy_cores", "cpu:busy_s")
N_CORES = ("n_cores", "cpu:busy_s (per core)")
SERVER_CPU = ("server_cpu_cores", "proc:cpu_user_s/cpu_system_s")
RUNQ = ("runq_delay_per_cpu_s", "proc:runqueue_delay_ns")
PSI_CPU = ("psi_cpu_some", "cpu:psi_cpu_some_total_us")
THROTTLED = ("cgroup_throttled_frac",
             "cpu:cgroup_nr_throttled/cgroup_nr_periods (the server's cgroup)")
QUOTA_USED = ("cgroup_quota_used",
              "cpu:cgroup_usage_s (or proc:cpu_user_s+cpu_system_s)/cgroup_quota_cores")
WAITING = ("waiting_mean", "prom:waiting_requests")
ENGINES = ("engines", "allowance:engine_nr_throttled/engine_nr_periods/engine_quota_cores "
           "(device pid<N>: each engine's own cgroup, where the path ends at several)")
# The server's CPU allowance (agent/collectors/allowance.py) and its threads' demand.
ALLOWED = ("server_allowed_cpus",
           "allowance:allowed_cpus (its threads' affinity within their cpuset, at most the "
           "CFS quota; the window's least)")
ALLOWED_BY = ("server_allowance_by",
              "allowance:cpuset_cpus/affinity_cpus/quota_cores (the CPU lists in the device "
              "names)")
RUNNABLE = ("server_runnable_cores", "runstate:run_s+wait_s+throttled_s")
OTHERS = ("other_processes",
          "allowance:cpu_s+children_cpu_s/strata_own (device pid<N> <command>)")
STARTS = ("host_process_starts_per_s", "cpu:forks")
WEIGHT = ("server_cpu_weight", "allowance:cpu_weight (device <file> <group>: v1 cpu.shares, "
          "v2 cpu.weight of the server's cpu cgroup)")
NICE = ("server_nice", "allowance:nice_min/nice_max (its threads' nice values)")
OTHER_WEIGHTS = ("other_weights", "allowance:nice/cpu_weight (device pid<N> ...: the named "
                 "other processes')")
STALLS = "requests: token events against dispatch..first token of prefills"

#: Every rule, in the order that breaks score ties (``CLASSES``); within a group, the
#: order the rules run and their evidence is listed in.
RULES: tuple[Rule, ...] = (
    Rule("gpu_compute", "gpu", gpu.rule_gpu_compute, (SM, TENSOR, DRAM), core=("gpu",)),
    Rule("gpu_memory_bandwidth", "gpu", gpu.rule_gpu_memory_bandwidth, (DRAM, TENSOR),
         core=("gpu",)),
    Rule("gpu_communication", "gpu", gpu.rule_gpu_communication, (
        ("rdma_util", "rdma:xmit_bytes/rcv_bytes/link_rate_gbps"),
        ("nvlink_bytes_s", "nvml:gpm_nvlink_tx_bytes_s/gpm_nvlink_rx_bytes_s"),
        GPU_UTIL, SM, TENSOR)),
    Rule("gpu_pcie_copy", "gpu", gpu.rule_gpu_pcie_copy, (
        ("pcie_bytes_s", "nvml:pcie_rx_bytes_s/pcie_tx_bytes_s"), SM)),
    Rule("gpu_latency_low_occupancy", "gpu", gpu.rule_gpu_latency, (
        SM, DRAM, TENSOR, ("sm_occupancy", "nvml:gpm_sm_occupancy_pct"))),
    Rule("host_cpu_launch", "gpu", gpu.rule_host_cpu_launch, (
        SM, GPU_UTIL, DRAM, TENSOR, INFLIGHT, ("server_max_thread_cores", "proc:thread_cpu_s"),
        RUNQ, PSI_CPU), core=("gpu",)),
    Rule("input_starved", "host", host.rule_input_starved, (INFLIGHT,)),
    Rule("io_page_faults", "host", host.rule_io_page_faults, (
        ("major_faults_per_s", "proc:major_faults"), ("read_bytes_s", "proc:read_bytes"),
        ("disk_busy_frac", "disk:busy_ms"), ("psi_io_some", "cpu:psi_io_some_total_us"),
        ("iowait_frac", "cpu:iowait_s")), core=("gpu", "cpu")),
    Rule("waiting_on_peer", "gpu", gpu.rule_waiting_on_peer, (
        ("sm_active_cv", "nvml:gpm_sm_activity_pct"), ("gpu_util_max_min", "nvml:gpu_util_pct"),
        ("rdma_rail_max_min", "rdma:xmit_bytes/rcv_bytes"),
        ("rdma_rail_cv", "rdma:xmit_bytes/rcv_bytes"),
        ("straggler_rel_dev",
         "nvml:gpu_util_pct/gpm_sm_activity_pct/power_w (per GPU, per node)"))),
    Rule("cpu_compute", "cpu_server", host.rule_cpu_compute, (
        SERVER_CPU, N_CORES, HOST_BUSY,
        ("server_threads", "proc:num_threads (or thread_cpu_s devices)"), ALLOWED, ALLOWED_BY,
        WEIGHT, NICE),
        core=("cpu",)),
    Rule("cpu_contention", "host", host.rule_cpu_contention, (
        ("steal_frac", "cpu:steal_s"), HOST_BUSY, SERVER_CPU, N_CORES, RUNQ,
        ("ctx_involuntary_per_cpu_s", "proc:ctx_involuntary"), THROTTLED, QUOTA_USED,
        ("path_cpu_cores", "path:cpu_user_s/cpu_system_s (the proxies on the way)"),
        ("allowed_cpus_other_cores",
         "cpu:busy_s (the server's allowed CPUs) - proc:cpu_user_s/cpu_system_s"),
        ALLOWED, ALLOWED_BY, OTHERS, STARTS, WEIGHT, NICE, OTHER_WEIGHTS),
        core=("cpu",)),
    Rule("cpu_limited", "host", host.rule_cpu_limited, (
        THROTTLED, QUOTA_USED, RUNNABLE, ALLOWED, ALLOWED_BY, N_CORES, WEIGHT, NICE, ENGINES)),
    Rule("memory_pressure", "host", host.rule_memory_pressure, (
        ("cgroup_mem_events",
         "mem:cgroup_mem_max_events+cgroup_mem_oom_kills (the server's cgroup)"),
        ("psi_mem_some", "cpu:psi_memory_some_total_us"),
        ("mem_available_frac", "mem:mem_available_bytes/mem_total_bytes (and cgroup_mem_*)")),
        core=("gpu", "cpu")),
    Rule("network", "host", host.rule_network, (
        ("net_util", "net:rx_bytes/tx_bytes/link_speed_mbps (or profile telemetry.link_caps)"),
        ("net_wire_busy",
         "net:rx_bytes+tx_bytes/link_speed_mbps (or profile telemetry.link_caps)"),
        ("rdma_error_events", "rdma:symbol_error/port_rcv_errors/... (error counters)"),
        ("rdma_congestion_per_s", "rdma:np_cnp_sent/rp_cnp_handled/port_xmit_wait/..."),
        ("socket_fallback_bytes_s", "net:rx_bytes/tx_bytes (beside rdma:xmit_bytes/rcv_bytes)"))),
    Rule("server_stalled", "host", host.rule_server_stalled, (
        ("server_stalled_frac",
         "runstate:frozen/state_T/run_s/wait_s over the ledger's queue, prefill, decode "
         "and tail"),
        ("server_stalled_window_frac", "runstate:frozen/state_T/run_s/wait_s"),
        ("server_stalled_inflight_frac",
         "runstate:frozen/state_T/run_s/wait_s while requests were in flight "
         "(requests: dispatched..done)"),
        ("server_frozen_frac", "runstate:frozen (the window's samples)"),
        ("server_stopped_frac", "runstate:state_T/threads (the window's samples)"),
        ("server_threads", "proc:num_threads (or thread_cpu_s devices)"))),
    Rule("queueing", "serving", serving.rule_queueing, (
        WAITING,
        ("server_queue_frac",
         "requests: the ledger's server queue in TTFT (engine histograms, or the waiting "
         "count by Little's law; else TTFT outside prefill)"),
        ("engine_queue_frac", "prom:queue_time_seconds_sum/ttft_seconds_sum"))),
    Rule("kv_cache_capacity", "serving", serving.rule_kv_cache, (
        ("kv_usage_max", "prom:kv_cache_usage"),
        ("preemptions", "prom:preemptions_total/retracted_requests_total"))),
    Rule("prefill_decode_interference", "serving", serving.rule_interference, (
        ("prefill_stall_frac", STALLS), ("prefill_stall_share", STALLS),
        ("ab_prefill_stall_ratio", "requests: this arm's stalls against its A/B control's"),
        ("ab_tail_pace_rise", "requests: TPOT p95 against the A/B control's repetitions"),
        ("injected_pace_factor",
         "requests: decode pace inside the injected prefill against outside"))),
    Rule("outside_server", "serving", serving.rule_outside_server, (
        ("outside_server_frac",
         "requests: the ledger's time before the server in TTFT (TTFT - send - queue - "
         "prefill)"),
        ("before_server_ms", "requests: the same, the median request's ms"), WAITING,
        ("delivery_frac",
         "requests: the ledger's delivery in the case's metric (token events against the "
         "server's own token clock: EngineClocks.token_ms)"),
        ("delivery_clumped_frac",
         "requests: the ledger's delivery in the case's metric inferred from clumped reads "
         "while runstate shows the server running (no server token clock: weaker)"))),
    Rule("client_bound", "serving", serving.rule_client_bound, (
        ("client_bound", "cases.jsonl: client_bound (load generator self-check)"),)),
    Rule("unexplained", "serving", serving.rule_unexplained, (
        ("ledger_residual_frac",
         "requests: the ledger's residual in the case's metric (token events, server "
         "timings, runstate)"),), core=("gpu", "cpu")),
    Rule("throttling", "modifier", gpu.rule_throttling, (
        ("throttle_frac", "nvml:violation_power_ns/violation_thermal_ns/throttle_reasons"),
        ("sm_clock_low_frac", "nvml:sm_clock_mhz/sm_clock_max_mhz"), SM, GPU_UTIL)),
)

#: Signals the report shows that no rule reads, with their sources.
REPORTED_SIGNALS: tuple[tuple[str, str], ...] = (
    ("prefix_cache_hit_frac", "prom:prefix_cache_hits_total/prefix_cache_queries_total"),
    ("chunk_gap_p99_p50", "requests: chunk gaps"),
    ("path_runq_delay_per_cpu_s", "path:runqueue_delay_ns (the proxies on the way)"),
    ("server_run_cores", "runstate:run_s"),
)


def _sources() -> dict[str, str]:
    out: dict[str, str] = {}
    for name, src in [p for r in RULES for p in r.signals] + list(REPORTED_SIGNALS):
        if out.setdefault(name, src) != src:
            raise ValueError(f"signal {name!r} has two sources: {out[name]!r}, {src!r}")
    return out


def _group(*groups: str) -> tuple[Rule, ...]:
    return tuple(r for r in RULES if r.group in groups)


#: Every class the rules can name, in the order used to break score ties.
#: (``headroom`` is none: spare capacity is a modifier beside the first class, issue 30)
CLASSES: tuple[str, ...] = tuple(r.cls for r in RULES)
MODIFIERS: tuple[str, ...] = tuple(r.cls for r in _group("modifier"))
#: Classes that describe a symptom of load rather than a resource; they accompany
#: a resource class and never make a window "contradictory" on their own.
SERVING: tuple[str, ...] = tuple(r.cls for r in _group("serving"))
#: Which collector and metric each signal comes from (for "missing" messages).
SIGNAL_SOURCES: dict[str, str] = _sources()

GPU_RULES = tuple(r.fn for r in _group("gpu", "modifier"))
HOST_RULES = tuple(r.fn for r in _group("host"))
CPU_SERVER_RULES = tuple(r.fn for r in _group("cpu_server"))
SERVING_RULES = tuple(r.fn for r in _group("serving"))
#: Rules that must be assessable before a window with nothing past threshold is clear.
CORE_GPU = tuple(r.cls for r in RULES if "gpu" in r.core)
CORE_CPU = tuple(r.cls for r in RULES if "cpu" in r.core)

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
    "before_server_ms",
    "delivery_frac",
    "delivery_clumped_frac",
    "ledger_residual_frac",
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

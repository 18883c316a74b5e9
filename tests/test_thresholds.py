"""Every rule at each of its thresholds: a small step under and over, generated from the
one table (``analysis/thresholds.py``).

Windows built far from every threshold let a changed comparison, a swapped threshold or
a wrong scale pass unnoticed. Here each case puts one signal at ``value * (1 -+ STEP)``
of its row, everything else where ``tests/test_attribution.py``'s clean windows keep it,
and checks the class flips exactly there. A threshold row that no case covers must be
listed in ``NOT_A_RULE_BOUNDARY`` with where it is tested instead, so a new number
cannot join the table untested. ``PINNED`` holds the values as documented: a change to
a number is then a deliberate edit of the table, its source and this file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from strata_plugin.analysis.rules import Verdict, WindowSignals, classify
from strata_plugin.analysis.thresholds import THRESHOLDS, value
from tests.test_attribution import CPU_CLEAN, GPU_2NODE, GPU_CLEAN

STEP = 0.02  # 2% of the threshold each side


@dataclass(frozen=True)
class Boundary:
    threshold: str
    cls: str
    base: WindowSignals
    #: the window's changes for a value of the threshold's quantity
    at: Callable[[float], dict]
    op: str = ">="  # fires at or above (">="), above (">"), or below ("<")
    absolute_step: float | None = None  # counts: a whole step, not a fraction
    evidence: bool = True  # the rule records this comparison as evidence


def one(signal: str, **fixed) -> Callable[[float], dict]:
    return lambda x: {signal: x, **fixed}


GPU_BUSY = dict(gpu_util=0.99, dram_active=0.3, sm_occupancy=0.3)
ALLOWED_1 = dict(server_allowed_cpus=1.0, server_allowance_by="cpuset 0 (1 CPU)")
ALLOWED_2 = dict(server_allowed_cpus=2.0, server_allowance_by="affinity 0-1 (2 CPUs)")
CROWDED = dict(host_busy_cores=6.0, server_cpu_cores=1.0, runq_delay_per_cpu_s=0.6,
               ctx_involuntary_per_cpu_s=300.0)

CASES: tuple[Boundary, ...] = (
    # host: CPU
    Boundary("steal_frac", "cpu_contention", CPU_CLEAN, one("steal_frac")),
    Boundary("cgroup_throttled_frac", "cpu_limited", CPU_CLEAN, one("cgroup_throttled_frac")),
    # a crowded host is not contention for a server that used all its own quota: its waits
    # are the throttling's (its corroboration of cpu_limited: a test below)
    Boundary("cgroup_quota_used", "cpu_contention", CPU_CLEAN,
             lambda x: {**CROWDED, "cgroup_throttled_frac": 0.9, "cgroup_quota_used": x},
             op="<", evidence=False),
    Boundary("other_cpu_frac", "cpu_contention", CPU_CLEAN,
             lambda x: {**CROWDED, "host_busy_cores": 1.0 + x * 8}),
    Boundary("runq_delay_per_cpu_s", "cpu_contention", CPU_CLEAN,
             lambda x: {**CROWDED, "runq_delay_per_cpu_s": x, "ctx_involuntary_per_cpu_s": 3.0}),
    Boundary("involuntary_ctx_per_cpu_s", "cpu_contention", CPU_CLEAN,
             lambda x: {**CROWDED, "ctx_involuntary_per_cpu_s": x, "runq_delay_per_cpu_s": 0.01}),
    Boundary("server_cores_of_threads", "cpu_compute", CPU_CLEAN,
             lambda x: {"server_cpu_cores": x * 8, "host_busy_cores": x * 8 + 0.1}),
    # the server's CPU allowance (issue 30): measured against its 2 allowed CPUs, not the
    # host's 8 cores; other processes on its one allowed CPU, however idle the host
    Boundary("server_cores_of_threads", "cpu_compute", CPU_CLEAN,
             lambda x: {**ALLOWED_2, "server_cpu_cores": x * 2, "host_busy_cores": x * 2 + 0.1}),
    Boundary("other_cpu_frac", "cpu_contention", CPU_CLEAN,
             lambda x: {**CROWDED, **ALLOWED_1, "host_busy_cores": 1.2,
                        "allowed_cpus_other_cores": x}),
    Boundary("runnable_excess_threads", "cpu_limited", CPU_CLEAN,
             lambda x: {**ALLOWED_1, "server_runnable_cores": 1.0 + x}),
    Boundary("cores_busy_frac", "cpu_compute", CPU_CLEAN,
             lambda x: {"host_busy_cores": x * 8, "server_cpu_cores": 4.0}),
    Boundary("cpu_compute_server_share", "cpu_compute", CPU_CLEAN,
             lambda x: {"host_busy_cores": 7.5, "server_cpu_cores": x * 7.5}),
    # host: I/O, memory, network
    Boundary("major_faults_per_s", "io_page_faults", CPU_CLEAN, one("major_faults_per_s")),
    Boundary("read_bytes_s", "io_page_faults", CPU_CLEAN, one("read_bytes_s")),
    Boundary("disk_busy_frac", "io_page_faults", CPU_CLEAN,
             one("disk_busy_frac", major_faults_per_s=None, read_bytes_s=None)),
    Boundary("mem_available_frac_min", "memory_pressure", CPU_CLEAN,
             one("mem_available_frac"), op="<"),
    Boundary("psi_some_frac", "memory_pressure", CPU_CLEAN, one("psi_mem_some")),
    Boundary("cgroup_mem_events", "memory_pressure", CPU_CLEAN, one("cgroup_mem_events"),
             absolute_step=1.0),
    Boundary("net_link_frac", "network", CPU_CLEAN, one("net_util")),
    Boundary("net_wire_busy", "network", CPU_CLEAN, one("net_wire_busy")),
    Boundary("rail_error_events", "network", CPU_CLEAN, one("rdma_error_events"),
             absolute_step=1.0),
    Boundary("rail_congestion_per_s", "network", CPU_CLEAN, one("rdma_congestion_per_s")),
    Boundary("socket_fallback_bytes_s", "network", CPU_CLEAN, one("socket_fallback_bytes_s")),
    # serving
    Boundary("inflight_frac_min", "input_starved", CPU_CLEAN, one("inflight_frac"), op="<"),
    Boundary("waiting_requests_mean", "queueing", CPU_CLEAN, one("waiting_mean")),
    Boundary("server_queue_frac", "queueing", CPU_CLEAN,
             one("server_queue_frac", waiting_mean=None)),
    Boundary("outside_server_frac", "outside_server", CPU_CLEAN,
             one("outside_server_frac", before_server_ms=300.0)),
    # the same time in ms: a short TTFT's share is the server's own front end
    Boundary("outside_server_min_ms", "outside_server", CPU_CLEAN,
             one("before_server_ms", outside_server_frac=0.6)),
    # delivery (analysis/delivery.py): against the server's token clock, and from
    # clumping alone (the same threshold, a weaker margin)
    Boundary("delivery_frac", "outside_server", CPU_CLEAN, one("delivery_frac")),
    Boundary("delivery_frac", "outside_server", CPU_CLEAN, one("delivery_clumped_frac")),
    # the time ledger (analysis/ledger.py)
    Boundary("server_stalled_frac", "server_stalled", CPU_CLEAN, one("server_stalled_frac")),
    # the window with requests in flight, however little of the metric shows the stalls
    Boundary("server_stalled_window_lead", "server_stalled", CPU_CLEAN,
             one("server_stalled_inflight_frac", server_stalled_frac=0.02)),
    Boundary("ledger_residual_max", "unexplained", CPU_CLEAN, one("ledger_residual_frac")),
    Boundary("kv_usage_high", "kv_cache_capacity", CPU_CLEAN, one("kv_usage_max")),
    Boundary("preemptions_max", "kv_cache_capacity", CPU_CLEAN, one("preemptions"),
             op=">", absolute_step=1.0),
    Boundary("prefill_stall_frac", "prefill_decode_interference", CPU_CLEAN,
             one("prefill_stall_frac", prefill_stall_share=0.9)),
    Boundary("prefill_stall_share", "prefill_decode_interference", CPU_CLEAN,
             one("prefill_stall_share", prefill_stall_frac=0.4)),
    # an A/B treatment, judged against its control
    Boundary("ab_prefill_stall_ratio", "prefill_decode_interference", CPU_CLEAN,
             one("ab_prefill_stall_ratio", prefill_stall_frac=0.4, prefill_stall_share=0.9,
                 ab_tail_pace_rise=1.0)),
    Boundary("ab_tail_pace_rise", "prefill_decode_interference", CPU_CLEAN,
             one("ab_tail_pace_rise", prefill_stall_frac=0.4, prefill_stall_share=0.9,
                 ab_prefill_stall_ratio=5.0)),
    Boundary("injected_pace_factor", "prefill_decode_interference", CPU_CLEAN,
             one("injected_pace_factor", prefill_stall_frac=0.4, prefill_stall_share=0.9,
                 ab_prefill_stall_ratio=1.0, ab_tail_pace_rise=0.0)),
    # GPU busy: which kind
    Boundary("sm_active_compute", "gpu_compute", GPU_CLEAN,
             one("sm_active", tensor_active=0.75, **GPU_BUSY)),
    Boundary("tensor_active_compute", "gpu_compute", GPU_CLEAN,
             one("tensor_active", sm_active=0.7, **GPU_BUSY)),
    Boundary("sm_active_high", "gpu_compute", GPU_CLEAN,
             one("sm_active", tensor_active=0.1, **GPU_BUSY)),
    Boundary("dram_active_bound", "gpu_memory_bandwidth", GPU_CLEAN,
             lambda x: {**GPU_BUSY, "sm_active": 0.7, "tensor_active": 0.2, "dram_active": x}),
    Boundary("sm_active_busy", "gpu_latency_low_occupancy", GPU_CLEAN,
             one("sm_active", dram_active=0.2, tensor_active=0.1, sm_occupancy=0.1)),
    Boundary("dram_active_low", "gpu_latency_low_occupancy", GPU_CLEAN,
             one("dram_active", sm_active=0.6, tensor_active=0.1, sm_occupancy=0.1), op="<"),
    Boundary("tensor_active_low", "gpu_latency_low_occupancy", GPU_CLEAN,
             one("tensor_active", sm_active=0.6, dram_active=0.2, sm_occupancy=0.1), op="<"),
    Boundary("occupancy_low", "gpu_latency_low_occupancy", GPU_CLEAN,
             one("sm_occupancy", sm_active=0.6, dram_active=0.2, tensor_active=0.1), op="<"),
    Boundary("rdma_link_frac", "gpu_communication", GPU_2NODE,
             one("rdma_util", gpu_util=0.95, sm_active=0.3, tensor_active=0.05)),
    Boundary("nvlink_bytes_s", "gpu_communication", GPU_CLEAN, one("nvlink_bytes_s")),
    Boundary("pcie_link_frac", "gpu_pcie_copy", GPU_CLEAN,
             lambda x: {"pcie_bytes_s": x * value("pcie_bytes_s_cap")}),
    Boundary("pcie_active_bytes_s", "gpu_pcie_copy", GPU_CLEAN,
             one("pcie_bytes_s", sm_active=0.2)),
    Boundary("pcie_sm_max", "gpu_pcie_copy", GPU_CLEAN, one("sm_active", pcie_bytes_s=2e9),
             op="<"),
    Boundary("thread_core_saturated", "host_cpu_launch", GPU_CLEAN,
             one("server_max_thread_cores")),
    # GPU: peers and throttling
    Boundary("imbalance_cv", "waiting_on_peer", GPU_CLEAN, one("sm_active_cv")),
    Boundary("imbalance_max_min", "waiting_on_peer", GPU_CLEAN, one("gpu_util_max_min")),
    Boundary("straggler_rel_dev", "waiting_on_peer", GPU_CLEAN, one("straggler_rel_dev")),
    Boundary("throttle_frac", "throttling", GPU_CLEAN, one("throttle_frac")),
    Boundary("sm_clock_low_frac", "throttling", GPU_CLEAN,
             one("sm_clock_low_frac", sm_active=0.6, dram_active=0.45, tensor_active=0.1)),
    # "is the GPU busy?" by NVML utilization where SM activity is not measured
    Boundary("gpu_util_busy", "throttling", GPU_CLEAN,
             one("gpu_util", sm_active=None, sm_clock_low_frac=0.5), evidence=False),
)

#: Rows no classifier boundary covers, and where they are tested instead.
NOT_A_RULE_BOUNDARY = {
    "ab_max_repetitions": "the bound on an A/B expectation's added repetitions, never a class "
    "(test_ab_expectation.py: decided at the bound, and one past it)",
    # the verdict's confidences and its ledger-led first class (issue 30)
    "confidence_at_threshold": "test_verdict_ledger.py: the confidence at a tie and a "
    "full lead; test_attribution.py, each class alone",
    "confidence_span": "test_verdict_ledger.py: the confidence at a tie and a full lead",
    "confidence_agreement": "test_verdict_ledger.py: the first cause's rule past threshold",
    "confidence_conflict_max": "test_attribution.py, the ambiguous pairs; verdicts.txt",
    "confidence_disagreeing_samples": "test_proc_and_cpu_samples_that_disagree_make_the_"
    "verdict_inconclusive; verdicts.txt",
    "confidence_floor": "verdicts.txt (every collector missing)",
    "ledger_cause_lead": "test_verdict_ledger.py: the first class just ahead of the next",
    "ledger_second_min_share": "test_verdict_ledger.py: a measured class just under and "
    "at it beside the first",
    "rule_min_samples": "test_verdict_ledger.py: two samples said, three not",
    "engine_outage_margin_s": "the failed requests tied to an engine's death, never a "
    "class (test_engine_lifetime.py, just inside and just outside the margin)",
    "engine_conn_match_s": "which engine served each request, never a class "
    "(test_router_replicas.py, just inside and just outside the margin at either end)",
    "engine_pace_ratio": "the Engines section's imbalance finding, never a class "
    "(test_router_replicas.py, just below and just above the ratio)",
    "engine_pace_min_requests": "the Engines section's imbalance finding, never a class "
    "(test_router_replicas.py, one request fewer and at the count)",
    "roof_near_frac": "the roofline's evidence and note, never a class "
    "(test_roofline.py, just below and at the share)",
    "roof_far_frac": "the roofline's note, never a class (test_roofline.py, just below "
    "and at the share)",
    "requests_failed_share": "analysis/failures.py, before the rules "
    "(test_failures_first.py, just below and at the share)",
    "pcie_bytes_s_cap": "the scale of pcie_link_frac (its case uses it)",
    "comm_sm_max": "no effect on a verdict today: gpu_communication also fires for "
    "sm_active < sm_active_busy, the same 0.5 (an equivalent mutant; docs/validation.md)",
    "comm_tensor_max": "no effect on a verdict today, as comm_sm_max",
    "gpu_idle_util_pct": "a timeline window fraction (test_timeline.py), not a rule input",
    "sm_clock_ratio_min": "a timeline window fraction (test_timeline.py), not a rule input",
    "rail_active_bytes_s": "rails.py's imbalance filter (test_rails.py)",
    "net_drop_events": "a rails finding, not a classifier input (test_rails.py)",
    "iowait_frac": "corroboration: raises io_page_faults' score, never fires it alone",
    "client_bound": "a boolean (test_attribution.py, the client_bound cases)",
    "client_lateness_p99_ms": "the load generator's self-check (test_loadgen_selfcheck.py)",
    "client_handling_lag_p99_ms": "the load generator's self-check (test_loadgen_selfcheck.py)",
    "client_cpu_cores": "the load generator's self-check (test_loadgen_selfcheck.py)",
    "client_delay_share": "the load generator's self-check (test_loadgen_selfcheck.py)",
    "ledger_stall_factor": "analysis/ledger.py's stall yardstick (test_ledger.py, the "
    "gaps just under and over it)",
    "ledger_clock_error_ms": "the ledger's stated clock error (test_ledger.py)",
    "delivery_gap_min_ms": "analysis/delivery.py's per-gap floor (test_delivery.py, just "
    "under and over it)",
    "delivery_burst_events": "analysis/delivery.py's clumped read (test_delivery.py, one "
    "event under and at it)",
    "delivery_running_frac": "analysis/delivery.py's run-state gate (test_delivery.py, just "
    "under and at it)",
    "delivery_server_held_frac": "analysis/delivery.py's held-sender gate "
    "(test_delivery.py, just under and at it)",
    "chunk_gaps_min": "signals.build_signals (test_chunk_gap_ratio_needs_enough_gaps below)",
    "chunk_gap_p99_p50": "reported with the case's signals; the interference rule reads the "
    "prefill stalls instead (test_interference.py)",
    "client_timing_error_ms": "the load generator's self-check (test_loadgen_selfcheck.py)",
    "client_read_backlog_bytes": "the load generator's self-check (test_loadgen_selfcheck.py)",
    "trace_other_share": "the scheduling trace's settling (test_trace_readers.py)",
    "trace_rtt_p50_ms": "the socket trace's settling (test_trace_readers.py)",
    "trace_retrans_per_s": "the socket trace's settling (test_trace_readers.py)",
    "cpu_samples_disagree_factor": "the contradiction check (test below)",
    "cpu_samples_disagree_slack_cores": "the contradiction check (test below)",
    "full_margin": "scores (test_scores_reach_one_at_the_full_margin below)",
    "dominance_margin": "ambiguous pairs (test_attribution.py, ambiguity cases)",
    "missing_penalty": "confidence (test_attribution.py, missing-signal cases)",
}

#: The table's values as documented; see the module docstring.
PINNED = {
    "sm_active_busy": 0.5, "sm_active_high": 0.8, "gpu_util_busy": 0.8,
    "gpu_idle_util_pct": 10.0, "sm_active_compute": 0.6, "tensor_active_compute": 0.5,
    "dram_active_bound": 0.5, "dram_active_low": 0.4, "tensor_active_low": 0.3,
    "occupancy_low": 0.25, "comm_sm_max": 0.5, "comm_tensor_max": 0.2,
    "rdma_link_frac": 0.5, "nvlink_bytes_s": 1e11, "pcie_bytes_s_cap": 55e9,
    "pcie_link_frac": 0.5, "pcie_active_bytes_s": 1e9, "pcie_sm_max": 0.3,
    "throttle_frac": 0.05, "sm_clock_ratio_min": 0.9, "sm_clock_low_frac": 0.2,
    "imbalance_cv": 0.15, "imbalance_max_min": 1.2, "straggler_rel_dev": 0.15,
    "rail_active_bytes_s": 1e6, "rail_error_events": 1.0, "rail_congestion_per_s": 100.0,
    "socket_fallback_bytes_s": 10e6, "thread_core_saturated": 0.9,
    "runq_delay_per_cpu_s": 0.1, "psi_some_frac": 0.10, "cores_busy_frac": 0.9,
    "server_cores_of_threads": 0.85, "cpu_compute_server_share": 0.5,
    "other_cpu_frac": 0.25, "involuntary_ctx_per_cpu_s": 50.0, "steal_frac": 0.05,
    "cgroup_throttled_frac": 0.05, "cgroup_quota_used": 0.8, "cgroup_mem_events": 1.0,
    "runnable_excess_threads": 0.5,
    "cpu_samples_disagree_factor": 1.1,
    "cpu_samples_disagree_slack_cores": 0.5, "major_faults_per_s": 20.0,
    "read_bytes_s": 4e6, "disk_busy_frac": 0.5, "iowait_frac": 0.10,
    "mem_available_frac_min": 0.10, "net_link_frac": 0.7, "net_wire_busy": 1.0,
    "net_drop_events": 1.0, "waiting_requests_mean": 0.5, "server_queue_frac": 0.5,
    "outside_server_frac": 0.1, "outside_server_min_ms": 20.0,
    "server_stalled_frac": 0.1, "server_stalled_window_lead": 0.2, "ledger_residual_max": 0.1,
    "ledger_stall_factor": 3.0, "ledger_clock_error_ms": 1.0,
    "delivery_gap_min_ms": 5.0, "delivery_frac": 0.1, "delivery_burst_events": 3.0,
    "delivery_running_frac": 0.5, "delivery_server_held_frac": 0.8,
    "kv_usage_high": 0.95, "preemptions_max": 0.0,
    "chunk_gap_p99_p50": 3.0, "chunk_gaps_min": 20.0, "inflight_frac_min": 0.8,
    "client_bound": 1.0, "client_lateness_p99_ms": 5.0, "client_handling_lag_p99_ms": 5.0,
    "client_cpu_cores": 0.85, "client_delay_share": 0.05, "full_margin": 0.25,
    "dominance_margin": 0.5, "missing_penalty": 0.85,
    "prefill_stall_frac": 0.1, "prefill_stall_share": 0.5, "ab_prefill_stall_ratio": 2.0,
    "ab_tail_pace_rise": 0.2, "injected_pace_factor": 1.0, "client_timing_error_ms": 5.0,
    "client_read_backlog_bytes": 65536.0, "trace_other_share": 0.5, "trace_rtt_p50_ms": 5.0,
    "trace_retrans_per_s": 1.0, "requests_failed_share": 0.5,
    "engine_outage_margin_s": 0.5,
    "engine_conn_match_s": 0.05,
    "engine_pace_ratio": 2.0, "engine_pace_min_requests": 3,
    "roof_near_frac": 0.8, "roof_far_frac": 0.6, "ab_max_repetitions": 6,
}


PINNED.update({
    "confidence_at_threshold": 0.5, "confidence_span": 0.4, "confidence_agreement": 0.1,
    "confidence_conflict_max": 0.4, "confidence_disagreeing_samples": 0.2,
    "confidence_floor": 0.1, "ledger_cause_lead": 1.0, "ledger_second_min_share": 0.1,
    "rule_min_samples": 3.0,
})


def named(v: Verdict) -> set[str]:
    return {*v.classes, *v.also_flagged, *v.modifiers}


def _values(b: Boundary) -> tuple[float, float]:
    """(just short of firing, just past it) for the boundary's comparison: the threshold
    itself is on the side its operator puts it, so ">=" vs ">" and "<" vs "<=" differ."""
    t = value(b.threshold)
    step = b.absolute_step if b.absolute_step is not None else abs(t) * STEP
    if b.op == "<":
        return t, t - step  # "<": the threshold itself does not fire
    if b.op == ">":
        return t, t + step
    return t - step, t  # ">=": the threshold itself fires


@pytest.mark.parametrize("b", CASES, ids=[f"{b.threshold}-{b.cls}" for b in CASES])
def test_the_rule_flips_at_its_threshold(b: Boundary) -> None:
    short, past = _values(b)
    quiet = classify(dataclasses.replace(b.base, **b.at(short)))
    fired = classify(dataclasses.replace(b.base, **b.at(past)))
    assert b.cls not in named(quiet), (b.threshold, short, quiet)
    assert b.cls in named(fired), (b.threshold, past, fired)
    if b.evidence:
        ev = [e for e in fired.evidence if e.cls == b.cls and e.threshold == b.threshold]
        assert ev and any(e.met for e in ev), fired.evidence


def test_every_threshold_is_covered_or_says_where_it_is_tested() -> None:
    covered = {b.threshold for b in CASES}
    names = {t.name for t in THRESHOLDS}
    assert names == covered | set(NOT_A_RULE_BOUNDARY), (
        sorted(names - covered - set(NOT_A_RULE_BOUNDARY)),
        sorted((covered | set(NOT_A_RULE_BOUNDARY)) - names),
    )
    assert not covered & set(NOT_A_RULE_BOUNDARY)


def test_the_table_holds_the_documented_values() -> None:
    assert {t.name: t.value for t in THRESHOLDS} == PINNED


def disagreement_edge(host_busy_cores: float) -> float:
    """The most server CPU that the host's busy cores can explain (more: samples disagree)."""
    return (value("cpu_samples_disagree_factor") * host_busy_cores
            + value("cpu_samples_disagree_slack_cores"))


def test_proc_and_cpu_samples_that_disagree_make_the_verdict_inconclusive() -> None:
    host = 4.0
    edge = disagreement_edge(host)
    ok = classify(dataclasses.replace(CPU_CLEAN, host_busy_cores=host,
                                      server_cpu_cores=edge - 0.05))
    bad = classify(dataclasses.replace(CPU_CLEAN, host_busy_cores=host,
                                       server_cpu_cores=edge + 0.05))
    assert not any("disagree" in n for n in ok.notes), ok
    assert bad.inconclusive and any("disagree" in n for n in bad.notes), bad


def test_scores_reach_one_at_the_full_margin() -> None:
    from strata_plugin.analysis.rules import margin as _margin

    t, full = 2.0, value("full_margin")
    assert _margin(t * (1 + full), t, ">=") == 1.0
    assert _margin(t * (1 + full * 0.9), t, ">=") == pytest.approx(0.9)
    assert _margin(t * (1 - full), t, "<") == 1.0


def test_chunk_gap_ratio_needs_enough_gaps() -> None:
    from strata_plugin.analysis.signals import RequestFacts, build_signals

    def ratio(n: int) -> float | None:
        facts = RequestFacts(intervals_wall=((0, 10**9),), chunk_gap_p50=10.0,
                             chunk_gap_p99=50.0, n_chunk_gaps=n, tpot_p50=10.0,
                             server_queue_frac=None, concurrency=2, client_bound=False,
                             client_lateness_p99_ms=None, client_cpu_fraction=None)
        return build_signals(window="w", duration_s=1.0, start_ns=0, end_ns=10**9, hw=[],
                             requests=facts, gpu_present=False, gpu_expected=False,
                             multi_node=False, unavailable=()).chunk_gap_p99_p50

    n = int(value("chunk_gaps_min"))
    assert ratio(n - 1) is None
    assert ratio(n) == pytest.approx(5.0)


def test_quota_use_corroborates_cpu_limited() -> None:
    """Quota use just under / at its row: the evidence flips and the score rises, but the
    throttled periods alone decide whether the class fires."""
    t = value("cgroup_quota_used")
    throttled = value("cgroup_throttled_frac") * 2

    def verdict(used: float | None, frac: float = throttled) -> Verdict:
        return classify(dataclasses.replace(CPU_CLEAN, cgroup_throttled_frac=frac,
                                            cgroup_quota_used=used))

    def ev(v: Verdict):
        (e,) = [e for e in v.evidence if e.threshold == "cgroup_quota_used"]
        return e

    under, at = verdict(t * (1 - STEP)), verdict(t)
    assert "cpu_limited" in under.classes and "cpu_limited" in at.classes
    assert not ev(under).met and ev(at).met
    assert at.confidence > under.confidence
    # used to the full without throttled periods is a server at its quota, not limited
    assert "cpu_limited" not in named(verdict(1.0, frac=value("cgroup_throttled_frac") / 2))


def test_cpu_limited_is_not_cpu_contention() -> None:
    """A throttled server on an idle host is limited by its own cgroup: nobody else is
    taking the cores; a crowded host without a quota is contention, not a limit."""
    limited = classify(dataclasses.replace(CPU_CLEAN, cgroup_throttled_frac=0.9,
                                           cgroup_quota_used=0.98, server_cpu_cores=0.5,
                                           host_busy_cores=0.7))
    assert limited.classes[0] == "cpu_limited" and "cpu_contention" not in named(limited)
    assert any(e.threshold == "cgroup_throttled_frac" and e.met for e in limited.evidence)
    crowded = classify(dataclasses.replace(CPU_CLEAN, **CROWDED))
    assert "cpu_contention" in crowded.classes and "cpu_limited" not in named(crowded)
    unread = classify(dataclasses.replace(CPU_CLEAN, cgroup_throttled_frac=None))
    assert "cgroup_throttled_frac" in " ".join(unread.missing_signals)


def test_a_busy_disk_is_not_the_servers_when_its_own_reads_are_quiet() -> None:
    """Another process's I/O fills the device: with the server's major faults and reads
    measured and under their rows, a busy disk alone names nothing; with them past, it
    adds to the score."""
    busy = dict(disk_busy_frac=0.9, psi_io_some=0.4, iowait_frac=0.2)
    quiet = classify(dataclasses.replace(CPU_CLEAN, **busy))
    assert "io_page_faults" not in named(quiet), quiet
    reads = classify(dataclasses.replace(CPU_CLEAN, read_bytes_s=value("read_bytes_s"), **busy))
    assert "io_page_faults" in reads.classes
    assert any(e.threshold == "disk_busy_frac" and e.met for e in reads.evidence)


def test_cpu_rules_without_their_host_signals_say_what_would_settle_them() -> None:
    """Killed mutants (docs/validation.md, Mutation testing): an unmeasured signal makes a
    rule unassessable with its finer trace; steal still names contention without the
    host's core counts; a missing core count is missing, not a crash."""
    from strata_plugin.analysis.rules import TRACE_SCHED

    no_cgroup = classify(dataclasses.replace(CPU_CLEAN, cgroup_throttled_frac=None))
    assert no_cgroup.classes == () and not no_cgroup.inconclusive
    assert no_cgroup.finer_trace == (TRACE_SCHED,)
    no_host = classify(dataclasses.replace(CPU_CLEAN, host_busy_cores=None))
    assert no_host.inconclusive and no_host.finer_trace == (TRACE_SCHED,), no_host
    stolen = classify(dataclasses.replace(CPU_CLEAN, host_busy_cores=None, steal_frac=0.2))
    assert stolen.classes[0] == "cpu_contention", stolen
    no_cores = classify(dataclasses.replace(CPU_CLEAN, n_cores=None))
    assert any(m.startswith("n_cores") for m in no_cores.missing_signals), no_cores


def test_other_processes_are_counted_in_cores_of_a_small_host() -> None:
    """On a 2-core host a server alone, its threads waiting on each other, is not
    contention (no other process holds a core); on a 1-core host 0.4 of the core held by
    others is 40% of it, past the row."""
    alone = classify(dataclasses.replace(CPU_CLEAN, n_cores=2, host_busy_cores=1.0,
                                         server_cpu_cores=1.0, runq_delay_per_cpu_s=0.6,
                                         ctx_involuntary_per_cpu_s=300.0))
    assert "cpu_contention" not in named(alone), alone
    one_core = classify(dataclasses.replace(CPU_CLEAN, n_cores=1, server_threads=1,
                                            host_busy_cores=1.0, server_cpu_cores=0.6,
                                            runq_delay_per_cpu_s=0.6,
                                            ctx_involuntary_per_cpu_s=300.0))
    assert "cpu_contention" in named(one_core), one_core
    (ev,) = [e for e in one_core.evidence if e.threshold == "other_cpu_frac"]
    assert ev.metric == "other_processes_cores_frac" and ev.value == pytest.approx(0.4)


def test_a_server_throttled_at_exactly_the_row_and_at_its_quota_is_not_contention() -> None:
    at_row = classify(dataclasses.replace(CPU_CLEAN, **CROWDED,
                                          cgroup_throttled_frac=value("cgroup_throttled_frac"),
                                          cgroup_quota_used=0.95))
    assert "cpu_contention" not in named(at_row) and "cpu_limited" in at_row.classes, at_row
    # steal still names contention; the evidence says why the crowding did not count
    stolen = classify(dataclasses.replace(CPU_CLEAN, **CROWDED, steal_frac=0.2,
                                          cgroup_throttled_frac=0.5, cgroup_quota_used=0.95))
    (ev,) = [e for e in stolen.evidence if e.metric == "quota_used_not_binding"]
    assert ev.cls == "cpu_contention" and not ev.met, stolen.evidence


def test_contention_scores_from_its_own_margins() -> None:
    """Other processes exactly at their row (margin 0), both delay signals half-way to the
    full margin: score (0.5 + 0) / 2, confidence 0.5 + 0.4 x 0.25 + 0.1 (two rows met)."""
    full = value("full_margin")
    half = 1 + full / 2
    w = dataclasses.replace(
        CPU_CLEAN, host_busy_cores=1.0 + value("other_cpu_frac") * 8,
        runq_delay_per_cpu_s=value("runq_delay_per_cpu_s") * half,
        ctx_involuntary_per_cpu_s=value("involuntary_ctx_per_cpu_s") * half)
    v = classify(w)
    assert v.classes == ("cpu_contention",), v
    assert v.confidence == pytest.approx(0.7), v


def test_contention_needs_the_waits_only_where_others_hold_the_cores() -> None:
    no_waits = dict(runq_delay_per_cpu_s=None, ctx_involuntary_per_cpu_s=None)
    crowded = classify(dataclasses.replace(CPU_CLEAN, **{**CROWDED, **no_waits}))
    assert "cpu_contention" not in named(crowded)
    assert any(m.startswith("runq_delay_per_cpu_s") for m in crowded.missing_signals)
    quiet = classify(dataclasses.replace(CPU_CLEAN, **no_waits))
    assert not any(m.startswith("runq_delay_per_cpu_s") for m in quiet.missing_signals)


def test_memory_pressure_from_any_one_of_its_signals() -> None:
    from strata_plugin.analysis.rules import TRACE_MEM

    none = dict(psi_mem_some=None, mem_available_frac=None, cgroup_mem_events=None)
    for one_signal in (dict(psi_mem_some=0.3), dict(mem_available_frac=0.04),
                       dict(cgroup_mem_events=3.0)):
        v = classify(dataclasses.replace(CPU_CLEAN, **{**none, **one_signal}))
        assert v.classes == ("memory_pressure",), (one_signal, v)
        # each far past its row: scored as such (MemAvailable is a "below" margin)
        assert v.confidence >= 0.85, (one_signal, v)
    blind = classify(dataclasses.replace(CPU_CLEAN, **none))
    assert blind.inconclusive and blind.finer_trace == (TRACE_MEM,), blind
    missing = " ".join(blind.missing_signals)
    assert "psi_mem_some" in missing and "mem_available_frac" in missing


def test_each_class_past_threshold_is_ranked_once() -> None:
    """A resource class, then the strongest serving class, then the rest, each once."""
    v = classify(dataclasses.replace(CPU_CLEAN, mem_available_frac=0.04, waiting_mean=6.0,
                                     server_queue_frac=0.9, kv_usage_max=0.99,
                                     prefill_stall_frac=0.4, prefill_stall_share=0.9,
                                     concurrency=2))
    assert v.classes[0] == "memory_pressure" and len(v.classes) == 2, v
    assert len(v.past_threshold) == len(set(v.past_threshold)) == 4, v


def test_a_clear_windows_confidence_is_the_closest_comparisons_distance_from_firing() -> None:
    """A clear window's (nothing past threshold, no ledger) confidence is 0.5 + 0.4 x the
    closest not-met row's margin: a window 2% short of any threshold, above or below
    type, is barely clear. A count at its zero threshold (no preemptions) has no relative
    distance and does not pin it to 0.5."""
    def conf(**kw) -> float:
        v = classify(dataclasses.replace(CPU_CLEAN, **kw))
        assert v.classes == () and not v.inconclusive, v
        return v.confidence

    step = STEP / value("full_margin")  # a 2% distance, as a share of the full margin
    # CPU_CLEAN's closest row: inflight_frac 0.98 against "< 0.8", 22.5% over it
    assert conf() == pytest.approx(0.5 + 0.4 * (0.98 - 0.8) / 0.8 / value("full_margin"))
    assert conf(steal_frac=0.049) == pytest.approx(0.5 + 0.4 * step, abs=1e-3)
    assert conf(mem_available_frac=0.102) == pytest.approx(0.5 + 0.4 * step, abs=1e-3)
    assert conf(preemptions=0.0) == conf(preemptions=None) > 0.8

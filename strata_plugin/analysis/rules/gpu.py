"""The GPU rules: busy (compute, memory bandwidth, communication, PCIe copies, latency)
or waiting (host CPU / launch, a peer), and the throttling modifier."""

from __future__ import annotations

from strata_plugin.analysis.rules.outcome import Outcome, RuleCheck, signal_margin
from strata_plugin.analysis.rules.traces import TRACE_CUDA, TRACE_GPM, TRACE_NCCL, TRACE_SCHED
from strata_plugin.analysis.rules.window import WindowSignals
from strata_plugin.analysis.thresholds import value as _v


def _gpu_busy(s: WindowSignals) -> bool | None:
    """Level 1: SM activity when measured, else NVML utilization; None if neither."""
    if s.sm_active is not None:
        return s.sm_active >= _v("sm_active_busy")
    if s.gpu_util is not None:
        return s.gpu_util >= _v("gpu_util_busy")
    return None


def rule_gpu_compute(s: WindowSignals) -> Outcome:
    r = RuleCheck("gpu_compute", s)
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
            signal_margin(s, "sm_active", "sm_active_compute"),
            signal_margin(s, "tensor_active", "tensor_active_compute"),
        )
    sm_hi = (
        s.dram_active is not None
        and r.cmp("sm_active", ">=", "sm_active_high")
        and r.cmp("dram_active", "<", "dram_active_bound")
    )
    if sm_hi:
        return r.fire(signal_margin(s, "sm_active", "sm_active_high"))
    return r.o


def rule_gpu_memory_bandwidth(s: WindowSignals) -> Outcome:
    r = RuleCheck("gpu_memory_bandwidth", s)
    if not r.need("dram_active"):
        return r.unassessable(TRACE_GPM)
    if r.cmp("dram_active", ">=", "dram_active_bound"):
        if s.tensor_active is not None and not r.cmp("tensor_active", "<", "tensor_active_compute"):
            # Tensor pipes busy too: compute leads, DRAM is a second, balanced load.
            return r.fire(signal_margin(s, "dram_active", "dram_active_bound") / 2)
        return r.fire(signal_margin(s, "dram_active", "dram_active_bound"))
    return r.o


def rule_gpu_communication(s: WindowSignals) -> Outcome:
    r = RuleCheck("gpu_communication", s)
    if s.multi_node and not r.need("rdma_util"):
        return r.unassessable(TRACE_NCCL)
    link = s.rdma_util is not None and r.cmp("rdma_util", ">=", "rdma_link_frac")
    nvl = s.nvlink_bytes_s is not None and r.cmp("nvlink_bytes_s", ">=", "nvlink_bytes_s")
    if not r.need("gpu_util", "sm_active"):
        if link:
            return r.fire(signal_margin(s, "rdma_util", "rdma_link_frac"))
        return r.unassessable(TRACE_NCCL)
    busy_not_computing = (
        r.cmp("gpu_util", ">=", "gpu_util_busy")
        and r.cmp("sm_active", "<", "comm_sm_max")
        and (s.tensor_active is None or r.cmp("tensor_active", "<", "comm_tensor_max"))
    )
    if (link or nvl) and (busy_not_computing or (s.sm_active or 0) < _v("sm_active_busy")):
        m = (
            signal_margin(s, "rdma_util", "rdma_link_frac")
            if link
            else signal_margin(s, "nvlink_bytes_s", "nvlink_bytes_s")
        )
        return r.fire(m)
    return r.o


def rule_gpu_pcie_copy(s: WindowSignals) -> Outcome:
    r = RuleCheck("gpu_pcie_copy", s)
    if not r.need("pcie_bytes_s"):
        return r.unassessable(TRACE_CUDA)
    cap = _v("pcie_bytes_s_cap")
    if r.cmp("pcie_bytes_s", ">=", "pcie_link_frac", scale=cap):
        return r.fire(signal_margin(s, "pcie_bytes_s", "pcie_link_frac", scale=cap))
    if (
        s.sm_active is not None
        and r.cmp("pcie_bytes_s", ">=", "pcie_active_bytes_s")
        and r.cmp("sm_active", "<", "pcie_sm_max")
    ):
        return r.fire(signal_margin(s, "sm_active", "pcie_sm_max", "<"))
    return r.o


def rule_gpu_latency(s: WindowSignals) -> Outcome:
    r = RuleCheck("gpu_latency_low_occupancy", s)
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
                signal_margin(s, "dram_active", "dram_active_low", "<"),
                signal_margin(s, "tensor_active", "tensor_active_low", "<"),
            )
    return r.o


# --- the rules: GPU waiting --------------------------------------------------------------


def rule_host_cpu_launch(s: WindowSignals) -> Outcome:
    """GPU under-fed while work is in flight, and a host CPU signal says why.

    Under-fed: SM activity under 0.5, or SMs "active" but moving neither DRAM nor tensor
    work (tiny kernels between slow launches look like that too: hence the conflict
    with gpu_latency_low_occupancy, which only a CUDA timeline separates).
    """
    r = RuleCheck("host_cpu_launch", s)
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
        margins.append(signal_margin(s, "server_max_thread_cores", "thread_core_saturated"))
    if s.runq_delay_per_cpu_s is not None and r.cmp(
        "runq_delay_per_cpu_s", ">=", "runq_delay_per_cpu_s"
    ):
        margins.append(signal_margin(s, "runq_delay_per_cpu_s", "runq_delay_per_cpu_s"))
    if s.psi_cpu_some is not None and r.cmp("psi_cpu_some", ">=", "psi_some_frac"):
        margins.append(signal_margin(s, "psi_cpu_some", "psi_some_frac"))
    if not margins:
        return r.o
    if idle_pipes:
        underfed = (
            signal_margin(s, "dram_active", "dram_active_low", "<")
            + signal_margin(s, "tensor_active", "tensor_active_low", "<")
        ) / 2
    elif s.sm_active is not None:
        underfed = signal_margin(s, "sm_active", "sm_active_busy", "<")
    else:
        underfed = signal_margin(s, "gpu_util", "gpu_util_busy", "<")
    return r.fire(*margins, underfed)




def rule_waiting_on_peer(s: WindowSignals) -> Outcome:
    r = RuleCheck("waiting_on_peer", s)
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
            margins.append(signal_margin(s, signal, thr))
    return r.fire(*margins) if margins else r.o


def rule_throttling(s: WindowSignals) -> Outcome:
    r = RuleCheck("throttling", s)
    if s.throttle_frac is None and s.sm_clock_low_frac is None:
        r.need("throttle_frac")
        return r.unassessable("NVML clock-event reasons and violation counters")
    if s.throttle_frac is not None and r.cmp("throttle_frac", ">=", "throttle_frac"):
        return r.fire(signal_margin(s, "throttle_frac", "throttle_frac"))
    if (
        s.sm_clock_low_frac is not None
        and _gpu_busy(s)
        and r.cmp("sm_clock_low_frac", ">=", "sm_clock_low_frac")
    ):
        return r.fire(signal_margin(s, "sm_clock_low_frac", "sm_clock_low_frac"))
    return r.o



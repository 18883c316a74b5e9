"""The whole verdict of a fixed set of windows, compared with a reviewed golden file.

The boundary tests (``test_thresholds.py``) say *whether* a class fires; a user reads more
than that: the evidence rows with their labels, values, operators and thresholds, the
confidence, the summary line, what was missing and which finer trace would settle it. A
changed label, a dropped trace or a score computed from the wrong margin changes none of
the classes, so only a test of the whole output can notice it (mutation testing found
dozens such changes that every other test let through: docs/validation.md).

The windows: the clean bases of ``test_attribution.py``; each boundary case of
``test_thresholds.py`` just short of, just past and well past its threshold; windows
where two conditions meet; groups of signals lost together; and each base with one
measured signal taken away (what the verdict then says is missing and which trace it
asks for). ``tests/golden/verdicts.txt`` holds the expected text. After a deliberate
change to the rules, regenerate it with ``STRATA_REGEN_GOLDEN=1 pytest
tests/test_verdict_golden.py`` and review the diff like code: every changed line is a
changed verdict.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path

from strata_plugin.analysis.rules import Verdict, WindowSignals, classify
from tests.test_attribution import (
    CPU_CLEAN,
    GPU_2NODE,
    GPU_2NODE_RAILS,
    GPU_CLEAN,
    WEAK_CPU_PAIR,
)
from tests.test_thresholds import CASES, _values, disagreement_edge

GOLDEN = Path(__file__).parent / "golden" / "verdicts.txt"
BASES = {"CPU_CLEAN": CPU_CLEAN, "GPU_CLEAN": GPU_CLEAN, "GPU_2NODE": GPU_2NODE,
         "GPU_2NODE_RAILS": GPU_2NODE_RAILS}


def _f(x: object) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def _head(v: Verdict) -> list[str]:
    return [
        f"  verdict: {v.summary()} | inconclusive={v.inconclusive!r}"
        f" | confidence {v.confidence:.4f} {v.confidence_label}"
        f" | also {','.join(v.also_flagged) or '-'} | modifiers {','.join(v.modifiers) or '-'}",
        f"  missing: {', '.join(v.missing_signals) or '-'}",
        *([f"  lead: {v.lead}"] if v.lead else []),
        *([f"  spare: {v.spare} ({v.spare_cores})"] if v.spare else []),
        *(f"  trace: {t}" for t in v.finer_trace),
        *(f"  note: {n}" for n in v.notes),
    ]


def _rows(v: Verdict) -> list[str]:
    return [
        f"  ev {e.cls}: {e.metric} = {_f(e.value)} {e.unit} {e.op} {e.threshold}"
        f" {_f(e.threshold_value)} [{e.source[:40]}] {'MET' if e.met else 'not met'}"
        + (f" | {e.detail}" if e.detail else "")
        for e in v.evidence
    ]


def _full(v: Verdict, base: Verdict | None = None) -> list[str]:
    """The verdict; with ``base``, only the evidence rows the base window does not have
    (a boundary case moves one signal: its other rows are the base's, shown once)."""
    seen = set(_rows(base)) if base is not None else set()
    return _head(v) + [row for row in _rows(v) if row not in seen]


def _disagreeing() -> WindowSignals:
    """CPU samples that contradict each other: an inconclusive verdict that names classes."""
    return dataclasses.replace(CPU_CLEAN, host_busy_cores=4.0,
                               server_cpu_cores=disagreement_edge(4.0) + 0.05, steal_frac=0.2)


GPU_ACTIVITY = ("sm_active", "tensor_active", "dram_active", "sm_occupancy")
#: signals that go missing together (one collector lost), by the window they leave
GROUPS = {
    "every GPU activity signal (no GPM/DCGM)": GPU_ACTIVITY,
    "GPU activity and utilization (no GPU telemetry)": (*GPU_ACTIVITY, "gpu_util"),
    "both clock signals": ("throttle_frac", "sm_clock_low_frac"),
    "the host CPU signals": ("server_max_thread_cores", "runq_delay_per_cpu_s", "psi_cpu_some"),
    "the server's CPU and thread counts": ("server_cpu_cores", "server_threads"),
    "tensor and DRAM activity (SM activity measured)": ("tensor_active", "dram_active"),
    "every peer signal": ("sm_active_cv", "gpu_util_max_min", "rdma_rail_max_min",
                          "rdma_rail_cv", "straggler_rel_dev"),
    "the fault and read counters": ("major_faults_per_s", "read_bytes_s"),
    "every queue signal": ("waiting_mean", "server_queue_frac", "engine_queue_frac"),
    "the KV-cache signals": ("kv_usage_max", "preemptions"),
    "every disk signal": ("major_faults_per_s", "read_bytes_s", "disk_busy_frac"),
}
#: the same on the two-node base, whose network the rules assess
GROUPS_2NODE = {
    "every network signal": ("net_util", "net_wire_busy", "rdma_error_events",
                             "rdma_congestion_per_s", "socket_fallback_bytes_s"),
    "the link's utilization, rail counters measured": ("net_util",),
}
BUSY = dict(gpu_util=0.99, sm_occupancy=0.3)
#: windows where two conditions meet, each picked where a rule has a branch the boundary
#: cases do not reach (mutation testing found these unread)
SCENARIOS: dict[str, tuple[WindowSignals, dict]] = {
    "DRAM bound while the tensor pipes are busy": (
        GPU_CLEAN, dict(BUSY, sm_active=0.7, tensor_active=0.7, dram_active=0.7)),
    "SM activity exactly at sm_active_busy, clocks often low": (
        GPU_CLEAN, dict(BUSY, sm_active=0.5, dram_active=0.45, tensor_active=0.1,
                        sm_clock_low_frac=0.5)),
    "two GPUs, imbalanced": (GPU_CLEAN, dict(n_gpus=2, sm_active_cv=0.3)),
    "one GPU, imbalanced (nothing to be imbalanced against)": (
        GPU_CLEAN, dict(n_gpus=1, sm_active_cv=0.3)),
    "one GPU per node, two nodes, imbalanced": (
        GPU_2NODE, dict(n_gpus=1, gpu_util_max_min=1.5)),
    "launch-bound: SMs active, pipes idle, a saturated thread": (
        GPU_CLEAN, dict(BUSY, sm_active=0.6, dram_active=0.1, tensor_active=0.05,
                        server_max_thread_cores=0.98)),
    "launch-bound: DRAM exactly at dram_active_low": (
        GPU_CLEAN, dict(BUSY, sm_active=0.6, dram_active=0.4, tensor_active=0.05,
                        server_max_thread_cores=0.98)),
    "launch-bound: tensor exactly at tensor_active_low": (
        GPU_CLEAN, dict(BUSY, sm_active=0.6, dram_active=0.1, tensor_active=0.3,
                        server_max_thread_cores=0.98)),
    "launch-bound: SMs under-fed, run queue long": (
        GPU_CLEAN, dict(sm_active=0.2, runq_delay_per_cpu_s=0.5)),
    "launch-bound by NVML utilization alone, PSI cpu only": (
        GPU_CLEAN, dict(sm_active=None, tensor_active=None, dram_active=None,
                        sm_occupancy=None, gpu_util=0.3, server_max_thread_cores=None,
                        runq_delay_per_cpu_s=None, psi_cpu_some=0.3)),
    "NVLink busy, SMs idle, no SM activity measured": (
        GPU_CLEAN, dict(nvlink_bytes_s=2e11, sm_active=None, gpu_util=0.9)),
    "NVLink busy, SMs idle": (GPU_CLEAN, dict(nvlink_bytes_s=2e11, sm_active=0.2)),
    "NVLink busy, SMs at 0": (GPU_CLEAN, dict(nvlink_bytes_s=2e11, sm_active=0.0)),
    "NVLink busy, SMs exactly at sm_active_busy": (
        GPU_CLEAN, dict(nvlink_bytes_s=2e11, sm_active=0.5, gpu_util=0.6)),
    "NVLink busy while the SMs compute": (
        GPU_CLEAN, dict(BUSY, nvlink_bytes_s=2e11, sm_active=0.7, tensor_active=0.6)),
    "a CPU server using 2 threads' worth of cores on 8": (
        CPU_CLEAN, dict(server_threads=2, server_cpu_cores=1.9, host_busy_cores=2.0)),
    "one core, nearly all busy, half of it the server's": (
        CPU_CLEAN, dict(n_cores=1, server_threads=4, host_busy_cores=0.95,
                        server_cpu_cores=0.5)),
    "an ambiguous CPU pair below a clear memory-pressure leader": (
        CPU_CLEAN, dict(WEAK_CPU_PAIR, psi_mem_some=0.5,
                        mem_available_frac=0.01)),
    "GPU expected, two collectors unavailable": (
        CPU_CLEAN, dict(gpu_expected=True, unavailable=(
            ("node0/nvml", "no driver"), ("node0/dcgm", "exporter unreachable"),
            ("node0/gpu/0/sm_active", "GPM not supported")))),
    "a CPU server with no thread count, all cores busy": (
        CPU_CLEAN, dict(server_threads=None, server_cpu_cores=7.5, host_busy_cores=7.6)),
    "memory, disk and network all past threshold at once": (
        CPU_CLEAN, dict(mem_available_frac=0.02, psi_mem_some=0.4, major_faults_per_s=500.0,
                        net_util=0.95, steal_frac=0.2)),
    "faults past, PSI io and iowait past too": (
        CPU_CLEAN, dict(major_faults_per_s=22.0, psi_io_some=0.3, iowait_frac=0.3)),
    "disk busy, faults quiet, reads unmeasured": (
        CPU_CLEAN, dict(disk_busy_frac=0.9, read_bytes_s=None)),
    "time outside the server, waiting count unmeasured": (
        CPU_CLEAN, dict(outside_server_frac=0.5, before_server_ms=300.0, waiting_mean=None)),
    "the load generator fell behind": (CPU_CLEAN, dict(client_bound=True)),
    "CPU samples disagree, with throttled GPUs and three classes past": (
        GPU_CLEAN, dict(host_busy_cores=4.0, server_cpu_cores=5.0, steal_frac=0.2,
                        throttle_frac=0.5, psi_mem_some=0.5, major_faults_per_s=100.0)),
    "CPU samples exactly at the disagreement edge": (
        CPU_CLEAN, dict(host_busy_cores=4.0, server_cpu_cores=disagreement_edge(4.0))),
    "an ambiguous CPU pair alone, the memory signals unmeasured": (
        CPU_CLEAN, dict(WEAK_CPU_PAIR, psi_mem_some=None,
                        mem_available_frac=None, cgroup_mem_events=None)),
    "a busy GPU with no request in flight, throttled, queue past, PCIe unmeasured": (
        GPU_CLEAN, dict(BUSY, sm_active=0.9, tensor_active=0.7, dram_active=0.3,
                        inflight_frac=0.1, throttle_frac=0.5, waiting_mean=3.0,
                        pcie_bytes_s=None)),
    "a weak resource beside a strong serving symptom": (
        CPU_CLEAN, dict(steal_frac=0.051, waiting_mean=5.0, server_queue_frac=0.9)),
    # scores 1.0 and 0.5: apart by exactly dominance_margin, so the leader leads; 0.504
    # is inside the margin, and the pair is ambiguous
    "a saturated server beside steal scoring exactly dominance_margin less": (
        CPU_CLEAN, dict(server_threads=4, server_cpu_cores=4.5, host_busy_cores=4.6,
                        steal_frac=0.05625)),
    "a saturated server beside steal scoring just inside dominance_margin": (
        CPU_CLEAN, dict(server_threads=4, server_cpu_cores=4.5, host_busy_cores=4.6,
                        steal_frac=0.0563)),
    "an ambiguous CPU pair below a memory leader, contention second": (
        CPU_CLEAN, dict(WEAK_CPU_PAIR, runq_delay_per_cpu_s=0.13, psi_mem_some=0.5,
                        mem_available_frac=0.01)),
    "steal past, the server's CPU unmeasured": (
        CPU_CLEAN, dict(steal_frac=0.2, server_cpu_cores=None)),
    "nothing measured": (
        WindowSignals(window="w", duration_s=60.0), {}),
    # the ledger by cause leads (issue 30): its largest cause is the first class
    "a C=1 prefill: TTFT 97% prefill running, one proc sample": (
        CPU_CLEAN, dict(n_cores=2, server_threads=2, server_cpu_cores=1.35,
                        host_busy_cores=1.4, ledger_metric="ttft", ledger_run_state=True,
                        ledger_run_cores=1.35, ledger_runnable_cores=1.37,
                        collector_samples=(("cpu", 1), ("proc", 1), ("runstate", 21)),
                        ledger_causes=(("prefill:running", 0.97),
                                       ("outside:before_server", 0.02),
                                       ("queue:running", 0.01)))),
    "a decode 40x slower, two threads waiting for one CPU": (
        CPU_CLEAN, dict(n_cores=2, server_threads=2, server_cpu_cores=1.0, host_busy_cores=1.05,
                        runq_delay_per_cpu_s=1.01, ctx_involuntary_per_cpu_s=263.0,
                        ledger_metric="itl", ledger_run_state=True, ledger_run_cores=1.0,
                        ledger_runnable_cores=2.0,
                        ledger_causes=(("decode:waiting", 0.96), ("decode:running", 0.04)))),
    "a late client beside a queue that is the ledger's largest cause": (
        CPU_CLEAN, dict(client_bound=True, waiting_mean=5.0, ledger_metric="e2e",
                        ledger_run_state=True,
                        ledger_causes=(("queue:running", 0.6), ("decode:running", 0.3),
                                       ("outside:client_send", 0.1)))),
    "a ledger whose residual could hold a larger cause than its first": (
        CPU_CLEAN, dict(ledger_metric="itl", ledger_run_state=True, ledger_residual_frac=0.3,
                        ledger_causes=(("decode:running", 0.4), ("stall:stopped", 0.3),
                                       ("unexplained:residual_decode", 0.3)))),
}


def render() -> str:
    out: list[str] = []
    for name, base in BASES.items():
        out += [f"== base {name}", *_full(classify(base))]
    out += ["== CPU samples disagree, with steal", *_full(classify(_disagreeing()))]
    for b in CASES:
        short, past = _values(b)
        far = past + 4 * (past - short)  # well past: the score grows with the margin
        for side, x in (("short", short), ("past", past), ("far", far)):
            w = dataclasses.replace(b.base, **b.at(x))
            out += [f"== boundary {b.threshold} -> {b.cls}, {side} ({_f(x)});"
                    " evidence rows other than its base's",
                    *_full(classify(w), classify(b.base))]
    for title, (base, changes) in SCENARIOS.items():
        out += [f"== {title}", *_full(classify(dataclasses.replace(base, **changes)))]
    for title, names in GROUPS.items():
        w = dataclasses.replace(GPU_CLEAN, **dict.fromkeys(names))
        out += [f"== GPU_CLEAN without {title}", *_head(classify(w))]
    for title, names in GROUPS_2NODE.items():
        w = dataclasses.replace(GPU_2NODE_RAILS, **dict.fromkeys(names))
        out += [f"== GPU_2NODE_RAILS without {title}", *_head(classify(w))]
    for name in ("CPU_CLEAN", "GPU_CLEAN", "GPU_2NODE_RAILS"):
        base = BASES[name]
        for fld in dataclasses.fields(base):
            if "None" not in str(fld.type) or getattr(base, fld.name) is None:
                continue  # only signals that may be unmeasured, and are measured here
            w = dataclasses.replace(base, **{fld.name: None})
            out += [f"== {name} without {fld.name}", *_head(classify(w))]
    return "\n".join(out) + "\n"


def test_verdicts_match_the_reviewed_golden_file() -> None:
    got = render()
    if os.environ.get("STRATA_REGEN_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(got)
    want = GOLDEN.read_text()
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                        "golden", "now", n=1))
    assert got == want, ("verdicts changed (review, then regenerate: module docstring):\n"
                         + diff[:6000])

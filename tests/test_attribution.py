"""The classifier on constructed windows: each class alone, pairs, conflicts, gaps."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_plugin.analysis.rules import (
    CLASSES,
    TRACE_BLOCK,
    TRACE_CUDA,
    TRACE_GPM,
    TRACE_LEDGER,
    TRACE_SCHED,
    Verdict,
    WindowSignals,
    classify,
)
from strata_plugin.analysis.thresholds import THRESHOLDS, threshold, value

ROOT = Path(__file__).resolve().parents[1]

#: A CPU-only window where every signal is measured and nothing binds.
CPU_CLEAN = WindowSignals(
    window="w",
    duration_s=60.0,
    n_cores=8,
    host_busy_cores=1.2,
    iowait_frac=0.0,
    steal_frac=0.0,
    psi_cpu_some=0.01,
    psi_io_some=0.0,
    psi_mem_some=0.0,
    cgroup_throttled_frac=0.0,
    server_cpu_cores=1.0,
    server_threads=8,
    server_max_thread_cores=0.3,
    runq_delay_per_cpu_s=0.01,
    ctx_involuntary_per_cpu_s=3.0,
    major_faults_per_s=0.0,
    read_bytes_s=0.0,
    disk_busy_frac=0.01,
    mem_available_frac=0.6,
    net_util=0.01,
    waiting_mean=0.0,
    kv_usage_max=0.2,
    preemptions=0.0,
    server_queue_frac=0.05,
    outside_server_frac=0.02,
    before_server_ms=0.5,
    ledger_metric="e2e",
    ledger_residual_frac=0.02,
    server_stalled_frac=0.0,
    server_stalled_window_frac=0.0,
    chunk_gap_p99_p50=1.3,
    prefill_stall_frac=0.01,
    prefill_stall_share=0.2,
    concurrency=4,
    inflight_frac=0.98,
    client_bound=False,
    client_lateness_p99_ms=0.5,
    client_cpu_fraction=0.05,
)
#: The same host with 8 GPUs measured by NVML + GPM, lightly loaded.
GPU_CLEAN = dataclasses.replace(
    CPU_CLEAN,
    gpu_present=True,
    n_gpus=8,
    gpu_util=0.45,
    sm_active=0.3,
    tensor_active=0.1,
    dram_active=0.2,
    sm_occupancy=0.3,
    sm_active_cv=0.05,
    gpu_util_max_min=1.05,
    pcie_bytes_s=2e8,
    nvlink_bytes_s=1e9,
    throttle_frac=0.0,
    sm_clock_low_frac=0.0,
)
GPU_2NODE = dataclasses.replace(GPU_CLEAN, multi_node=True, rdma_util=0.05, rdma_rail_max_min=1.1)


def v(base: WindowSignals, **kw) -> Verdict:
    return classify(dataclasses.replace(base, **kw))


def assert_only(verdict: Verdict, *classes: str) -> None:
    assert not verdict.inconclusive, verdict
    assert verdict.classes == classes, verdict
    for cls in classes:
        assert any(e.cls == cls and e.met for e in verdict.evidence), cls


# --- the threshold table -----------------------------------------------------------------


def test_thresholds_are_one_table_with_sources():
    names = [t.name for t in THRESHOLDS]
    assert len(names) == len(set(names))
    for t in THRESHOLDS:
        assert t.source.strip() and t.unit.strip(), t
        assert math.isfinite(t.value)
        with pytest.raises(dataclasses.FrozenInstanceError):
            t.value = 0  # type: ignore[misc]


def test_threshold_sources_can_be_opened_by_a_user():
    # A public document with its section, or [inferred]; never a file outside the
    # repository (a seed, a research note, a run folder).
    for t in THRESHOLDS:
        assert "shared/" not in t.source and "seed 0" not in t.source, t
        assert "reports/" not in t.source, t
        in_repo = [w for w in t.source.replace(",", " ").split() if w.startswith("docs/")]
        for path in in_repo:
            assert (ROOT / path.rstrip(".;:)")).is_file(), (t.name, path)


def test_every_evidence_names_a_threshold_of_the_table():
    names = {t.name for t in THRESHOLDS}
    for base in (CPU_CLEAN, GPU_CLEAN, GPU_2NODE):
        for e in classify(base).evidence:
            assert e.threshold in names
            assert e.source == threshold(e.threshold).source


# --- clean windows -----------------------------------------------------------------------


@pytest.mark.parametrize("base", [CPU_CLEAN, GPU_CLEAN, GPU_2NODE], ids=["cpu", "gpu", "2node"])
def test_clean_window_without_a_ledger_names_no_class_and_states_its_spare_capacity(base):
    """No rule past threshold and no ledger by cause to name where the time went: no
    class (there is no "headroom" class, issue 30), conclusively, with the spare capacity
    stated."""
    verdict = classify(base)
    assert verdict.classes == () and not verdict.inconclusive, verdict
    assert "headroom" not in verdict.summary()
    assert "spare" in verdict.spare
    # Every rule was assessed and left unmet (a gate like "requests in flight" may hold).
    unmet = {e.cls for e in verdict.evidence if not e.met}
    assert {"io_page_faults", "memory_pressure", "queueing"} <= unmet
    assert verdict.missing_signals == ()
    assert verdict.confidence >= 0.5


def test_cpu_only_says_gpu_classes_were_not_assessed():
    verdict = classify(CPU_CLEAN)
    assert any("GPU classes not assessed" in n for n in verdict.notes)
    assert not any(e.cls.startswith("gpu_") for e in verdict.evidence)


# --- each class alone --------------------------------------------------------------------

ALONE = [
    ("cpu_compute", CPU_CLEAN, dict(server_cpu_cores=7.8, host_busy_cores=7.9)),
    (
        "cpu_contention",
        CPU_CLEAN,
        dict(host_busy_cores=6.0, runq_delay_per_cpu_s=0.6, ctx_involuntary_per_cpu_s=300.0),
    ),
    # the server's own cgroup quota on an idle host: nobody else holds the cores
    ("cpu_limited", CPU_CLEAN, dict(cgroup_throttled_frac=0.6, cgroup_quota_used=0.97)),
    (
        "io_page_faults",
        CPU_CLEAN,
        dict(major_faults_per_s=42.0, read_bytes_s=5.2e6, psi_io_some=0.3),
    ),
    ("memory_pressure", CPU_CLEAN, dict(psi_mem_some=0.25, mem_available_frac=0.04)),
    ("network", CPU_CLEAN, dict(net_util=0.92)),
    ("input_starved", CPU_CLEAN, dict(inflight_frac=0.4)),
    ("queueing", CPU_CLEAN, dict(waiting_mean=6.0, server_queue_frac=0.8)),
    ("kv_cache_capacity", CPU_CLEAN, dict(kv_usage_max=0.99, preemptions=12.0)),
    (
        "prefill_decode_interference",
        CPU_CLEAN,
        dict(prefill_stall_frac=0.4, prefill_stall_share=0.9),
    ),
    # latency added between client and server: TTFT outside prefill, no server queue
    ("outside_server", CPU_CLEAN,
     dict(outside_server_frac=0.6, before_server_ms=300.0, server_queue_frac=0.8)),
    ("client_bound", CPU_CLEAN, dict(client_bound=True)),
    # the server frozen for a third of the decode time (the time ledger, runstate)
    ("server_stalled", CPU_CLEAN, dict(server_stalled_frac=0.33, server_stalled_window_frac=0.3)),
    (
        "gpu_compute",
        GPU_CLEAN,
        dict(gpu_util=0.99, sm_active=0.9, tensor_active=0.75, dram_active=0.3),
    ),
    (
        "gpu_memory_bandwidth",
        GPU_CLEAN,
        dict(gpu_util=0.97, sm_active=0.7, tensor_active=0.2, dram_active=0.72),
    ),
    (
        "gpu_communication",
        GPU_2NODE,
        dict(gpu_util=0.95, sm_active=0.3, tensor_active=0.05, rdma_util=0.7),
    ),
    ("gpu_pcie_copy", GPU_CLEAN, dict(pcie_bytes_s=40e9)),
    (
        "gpu_latency_low_occupancy",
        GPU_CLEAN,
        dict(gpu_util=0.95, sm_active=0.6, tensor_active=0.1, dram_active=0.2, sm_occupancy=0.1),
    ),
    ("host_cpu_launch", GPU_CLEAN, dict(server_max_thread_cores=0.99)),
    ("waiting_on_peer", GPU_CLEAN, dict(sm_active_cv=0.4, gpu_util_max_min=1.8)),
]


@pytest.mark.parametrize("cls,base,kw", ALONE, ids=[a[0] for a in ALONE])
def test_each_class_alone(cls, base, kw):
    verdict = v(base, **kw)
    assert_only(verdict, cls)
    assert verdict.confidence >= 0.5
    assert verdict.modifiers == ()


def test_a_ledger_that_does_not_close_is_unexplained_not_clear():
    """Nothing past threshold but a fifth of the metric explained by no clock: the
    verdict names ``unexplained`` with its size, is inconclusive (the escalation round
    takes it) and asks for the ledger's finer trace; just under the bound it is clear."""
    verdict = v(CPU_CLEAN, ledger_metric="itl", ledger_residual_frac=0.2,
                ledger_residual_ms=6.0, ledger_residual_part="decode gaps, no run state")
    assert verdict.classes == ("unexplained",) and verdict.inconclusive
    assert verdict.confidence <= 0.4
    assert TRACE_LEDGER in verdict.finer_trace
    assert any("6 ms, 20.0% of TPOT/ITL" in n and "decode gaps, no run state" in n
               for n in verdict.notes), verdict.notes
    from strata_plugin.analysis.traces import settle

    assert settle.needs_diagnosis(verdict)  # --strata-escalate auto takes it
    assert settle.traces_for(verdict) == ("sched", "block")
    closed = v(CPU_CLEAN, ledger_metric="itl", ledger_residual_frac=0.09)
    assert closed.classes == () and not closed.inconclusive
    assert any("closes: residual 9.0% of TPOT/ITL" in n for n in closed.notes)


def test_an_unmeasured_ledger_never_says_headroom():
    verdict = v(CPU_CLEAN, ledger_residual_frac=None)
    assert verdict.classes == () and verdict.inconclusive
    assert any("unexplained" in n for n in verdict.notes), verdict.notes


def test_unexplained_beside_a_class_that_fired_is_named_last():
    verdict = v(CPU_CLEAN, ledger_residual_frac=0.5, psi_mem_some=0.5,
                mem_available_frac=0.01, waiting_mean=6.0, server_queue_frac=0.8)
    assert verdict.classes == ("memory_pressure", "queueing")
    assert verdict.also_flagged == ("unexplained",) and not verdict.inconclusive


def test_outside_server_needs_no_waiting_count_once_the_ledger_split_the_queue_out():
    """The ledger took the server's queue out of TTFT (its queue clock, or the waiting
    count by Little's law): the time before the server stands alone. Merged, it needs a
    low waiting count to tell it from the queue, and is unassessable without one."""
    past = value("outside_server_frac")
    split = v(CPU_CLEAN, outside_server_frac=past, before_server_ms=300.0, queue_split=True,
              waiting_mean=None)
    assert_only(split, "outside_server")
    assert not [e for e in split.evidence if e.metric == "waiting_mean"]
    short = v(CPU_CLEAN, outside_server_frac=past * 0.98, before_server_ms=300.0,
              queue_split=True, waiting_mean=None)
    assert "outside_server" not in short.past_threshold
    merged = v(CPU_CLEAN, outside_server_frac=past, before_server_ms=300.0, queue_split=False,
               waiting_mean=None)
    assert "outside_server" not in merged.past_threshold
    assert any(m.startswith("waiting_mean") for m in merged.missing_signals)


def test_a_short_ttfts_front_end_is_not_a_path():
    """A direct connection's 16-token prompt: 6 ms before prefill is 0.17 of a 35 ms TTFT
    (the highest clean case that set ``outside_server_min_ms``), the server's own front
    end; the same share of a TTFT with a path's 300 ms in it is the path."""
    front_end = v(CPU_CLEAN, outside_server_frac=0.17, before_server_ms=6.05, queue_split=True)
    assert "outside_server" not in front_end.past_threshold
    ev = {e.metric: e for e in front_end.evidence if e.cls == "outside_server"}
    assert ev["outside_server_frac"].met and not ev["before_server_ms"].met
    path = v(CPU_CLEAN, outside_server_frac=0.17, before_server_ms=300.0, queue_split=True)
    assert_only(path, "outside_server")


def test_every_class_is_reachable():
    tested = {a[0] for a in ALONE} | {"throttling", "unexplained"}
    assert tested == set(CLASSES)


def test_throttling_is_a_modifier():
    alone = v(GPU_CLEAN, throttle_frac=0.3)
    assert alone.classes == ("throttling",) and not alone.inconclusive
    busy = v(
        GPU_CLEAN,
        gpu_util=0.99,
        sm_active=0.9,
        tensor_active=0.75,
        dram_active=0.3,
        throttle_frac=0.3,
    )
    assert busy.classes == ("gpu_compute",)
    assert busy.modifiers == ("throttling",)
    assert busy.summary() == "gpu_compute (+throttling)"
    clocks = v(
        GPU_CLEAN,
        gpu_util=0.99,
        sm_active=0.9,
        tensor_active=0.75,
        dram_active=0.3,
        sm_clock_low_frac=0.6,
    )
    assert clocks.modifiers == ("throttling",)


# --- two together ------------------------------------------------------------------------


def test_resource_and_serving_class_together():
    verdict = v(CPU_CLEAN, server_cpu_cores=7.9, host_busy_cores=8.0, waiting_mean=5.0)
    assert_only(verdict, "cpu_compute", "queueing")


def test_two_resource_classes_together():
    verdict = v(
        CPU_CLEAN,
        major_faults_per_s=300.0,
        read_bytes_s=80e6,
        psi_mem_some=0.4,
        mem_available_frac=0.02,
    )
    assert set(verdict.classes) == {"io_page_faults", "memory_pressure"}
    assert not verdict.inconclusive


def test_gpu_memory_bound_with_full_kv_cache():
    verdict = v(
        GPU_CLEAN,
        gpu_util=0.97,
        sm_active=0.7,
        tensor_active=0.2,
        dram_active=0.75,
        kv_usage_max=0.99,
    )
    assert_only(verdict, "gpu_memory_bandwidth", "kv_cache_capacity")


def test_more_than_two_keeps_the_rest_as_also_flagged():
    verdict = v(
        CPU_CLEAN,
        server_cpu_cores=7.9,
        host_busy_cores=8.0,
        waiting_mean=5.0,
        kv_usage_max=0.99,
        client_bound=True,
    )
    assert len(verdict.classes) == 2
    assert set(verdict.also_flagged) >= {"kv_cache_capacity"} - set(verdict.classes)
    assert verdict.modifiers == ("client_bound",)  # beside them, never ranked (issue 30)


def test_a_late_client_alone_is_named_and_its_request_signals_are_not_trusted():
    """A starved load generator inflates client-side TTFT (queueing), leaves the server
    idle (input_starved) and delays its reads of the stream (chunk gaps): none of that
    is the server's doing, and a contradiction between the first two must not hide it."""
    # a server that reports no waiting count: client-side TTFT is all queueing can go by
    starved = dict(server_queue_frac=0.9, inflight_frac=0.45, prefill_stall_frac=0.5,
                   prefill_stall_share=0.9, waiting_mean=None)
    without_flag = v(CPU_CLEAN, **starved)
    assert without_flag.inconclusive  # what the same numbers say when nobody flags the client
    verdict = v(CPU_CLEAN, **starved, client_bound=True)
    assert_only(verdict, "client_bound")
    assert not {"queueing", "input_starved", "prefill_decode_interference"} & set(
        verdict.also_flagged
    )
    untrusted = [m for m in verdict.missing_signals if "not trusted" in m]
    assert sorted(m.split(" ", 1)[0] for m in untrusted) == sorted(
        [
            "server_queue_frac",
            "inflight_frac",
            "chunk_gap_p99_p50",
            "prefill_stall_frac",
            "prefill_stall_share",
            "outside_server_frac",
            "before_server_ms",
            "ledger_residual_frac",
        ]
    )
    assert any("fell behind" in n for n in verdict.notes)


def test_latency_outside_the_server_is_not_blamed_on_its_queue():
    # The server's own count says nothing waited: TTFT outside prefill is the path.
    verdict = v(CPU_CLEAN, server_queue_frac=0.85, outside_server_frac=0.7,
                before_server_ms=300.0)
    assert_only(verdict, "outside_server")
    q = {e.metric: e for e in verdict.evidence if e.cls == "outside_server"}
    assert q["outside_server_frac"].met and q["waiting_mean"].met  # waiting < 0.5
    # The same requests with a queue on the server: queueing, not the path.
    queued = v(CPU_CLEAN, server_queue_frac=0.85, outside_server_frac=0.7, before_server_ms=300.0,
                waiting_mean=5.0)
    assert_only(queued, "queueing")
    # No waiting count: the path cannot be told from a queue; queueing goes by TTFT.
    blind = v(CPU_CLEAN, server_queue_frac=0.85, outside_server_frac=0.7, before_server_ms=300.0,
                waiting_mean=None)
    assert "outside_server" not in blind.classes and "queueing" in blind.classes
    assert any(m.startswith("waiting_mean") for m in blind.missing_signals)


def test_the_proxies_cpu_is_the_paths_not_other_processes():
    """An attached server behind a proxy on the same host: the proxy's cores are the path
    (agent source ``path``), not other processes crowding the server. 3.1 cores busy, 1.0
    the server's, the server waiting for a CPU: other processes hold 2.1 of 8 cores
    (0.2625, past a quarter) without the proxy's share taken out; with 0.05 of it taken
    out 2.05 (0.256: still past), with 0.2 taken out 1.9 (0.2375: under)."""
    crowded = dict(host_busy_cores=3.1, runq_delay_per_cpu_s=0.6, ctx_involuntary_per_cpu_s=300.0)
    assert "cpu_contention" in v(CPU_CLEAN, **crowded).classes
    assert "cpu_contention" in v(CPU_CLEAN, **crowded, path_cpu_cores=0.05).classes
    assert "cpu_contention" not in v(CPU_CLEAN, **crowded, path_cpu_cores=0.2).classes
    assert "cpu_contention" not in v(CPU_CLEAN, **crowded, path_cpu_cores=2.1).classes


def test_a_late_client_still_sees_a_server_side_queue_and_resources():
    verdict = v(
        CPU_CLEAN,
        client_bound=True,
        server_queue_frac=0.9,
        waiting_mean=5.0,  # the server's own count of waiting requests
        server_cpu_cores=7.9,
        host_busy_cores=8.0,
    )
    # the client beside the server's classes, not first (issue 30)
    assert verdict.classes == ("cpu_compute", "queueing")
    assert verdict.modifiers == ("client_bound",)
    queue = [e for e in verdict.evidence if e.cls == "queueing"]
    assert all(e.metric != "server_queue_frac" for e in queue)


def test_a_serving_symptom_takes_the_second_slot_over_a_second_resource():
    """3x more requests than slots on a crowded CPU server: the queue is what users see."""
    verdict = v(
        CPU_CLEAN,
        server_cpu_cores=7.9,
        host_busy_cores=8.0,
        psi_mem_some=0.3,
        mem_available_frac=0.03,
        waiting_mean=0.6,  # barely past its threshold: a lower score than the resources
    )
    assert verdict.classes[1] == "queueing", verdict
    assert verdict.classes[0] in ("cpu_compute", "memory_pressure")
    assert set(verdict.classes[:1]) | set(verdict.also_flagged) >= {"cpu_compute",
                                                                    "memory_pressure"}


#: cpu_compute and cpu_contention both barely past threshold on a shared 2-core host
WEAK_CPU_PAIR = dict(
    n_cores=2,
    server_threads=2,
    server_cpu_cores=1.45,
    host_busy_cores=2.0,
    runq_delay_per_cpu_s=0.105,
    ctx_involuntary_per_cpu_s=52.0,
)


def test_an_ambiguous_pair_below_a_clear_leader_is_a_note_not_inconclusive():
    """cpu_compute and cpu_contention both barely past threshold (a shared host) beside a
    memory-pressure window that is far past its own."""
    both = v(CPU_CLEAN, **WEAK_CPU_PAIR)
    assert both.inconclusive and set(both.classes) == {"cpu_compute", "cpu_contention"}
    verdict = v(CPU_CLEAN, **WEAK_CPU_PAIR, psi_mem_some=0.5, mem_available_frac=0.01)
    assert not verdict.inconclusive, verdict
    assert verdict.classes[0] == "memory_pressure"
    assert any("could equally be" in n and TRACE_SCHED in n for n in verdict.notes), verdict


# --- conflicts ---------------------------------------------------------------------------


def test_cpu_seconds_and_faults_that_cannot_be_separated_are_inconclusive():
    """The seed 000 situation: CPU busy and faulting; which one is the wait?"""
    verdict = v(
        CPU_CLEAN,
        server_cpu_cores=7.9,
        host_busy_cores=8.0,
        major_faults_per_s=40.0,
        read_bytes_s=6e6,
    )
    assert verdict.inconclusive
    assert set(verdict.classes) == {"cpu_compute", "io_page_faults"}
    trace = " ".join(verdict.finer_trace)
    assert TRACE_SCHED in trace and TRACE_BLOCK in trace
    assert verdict.confidence <= 0.4


def test_a_dominant_class_settles_an_ambiguous_pair():
    verdict = v(
        CPU_CLEAN,
        server_cpu_cores=6.81,
        host_busy_cores=7.0,
        major_faults_per_s=400.0,
        read_bytes_s=90e6,
    )
    assert not verdict.inconclusive
    assert verdict.classes[0] == "io_page_faults"


def test_launch_vs_small_kernels_asks_for_a_cuda_timeline():
    pattern = dict(
        gpu_util=0.95, sm_active=0.55, tensor_active=0.05, dram_active=0.1, sm_occupancy=0.1
    )
    assert_only(v(GPU_CLEAN, **pattern), "gpu_latency_low_occupancy")
    both = v(GPU_CLEAN, **pattern, server_max_thread_cores=0.99)
    assert both.inconclusive
    assert set(both.classes) == {"host_cpu_launch", "gpu_latency_low_occupancy"}
    assert both.finer_trace == (TRACE_CUDA,)


def test_contradictory_signals_are_inconclusive():
    busy_gpu_no_requests = v(
        GPU_CLEAN,
        gpu_util=0.99,
        sm_active=0.9,
        tensor_active=0.75,
        dram_active=0.3,
        inflight_frac=0.2,
    )
    assert busy_gpu_no_requests.inconclusive
    assert set(busy_gpu_no_requests.classes) == {"gpu_compute", "input_starved"}
    assert busy_gpu_no_requests.finer_trace == (TRACE_CUDA,)
    queue_without_requests = v(CPU_CLEAN, waiting_mean=4.0, inflight_frac=0.1)
    assert queue_without_requests.inconclusive
    proc_above_node = v(CPU_CLEAN, server_cpu_cores=6.0, host_busy_cores=2.0)
    assert proc_above_node.inconclusive
    assert any("disagree" in n for n in proc_above_node.notes)


# --- missing signals ---------------------------------------------------------------------


def test_missing_proc_samples_are_inconclusive_and_named():
    verdict = v(
        CPU_CLEAN,
        server_cpu_cores=None,
        server_threads=None,
        server_max_thread_cores=None,
        runq_delay_per_cpu_s=None,
        ctx_involuntary_per_cpu_s=None,
        major_faults_per_s=None,
        read_bytes_s=None,
        disk_busy_frac=None,
        unavailable=(("node0/proc", "permission denied"),),
    )
    assert verdict.inconclusive
    assert verdict.classes == ()
    assert verdict.confidence == 0.0
    text = " ".join(verdict.missing_signals)
    assert "server_cpu_cores" in text and "permission denied" in text
    assert verdict.finer_trace


def test_no_gpm_on_a_gpu_run_never_guesses_busy_kind():
    verdict = v(
        GPU_CLEAN,
        gpu_util=0.97,
        sm_active=None,
        tensor_active=None,
        dram_active=None,
        sm_occupancy=None,
        sm_active_cv=None,
        unavailable=(("node0/gpm", "GPM not supported"),),
    )
    assert verdict.inconclusive
    assert not any(c.startswith("gpu_") for c in verdict.classes)
    assert TRACE_GPM in verdict.finer_trace
    assert any("sm_active" in m and "GPM not supported" in m for m in verdict.missing_signals)


def test_gpu_expected_but_not_measured_is_inconclusive():
    verdict = v(CPU_CLEAN, gpu_expected=True, unavailable=(("node0/nvml", "no driver"),))
    assert verdict.inconclusive
    assert any("nvml" in m and "no driver" in m for m in verdict.missing_signals)


def test_missing_collector_lowers_confidence_but_keeps_a_measured_verdict():
    full = v(CPU_CLEAN, server_cpu_cores=7.9, host_busy_cores=8.0)
    partial = v(
        CPU_CLEAN,
        server_cpu_cores=7.9,
        host_busy_cores=8.0,
        waiting_mean=None,
        kv_usage_max=None,
        preemptions=None,
        server_queue_frac=None,
    )
    assert partial.classes == full.classes == ("cpu_compute",)
    assert partial.confidence < full.confidence
    assert any("waiting_mean" in m for m in partial.missing_signals)


def test_a_missing_signal_never_fires_a_class():
    """io_page_faults would fire on its fault rate; without proc it must not."""
    verdict = v(
        CPU_CLEAN, major_faults_per_s=None, read_bytes_s=None, disk_busy_frac=None, psi_io_some=0.5
    )
    assert "io_page_faults" not in verdict.classes


# --- properties over random windows ------------------------------------------------------

_FLOATS = {f.name for f in dataclasses.fields(WindowSignals) if f.type in ("float | None",)}


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_random_windows_keep_the_promises(data):
    base = data.draw(st.sampled_from([CPU_CLEAN, GPU_CLEAN, GPU_2NODE]))
    changes = {}
    for name in sorted(_FLOATS):
        choice = data.draw(st.sampled_from(["keep", "none", "value"]), label=name)
        if choice == "none":
            changes[name] = None
        elif choice == "value":
            changes[name] = data.draw(st.floats(0.0, 2.0, allow_nan=False), label=name + "=")
    s = dataclasses.replace(base, **changes)
    verdict = classify(s)
    assert set(verdict.classes) <= set(CLASSES)
    assert 0.0 <= verdict.confidence <= 1.0
    assert len(verdict.classes) <= 2
    for e in verdict.evidence:
        assert math.isfinite(e.value)
    assert "headroom" not in verdict.classes
    if not verdict.inconclusive and verdict.classes:
        for cls in verdict.classes:
            assert any(e.cls == cls and e.met for e in verdict.evidence), (cls, verdict)
    if verdict.inconclusive:
        assert verdict.finer_trace or verdict.notes


# --- rails-derived signals (strata_plugin.analysis.rails) -----------------------------------------

#: Two nodes where every rails-derived signal is measured and nothing binds.
GPU_2NODE_RAILS = dataclasses.replace(
    GPU_2NODE,
    rdma_rail_cv=0.05,
    rdma_error_events=0.0,
    rdma_congestion_per_s=0.0,
    socket_fallback_bytes_s=2e5,
    straggler_rel_dev=0.0,
    net_wire_busy=0.02,
)


def test_clean_two_node_window_names_neither_network_nor_a_peer():
    verdict = classify(GPU_2NODE_RAILS)
    assert verdict.classes == () and not verdict.inconclusive, verdict
    assert not verdict.also_flagged
    assessed = {(e.cls, e.metric) for e in verdict.evidence if not e.met}
    assert {
        ("network", "net_wire_busy"),
        ("network", "rdma_error_events"),
        ("network", "rdma_congestion_per_s"),
        ("network", "socket_fallback_bytes_s"),
        ("waiting_on_peer", "rdma_rail_cv"),
        ("waiting_on_peer", "straggler_rel_dev"),
    } <= assessed


def test_capped_round_trip_link_is_network():
    """llama.cpp RPC over an 8 Mbit/s tbf-capped veth: the busier direction at 0.69-0.89 of
    the cap (under net_link_frac at the low end), both directions 1.15-1.37."""
    verdict = v(CPU_CLEAN, net_util=0.69, net_wire_busy=1.15)
    assert_only(verdict, "network")
    ev = {e.metric: e for e in verdict.evidence if e.cls == "network"}
    assert ev["net_wire_busy"].met and ev["net_wire_busy"].threshold == "net_wire_busy"
    assert not ev["net_util"].met
    # the same busier direction without the other one is not the link
    assert "network" not in v(CPU_CLEAN, net_util=0.69, net_wire_busy=0.75).classes
    assert "network" not in v(CPU_CLEAN, net_util=0.69).classes


@pytest.mark.parametrize(
    "cls, kw",
    [
        ("waiting_on_peer", dict(rdma_rail_max_min=1.6, rdma_rail_cv=0.3)),  # rail_imbalance
        ("waiting_on_peer", dict(rdma_rail_cv=0.3)),  # CV alone
        ("waiting_on_peer", dict(straggler_rel_dev=0.5)),  # gpu_/node_straggler
        ("network", dict(rdma_error_events=3.0)),  # rail_errors
        ("network", dict(rdma_congestion_per_s=500.0)),  # rail_congestion
        ("network", dict(socket_fallback_bytes_s=3e8)),  # socket_fallback
        ("network", dict(net_wire_busy=1.3)),  # net_round_trip_bound
    ],
    ids=["rail-imbalance", "rail-cv", "straggler", "rail-errors", "congestion", "fallback", "rr"],
)
def test_rails_findings_feed_their_class(cls, kw):
    assert_only(v(GPU_2NODE_RAILS, **kw), cls)


def test_rail_signals_alone_do_not_clear_an_unmeasured_link():
    verdict = v(CPU_CLEAN, net_util=None, rdma_error_events=0.0, rdma_congestion_per_s=0.0)
    assert any(m.startswith("net_util") for m in verdict.missing_signals)
    # but they fire on their own
    assert "network" in v(CPU_CLEAN, net_util=None, rdma_error_events=2.0).classes


def test_rails_thresholds_live_in_the_one_table():
    from strata_plugin.analysis import rails
    names = {t.name for t in THRESHOLDS}
    for t in rails.RAIL_THRESHOLDS:
        assert t.name in names and threshold(t.name) is t
    assert threshold("net_wire_busy").value == 1.0


@pytest.mark.parametrize(("frac", "fires"), [(0.49, False), (0.5, True)])
def test_the_engines_own_queue_time_decides_queueing_even_with_a_late_client(frac, fires):
    """vLLM's queue-time histogram over its TTFT is the server's clock: a starved client
    (whose own TTFT split is not trusted) does not hide it, and it alone decides."""
    verdict = v(CPU_CLEAN, waiting_mean=None, server_queue_frac=None, engine_queue_frac=frac,
                client_bound=True)
    assert ("queueing" in verdict.classes + verdict.also_flagged) is fires, verdict
    if fires:
        met = [e for e in verdict.evidence if e.cls == "queueing" and e.met]
        assert [e.metric for e in met] == ["engine_queue_frac"], verdict

"""The ledger by cause and the verdict it leads (issue 30, items 1 and 3).

A case's metric is split by what the server's threads did (running, waiting for a CPU,
held by the quota, blocked, stopped) and what was outside the server; the level-1 split
sums to 100%. The verdict's first class is the largest cause mapped to its resource:
a TTFT that is 97% prefill running is the prefill's compute, never "headroom"; a decode
whose tokens took 40x their clean time because its two threads shared one CPU is
waiting, not compute. Spare capacity is stated beside the first class; a late client is
first only where its own time is the largest cause; a rule resting on too few samples
is said so.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from strata_plugin.analysis.ledger import LEVEL1, case_ledger, level1_of, request_ledger
from strata_plugin.analysis.rules import WindowSignals, classify
from strata_plugin.analysis.run_states import classify_intervals
from strata_plugin.analysis.thresholds import value
from tests.test_attribution import CPU_CLEAN, GPU_CLEAN
from tests.test_ledger import ANCHOR, MS, T0, record


def states(*, run_cores: float, wait_cores: float = 0.0, throttled_cores: float = 0.0,
           threads: float = 2.0, end_ms: float = 60_000.0, step_ms: float = 20.0):
    """Run-state samples every ``step_ms`` from T0: the server's threads run
    ``run_cores``, wait ``wait_cores`` in the run queue and ``throttled_cores`` held by
    the quota, steadily."""
    t = np.arange(0.0, end_ms + step_ms, step_ms)
    dt = step_ms / 1e3
    tn = (T0 + t * MS).astype(np.int64)
    z = np.zeros(len(t))
    return classify_intervals(
        tn, np.arange(len(t)) * run_cores * dt, np.arange(len(t)) * wait_cores * dt,
        z, z, z, np.full(len(t), threads), z, int(tn[0]), int(tn[-1]),
        throttled_s=np.arange(len(t)) * throttled_cores * dt)


def sig(base: WindowSignals = CPU_CLEAN, **kw) -> WindowSignals:
    return dataclasses.replace(base, **kw)


def ledger_signals(led, **kw) -> WindowSignals:
    return sig(**{**led.signals(), **kw})


# --- the ledger by cause ------------------------------------------------------------------


def test_a_token_that_took_40x_because_its_threads_queued_for_a_cpu_is_waiting() -> None:
    """Two compute threads on one CPU: 1.0 core running, 1.0 core in the run queue. Every
    token at the same slow pace (no stall: it is the pace), yet its time is waiting."""
    st = states(run_cores=1.0, wait_cores=1.0)
    recs = [record(rid=f"r{i}", pace_ms=240.0, n=20) for i in range(3)]  # 40x a 6 ms token
    led = case_ledger("c", "decode_cut", {"osl": 20}, recs, states=st, anchor=ANCHOR)
    assert all(r.part("decode_compute") > 0 and r.n_stalls == 0 for r in led.requests)
    lv = dict(led.level1())
    assert lv["waiting"] == pytest.approx(1.0, abs=1e-6) and lv["running"] < 1e-6
    assert dict(led.cause_shares())["decode:waiting"] == pytest.approx(1.0, abs=1e-6)
    v = classify(ledger_signals(led, n_cores=1))
    assert v.classes[0] == "cpu_limited", v  # 2 runnable threads on 1 CPU: its own
    assert "cpu_compute" not in v.classes and "headroom" not in v.classes
    assert v.lead.startswith("decode, its threads waiting for a CPU (run queue), 100% of")


def test_a_clean_decode_is_running_and_its_waiting_share_is_the_wait_over_the_run() -> None:
    clean = case_ledger("c", "decode_x", {"osl": 20}, [record(n=20)],
                        states=states(run_cores=2.0), anchor=ANCHOR)
    assert dict(clean.level1())["running"] == pytest.approx(1.0)
    # a tenth of a core waiting beside 2 running: a twentieth of the time held back
    bit = case_ledger("c", "decode_x", {"osl": 20}, [record(n=20)],
                      states=states(run_cores=2.0, wait_cores=0.1), anchor=ANCHOR)
    assert dict(bit.level1())["waiting"] == pytest.approx(0.05, abs=1e-6)
    assert classify(ledger_signals(bit)).classes[0] == "cpu_compute"


def test_the_quota_is_told_from_the_run_queue() -> None:
    led = case_ledger("c", "decode_x", {"osl": 20}, [record(pace_ms=40.0, n=20)],
                      states=states(run_cores=0.5, throttled_cores=1.5), anchor=ANCHOR)
    causes = dict(led.cause_shares())
    assert causes["decode:throttled"] == pytest.approx(1.0, abs=1e-6)
    assert classify(ledger_signals(led)).classes[0] == "cpu_limited"


@pytest.mark.parametrize("seed", range(6))
def test_level1_sums_to_100_percent_and_causes_to_the_parts(seed: int) -> None:
    """Fixed cases (no hypothesis): pauses, over-claiming clocks, run states of every
    kind; per request the causes sum to its parts, per case the level-1 split to 1 for
    each metric."""
    rng = random.Random(seed)
    st = states(run_cores=rng.uniform(0.2, 2.0), wait_cores=rng.uniform(0.0, 1.5),
                throttled_cores=rng.uniform(0.0, 0.5), end_ms=30_000)
    recs = []
    for k in range(12):
        rec = record(send_ms=rng.uniform(0, 2), before_ms=rng.uniform(0, 60),
                     prefill_ms=rng.uniform(0, 80), pace_ms=rng.uniform(2, 40),
                     n=rng.randrange(1, 40), rid=f"r{k}", tail_ms=rng.uniform(0, 5),
                     pauses={rng.randrange(1, 40): rng.uniform(0, 300)})
        if k % 4 == 0 and rec.timings is not None:  # a server clock claiming too much
            rec = dataclasses.replace(rec, timings=dataclasses.replace(
                rec.timings, prompt_ms=rec.timings.prompt_ms + 50.0))
        recs.append(rec)
    for with_states in (True, False):
        kw = dict(states=st, anchor=ANCHOR) if with_states else {}
        for r in (request_ledger(x, **kw) for x in recs):
            assert sum(ms for _, _, ms in r.causes) == pytest.approx(sum(v for _, v in r.parts),
                                                                     abs=1e-6)
        for name, osl in (("decode_x", 30), ("prefill_x", 1), ("mix", 30)):
            led = case_ledger("c", name, {"osl": osl}, recs, **kw)
            lv = led.level1()
            assert [k for k, _ in lv] == list(LEVEL1)
            assert sum(x for _, x in lv) == pytest.approx(1.0, abs=1e-9)
            assert sum(x for _, x in led.cause_shares()) == pytest.approx(1.0, abs=1e-9)


def test_each_cause_has_its_level1_category() -> None:
    assert [level1_of(c) for c in ("prefill:running", "decode:waiting", "queue:throttled",
                                   "stall:io", "stall:sleeping", "stall:stopped",
                                   "outside:client_send", "unexplained:residual_decode",
                                   "queue:running")] == [
        "running", "waiting", "waiting", "blocked", "blocked", "stopped", "outside",
        "unexplained", "running"]


# --- the first class ----------------------------------------------------------------------

#: a C=1 prefill case on a quiet 2-core server: TTFT 97% prefill running
PREFILL_C1 = dict(n_cores=2, server_threads=2, server_cpu_cores=1.35, host_busy_cores=1.35,
                  ledger_metric="ttft", ledger_run_state=True, ledger_run_cores=1.35,
                  ledger_runnable_cores=1.37,
                  ledger_causes=(("prefill:running", 0.97), ("outside:before_server", 0.02),
                                 ("queue:running", 0.01)))


def test_a_ttft_that_is_97_percent_prefill_running_is_compute_not_headroom() -> None:
    v = classify(sig(**PREFILL_C1))
    assert v.classes == ("cpu_compute",) and not v.inconclusive, v
    assert v.lead == ("prefill compute, 97% of TTFT, on 1.35 of 2 host cores (allowance "
                      "not observed; run-state grid); spare 0.65 cores")
    assert v.spare_cores == pytest.approx(0.65)
    # what other processes hold of the same cores is not spare
    busy = classify(sig(**{**PREFILL_C1, "host_busy_cores": 1.95}))
    assert busy.spare.endswith("other processes 0.6; spare 0.05 cores")
    assert busy.spare_cores == pytest.approx(0.05)
    row = next(e for e in v.evidence if e.metric == "ledger_cause_share")
    assert row.cls == "cpu_compute" and row.met and row.value == pytest.approx(0.97)
    # the compute rule, short of its threshold, is its evidence still
    assert any(e.cls == "cpu_compute" and not e.met for e in v.evidence)


def test_the_spare_capacity_is_measured_against_the_allowance_where_observed() -> None:
    s = sig(**{**PREFILL_C1, "n_cores": 8, "server_allowed_cpus": 2.0,
               "server_allowance_by": "affinity 0-1 (2 CPUs)"})
    v = classify(s)
    assert v.lead.endswith("on 1.35 of 2 allowed cores (affinity 0-1 (2 CPUs); run-state "
                           "grid); spare 0.65 cores")
    # waiting with 2 runnable threads on 1 allowed CPU: its own threads, cpu_limited
    w = dataclasses.replace(s, server_allowed_cpus=1.0, ledger_runnable_cores=2.0,
                            ledger_causes=(("decode:waiting", 0.9), ("decode:running", 0.1)))
    assert classify(w).classes[0] == "cpu_limited"


@pytest.mark.parametrize(("excess", "cls"), [(0.49, "cpu_contention"), (0.5, "cpu_limited")])
def test_waiting_is_its_own_threads_past_the_allowed_cpus_else_other_processes(excess, cls):
    bound = value("runnable_excess_threads")
    assert bound == 0.5
    v = classify(sig(n_cores=2, ledger_run_state=True, ledger_runnable_cores=2.0 + excess,
                     host_busy_cores=2.0, server_cpu_cores=1.0,  # others: half the cores
                     ledger_metric="itl",
                     ledger_causes=(("decode:waiting", 0.7), ("decode:running", 0.3))))
    assert v.classes[0] == cls, v


def test_the_first_class_is_the_largest_cause_summed_by_class_just_ahead() -> None:
    """Two causes of one class add up (prefill and decode running: compute); the first
    leads the next by ``ledger_cause_lead`` x its share; the confidence grows with the
    lead, and with its own rule past threshold."""
    assert value("ledger_cause_lead") == 1.0
    base = dict(ledger_metric="e2e", ledger_run_state=True)
    v = classify(sig(**base, ledger_causes=(
        ("queue:running", 0.40), ("prefill:running", 0.30), ("decode:running", 0.30))))
    assert v.classes[0] == "cpu_compute" and "0.6" in str(v.evidence[0].value)
    tie = classify(sig(**base, ledger_causes=(("queue:running", 0.50),
                                              ("prefill:running", 0.50))))
    assert tie.evidence[0].met and tie.confidence == pytest.approx(
        value("confidence_at_threshold"))
    just = classify(sig(**base, ledger_causes=(("queue:running", 0.49),
                                               ("prefill:running", 0.51))))
    assert just.classes[0] == "cpu_compute"
    far = classify(sig(**base, ledger_causes=(("prefill:running", 0.70),
                                              ("queue:running", 0.30))))
    assert far.confidence == pytest.approx(0.5 + 0.4 * 1.0)  # twice the next or more
    backed = classify(sig(**base, server_cpu_cores=7.8, host_busy_cores=7.9,
                          ledger_causes=(("prefill:running", 0.70), ("queue:running", 0.30))))
    assert backed.confidence == pytest.approx(min(1.0, 0.9 + value("confidence_agreement")))


def test_a_late_client_is_first_only_where_its_own_time_is_the_largest_cause() -> None:
    causes = (("decode:running", 0.8), ("outside:client_send", 0.2))
    beside = classify(sig(client_bound=True, ledger_metric="e2e", ledger_run_state=True,
                          ledger_causes=causes))
    assert beside.classes[0] == "cpu_compute" and "client_bound" in beside.modifiers
    first = classify(sig(client_bound=True, ledger_metric="e2e", ledger_run_state=True,
                         ledger_causes=(("outside:client_send", 0.6),
                                        ("decode:running", 0.4))))
    assert first.classes[0] == "client_bound" and "client_bound" not in first.modifiers


@pytest.mark.parametrize(("cause", "cls"), [
    ("stall:stopped", "server_stalled"), ("decode:io", "io_page_faults"),
    ("queue:running", "queueing"), ("outside:before_server", "outside_server"),
    ("outside:delivery", "outside_server"), ("decode:throttled", "cpu_limited"),
])
def test_each_cause_maps_to_its_resource(cause, cls) -> None:
    v = classify(sig(ledger_metric="e2e", ledger_run_state=True,
                     ledger_causes=((cause, 0.8), ("decode:running", 0.2))))
    assert v.classes[0] == cls, v


def test_a_gpu_servers_time_on_the_device_is_its_compute_class() -> None:
    v = classify(sig(GPU_CLEAN, ledger_metric="itl", ledger_run_state=True,
                     ledger_causes=(("decode:running", 0.95), ("outside:delivery", 0.05))))
    assert v.classes[0] == "gpu_compute"
    assert "GPUs busy 45%" in v.spare
    bw = classify(sig(GPU_CLEAN, ledger_metric="itl", ledger_run_state=True, gpu_util=0.99,
                      sm_active=0.7, tensor_active=0.2, dram_active=0.75,
                      ledger_causes=(("decode:running", 0.95), ("outside:delivery", 0.05))))
    assert bw.classes[0] == "gpu_memory_bandwidth"


@pytest.mark.parametrize(("n", "said"), [(2, True), (3, False)])
def test_a_rule_on_too_few_samples_is_said_so(n: int, said: bool) -> None:
    assert value("rule_min_samples") == 3
    v = classify(sig(**PREFILL_C1, collector_samples=(("cpu", 40), ("proc", n))))
    notes = [x for x in v.notes if x.startswith("too few samples in the")]
    assert bool(notes) is said, v.notes
    if said:
        assert "(proc 2; fewer than 3) to support cpu_compute, " in notes[0]


def test_headroom_is_never_a_class() -> None:
    from strata_plugin.analysis.rules import CLASSES

    assert "headroom" not in CLASSES
    for s in (CPU_CLEAN, GPU_CLEAN, sig(**PREFILL_C1), WindowSignals(window="w", duration_s=1)):
        assert "headroom" not in classify(s).past_threshold


@pytest.mark.parametrize(("share", "beside"), [(0.099, False), (0.1, True)])
def test_a_class_the_run_state_measured_small_is_not_named_beside_the_first(share, beside):
    """The compute rule past threshold (a saturated server) beside a ledger whose time
    went to waiting: named second only with ``ledger_second_min_share`` of the metric."""
    assert value("ledger_second_min_share") == 0.1
    v = classify(sig(server_cpu_cores=7.8, host_busy_cores=7.9, ledger_metric="itl",
                     ledger_run_state=True, n_cores=8, ledger_runnable_cores=9.0,
                     ledger_causes=(("decode:waiting", 1 - share), ("decode:running", share))))
    assert v.classes[0] == "cpu_limited"
    assert ("cpu_compute" in v.classes) is beside, v
    assert "cpu_compute" in v.past_threshold


@pytest.mark.parametrize(("others", "cls"), [(0.24, "cpu_limited"), (0.25, "cpu_contention")])
def test_waiting_while_others_held_little_of_the_cpus_is_the_servers_own(others, cls):
    """Allowance not observed: threads waited for a CPU while other processes held under
    ``other_cpu_frac`` of the host's cores: they waited for the server's own threads."""
    assert value("other_cpu_frac") == 0.25
    v = classify(sig(n_cores=2, server_cpu_cores=1.0, host_busy_cores=1.0 + 2 * others,
                     ledger_run_state=True, ledger_runnable_cores=2.0, ledger_metric="itl",
                     ledger_causes=(("decode:waiting", 0.96), ("decode:running", 0.04))))
    assert v.classes[0] == cls, v


def test_a_pair_the_counters_cannot_tell_apart_is_settled_by_the_run_state() -> None:
    """cpu_compute and cpu_contention both barely past threshold: inconclusive on the
    counters alone, named by the ledger where the run-state grid split it."""
    from tests.test_attribution import WEAK_CPU_PAIR

    causes = (("decode:running", 0.7), ("decode:waiting", 0.3))
    unsplit = classify(sig(**WEAK_CPU_PAIR, ledger_metric="itl", ledger_run_state=False,
                           ledger_causes=causes))
    assert unsplit.inconclusive and set(unsplit.classes) == {"cpu_compute", "cpu_contention"}
    split = classify(sig(**WEAK_CPU_PAIR, ledger_metric="itl", ledger_run_state=True,
                         ledger_causes=causes))
    assert not split.inconclusive and split.classes == ("cpu_compute", "cpu_contention")
    assert any("the run-state grid settles it, decode compute, 70%" in n for n in split.notes)


@pytest.mark.parametrize(("others", "beside"), [(0.24, False), (0.25, True)])
def test_a_foreign_loop_on_the_only_allowed_cpu_stands_beside_its_own_threads(others, beside):
    """Two threads pinned to one CPU that a foreign loop also runs on (the fault suite's
    ``pinned_hog``): the threads' waiting is both their own (cpu_limited) and the loop's
    (cpu_contention), so the other waiting class is named beside the first once its rule
    fires (``other_cpu_frac`` of the allowed CPU), though the ledger booked the waiting
    to one of them."""
    assert value("other_cpu_frac") == 0.25
    v = classify(sig(n_cores=2, server_allowed_cpus=1.0, server_allowance_by="affinity 0 (1 CPU)",
                     server_runnable_cores=2.0, ledger_runnable_cores=2.0,
                     allowed_cpus_other_cores=others, server_cpu_cores=0.75,
                     host_busy_cores=0.75 + others, runq_delay_per_cpu_s=1.0,
                     ctx_involuntary_per_cpu_s=300.0, ledger_run_state=True, ledger_metric="itl",
                     ledger_causes=(("decode:waiting", 0.9), ("decode:running", 0.1))))
    assert v.classes[0] == "cpu_limited", v
    assert ("cpu_contention" in v.classes) is beside, v


@pytest.mark.parametrize("read_bytes_s", [3.9e6, 4e6])
def test_page_faults_past_threshold_stand_beside_compute_though_d_state_was_small(
        read_bytes_s) -> None:
    """The fault suite's page-out arm: the server rereads its weights at 93 MB/s and the
    case is ~16% slower, but its threads sat in D for 2.7% of TPOT/ITL (the fault's own
    kernel work is booked as running). The grid's small share does not rule the I/O out:
    past ``read_bytes_s`` it is named beside the first class, and not just under it."""
    assert value("read_bytes_s") == 4e6
    v = classify(sig(ledger_metric="itl", ledger_run_state=True, read_bytes_s=read_bytes_s,
                     ledger_causes=(("decode:running", 0.74), ("decode:waiting", 0.2),
                                    ("decode:io", 0.027), ("stall:sleeping", 0.023))))
    assert v.classes[0] == "cpu_compute"
    assert ("io_page_faults" in v.classes) is (read_bytes_s >= 4e6), v


@pytest.mark.parametrize("client_bound", [False, True])
def test_decode_stalls_asleep_behind_a_client_that_fell_behind_are_the_clients(
        client_bound) -> None:
    """The fault suite's client_bound arm: the server sat asleep in two thirds of its
    decode gaps, holding tokens for a reader that did not read. With the client's own
    check saying it fell behind, those stalls are the client's (first class); without
    it, a server asleep mid-decode is a stall of its own."""
    v = classify(sig(client_bound=client_bound, ledger_metric="itl", ledger_run_state=True,
                     ledger_causes=(("stall:sleeping", 0.67), ("decode:running", 0.3),
                                    ("outside:delivery", 0.03))))
    assert v.classes[0] == ("client_bound" if client_bound else "server_stalled"), v

"""The server's CPU allowance in the verdict (issue 30 items 2 and 4): the window's
signals from the allowance collector's samples, every CPU rule measured against the
allowance, ``cpu_limited`` when the server's runnable threads exceed it (the allowance
and what to change in its evidence), and ``cpu_contention`` naming the processes.

The samples are the collector's as a window summarizes them (``HwStat`` rows, the shapes
tests/test_agent_allowance.py records from a real agent); the numbers are those of the
fault suite's arms on the 2-core VM (two compute threads on one CPU: ~2.0 runnable, 1.0
running; a hog on the server's only CPU: ~0.5 each).
"""

from __future__ import annotations

import dataclasses

import pytest

from strata_plugin.analysis import signals
from strata_plugin.analysis.rules import classify
from strata_plugin.analysis.timeline import HwStat
from tests.test_attribution import CPU_CLEAN

NODE = "local"
HOG_CMD = "python -m strata_plugin.testing.faults hog --parent 41 --max-s 300"


def gauge(device: str, metric: str, lo: float, hi: float | None = None,
          source: str = "allowance") -> HwStat:
    hi = lo if hi is None else hi
    return HwStat("w", NODE, source, device, metric, "gauge", 4, 1.0, mean=(lo + hi) / 2,
                  min=lo, max=hi)


def counter(device: str, metric: str, rate: float, duration_s: float = 4.0,
            source: str = "allowance") -> HwStat:
    return HwStat("w", NODE, source, device, metric, "counter", 8, 1.0, mean=rate,
                  delta=rate * duration_s, rate=rate)


def server_proc(cores: float) -> list[HwStat]:
    return [counter("", "cpu_user_s", cores, source="proc"),
            counter("", "cpu_system_s", 0.0, source="proc")]


def per_core(*busy: float) -> list[HwStat]:
    return [counter(f"cpu{i}", "busy_s", b, source="cpu") for i, b in enumerate(busy)] + [
        counter("", "busy_s", sum(busy), source="cpu")]


def runstate(run: float, wait: float, throttled: float | None = None) -> list[HwStat]:
    rows = [counter("", "run_s", run, source="runstate"),
            counter("", "wait_s", wait, source="runstate")]
    if throttled is not None:
        rows.append(counter("", "throttled_s", throttled, source="runstate"))
    return rows


def sig(rows: list[HwStat], duration_s: float = 4.0) -> dict:
    view = signals.HwView(rows)
    proc = signals._host_signals(view, NODE)
    return signals._allowance_signals(view, NODE, duration_s, proc["server_cpu_cores"],
                                      proc["path_cpu_cores"])


# --- the window's signals --------------------------------------------------------------


def test_a_cpuset_cut_names_the_cpuset_and_counts_the_runnable_threads():
    """A cpuset of CPU 1 (which sets the masks too): 1 allowed CPU, by the cpuset."""
    rows = [gauge("", "allowed_cpus", 1.0), gauge("cpuset 1", "cpuset_cpus", 1),
            gauge("affinity 1", "affinity_cpus", 1), *server_proc(1.0), *per_core(0.3, 1.0),
            *runstate(1.0, 1.0)]
    s = sig(rows)
    assert s["server_allowed_cpus"] == 1.0
    assert s["server_allowance_by"] == "cpuset 1 (1 CPU)"
    assert s["server_runnable_cores"] == 2.0 and s["server_run_cores"] == 1.0
    # CPU 1 was busy 1.0, all of it the server's
    assert s["allowed_cpus_other_cores"] == 0.0


def test_a_mask_changed_mid_window_is_the_least_and_the_affinity_names_it():
    rows = [gauge("", "allowed_cpus", 1.0, 2.0), gauge("cpuset 0-1", "cpuset_cpus", 2),
            gauge("affinity 0-1", "affinity_cpus", 2), gauge("affinity 1", "affinity_cpus", 1)]
    assert signals.allowance(signals.HwView(rows), NODE) == (
        1.0, "affinity 1 (1 CPU)", frozenset({1}))


def test_the_quota_names_it_where_it_binds_and_throttled_time_is_runnable():
    rows = [gauge("", "allowed_cpus", 0.5), gauge("", "quota_cores", 0.5),
            gauge("cpuset 0-1", "cpuset_cpus", 2), gauge("affinity 0-1", "affinity_cpus", 2),
            *server_proc(0.5), *runstate(0.5, 0.1, throttled=1.2)]
    s = sig(rows)
    assert (s["server_allowed_cpus"], s["server_allowance_by"]) == (0.5, "CFS quota 0.5 CPU")
    assert abs(s["server_runnable_cores"] - 1.8) < 1e-9
    assert s["allowed_cpus_other_cores"] is None  # a quota limits time, not CPUs


def test_without_allowance_samples_nothing_is_made_up():
    s = sig([*server_proc(1.0), *per_core(0.5, 0.6)])
    assert s["server_allowed_cpus"] is None and s["server_allowance_by"] == ""
    assert s["allowed_cpus_other_cores"] is None and s["other_processes"] == ()
    assert s["server_runnable_cores"] is None


def test_other_processes_are_named_busiest_first_without_the_path():
    rows = [counter(f"pid4242 {HOG_CMD}", "cpu_s", 0.5),
            gauge(f"pid4242 {HOG_CMD}", "strata_own", 0),
            counter("pid77 pytest cases/test_faults.py", "cpu_s", 0.12),
            gauge("pid77 pytest cases/test_faults.py", "strata_own", 1),
            counter("pid90 relay --delay-ms 10", "cpu_s", 0.3),
            counter("pid90", "cpu_user_s", 0.3, source="path"),  # a proxy on the way
            counter("pid5 [ksoftirqd/1]", "cpu_s", 0.0)]
    assert signals.other_processes(signals.HwView(rows), NODE, 4.0) == (
        (4242, HOG_CMD, 0.5, False), (77, "pytest cases/test_faults.py", 0.12, True))


def test_a_process_on_the_servers_cpus_is_named_before_a_busier_one_elsewhere():
    rows = [counter("pid10 cc1plus big.cc", "cpu_s", 0.9),
            gauge("pid10 cc1plus big.cc", "allowed_share", 0.0),
            counter(f"pid4242 {HOG_CMD}", "cpu_s", 0.4),
            gauge(f"pid4242 {HOG_CMD}", "allowed_share", 1.0),
            counter("pid11 make -j2", "cpu_s", 0.5),
            gauge("pid11 make -j2", "allowed_share", 0.5)]
    assert [p[0] for p in signals.other_processes(signals.HwView(rows), NODE, 4.0)] == [
        4242, 11, 10]


def test_a_parent_is_named_with_the_cpu_of_the_children_it_reaped():
    """A shell loop starting short-lived tools: its own CPU is ~0, its reaped children's
    (children_cpu_s) 0.5 core; it is named with 0.5 core, before a process of 0.4 core
    of its own, and the sum is the two series' growth, each counted once."""
    loop = "pid300 bash -c while true; do date >/dev/null; done"
    rows = [counter(loop, "cpu_s", 0.001), counter(loop, "children_cpu_s", 0.5),
            counter("pid11 make -j2", "cpu_s", 0.4),
            counter("pid11 make -j2", "children_cpu_s", 0.0)]
    assert signals.other_processes(signals.HwView(rows), NODE, 4.0) == (
        (300, loop[7:], 0.501, False), (11, "make -j2", 0.4, False))
    # an older run, cpu_s alone: the process's own CPU, as before
    assert signals.other_processes(signals.HwView([rows[0], rows[2]]), NODE, 4.0) == (
        (11, "make -j2", 0.4, False), (300, loop[7:], 0.001, False))


def test_others_on_the_allowed_cpus_are_those_cpus_busy_time_less_the_servers():
    """A hog on the server's only CPU (1): that CPU busy 1.0, the server 0.5 of it."""
    rows = [gauge("", "allowed_cpus", 1.0), gauge("affinity 1", "affinity_cpus", 1),
            gauge("cpuset 0-1", "cpuset_cpus", 2), *server_proc(0.5), *per_core(0.2, 1.0)]
    assert sig(rows)["allowed_cpus_other_cores"] == 0.5


# --- the verdict ----------------------------------------------------------------------------


ONE_CPU = dict(server_allowed_cpus=1.0, server_allowance_by="cpuset 0 (1 CPU)",
               server_threads=15, n_cores=2, host_busy_cores=1.1, allowed_cpus_other_cores=0.0)


def test_two_runnable_threads_on_one_allowed_cpu_are_cpu_limited_with_what_to_change():
    """The issue's case: 2 busy threads on 1 allowed CPU, an idle host (1 of its 2 cores
    idle), run-queue delay past threshold: cpu_limited named first, its evidence stating
    the allowance and what to change."""
    s = dataclasses.replace(CPU_CLEAN, **ONE_CPU, server_cpu_cores=1.0,
                            server_runnable_cores=2.0, server_run_cores=1.0,
                            runq_delay_per_cpu_s=1.01, ctx_involuntary_per_cpu_s=263.0)
    v = classify(s)
    assert v.classes[0] == "cpu_limited", v
    assert "headroom" not in v.classes and "cpu_contention" not in v.past_threshold
    ev = next(e for e in v.evidence if e.cls == "cpu_limited" and e.met)
    assert ev.metric == "runnable_threads_over_allowed_cpus" and ev.value == 1.0
    assert ev.detail.startswith("2.0 runnable threads on 1 allowed CPU (cpuset 0)"), ev.detail
    assert "a wider cpuset" in ev.detail and "at most 1 compute thread " in ev.detail
    # and the compute against the allowance, not the host's 2 cores
    comp = next(e for e in v.evidence if e.cls == "cpu_compute" and e.met)
    assert comp.threshold_value == 0.85 and "1.00 cores on 1 allowed CPU" in comp.detail


def test_a_server_whose_threads_fit_its_cpus_is_not_cpu_limited():
    s = dataclasses.replace(CPU_CLEAN, **{**ONE_CPU, "server_allowed_cpus": 2.0,
                                          "server_allowance_by": "affinity 0-1 (2 CPUs)"},
                            server_cpu_cores=1.9, server_runnable_cores=2.2)
    v = classify(s)
    assert "cpu_limited" not in v.past_threshold, v
    assert v.classes[0] == "cpu_compute"
    assert next(e for e in v.evidence if e.cls == "cpu_compute" and e.met).detail == (
        "1.90 cores on 2 allowed CPUs (affinity 0-1)")


def test_the_compute_rule_measures_against_the_allowance_not_the_host():
    """1.0 core used: under 0.85 x min(8 threads, 8 cores) on the host, past 0.85 x 1 on
    an allowance of one CPU."""
    base = dataclasses.replace(CPU_CLEAN, server_cpu_cores=1.0, host_busy_cores=1.1)
    assert "cpu_compute" not in classify(base).past_threshold
    cut = classify(dataclasses.replace(base, server_allowed_cpus=1.0,
                                       server_allowance_by="affinity 7 (1 CPU)"))
    assert "cpu_compute" in cut.past_threshold


def test_contention_on_the_only_allowed_cpu_names_the_processes():
    """A hog on the server's one allowed CPU of an 8-core host that is otherwise idle:
    host-wide, others hold 0.06 of the cores (under 0.25); on the allowance, half of it."""
    others = ((4242, HOG_CMD, 0.5, False), (77, "pytest cases/test_faults.py", 0.12, True))
    s = dataclasses.replace(CPU_CLEAN, **{**ONE_CPU, "n_cores": 8, "host_busy_cores": 1.0,
                                          "allowed_cpus_other_cores": 0.5},
                            server_cpu_cores=0.5,
                            runq_delay_per_cpu_s=1.2, ctx_involuntary_per_cpu_s=300.0,
                            other_processes=others, server_runnable_cores=1.0)
    v = classify(s)
    assert "cpu_contention" in v.classes, v
    ev = next(e for e in v.evidence if e.cls == "cpu_contention"
              and e.threshold == "other_cpu_frac")
    assert ev.met and ev.metric == "other_processes_allowed_cpus_frac" and ev.value == 0.5
    assert ev.detail == (
        f"other processes: pid 4242 {HOG_CMD} 0.50 cores (not Strata's); pid 77 pytest "
        "cases/test_faults.py 0.12 cores (Strata's own); named: 0.62 cores, all of the 0.50 "
        "other work held host-wide; the server: 1 allowed CPU (cpuset 0)")
    # without the allowance the same host reads as not crowded (0.5 / 8 cores)
    host = classify(dataclasses.replace(s, server_allowed_cpus=None, allowed_cpus_other_cores=None,
                                        server_allowance_by=""))
    assert "cpu_contention" not in host.past_threshold


def test_contention_says_how_much_of_the_others_cpu_its_names_cover():
    """A window where the harness and the agent are named, 0.17 cores between them, while
    the host's counters leave 0.55 cores beside the server: the verdict says the names
    cover 0.17 of the 0.55, not that they were all of it."""
    named = ((501, "pytest cases/", 0.13, True), (502, "python -m strata_plugin.agent", 0.04,
                                                   True))
    s = dataclasses.replace(CPU_CLEAN, n_cores=2, host_busy_cores=1.75, server_cpu_cores=1.2,
                            path_cpu_cores=None, runq_delay_per_cpu_s=1.2,
                            ctx_involuntary_per_cpu_s=300.0, other_processes=named,
                            ledger_run_state=True, ledger_runnable_cores=2.0,
                            ledger_metric="itl", ledger_causes=(("decode:waiting", 0.7),
                                                                ("decode:running", 0.3)))
    v = classify(s)
    assert v.classes[0] == "cpu_contention", v
    line = next(n for n in v.notes if n.startswith("other processes on the CPUs: "))
    assert line.endswith("; named: 0.17 of the 0.55 cores other work held host-wide"), line
    ev = next(e for e in v.evidence if e.cls == "cpu_contention"
              and e.threshold == "other_cpu_frac")
    assert "; named: 0.17 of the 0.55 cores other work held host-wide; the server: " in (
        ev.detail or ""), ev.detail


@pytest.mark.parametrize(("rate", "says"), [
    (412.4, "; 412 process starts/s; the server: "),
    (9.94, "; 9.9 process starts/s; the server: "),  # just under ten: a decimal kept
    (9.96, "; 10 process starts/s; the server: "),
])
def test_contention_states_the_hosts_process_start_rate_where_sampled(rate, says):
    """cpu:forks' rate beside the named processes: children too short-lived to be named
    themselves, in the evidence and in the verdict's note of the actors."""
    rows = [counter("", "forks", rate, source="cpu"), counter("pid9 make", "cpu_s", 0.3)]
    assert sig(rows)["host_process_starts_per_s"] == pytest.approx(rate)
    procs = ((9, "make", 0.3, False),)
    s = dataclasses.replace(CPU_CLEAN, n_cores=2, host_busy_cores=1.75, server_cpu_cores=1.2,
                            path_cpu_cores=None, runq_delay_per_cpu_s=1.2,
                            ctx_involuntary_per_cpu_s=300.0, other_processes=procs,
                            host_process_starts_per_s=rate, ledger_run_state=True,
                            ledger_runnable_cores=2.0, ledger_metric="itl",
                            ledger_causes=(("decode:waiting", 0.7), ("decode:running", 0.3)))
    assert says in _named_words(s)
    note = next(n for n in classify(s).notes if n.startswith("other processes on the CPUs"))
    assert note.endswith(says.split("; the server")[0]), note
    # a run recorded before forks: no rate, no words
    assert sig(rows[1:])["host_process_starts_per_s"] is None
    assert "process starts" not in _named_words(
        dataclasses.replace(s, host_process_starts_per_s=None))


def _named_words(s) -> str:
    return next(e.detail for e in classify(s).evidence
                if e.cls == "cpu_contention" and e.threshold == "other_cpu_frac")


@pytest.mark.parametrize(("third", "path", "says"), [
    (0.37, None, "named: 0.54 of the 0.55 cores"),  # just short of all of it
    (0.38, None, "named: all 0.55 cores"),
    (0.50, None, "named: 0.67 cores, all of the 0.55"),  # the two counters read apart
    (0.0, 0.10, "named: 0.17 of the 0.45 cores"),  # the proxies on the way are the path's
    (0.28, 0.10, "named: all 0.45 cores"),
])
def test_the_named_share_just_short_of_all_and_past_it(third, path, says):
    procs = ((501, "pytest cases/", 0.13, True), (502, "agent", 0.04, True))
    if third:
        procs += ((9, "kworker/0:1", third, False),)
    s = dataclasses.replace(CPU_CLEAN, n_cores=2, host_busy_cores=1.75, server_cpu_cores=1.2,
                            path_cpu_cores=path, other_processes=procs,
                            runq_delay_per_cpu_s=1.2, ctx_involuntary_per_cpu_s=300.0)
    assert f"; {says} other work held host-wide; the server: " in _named_words(s)


def test_contention_on_steal_alone_does_not_name_a_share_of_nothing():
    s = dataclasses.replace(CPU_CLEAN, n_cores=2, host_busy_cores=1.2, server_cpu_cores=1.2,
                            path_cpu_cores=None, steal_frac=0.2,
                            other_processes=((9, "kworker/0:1", 0.02, False),))
    words = _named_words(s)
    assert "the host's CPU counters left no time beside the server's" in words, words
    assert "named:" not in words


def test_the_named_actors_reach_the_report_and_the_deciding_line():
    from strata_plugin.report.markdown import _deciding, verdict_md

    s = dataclasses.replace(CPU_CLEAN, **ONE_CPU, server_cpu_cores=1.0,
                            server_runnable_cores=2.0)
    v = classify(s)
    text = verdict_md(v)
    assert "- `cpu_limited`: 2.0 runnable threads on 1 allowed CPU (cpuset 0)" in text
    assert "(2.0 runnable threads on 1 allowed CPU (cpuset 0)" in _deciding(v)


# --- a stall names its state and the threads ------------------------------------------------


def test_a_stall_names_the_freezer_or_the_stopped_threads_from_the_runstate_samples():
    frozen = sig([gauge("", "frozen", 0.0, 1.0, source="runstate"),
                  gauge("", "threads", 15.0, source="runstate"),
                  gauge("", "state_T", 0.0, source="runstate")])
    # the gauge's mean over the window's samples: a third of them frozen
    frozen_rows = [HwStat("w", NODE, "runstate", "", "frozen", "gauge", 30, 1.0, mean=1 / 3,
                          min=0.0, max=1.0),
                   HwStat("w", NODE, "runstate", "", "threads", "gauge", 30, 1.0, mean=15.0,
                          min=15.0, max=15.0),
                   HwStat("w", NODE, "runstate", "", "state_T", "gauge", 30, 1.0, mean=5.0,
                          min=0.0, max=15.0)]
    s = sig(frozen_rows)
    assert abs(s["server_frozen_frac"] - 1 / 3) < 1e-9
    assert abs(s["server_stopped_frac"] - 1 / 3) < 1e-9
    assert frozen["server_frozen_frac"] == 0.5
    base = dataclasses.replace(CPU_CLEAN, server_stalled_frac=0.3, server_threads=15)
    v = classify(dataclasses.replace(base, server_frozen_frac=1 / 3, server_stopped_frac=0.0))
    ev = next(e for e in v.evidence if e.cls == "server_stalled" and e.met)
    assert ev.detail == "frozen by its cgroup freezer in 33% of the window's samples (15 threads)"
    v = classify(dataclasses.replace(base, server_frozen_frac=0.0, server_stopped_frac=0.31))
    ev = next(e for e in v.evidence if e.cls == "server_stalled" and e.met)
    assert ev.detail == ("stopped (state T: SIGSTOP or a tracer) in 31% of its threads' samples "
                         "(15 threads)")
    v = classify(dataclasses.replace(base, server_frozen_frac=0.0, server_stopped_frac=0.0))
    ev = next(e for e in v.evidence if e.cls == "server_stalled" and e.met)
    assert ev.detail.startswith("neither frozen nor stopped")
    # without the runstate samples, nothing is made up
    assert next(e for e in classify(base).evidence if e.cls == "server_stalled").detail == ""


def test_the_share_of_the_allowed_cpus_is_at_most_all_of_them():
    """Found by test_attribution's random windows on CI: others' 1.0 core over an
    allowance of 2.2e-313 CPUs was an infinite share in the evidence. No sampled cpuset
    is that small, but the share is of CPUs the server may use: at most all of them."""
    s = dataclasses.replace(CPU_CLEAN, allowed_cpus_other_cores=1.0,
                            server_allowed_cpus=2.2250738585e-313, steal_frac=1.0)
    ev = [e for e in classify(s).evidence if e.metric == "other_processes_allowed_cpus_frac"]
    assert ev and ev[0].value == 1.0, ev
    # an allowance of one CPU that others held 0.4 of: the share as it was
    one = dataclasses.replace(s, server_allowed_cpus=1.0, allowed_cpus_other_cores=0.4)
    assert next(e.value for e in classify(one).evidence
                if e.metric == "other_processes_allowed_cpus_frac") == 0.4


# --- the weights: the server's cgroup weight and nice beside its competitors' (issue 42) --


def test_the_weights_are_read_from_the_collectors_samples():
    """The server's cgroup weight (the least, where it moved mid-window), its threads'
    nice range, and each named process's nice and group weight, by PID."""
    rows = [gauge("cpu.shares /batch", "cpu_weight", 256),
            gauge("cpu.shares /x", "cpu_weight", 512),
            gauge("", "nice_min", 0), gauge("", "nice_max", 5),
            gauge(f"pid4242 {HOG_CMD}", "nice", -5),
            gauge("pid4242 cpu.shares /", "cpu_weight", 1024),
            gauge("pid77 pytest", "nice", 0)]
    w = signals.cpu_weights(signals.HwView(rows), NODE)
    assert w["server_cpu_weight"] == ("cpu.shares", 256, "/batch")
    assert w["server_nice"] == (0, 5)
    assert w["other_weights"] == ((77, 0, None), (4242, -5, ("cpu.shares", 1024, "/")))
    none = signals.cpu_weights(signals.HwView([]), NODE)
    assert none == dict(server_cpu_weight=None, server_nice=None, other_weights=())


#: the server's cgroup weighs a quarter of its neighbour's (the issue's case)
WEIGHED = dict(server_cpu_weight=("cpu.shares", 256.0, "/batch"), server_nice=(0.0, 0.0))


def _contended(**kw) -> object:
    others = ((4242, HOG_CMD, 0.75, False),)
    s = dataclasses.replace(CPU_CLEAN, **{**ONE_CPU, "n_cores": 8, "host_busy_cores": 1.0,
                                          "allowed_cpus_other_cores": 0.75},
                            server_cpu_cores=0.25, runq_delay_per_cpu_s=3.0,
                            ctx_involuntary_per_cpu_s=300.0, other_processes=others,
                            server_runnable_cores=1.0, **kw)
    v = classify(s)
    return next(e for e in v.evidence if e.cls == "cpu_contention"
                and e.threshold == "other_cpu_frac")


def test_contention_names_the_weights_where_they_differ():
    """The server's cgroup weighs a quarter of its neighbour's: both weights are in
    cpu_contention's evidence, and the server's (with its nice) in the allowance line."""
    ev = _contended(**WEIGHED, other_weights=((4242, 0.0, ("cpu.shares", 1024.0, "/")),))
    assert ev.met, ev
    assert ev.detail == (
        f"other processes: pid 4242 {HOG_CMD} 0.75 cores (not Strata's; cpu.shares 1024 (/) "
        "against the server's 256 (/batch)); named: all 0.75 cores other work held "
        "host-wide; the server: 1 allowed CPU (cpuset 0); weight cpu.shares 256 (/batch), "
        "nice 0")


def test_a_neighbours_nice_is_named_only_where_it_differs():
    same = _contended(**WEIGHED, other_weights=((4242, 0.0, ("cpu.shares", 256.0, "/batch")),))
    assert "against the server's" not in same.detail, same.detail
    nicer = _contended(**WEIGHED, other_weights=((4242, -5.0, ("cpu.shares", 256.0, "/batch")),))
    assert "(not Strata's; nice -5 against the server's 0)" in nicer.detail, nicer.detail
    # unobserved: the line is as before, nothing made up
    bare = _contended()
    assert "weight" not in bare.detail and "nice" not in bare.detail, bare.detail

"""Every cause past threshold is reported, each marked host background (past threshold in
the idle baseline too) or appeared with the load.

On a real host other users' work is there before the case starts; a verdict that shows
only two slots hid the fault the user came for behind it.
"""

from __future__ import annotations

import dataclasses

from bundle_factory import CaseSpec, RunSpec, make_run

from strata_plugin.analysis.case_summary import analyze_run, summarize_case
from strata_plugin.analysis.rules import classify
from tests.test_attribution import CPU_CLEAN, v

#: hypervisor steal on the host all along: before the load and during it
STEAL = dict(steal_frac=0.1)


def test_every_class_past_threshold_keeps_its_evidence():
    verdict = v(CPU_CLEAN, steal_frac=0.1, mem_available_frac=0.04, major_faults_per_s=50.0,
                waiting_mean=4.0)
    assert len(verdict.past_threshold) >= 4, verdict
    for cls in verdict.past_threshold:
        assert any(e.cls == cls and e.met for e in verdict.evidence), cls


def _run(tmp_path):
    cases = [
        CaseSpec("fault", behaviour=dict(server_cores=1.0, mem_available_frac=0.04, **STEAL)),
        CaseSpec("clean", behaviour=dict(server_cores=1.0, **STEAL)),
    ]
    return make_run(tmp_path, RunSpec(cases=cases, baseline_behaviour=dict(STEAL)))


def test_host_background_and_what_came_with_the_load_are_told_apart(tmp_path):
    run = _run(tmp_path)
    for get in (lambda cid: summarize_case(run, cid).verdict,
                lambda cid: {a.case_id: a for a in analyze_run(run).analyses}[cid].verdict):
        fault = get("fault")
        assert {"cpu_contention", "memory_pressure"} <= set(fault.past_threshold), fault
        assert fault.background == ("cpu_contention",), fault
        assert "memory_pressure" in fault.appeared_with_load
        assert fault.classes[0] == "memory_pressure", fault  # the load's class leads
        clean = get("clean")
        assert clean.background == ("cpu_contention",) and not clean.appeared_with_load


def test_without_a_baseline_nothing_is_called_background():
    assert classify(CPU_CLEAN).background == ()


def test_host_background_ranks_after_what_came_with_the_load():
    """A busy host's standing contention, there in the idle baseline, ties with the fault
    and wins the tie by class order; with a serving symptom beside them the fault was
    ranked third, out of the named two. Marked background, it ranks after the fault."""
    kw = dict(CROWDED_HOST, mem_available_frac=0.04, prefill_stall_frac=0.4,
              prefill_stall_share=0.9, concurrency=2)
    plain = v(CPU_CLEAN, **kw)
    assert plain.classes == ("cpu_contention", "prefill_decode_interference"), plain
    assert "memory_pressure" in plain.also_flagged
    marked = classify(dataclasses.replace(CPU_CLEAN, **kw), {"cpu_contention"})
    assert marked.classes == ("memory_pressure", "prefill_decode_interference"), marked
    assert marked.background == ("cpu_contention",) and "cpu_contention" in marked.also_flagged


#: other processes on most of the cores, the server's threads waiting for them
CROWDED_HOST = dict(host_busy_cores=6.0, runq_delay_per_cpu_s=0.6, ctx_involuntary_per_cpu_s=300.0)

"""Every cause past threshold is reported, each marked present before the run (past
threshold in the idle baseline too) or appeared with the load (issue 42, item 3).

On a real host other users' work is there before the case starts. Being there before
the run is a fact about the host, stated beside the class; it never lowers its rank: a
co-tenant that runs all the time is the most common form of contention there is, and is
the case's cause where it takes the largest share of the case's metric. A class the
baseline shows that the case's ledger does not feel is said as such.
"""

from __future__ import annotations

import dataclasses

import pytest
from bundle_factory import CaseSpec, RunSpec, make_run

from strata_plugin.analysis.case_summary import analyze_run, summarize_case
from strata_plugin.analysis.rules import classify
from strata_plugin.analysis.thresholds import value
from tests.test_attribution import CPU_CLEAN, v

#: hypervisor steal on the host all along: before the load and during it
STEAL = dict(steal_frac=0.1)
#: other processes on most of the cores, the server's threads waiting for them
CROWDED_HOST = dict(host_busy_cores=6.0, runq_delay_per_cpu_s=0.6, ctx_involuntary_per_cpu_s=300.0)


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
    for get in (lambda cid: summarize_case(run, cid),
                lambda cid: {a.case_id: a for a in analyze_run(run).analyses}[cid]):
        fault = get("fault")
        fv = fault.verdict
        assert {"cpu_contention", "memory_pressure"} <= set(fv.past_threshold), fv
        assert fv.background == ("cpu_contention",), fv
        assert "memory_pressure" in fv.appeared_with_load
        # ranked by the case's own figures, as without a baseline
        assert fv.classes == classify(fault.signals).classes, fv
        clean = get("clean").verdict
        assert clean.background == ("cpu_contention",) and not clean.appeared_with_load
        assert clean.baseline_unfelt == ()


def test_without_a_baseline_nothing_is_called_background():
    v0 = classify(CPU_CLEAN)
    assert v0.background == () and v0.baseline_unfelt == ()


def test_a_class_in_the_idle_baseline_keeps_its_rank():
    """A busy host's standing contention, there in the idle baseline, ties with a fault
    and wins the tie by class order: marked, it keeps the first slot (before, it was
    ranked after every class that appeared with the load)."""
    kw = dict(CROWDED_HOST, mem_available_frac=0.04, prefill_stall_frac=0.4,
              prefill_stall_share=0.9, concurrency=2)
    plain = v(CPU_CLEAN, **kw)
    assert plain.classes == ("cpu_contention", "prefill_decode_interference"), plain
    marked = classify(dataclasses.replace(CPU_CLEAN, **kw), {"cpu_contention"})
    assert marked.classes == plain.classes and marked.also_flagged == plain.also_flagged
    assert marked.background == ("cpu_contention",), marked


#: a decode case on a crowded host, its ledger split by the run-state grid
LEDGER = dict(CROWDED_HOST, ledger_metric="itl", ledger_run_state=True,
              ledger_run_cores=1.0, ledger_runnable_cores=1.8)


def _waiting(share: float) -> dict:
    return dict(LEDGER, ledger_causes=(("decode:running", 1.0 - share),
                                       ("decode:waiting", share)))


def test_a_co_tenant_there_before_the_run_is_first_where_it_takes_the_largest_share():
    """The issue's neighbour: other processes there in the baseline, the server's threads
    waiting for them 60% of TPOT/ITL: cpu_contention first, said present before the run."""
    verdict = classify(dataclasses.replace(CPU_CLEAN, **_waiting(0.6)),
                       {"cpu_contention", "memory_pressure"})
    assert verdict.classes[0] == "cpu_contention", verdict
    assert verdict.background == ("cpu_contention",)
    # the baseline's memory pressure: not past threshold in the case, not felt by it
    assert verdict.baseline_unfelt == ("memory_pressure",)


@pytest.mark.parametrize(("step", "felt"), [(0.98, False), (1.0, True)])
def test_a_baseline_class_the_ledger_does_not_feel_is_said_so(step: float, felt: bool):
    """Contention past its rule's threshold in the baseline and in the case, but the
    server's threads waited just under / at ``ledger_second_min_share`` of the metric:
    under it, the case's ledger does not feel it and the verdict says so instead."""
    share = step * value("ledger_second_min_share")
    verdict = classify(dataclasses.replace(CPU_CLEAN, **_waiting(share)), {"cpu_contention"})
    assert "cpu_contention" in verdict.past_threshold, verdict
    assert (verdict.background == ("cpu_contention",)) is felt, verdict
    assert (verdict.baseline_unfelt == ("cpu_contention",)) is not felt, verdict


def test_the_report_states_the_baseline_beside_the_verdict():
    from strata_plugin.report.markdown import verdict_md

    felt = classify(dataclasses.replace(CPU_CLEAN, **_waiting(0.6)),
                    {"cpu_contention", "memory_pressure"})
    text = verdict_md(felt)
    assert "Present before the run (past threshold in the idle baseline too" in text
    assert "In the idle baseline, not felt by this case" in text and "memory_pressure" in text
    assert "Host background" not in text


"""A report read in a minute: the summary first, then the A/B groups, details collapsed;
finer traces only for classes in question; one verdict per case, recorded once."""

from __future__ import annotations

import dataclasses
import json

import pytest
from bundle_factory import cpu_run

from strata_plugin.analysis.rules import TRACE_NET, classify
from strata_plugin.report import write_report
from tests.test_attribution import CPU_CLEAN


@pytest.mark.integration
def test_summary_first_then_ab_then_collapsed_details(tmp_path):
    run = cpu_run(tmp_path)
    write_report(run)
    text = (run / "report.md").read_text()
    order = [text.index(h) for h in ("## Summary", "## A/B comparisons", "## Limits of this run",
                                     "## Cases at a glance", "## Cases\n")]
    assert order == sorted(order)
    summary = text.split("## Summary")[1].split("## A/B comparisons")[0]
    rows = [line for line in summary.splitlines() if line.startswith("| [`")]
    assert len(rows) == 4  # one line per case
    cases = {c["case_id"]: c for c in json.loads((run / "summary.json").read_text())["cases"]}
    for row in rows:
        cid = row.split("`")[1]
        assert f"| {cases[cid]['verdict']['summary']} |" in row  # the same verdict
    treat = next(r for r in rows if "`ab_treatment`" in r)
    assert "vs control: tok/s" in treat and "TPOT p95" in treat
    assert "control (reference)" in next(r for r in rows if "`ab_control`" in r)
    # the details: each case, the servers and nodes, the thresholds, collapsed
    details = text.split("## Cases\n", 1)[1]
    assert details.count("<details><summary>") >= 4
    assert "<details><summary>Servers, nodes, versions, collectors</summary>" in text


@pytest.mark.integration
def test_a_recorded_verdict_is_the_one_reported(tmp_path):
    """The verdict written to cases.jsonl at the case's end stands in every derived file,
    with a note when the files now say otherwise."""
    run = cpu_run(tmp_path)
    write_report(run)
    before = {c["case_id"]: c["verdict"] for c in
              json.loads((run / "summary.json").read_text())["cases"]}
    lines = [json.loads(x) for x in (run / "cases.jsonl").read_text().splitlines()]
    light = next(c for c in lines if c["case_id"] == "light")
    recorded = dict(before["light"], classes=["memory_pressure"], confidence=0.9,
                    inconclusive=False)
    for k in ("summary", "confidence_label"):
        recorded.pop(k)
    with (run / "cases.jsonl").open("a") as fh:
        fh.write(json.dumps({**light, "verdict": recorded}) + "\n")
    write_report(run)
    after = {c["case_id"]: c for c in json.loads((run / "summary.json").read_text())["cases"]}
    v = after["light"]["verdict"]
    assert v["summary"] == "memory_pressure"
    assert any(n.startswith("recomputed from the files now: cpu_compute") for n in v["notes"])
    csv_row = next(x for x in (run / "case_summary.csv").read_text().splitlines()
                   if x.startswith("light,"))
    assert ",memory_pressure," in csv_row
    assert "| [`light`](#case-light) | memory_pressure |" in (run / "report.md").read_text()


def test_no_network_trace_for_a_one_node_window():
    one = classify(dataclasses.replace(CPU_CLEAN, net_util=None, multi_node=False))
    two = classify(dataclasses.replace(CPU_CLEAN, net_util=None, multi_node=True))
    assert TRACE_NET not in one.finer_trace
    assert TRACE_NET in two.finer_trace

"""``python -m strata_plugin scorecard``: fault-suite run folders scored arm by arm.

The run folders here are written by the test in the format the fault suite leaves
(cases.jsonl lines with ``fault`` / ``fault_arm`` and the recorded verdict;
fault_matrix.json with each arm's ground truth), so each number can be checked by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from strata_plugin.__main__ import main
from strata_plugin.report.scorecard import class_scores, read_run, scorecard_markdown

FAULT_CLASSES = ["cpu_contention", "cpu_limited", "io_page_faults", "memory_pressure"]


def ev(cls: str, metric: str, value: float, thr: float, met: bool = True) -> dict:
    return {"cls": cls, "metric": metric, "value": value, "op": ">=", "threshold": metric,
            "threshold_value": thr, "unit": "", "source": "", "met": met}


def case(cid: str, fault: str, arm: str, classes: list[str], also: list[str] = (),
         evidence: list[dict] = (), inconclusive: bool = False) -> dict:
    return {"case_id": cid, "fault": fault, "fault_arm": arm,
            "verdict": {"classes": classes, "also_flagged": list(also),
                        "inconclusive": inconclusive, "evidence": list(evidence)}}


def make_run(root: Path, name: str, cases: list[dict], truth: dict[str, list[str]]) -> Path:
    d = root / name
    d.mkdir()
    (d / "manifest.json").write_text("{}")
    (d / "cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases)
                                   + json.dumps({"case_id": "other", "verdict": {}}) + "\n")
    (d / "fault_matrix.json").write_text(json.dumps({
        "fault_classes": FAULT_CLASSES,
        "arms": [{"case_id": k, "truth": v} for k, v in truth.items()]}))
    return d


THROTTLED = ev("cpu_limited", "cgroup_throttled_frac", 0.99, 0.05)


@pytest.fixture()
def runs(tmp_path: Path) -> list[Path]:
    a = make_run(tmp_path, "a", [
        case("fault/cpu_limited/clean/0", "cpu_limited", "clean", ["cpu_compute"]),
        # hit: first class, evidence past threshold
        case("fault/cpu_limited/fault/0", "cpu_limited", "fault", ["cpu_limited"],
             evidence=[THROTTLED]),
        # hit, second of two; the real contention beside it happened (ground truth)
        case("fault/cpu_limited/fault/1", "cpu_limited", "fault",
             ["cpu_contention", "cpu_limited"], evidence=[THROTTLED]),
    ], {"fault/cpu_limited/clean/0": [], "fault/cpu_limited/fault/0": ["cpu_limited"],
        "fault/cpu_limited/fault/1": ["cpu_contention", "cpu_limited"]})
    b = make_run(tmp_path, "b", [
        # miss: ranked third (past threshold only), and names io_page_faults falsely
        case("fault/cpu_limited/fault/0", "cpu_limited", "fault",
             ["io_page_faults", "cpu_contention"], also=["cpu_limited"], evidence=[THROTTLED]),
        # miss: a clean arm naming a fault that did not happen
        case("fault/memory_pressure/clean/0", "memory_pressure", "clean", ["memory_pressure"]),
        # miss: named inconclusively
        case("fault/memory_pressure/fault/0", "memory_pressure", "fault",
             ["memory_pressure", "cpu_compute"], inconclusive=True,
             evidence=[ev("memory_pressure", "mem_available_frac", 0.05, 0.1)]),
    ], {"fault/cpu_limited/fault/0": ["cpu_contention", "cpu_limited"],
        "fault/memory_pressure/clean/0": [],
        "fault/memory_pressure/fault/0": ["memory_pressure"]})
    return [a, b]


def test_each_arm_is_scored_as_the_suite_judges_it(runs):
    arms = [x for r in runs for x in read_run(r)]
    got = {(a.run, a.case_id): (a.hit, a.top1, a.top3, a.false_classes) for a in arms}
    assert got == {
        ("a", "fault/cpu_limited/clean/0"): (True, False, False, ()),
        ("a", "fault/cpu_limited/fault/0"): (True, True, True, ()),
        ("a", "fault/cpu_limited/fault/1"): (True, False, True, ()),
        ("b", "fault/cpu_limited/fault/0"): (False, False, True, ("io_page_faults",)),
        ("b", "fault/memory_pressure/clean/0"): (False, False, False, ("memory_pressure",)),
        ("b", "fault/memory_pressure/fault/0"): (False, True, True, ()),
    }
    scores = {s.cls: (s.runs, s.tp, s.fn, s.fp) for s in class_scores(arms)}
    # memory_pressure: 1 arm, missed (inconclusive), one clean arm named it falsely
    assert scores == {"cpu_limited": (3, 2, 1, 0), "memory_pressure": (1, 0, 1, 1)}
    text = scorecard_markdown(arms)
    assert "Hits: 3 of 6." in text
    # top-k is about the ranking alone (the inconclusive memory_pressure arm is top-1)
    assert ("named): 2 of 4; top-3 (among the first three classes past threshold): 4 of 4"
            in text.replace("\n", " ")), text
    assert "| cpu_limited | 3 | 2 | 1 | 0 | 1.00 | 0.67 |" in text
    assert "| memory_pressure | 1 | 0 | 1 | 1 | 0.00 | 0.00 |" in text
    assert "miss (missed; false: io_page_faults)" in text


def test_the_command_prints_and_writes_it(runs, tmp_path, capsys):
    out, js = tmp_path / "card.md", tmp_path / "card.json"
    assert main(["scorecard", *map(str, runs), "-o", str(out), "--json", str(js)]) == 0
    printed = capsys.readouterr().out
    assert printed == out.read_text() and "| run | case | expected |" in printed
    doc = json.loads(js.read_text())
    assert len(doc["arms"]) == 6 and {c["cls"] for c in doc["classes"]} == {
        "cpu_limited", "memory_pressure"}


def test_a_folder_that_is_not_a_fault_run_is_a_clear_error(tmp_path, capsys):
    assert main(["scorecard", str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err
    d = tmp_path / "plain"
    d.mkdir()
    (d / "manifest.json").write_text("{}")
    (d / "cases.jsonl").write_text(json.dumps({"case_id": "decode", "verdict": {}}) + "\n")
    assert main(["scorecard", str(d)]) == 2
    assert "no case records an injected fault" in capsys.readouterr().err

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
    assert printed == out.read_text() and "| run | set | case | expected |" in printed
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


STALLED = ev("server_stalled", "stalled_share", 0.33, 0.1)
OUTSIDE = ev("outside_server", "outside_server_ttft_frac", 0.7, 0.25)


def aside(c: dict, name: str) -> dict:
    return {**c, "fault_set": "set-aside", "fault_scenario": name}


@pytest.fixture()
def split_run(tmp_path: Path) -> Path:
    """Two tuning arms and four set-aside arms, each figure countable by hand."""
    return make_run(tmp_path, "s", [
        case("fault/cpu_limited/clean/0", "cpu_limited", "clean", ["cpu_compute"]),
        case("fault/cpu_limited/fault/0", "cpu_limited", "fault", ["cpu_limited"],
             evidence=[THROTTLED]),
        # set-aside: a freezer arm named, a proxy arm missed (headroom), a clean arm
        # naming outside_server although no relay ran, a proxy arm ranked second
        aside(case("fault/freezer_pause/fault/0", "server_stalled", "fault",
                   ["server_stalled"], evidence=[STALLED]), "freezer_pause"),
        aside(case("fault/proxy_50ms/fault/0", "outside_server", "fault", ["headroom"]),
              "proxy_50ms"),
        aside(case("fault/proxy_50ms/clean/0", "outside_server", "clean",
                   ["outside_server"], evidence=[OUTSIDE]), "proxy_50ms"),
        aside(case("fault/proxy_200ms/fault/0", "outside_server", "fault",
                   ["cpu_compute", "outside_server"], evidence=[OUTSIDE]), "proxy_200ms"),
    ], {"fault/cpu_limited/clean/0": [], "fault/cpu_limited/fault/0": ["cpu_limited"],
        "fault/freezer_pause/fault/0": ["server_stalled"],
        "fault/proxy_50ms/fault/0": ["outside_server"], "fault/proxy_50ms/clean/0": [],
        "fault/proxy_200ms/fault/0": ["outside_server"]})


def test_the_tuning_and_set_aside_sets_are_scored_apart(split_run, tmp_path):
    arms = read_run(split_run)
    assert {a.case_id: a.fault_set for a in arms}["fault/proxy_50ms/clean/0"] == "set-aside"
    assert {a.scenario for a in arms if a.fault_set == "set-aside"} == {
        "freezer_pause", "proxy_50ms", "proxy_200ms"}
    text = scorecard_markdown(arms)
    tuning, aside_part = text.split("### Set-aside set")
    assert "### Tuning set" in tuning
    assert "Hits: 2 of 2." in tuning and "named): 1 of 1" in tuning.replace("\n", " ")
    # set-aside: the freezer hit and the proxy_200ms hit (second of two); the missed
    # proxy arm and the clean arm that named outside_server falsely are misses
    assert "Hits: 2 of 4." in aside_part
    assert ("named): 1 of 3; top-3 (among the first three classes past threshold): 2 of 3"
            in aside_part.replace("\n", " ")), aside_part
    assert "| outside_server | 2 | 1 | 1 | 1 | 0.50 | 0.50 |" in aside_part
    assert "| server_stalled | 1 | 1 | 0 | 0 | 1.00 | 1.00 |" in aside_part
    assert "cpu_limited" not in aside_part.split("| run | set |")[0]  # no tuning rows in it
    js = tmp_path / "card.json"
    assert main(["scorecard", str(split_run), "--json", str(js)]) == 0
    sets = json.loads(js.read_text())["sets"]
    assert {k: (v["arms"], v["hits"], v["fault_arms"], v["top1"], v["top3"])
            for k, v in sets.items()} == {"tuning": (2, 2, 1, 1, 1),
                                         "set-aside": (4, 2, 3, 1, 2)}


def test_a_run_from_before_the_split_is_all_tuning(runs):
    text = scorecard_markdown([x for r in runs for x in read_run(r)])
    assert "### " not in text and "| a | tuning | fault/cpu_limited/clean/0 |" in text


def test_an_unknown_fault_set_is_a_clear_error(tmp_path, capsys):
    d = make_run(tmp_path, "bad", [
        {**case("fault/x/fault/0", "cpu_limited", "fault", ["cpu_limited"]),
         "fault_set": "holdout"}], {})
    assert main(["scorecard", str(d)]) == 2
    err = capsys.readouterr().err
    assert "fault/x/fault/0" in err and "'holdout'" in err and "tuning, set-aside" in err


def test_rescore_decides_each_verdict_again(runs, monkeypatch, capsys):
    """--rescore scores the verdict this code decides from the raw files, not the one the
    run recorded: the analysis is asked for each case of a view of the run folder whose
    cases.jsonl holds no verdict (here a stand-in for the analysis names the fault in
    every arm), and the run folder itself is untouched."""
    from types import SimpleNamespace

    from strata_plugin.analysis import case_summary

    asked = []
    before = {r: (r / "cases.jsonl").read_text() for r in runs}

    def decide(view, case_id):
        lines = [json.loads(x) for x in (view / "cases.jsonl").read_text().splitlines()]
        assert all("verdict" not in c for c in lines) and (view / "manifest.json").is_symlink()
        asked.append((view.name, case_id))
        fault = case_id.split("/")[1]
        return SimpleNamespace(verdict=case_summary.Verdict(
            classes=(fault,), evidence=(case_summary.Evidence(**ev(fault, "m", 1.0, 0.5)),),
            confidence=1.0, inconclusive=False, finer_trace=(), missing_signals=()))

    monkeypatch.setattr(case_summary, "summarize_case", decide)
    assert main(["scorecard", *map(str, runs)]) == 0
    recorded = capsys.readouterr().out
    assert main(["scorecard", "--rescore", *map(str, runs)]) == 0
    again = capsys.readouterr().out
    assert len(asked) == 6 and {v for v, _ in asked} == {"a", "b"}
    assert "Hits: 3 of 6." in recorded
    # every fault arm now hits; the clean arms named the scenario's class, which the
    # ground truth did not see there, so they miss
    assert "Hits: 4 of 6." in again and "named): 4 of 4" in again.replace("\n", " ")
    assert {r: (r / "cases.jsonl").read_text() for r in runs} == before


def test_a_quiet_prefill_expects_compute_which_is_no_fault(tmp_path) -> None:
    """Issue 30's prefill scenarios expect ``cpu_compute`` first. That makes it a
    scenario's class, not a fault: a clean arm naming it is right (a healthy server
    computes), and it is wrong only where it came first while a fault held the server."""
    compute = ev("cpu_compute", "ledger_cause_share", 0.92, 0.06)
    d = make_run(tmp_path, "p", [
        case("fault/prefill_c1/fault/0", "cpu_compute", "fault", ["cpu_compute"],
             evidence=[compute]),
        case("fault/cpu_limited/clean/0", "cpu_limited", "clean", ["cpu_compute"],
             evidence=[compute]),
        # the quota held the server and the verdict said compute: a miss, and compute's FP
        case("fault/cpu_limited/fault/0", "cpu_limited", "fault", ["cpu_compute"],
             also=["cpu_limited"], evidence=[compute, THROTTLED]),
    ], {"fault/prefill_c1/fault/0": [], "fault/cpu_limited/clean/0": [],
        "fault/cpu_limited/fault/0": ["cpu_limited"]})
    arms = {a.case_id: a for a in read_run(d)}
    assert "cpu_compute" not in arms["fault/cpu_limited/clean/0"].fault_classes
    assert arms["fault/prefill_c1/fault/0"].hit and arms["fault/prefill_c1/fault/0"].top1
    assert arms["fault/cpu_limited/clean/0"].hit
    assert not arms["fault/cpu_limited/fault/0"].hit
    scores = {s.cls: s for s in class_scores(list(arms.values()))}
    assert (scores["cpu_compute"].tp, scores["cpu_compute"].fp) == (1, 1)
    assert (scores["cpu_limited"].tp, scores["cpu_limited"].fn) == (0, 1)


def test_a_quiet_prefill_on_a_held_host_must_name_what_held_it(tmp_path) -> None:
    """A scenario that injects nothing (a quiet prefill, ``cpu_compute`` expected) ran
    while a real hog held a core: the host watch says contention happened, the case's
    largest cause is then that wait, and the arm is judged by it, first, in the
    scorecard as in the suite (cases/test_faults.py ``_busy_host``); compute first there
    is a miss."""
    from cases.test_faults import ArmResult, _check

    waiting = ev("cpu_contention", "ledger_cause_share", 0.97, 0.02)
    d = make_run(tmp_path, "h", [
        case("fault/prefill_c1/fault/0", "cpu_compute", "fault", ["cpu_contention"],
             evidence=[waiting]),
        case("fault/prefill_c1/fault/1", "cpu_compute", "fault", ["cpu_compute",
                                                                  "cpu_contention"],
             evidence=[waiting]),
    ], {"fault/prefill_c1/fault/0": ["cpu_contention"],
        "fault/prefill_c1/fault/1": ["cpu_contention"]})
    arms = {a.case_id: a for a in read_run(d)}
    held, wrong = arms["fault/prefill_c1/fault/0"], arms["fault/prefill_c1/fault/1"]
    assert held.wanted == ("cpu_contention",) and held.hit and held.top1
    assert not wrong.hit and not wrong.top1
    assert "the host held it: cpu_contention first" in scorecard_markdown(list(arms.values()))

    def arm(classes: tuple[str, ...], truth: tuple[str, ...]) -> ArmResult:
        return ArmResult("cpu_compute", "fault", "fault/prefill_c1/fault/0", " + ".join(classes),
                         classes, (), False, tuple(f"{c}: ledger_cause_share 0.9"
                                                   for c in classes[:1]),
                         truth, {"ground_truth": {}}, mechanism="prefill_c1")

    assert _check(arm(("cpu_contention",), ("cpu_contention",))) == []
    assert _check(arm(("cpu_compute", "cpu_contention"), ("cpu_contention",)))
    assert _check(arm(("cpu_compute",), ())) == []  # quiet: compute first, as expected
    assert _check(arm(("cpu_contention",), ()))  # quiet: contention that did not happen

"""An A/B expectation decided by its interval, with repetitions added up to a bound
(analysis/expectations.py, CaseRunner.expect_ab) and "not established" as its own outcome.

Issue 32: the mixed case asserted a positive lower bound on TPOT p95 at 3 repetitions and
failed whenever the host was noisy (-75% .. +19578% under load). Now an interval that
holds zero adds repetitions, then reports "not established"; only an interval wholly on
the other side of zero fails.
"""

import json
import xml.etree.ElementTree as ET

import pytest

from strata_plugin.analysis.effects import Effect
from strata_plugin.analysis.expectations import (
    CONTRADICTED,
    ESTABLISHED,
    NOT_ESTABLISHED,
    ABExpectation,
    judge,
)
from strata_plugin.analysis.thresholds import value
from strata_plugin.formats.typed import FormatError
from strata_plugin.load.case_runner import ABArm, CaseRunner
from tests.sse_script_server import ScriptServer
from tests.test_plugin import llama_reply

pytest_plugins = ["pytester"]


def _effect(lo: float | None, hi: float | None, n: int = 3) -> Effect:
    return Effect("tpot_p95_ms", 10.0, 12.0, 20.0, lo, hi, n, n, method="t-interval")


@pytest.mark.parametrize(("lo", "hi", "up", "down"), [
    (0.01, 50.0, ESTABLISHED, CONTRADICTED),  # just above zero
    (0.0, 50.0, NOT_ESTABLISHED, NOT_ESTABLISHED),  # touching zero: not told from it
    (-0.01, 50.0, NOT_ESTABLISHED, NOT_ESTABLISHED),  # just below
    (-50.0, -0.01, CONTRADICTED, ESTABLISHED),  # wholly below zero
    (-50.0, 0.0, NOT_ESTABLISHED, NOT_ESTABLISHED),
    (-75.0, 19578.0, NOT_ESTABLISHED, NOT_ESTABLISHED),  # issue 32's noisy host
    (None, None, NOT_ESTABLISHED, NOT_ESTABLISHED),  # no interval
])
def test_the_interval_decides_and_only_the_other_side_contradicts(lo, hi, up, down):
    assert judge(_effect(lo, hi), "increase") == up
    assert judge(_effect(lo, hi), "decrease") == down


def test_no_effect_at_all_is_not_established_and_a_bad_direction_is_an_error():
    assert judge(None, "increase") == NOT_ESTABLISHED
    with pytest.raises(ValueError, match="direction 'up'"):
        judge(_effect(1, 2), "up")


def test_the_bound_is_in_the_threshold_table():
    assert value("ab_max_repetitions") == 6


# --- the runner: repetitions added one per arm, in a balanced order, up to the bound ---


class _Result:
    def __init__(self, arm: str, i: int) -> None:
        self.ab = ABArm("g", arm, repetition=i)
        self.case_id = f"g/{arm}/{i}"


class _Runner:
    """CaseRunner's A/B bookkeeping alone (its history), without a server."""

    ab_results = CaseRunner.ab_results
    expect_ab = CaseRunner.expect_ab

    def __init__(self, initial: int = 3) -> None:
        self.history = {"g": []}
        self.expectations = []
        self.order = []
        for i, arm in enumerate(("control", "treatment", "treatment", "control",
                                 "control", "treatment")[:2 * initial]):
            self.run_arm(arm, i)
        self.order.clear()

    def run_arm(self, arm: str, i: int) -> _Result:
        r = _Result(arm, i)
        self.history["g"].append(r)
        self.order.append((arm, i))
        return r


def _decided_at(n_decided: int, lo: float = 5.0, hi: float = 50.0):
    """Effects whose interval holds zero below ``n_decided`` repetitions per arm, and is
    (lo, hi) from there."""
    def effects(c, t):
        n = min(len(c), len(t))
        return [_effect(lo, hi, n) if n >= n_decided else _effect(-10.0, 50.0, n)]
    return effects


def test_decided_at_its_own_repetitions_adds_none():
    r = _Runner()
    e = r.expect_ab("g", "tpot_p95_ms", "increase", effects=_decided_at(3), run_arm=r.run_arm)
    assert (e.outcome, e.repetitions, e.initial_repetitions, r.order) == (ESTABLISHED, 3, 3, [])
    assert r.expectations == [e]


def test_undecided_adds_one_per_arm_in_a_balanced_order_until_decided():
    r = _Runner()
    e = r.expect_ab("g", "tpot_p95_ms", "increase", effects=_decided_at(5), run_arm=r.run_arm)
    assert (e.outcome, e.repetitions) == (ESTABLISHED, 5)
    # C T T C C T, then T C, C T: the ABBA order continued
    assert r.order == [("treatment", 6), ("control", 7), ("control", 8), ("treatment", 9)]
    assert "2 repetition(s) added, bound 6 per arm" in e.line()


def test_decided_at_the_bound_itself_is_established():
    r = _Runner()
    e = r.expect_ab("g", "tpot_p95_ms", "increase", effects=_decided_at(6), run_arm=r.run_arm)
    assert (e.outcome, e.repetitions, len(r.order)) == (ESTABLISHED, 6, 6)


def test_one_past_the_bound_is_not_established_and_stops_at_the_bound():
    r = _Runner()
    e = r.expect_ab("g", "tpot_p95_ms", "increase", effects=_decided_at(7), run_arm=r.run_arm)
    assert (e.outcome, e.repetitions, len(r.order)) == (NOT_ESTABLISHED, 6, 6)
    assert e.line().startswith("g: tpot_p95_ms expected to increase: not established (+20.0%, "
                               "-10.0% .. +50.0%, 95% t-interval, 6/6 repetitions; 3 "
                               "repetition(s) added, bound 6 per arm)")


def test_a_contradiction_adds_nothing():
    r = _Runner()
    e = r.expect_ab("g", "tpot_p95_ms", "increase", effects=_decided_at(3, -50.0, -1.0),
                    run_arm=r.run_arm)
    assert (e.outcome, r.order) == (CONTRADICTED, [])


def test_the_bound_can_be_the_cases_own():
    r = _Runner()
    e = r.expect_ab("g", "tpot_p95_ms", "increase", effects=_decided_at(9), run_arm=r.run_arm,
                    max_repetitions=4)
    assert (e.outcome, e.repetitions, e.max_repetitions) == (NOT_ESTABLISHED, 4, 4)


def test_a_recorded_expectation_reads_back_or_names_its_bad_key():
    e = ABExpectation.of("g", "tpot_p95_ms", "increase", _effect(-1, 2, 6), initial=3, bound=6)
    assert ABExpectation.from_json(json.loads(json.dumps(e.to_json()))) == e
    bad = dict(e.to_json(), repetitions="six")
    with pytest.raises(FormatError, match=r"case 'x': ab_expectations\[0\]: repetitions"):
        ABExpectation.from_json(bad, "case 'x': ab_expectations[0]")
    with pytest.raises(FormatError, match="outcome/direction"):
        ABExpectation.from_json(dict(e.to_json(), outcome="maybe"))


# --- as a user sees it: the outcome in the terminal, JUnit, cases.jsonl, the report ---

PROFILE = """
name = "ab-test"
[server]
engine = "llamacpp"
api = "llamacpp"
health_timeout_s = 5
token_id_range = [300, 1000]
[telemetry]
interval_s = 0.1
baseline_s = 0
cooldown_s = 0
collectors = ["proc"]
"""

CASES = """
from strata_plugin import ABArm
from strata_plugin.analysis.effects import Effect
from strata_plugin.load.workload import Workload

W = Workload("d", isl=8, osl=2, requests=1)


def _case(strata, group, lo, hi):
    def run_arm(arm, i):
        return strata.run(W, case_id=f"{group}/{arm}/{i}", scale=False,
                          ab=ABArm(group, arm, repetition=i))

    def effects(c, t):
        n = min(len(c), len(t))
        return [Effect("tpot_p95_ms", 1.0, 1.2, 20.0, lo, hi, n, n, method="t-interval")]

    for i, arm in enumerate(("control", "treatment", "treatment", "control")):
        run_arm(arm, i)
    return strata.expect_ab(group, "tpot_p95_ms", "increase", effects=effects,
                            run_arm=run_arm, max_repetitions=3)


def test_established(strata):
    _case(strata, "up", 5.0, 50.0)


def test_noise(strata):
    _case(strata, "noise", -10.0, 50.0)


def test_against(strata):
    _case(strata, "down", -50.0, -5.0)
"""


@pytest.mark.integration
def test_not_established_is_its_own_outcome_everywhere(pytester, monkeypatch):
    from tests.test_plugin import ROOT

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest('"""Strata loads through its entry point."""\n')
    pytester.makeini(f"""
[pytest]
strata_profile = {pytester.path / "profile.toml"}
strata_reports_dir = {pytester.path / "reports"}
""")
    (pytester.path / "profile.toml").write_text(PROFILE)
    pytester.makepyfile(test_cases=CASES)
    xml = pytester.path / "junit.xml"
    with ScriptServer(llama_reply) as srv:
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", f"--strata-server-url={srv.url}", f"--junitxml={xml}",
            "--strata-run-id=r1", "-rA")
    out = result.stdout.str()
    assert result.ret == 1, out  # the contradiction fails the run
    assert "1 failed, 1 passed, 1 not established" in out, out
    assert "A/B expectation contradicted by the data" in out
    assert "down: tpot_p95_ms expected to increase: contradicted" in out
    cases = {c.get("name"): c for c in ET.parse(xml).getroot().iter("testcase")}
    skipped = cases["test_noise"].find("skipped")
    assert skipped is not None and cases["test_noise"].find("failure") is None
    assert skipped.get("message").startswith(
        "not established: noise: tpot_p95_ms expected to increase: not established (+20.0%, "
        "-10.0% .. +50.0%, 95% t-interval, 3/3 repetitions; 1 repetition(s) added, bound 3")
    assert cases["test_established"].find("skipped") is None
    assert cases["test_against"].find("failure") is not None
    props = {p.get("name"): p.get("value") for p in cases["test_noise"].iter("property")}
    assert props["strata_expectation.noise.tpot_p95_ms"] == "not established"
    props = {p.get("name"): p.get("value") for p in cases["test_established"].iter("property")}
    assert props["strata_expectation.up.tpot_p95_ms"] == "established"

    run = pytester.path / "reports" / "r1"
    lines = [json.loads(x) for x in (run / "cases.jsonl").read_text().splitlines()]
    last = {}
    for line in lines:
        last[line["case_id"]] = line
    noise = [x for x in last.values() if x.get("ab_group") == "noise"]
    assert len(noise) == 6  # 2 + 2, then one of each arm added (bound 3 per arm)
    assert {x["outcome"] for x in noise} == {"not established"}
    assert {x["ab_expectations"][0]["outcome"] for x in noise} == {"not established"}
    assert {x["outcome"] for x in last.values() if x.get("ab_group") == "up"} == {"passed"}
    assert len([x for x in last.values() if x.get("ab_group") == "up"]) == 4  # none added
    md = (run / "report.md").read_text()
    assert "**Expectation: not established.** noise: tpot_p95_ms expected to increase" in md
    assert "**Expectation: established.** up: tpot_p95_ms" in md
    assert "**Expectation: contradicted.** down: tpot_p95_ms" in md
    summary = json.loads((run / "summary.json").read_text())
    by_group = {g["group"]: g["expectations"] for g in summary["ab"]}
    assert [e["outcome"] for e in by_group["noise"]] == ["not established"]
    assert by_group["noise"][0]["repetitions"] == 3


def test_repetitions_that_do_not_define_the_metric_still_end_at_the_bound():
    r = _Runner()

    def effects(c, t):  # the added repetitions define no value: the count stays at 3
        return [_effect(-10.0, 50.0, 3)]

    e = r.expect_ab("g", "tpot_p95_ms", "increase", effects=effects, run_arm=r.run_arm)
    assert (e.outcome, len(r.order), e.repetitions) == (NOT_ESTABLISHED, 6, 6)
    assert "3/3 repetitions; 3 repetition(s) added" in e.line()

"""--strata-escalate as users drive it (pytester, scripted server): what is traced, what not.

Attached to a server by URL, Strata does not know the server's PID, so the traced
repetition runs and its traces are recorded UNAVAILABLE with that reason: the round's
bookkeeping is checked here without root; tests/test_diagnostic_round.py has the traces.
"""

import json
import xml.etree.ElementTree as ET

import pytest

from strata_plugin.formats.cases import CaseLine
from strata_plugin.run.diagnostic_round import parse_escalate
from tests.sse_script_server import ScriptServer
from tests.test_plugin import CASES, PROFILE, llama_reply

pytest_plugins = ["pytester"]


@pytest.fixture
def project(pytester, monkeypatch):
    from tests.test_plugin import ROOT

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest('"""Strata loads through its entry point."""\n')
    pytester.makeini(f"""
[pytest]
markers =
    prefill: p
    decode: d
strata_profile = {pytester.path / "profile.toml"}
strata_reports_dir = {pytester.path / "reports"}
""")
    (pytester.path / "profile.toml").write_text(PROFILE)
    pytester.makepyfile(test_cases=CASES)
    return pytester


def test_parse_escalate():
    assert parse_escalate("") == ()
    assert parse_escalate(" auto , decode/1") == ("auto", "decode/1")
    with pytest.raises(ValueError, match="empty name"):
        parse_escalate("auto,,x")


@pytest.mark.integration
def test_a_named_case_is_traced_apart_and_unavailable_traces_say_why(project):
    xml = project.path / "junit.xml"
    with ScriptServer(llama_reply) as srv:
        res = project.runpytest_subprocess(
            "-k", "test_decode and not wrong", f"--strata-server-url={srv.url}",
            "--strata-run-id=esc", "--strata-escalate=test_decode", f"--junitxml={xml}")
    res.assert_outcomes(passed=1)
    run = project.path / "reports" / "esc"
    lines = [json.loads(x) for x in (run / "cases.jsonl").read_text().splitlines()]
    by_id = {x["case_id"]: x for x in lines}
    cid = "test_cases.py::test_decode"  # attached: the node id carries no configuration
    assert set(by_id) == {cid, cid + "~traced"}
    traced = by_id[cid + "~traced"]
    assert traced["diagnostic_of"] == cid and traced["escalated"] == "named"
    assert "diagnostic_of" not in by_id[cid]
    # the timed case's records are its own: the traced repetition's are under its own id
    recs = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    measured = [r for r in recs if r["phase"] == "measured"]
    assert sum(r["case_id"] == cid for r in measured) == 4
    assert sum(r["case_id"] == cid + "~traced" for r in measured) == 4
    meta = json.loads((run / "traces" / (cid + "~traced") / "meta.json").read_text())
    assert meta["captured"] == ["net"]  # the harness's own connections: no PID needed
    assert set(meta["unavailable"]) == {"sched", "block", "engine"}
    assert "PID is not known" in meta["unavailable"]["sched"]
    assert "PID is not known" in meta["unavailable"]["engine"]  # perf needs the threads
    md = (run / "report.md").read_text()
    assert "## Diagnostic round" in md and "sched trace UNAVAILABLE" in md
    assert "The benchmark's TCP connections" in md
    # JUnit properties are the timed case's alone (one case: no per-case prefix)
    names = [p.get("name") for p in ET.parse(xml).getroot().iter("property")]
    assert "verdict" in names and not any("traced" in n for n in names)


@pytest.mark.integration
def test_off_by_default(project):
    with ScriptServer(llama_reply) as srv:
        off = project.runpytest_subprocess("-k", "test_prefill", f"--strata-server-url={srv.url}",
                                           "--strata-run-id=off")
    off.assert_outcomes(passed=1)
    run = project.path / "reports" / "off"
    ids = [json.loads(x)["case_id"] for x in (run / "cases.jsonl").read_text().splitlines()]
    assert ids and not any(i.endswith("~traced") for i in ids), ids
    assert not (run / "traces").exists()
    assert "## Diagnostic round" not in (run / "report.md").read_text()


@pytest.mark.integration
def test_a_bad_escalate_value_is_a_usage_error(project):
    res = project.runpytest_subprocess("-k", "test_prefill", "--strata-escalate=auto,,x",
                                       "--strata-server-url=http://127.0.0.1:9")
    assert res.ret == 4
    res.stderr.fnmatch_lines(["*--strata-escalate: empty name*"])



@pytest.mark.parametrize("inconclusive", [True, False])
def test_auto_traces_a_case_exactly_when_its_verdict_needs_it(tmp_path, monkeypatch,
                                                             inconclusive):
    """The round's decision from the verdict the analysis gives (the analysis itself is
    tested elsewhere: here it is replaced by the verdict under test)."""
    from types import SimpleNamespace

    from strata_plugin.analysis import case_summary
    from strata_plugin.analysis.rules import Verdict
    from strata_plugin.load.case_runner import CaseSetup
    from strata_plugin.load.client import Timeouts
    from strata_plugin.load.workload import TokenSpace, Workload
    from strata_plugin.run.diagnostic_round import DiagnosticRunner

    v = Verdict(classes=("cpu_compute", "cpu_contention"), evidence=(), confidence=0.4,
                inconclusive=inconclusive, finer_trace=(), missing_signals=())
    if not inconclusive:
        v = Verdict(classes=("cpu_compute", "queueing"), evidence=(), confidence=0.8,
                    inconclusive=False, finer_trace=(), missing_signals=())
    monkeypatch.setattr(case_summary, "summarize_case", lambda d, c: SimpleNamespace(verdict=v))
    lines: list[CaseLine] = []
    with ScriptServer(llama_reply) as srv:
        setup = CaseSetup(srv.url, "llamacpp", "x", TokenSpace(300, 1000), Timeouts(read_s=10))
        runner = DiagnosticRunner(setup, record=lambda r: None, mark=lambda *a: None,
                                  add_case=lines.append, escalate=("auto",), run_dir=tmp_path,
                                  server_pid=None, settle_s=0.0)
        r = runner.run(Workload("d", isl=8, osl=6, requests=2), case_id="c1", scale=False)
    assert runner.results == [r]
    if inconclusive:
        assert [d.case_id for d in runner.diagnostics] == ["c1~traced"]
        traced = next(x for x in lines if x.case_id == "c1~traced")
        assert traced.escalated == "verdict 'inconclusive: cpu_compute + cpu_contention'"
        assert traced.traces == ("sched",)
    else:
        assert runner.diagnostics == [] and [x.case_id for x in lines] == ["c1"]
        assert runner.decisions["c1"] == "not traced: verdict 'cpu_compute + queueing'"


@pytest.mark.integration
def test_the_engine_profile_option_repeats_the_case_and_says_why_none_was_taken(project):
    with ScriptServer(llama_reply) as srv:
        res = project.runpytest_subprocess(
            "-k", "test_decode and not wrong", f"--strata-server-url={srv.url}",
            "--strata-run-id=ep", "--strata-engine-profile=test_decode")
    res.assert_outcomes(passed=1)
    run = project.path / "reports" / "ep"
    cid = "test_cases.py::test_decode"
    meta = json.loads((run / "traces" / (cid + "~traced") / "meta.json").read_text())
    assert meta["traces"] == ["engine"] and meta["captured"] == []
    assert "PID is not known" in meta["unavailable"]["engine"]
    md = (run / "report.md").read_text()
    assert ("Engine profile (CPU samples (perf cpu-clock, software event)) not taken: the "
            "server's PID is not known") in md


@pytest.mark.integration
def test_a_bad_engine_profile_value_is_a_usage_error(project):
    res = project.runpytest_subprocess("-k", "test_prefill", "--strata-engine-profile=a,,b",
                                       "--strata-server-url=http://127.0.0.1:9")
    assert res.ret == 4
    res.stderr.fnmatch_lines(["*--strata-engine-profile: empty name in 'a,,b' (expected case "
                              "ids / workload names*"])

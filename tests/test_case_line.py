"""The typed case line (formats/cases.py): written byte for byte as main's dict was,
read back from any Strata's run folder, and a wrong type refused with the line named."""

from __future__ import annotations

import json
from pathlib import Path

import case_line_driver as driver
import pytest
from bundle_factory import cpu_run
from case_line_driver import drive

from strata_plugin.analysis.run_folder import load_bundle, read_cases
from strata_plugin.formats.cases import CaseLine, CaseLineError
from strata_plugin.report.writer import write_report

FIXTURE = Path(__file__).parent / "data" / "case_lines_main.json"


def _teardown(rec, line: CaseLine, outcome: str, nodeid: str, extra: dict) -> None:
    """plugin/case_teardown.finish_case's write."""
    rec.add_case(line.updated(outcome=outcome, nodeid=nodeid, **extra))


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    mp = pytest.MonkeyPatch()
    try:
        return drive(tmp_path_factory.mktemp("caseline"), mp.setattr, _teardown)
    finally:
        mp.undo()


@pytest.mark.parametrize("name", ["cases.jsonl", "dry_run.json", "dry_run.md"])
def test_every_writer_writes_the_bytes_main_wrote(written: dict[str, str], name: str) -> None:
    """The case runner (measured, interrupted, chat, injected, A/B, sweep, until=,
    timeslice), the teardown's rewrite and the dry run's plan, against what main's
    dict literals wrote through the same driver (tests/case_line_driver.py)."""
    main = json.loads(FIXTURE.read_text())
    assert written[name] == main[name]


def test_the_fixture_holds_every_kind_of_line() -> None:
    """The comparison above covers what it claims: each kind of line, and null-valued
    keys both written (measured) and left out (interrupted)."""
    lines = [json.loads(x) for x in json.loads(FIXTURE.read_text())["cases.jsonl"].splitlines()]
    kinds = {k for d in lines for k in ("interrupted", "isl_note", "sample_target",
                                        "timeslice_s", "sweep", "verdict", "diagnostic_of",
                                        "telemetry_flushed", "repetition") if k in d}
    assert kinds == {"interrupted", "isl_note", "sample_target", "timeslice_s", "sweep",
                     "verdict", "diagnostic_of", "telemetry_flushed", "repetition"}
    interrupted = next(d for d in lines if d.get("interrupted"))
    measured = next(d for d in lines if d["case_id"] == "t::plain")
    assert "scaled_from" not in interrupted and measured["cache_flush"] is None
    assert any(isinstance(d.get("injection"), dict) and "request_id" in d["injection"]
               for d in lines)
    assert any(d.get("where") == "/x/y" for d in lines)  # default=str of a Path in extra


def test_round_trip_of_every_line(written: dict[str, str]) -> None:
    for text in written["cases.jsonl"].splitlines():
        line = CaseLine.from_json(text)
        assert line.to_json() == text
        assert CaseLine.from_dict(line.to_dict()) == line
        assert line.to_dict() == json.loads(text)


def test_typed_values_read_as_attributes(written: dict[str, str]) -> None:
    lines = {CaseLine.from_json(t).case_id: CaseLine.from_json(t)
             for t in written["cases.jsonl"].splitlines()}
    plain, ab = lines["t::plain"], lines["t::unscaled"]
    assert plain.outcome == "passed" and plain.verdict["classes"] == ["decode_bound"]
    assert plain.window_mono_ns is not None and plain.window_mono_ns[0] < plain.window_mono_ns[1]
    assert plain.scaled_from is not None and plain.scaled_from["isl"] == 64
    assert plain.params is not None and plain.params["isl"] == 32
    assert (ab.ab_group, ab.ab_arm, ab.repetition, ab.allow_errors) == ("g", "treat", 2,
                                                                        ("timeout",))
    assert ab.timeslice_s == 2.0 and ab.traces == ("sched",)
    assert ab.extra == {"note": "kept as written", "where": "/x/y"}  # untyped: kept
    assert lines["t::cold"].telemetry_flushed is False
    assert lines["t::sweep/rate-4"].offered_rate == 4.0


def test_an_older_line_missing_keys_and_with_unknown_keys_reads(tmp_path: Path) -> None:
    """A line from before most keys existed, with a key this version does not know:
    read without an exception, the unknown key kept and written back."""
    old = {"case_id": "c1", "name": "decode", "params": {"isl": 8}, "outcome": "passed",
           "ab_group": "g", "ab_arm": "ref", "self_check": {"client_bound": True},
           "future_key": {"x": [1, 2]}}
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps(old) + "\n")
    info = read_cases(path)["c1"]
    assert info.line.extra == {"future_key": {"x": [1, 2]}}
    assert info.line.window_mono_ns is None and info.line.verdict is None
    assert info.client_bound is True  # from self_check: the line predates the copy
    assert (info.ab_group, info.ab_arm, info.config_id) == ("g", "ref", "")
    assert json.loads(info.line.to_json()) == old


def test_a_null_client_bound_does_not_fall_back_to_the_self_check(tmp_path: Path) -> None:
    """As the raw reader did: a key present with null is not the self-check's."""
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps({"case_id": "c", "client_bound": None,
                                "self_check": {"client_bound": True}}) + "\n")
    assert read_cases(path)["c"].client_bound is None


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("window_mono_ns", [1, "2"], "[start_ns, end_ns] (two integers)"),
    ("params", "isl=8", "an object"),
    ("client_bound", 1, "true or false"),
    ("warmup_s", True, "a number"),
    ("repetition", 1.0, "an integer"),
    ("problems", ["ok", 3], "a list of strings"),
    ("allow_errors", "timeout", "true or a list of error classes"),
])
def test_a_wrong_type_names_the_file_line_and_key(tmp_path: Path, key: str, value: object,
                                                  expected: str) -> None:
    path = tmp_path / "cases.jsonl"
    good = json.dumps({"case_id": "a", "warmup_s": 1, "repetition": 0})
    path.write_text(good + "\n" + json.dumps({"case_id": "b", key: value}) + "\n")
    with pytest.raises(CaseLineError) as e:
        read_cases(path)
    assert str(e.value).startswith(f"{path}:2: key {key!r}: expected {expected}, got ")


def test_the_right_types_at_the_boundary_read(tmp_path: Path) -> None:
    """Just inside each check: an int where a number is asked, false and an empty list,
    a dict sweep (a planned one) and a named one, null anywhere."""
    line = CaseLine.from_dict({"case_id": "a", "warmup_s": 1, "client_bound": False,
                               "problems": [], "sweep": {"start_rate": 1}, "slo": None,
                               "allow_errors": True, "window_mono_ns": [0, 0]})
    assert line.warmup_s == 1 and line.to_json() == json.dumps(line.to_dict(), sort_keys=True)
    assert line.nulls == frozenset({"slo"}) and line.problems == ()
    assert CaseLine.from_dict({"sweep": "cap"}).sweep == "cap"


def test_a_torn_last_line_is_still_skipped(tmp_path: Path) -> None:
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps({"case_id": "a"}) + "\n" + '{"case_id": "b", "na')
    assert list(read_cases(path)) == ["a"]


def test_the_writer_refuses_a_key_it_does_not_type() -> None:
    """A typo in a writer fails at once; a test's extra= keys go through the tail."""
    with pytest.raises(TypeError, match="warmup"):
        CaseLine.written(case_id="a", warmup=1.0)
    line = CaseLine.written({"mine": 1, "name": "from extra"}, case_id="a", name="w")
    assert line.name == "from extra" and line.extra == {"mine": 1}
    with pytest.raises(ValueError, match="are fields"):
        CaseLine("a", extra={"name": "x"})


def test_the_report_reads_the_typed_line(tmp_path: Path) -> None:
    """The analysis and the report read the line's attributes: an A/B arm and an
    unknown key on a fabricated run folder reach summary.json as before."""
    run = cpu_run(tmp_path)
    path = run / "cases.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[0].update(ab_group="g", ab_arm="treat", outcome="failed", unknown_key=3)
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    write_report(run, plots=False)
    summary = json.loads((run / "summary.json").read_text())
    first = next(c for c in summary["cases"] if c["case_id"] == lines[0]["case_id"])
    assert (first["ab_group"], first["ab_arm"], first["outcome"]) == ("g", "treat", "failed")
    bundle = load_bundle(run)
    assert bundle.case_info(lines[0]["case_id"]).line.extra == {"unknown_key": 3}


def test_the_report_command_names_a_bad_line_and_exits_2(tmp_path: Path, capsys) -> None:
    """``python -m strata_plugin report``: the error in the user's terms, no traceback,
    and the raw files untouched."""
    from strata_plugin.report.cli import report_main

    run = cpu_run(tmp_path)
    path = run / "cases.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = json.dumps({**json.loads(lines[1]), "warmup_s": "0.5"})
    path.write_text("\n".join(lines) + "\n")
    before = path.read_text()
    assert report_main([str(run), "-q"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {path}:2: key 'warmup_s': expected a number, got str \"0.5\"\n"
    assert path.read_text() == before


def test_a_test_extra_that_names_a_field_with_another_type_is_refused_when_written() -> None:
    """``strata.run(..., extra={"offered_rate": "fast"})``: refused before a line no
    reader could use reaches cases.jsonl, naming the case and the key."""
    with pytest.raises(CaseLineError, match=r"^the line of case 'a': key 'offered_rate': "
                       r"expected a number, got str \"fast\"$"):
        CaseLine.written({"offered_rate": "fast"}, case_id="a")
    assert CaseLine.written({"offered_rate": 2}, case_id="a").offered_rate == 2


@pytest.mark.parametrize("runner_kind", ["case", "planning"])
def test_a_bad_extra_is_refused_before_any_request(monkeypatch, tmp_path, runner_kind) -> None:
    """The wrong type under a field's name in ``extra=`` fails the case before its load
    runs (no request sent, nothing written), not after it, nor inside a Ctrl-C."""
    from strata_plugin.load import case_runner as cr
    from strata_plugin.load.workload import Workload

    calls: list = []
    monkeypatch.setattr(cr, "run_load", lambda jobs, load: calls.append(jobs))
    lines: list = []
    if runner_kind == "case":
        runner = cr.CaseRunner(driver._setup(), record=lambda r: None, mark=lambda *a: None,
                               add_case=lines.append)
    else:
        runner = cr.PlanningRunner(driver._setup(), plan=lines.append)
    w = Workload("decode", 32, 4, requests=2, warmups=1)
    with pytest.raises(CaseLineError, match="key 'offered_rate': expected a number"):
        runner.run(w, case_id="t::bad", extra={"offered_rate": "fast"})
    assert calls == [] and lines == []

"""The offline tools name the bad line (issue 32, item 5).

``report``, ``compare`` and ``scorecard`` read run folders a user may have copied,
edited or damaged. A value of the wrong type in any field they read is named as
``path:line: key 'k': expected ..., got ...`` on stderr, with exit status 2, no
traceback, and the raw files untouched (each of these was an AttributeError, TypeError
or KeyError traceback). Then the readers are fuzzed: every mutation of a valid line
reads, or fails with that named error, never with another exception.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from bundle_factory import cpu_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata_plugin.analysis.run_folder import check_read_parts
from strata_plugin.formats.cases import CaseLine
from strata_plugin.formats.manifest import check_manifest
from strata_plugin.formats.records import EngineClocks, RequestRecord, TokenEvent
from strata_plugin.formats.typed import FormatError, JsonLines
from strata_plugin.report.cli import compare_main, report_main
from strata_plugin.report.scorecard import scorecard_main


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    run = cpu_run(tmp_path_factory.mktemp("pristine"))
    # one record with the engine's own clocks, so those fields are read too
    path = run / "requests.jsonl"
    lines = path.read_text().splitlines()
    d = json.loads(lines[0])
    d["engine"] = {"source": "test clocks", "queue_ms": 1.0, "token_ms": [0.0, 2.5]}
    d["server_request_id"] = "req-1"
    lines[0] = json.dumps(d)
    path.write_text("\n".join(lines) + "\n")
    return run


@pytest.fixture
def run(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "run"))


def _edit_record(run: Path, n: int, edit) -> None:
    path = run / "requests.jsonl"
    lines = path.read_text().splitlines()
    d = json.loads(lines[n - 1])
    edit(d)
    lines[n - 1] = json.dumps(d)
    path.write_text("\n".join(lines) + "\n")


def _set(path: tuple, value):
    def edit(d):
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return edit


RECORD_CASES = {
    "events a string": (_set(("events",), "abc"),
                        "key 'events': expected a list of token events, got str \"abc\""),
    "first_byte_ns a string": (_set(("first_byte_ns",), "12"),
                               "key 'first_byte_ns': expected an integer or null, got str"),
    "scheduled_ns null": (_set(("scheduled_ns",), None),
                          "key 'scheduled_ns': expected an integer, got null"),
    "a non-integer usage": (_set(("usage", "prompt_tokens"), 1.5),
                            "key 'usage.prompt_tokens': expected an integer or null, got "
                            "float 1.5"),
    "extra a string": (_set(("extra",), "x"), "key 'extra': expected an object, got str"),
    "case_id a number": (_set(("case_id",), 7), "key 'case_id': expected a string, got int 7"),
    "an event's time a string": (_set(("events", 0, "t_ns"), "1"),
                                 "key 'events[0].t_ns': expected an integer, got str"),
    "engine clocks a number": (_set(("engine",), 3),
                               "key 'engine': expected an object (EngineClocks) or null"),
    "engine token times strings": (_set(("engine", "token_ms"), ["a"]),
                                   "key 'engine.token_ms[0]': expected a number, got str"),
    "server_request_id a number": (_set(("server_request_id",), 12),
                                   "key 'server_request_id': expected a string or null"),
    "an unknown error class": (_set(("error",), {"cls": "gremlins", "message": "m"}),
                               "key 'error': unknown error class 'gremlins'"),
}


@pytest.mark.parametrize("case", sorted(RECORD_CASES))
@pytest.mark.parametrize("tool", ["report", "compare"])
def test_a_wrong_record_field_is_named_by_report_and_compare(run, case, tool, capsys) -> None:
    edit, message = RECORD_CASES[case]
    _edit_record(run, 1, edit)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    rc = report_main([str(run), "-q"]) if tool == "report" else compare_main([str(run),
                                                                              str(run)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith(f"error: {run / 'requests.jsonl'}:1: {message}"), err
    assert "Traceback" not in err and err.count("\n") == 1
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_byte_that_is_not_utf8_is_named(run, capsys) -> None:
    path = run / "requests.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"measured"', b'"meas\xffured"', 1)
    path.write_bytes(b"".join(lines))
    for main in (lambda: report_main([str(run), "-q"]),
                 lambda: compare_main([str(run), str(run)])):
        assert main() == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {path}:3: not UTF-8 (byte 0xff at column "), err


def test_a_line_that_is_not_json_before_the_last_is_named(run, capsys) -> None:
    """Only the last line can be torn by a kill; one in the middle is damage."""
    path = run / "requests.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:40]
    path.write_text("\n".join(lines) + "\n")
    assert report_main([str(run), "-q"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {path}:2: not JSON (")


MARKER_CASES = {
    "a missing column": (lambda rows: [r.rsplit(",", 1)[0] for r in rows],
                         ":1: missing column(s) end_wall_ns (expected kind,name,case_id,"
                         "start_wall_ns,end_wall_ns)"),
    "a short row": (lambda rows: [*rows[:2], rows[2].rsplit(",", 2)[0], *rows[3:]],
                    ":3: short row: 3 of 5 columns"),
    "a non-numeric ns": (lambda rows: [*rows[:2], rows[2].rsplit(",", 1)[0] + ",soon",
                                       *rows[3:]],
                         ":3: key 'end_wall_ns': expected an integer (wall-clock ns), got "
                         "str \"soon\""),
}


@pytest.mark.parametrize("case", sorted(MARKER_CASES))
def test_a_wrong_markers_row_is_named(run, case, capsys) -> None:
    edit, message = MARKER_CASES[case]
    path = run / "markers.csv"
    path.write_text("\n".join(edit(path.read_text().splitlines())) + "\n")
    assert report_main([str(run), "-q"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {path}{message}\n", err


def test_a_manifest_with_servers_a_list_is_named_with_its_line(run, capsys) -> None:
    path = run / "manifest.json"
    m = json.loads(path.read_text())
    m["servers"] = [m["servers"]["default"]]
    path.write_text(json.dumps(m, indent=2, sort_keys=True))
    line = next(i for i, x in enumerate(path.read_text().splitlines(), 1)
                if x.startswith('  "servers"'))
    assert report_main([str(run), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:{line}: key 'servers': expected an object ("), err


def test_a_manifest_that_is_not_json_is_named(run, capsys) -> None:
    path = run / "manifest.json"
    path.write_text(path.read_text()[:-20])
    assert report_main([str(run), "-q"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {path}:")


def test_a_recorded_verdict_of_the_wrong_type_is_named(run, capsys) -> None:
    path = run / "cases.jsonl"
    lines = path.read_text().splitlines()
    d = json.loads(lines[0])
    d["verdict"] = {"classes": "cpu_compute"}
    lines[0] = json.dumps(d)
    path.write_text("\n".join(lines) + "\n")
    assert report_main([str(run), "-q"]) == 2
    assert capsys.readouterr().err == (
        f"error: {path}:1: key 'verdict.classes': expected a list of strings, got str "
        "\"cpu_compute\"\n")


# --- scorecard ---------------------------------------------------------------------------

def _fault_run(root: Path, matrix: str | None, verdict: dict | None = None) -> Path:
    d = root / "f"
    d.mkdir()
    (d / "manifest.json").write_text("{}")
    ev = {"cls": "cpu_limited", "metric": "m", "value": 0.9, "op": ">=", "threshold": "m",
          "threshold_value": 0.5, "unit": "", "source": "", "met": True}
    v = verdict if verdict is not None else {"classes": ["cpu_limited"], "evidence": [ev]}
    (d / "cases.jsonl").write_text(json.dumps({"case_id": "a", "fault": "cpu_limited",
                                               "fault_arm": "fault", "verdict": v}) + "\n")
    if matrix is not None:
        (d / "fault_matrix.json").write_text(matrix)
    return d


@pytest.mark.parametrize(("matrix", "verdict", "message"), [
    ("{not json", None, "fault_matrix.json:1: not JSON ("),
    ("[1, 2]", None, "fault_matrix.json: expected a JSON object (fault_classes, arms), got "
     "list [1, 2]"),
    ('{"arms": [{"truth": []}]}', None,
     "fault_matrix.json: key 'fault_matrix.arms[0].case_id': missing"),
    (None, {"classes": ["cpu_limited"], "evidence": [{"metric": "m"}]},
     "cases.jsonl:1: key 'verdict.evidence[0].cls': missing"),
    (None, {"classes": ["cpu_limited"], "evidence": [
        {"cls": "cpu_limited", "metric": "m", "value": "high", "op": ">=", "threshold": "m",
         "threshold_value": 0.5, "unit": "", "source": "", "met": True}]},
     "cases.jsonl:1: key 'verdict.evidence[0].value': expected a number, got str \"high\""),
    ('{"arms": [{"case_id": "a", "truth": "cpu_limited"}]}', None,
     "fault_matrix.json: key 'fault_matrix.arms[0].truth': expected a list (a string each)"),
])
def test_scorecard_names_the_file_and_the_key(tmp_path, capsys, matrix, verdict,
                                              message) -> None:
    d = _fault_run(tmp_path, matrix, verdict)
    assert scorecard_main([str(d)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{d}/{message}" in err, err
    assert "Traceback" not in err


def test_scorecard_reads_a_good_matrix(tmp_path, capsys) -> None:
    d = _fault_run(tmp_path, '{"fault_classes": ["cpu_limited"], "arms": [{"case_id": "a", '
                   '"truth": ["cpu_limited"]}]}')
    assert scorecard_main([str(d)]) == 0
    assert "Hits: 1 of 1" in capsys.readouterr().out


# --- fuzz: every mutation of a valid line reads, or is named -----------------------------

JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                      st.floats(allow_nan=False), st.text(max_size=8))
JSON = st.recursive(JSON_LEAF, lambda kids: st.one_of(
    st.lists(kids, max_size=3), st.dictionaries(st.text(max_size=6), kids, max_size=3)),
    max_leaves=6)


def _paths(d, prefix=()):
    """Every key path into a JSON value (dicts and lists), the value's own first."""
    yield prefix
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield from _paths(v, (*prefix, i))


@st.composite
def mutated(draw, base: dict):
    d = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(d) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        how = draw(st.sampled_from(["replace", "delete", "add"]))
        if how == "replace":
            parent[path[-1]] = draw(JSON)
        elif how == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=6))] = draw(JSON)
    return d


_RECORD = json.loads(RequestRecord(
    "r1", "c", "measured", "chat", 1, 2, first_byte_ns=3, done_ns=9,
    events=(TokenEvent(4, 1, "content", 5), TokenEvent(6, 2, "reasoning", 7)),
    engine=EngineClocks("vllm", queue_ms=1.0, token_ms=(0.0, 1.5)),
    server_request_id="x").to_json())
_CASE = {"case_id": "c", "params": {"isl": 8, "osl": 4, "concurrency": 2, "rate": None},
         "self_check": {"client_bound": False, "dispatch_lateness_p99_ms": 1.0},
         "verdict": {"classes": ["cpu_compute"], "confidence": 0.9, "inconclusive": False,
                     "evidence": [{"cls": "cpu_compute", "metric": "m", "value": 1.0,
                                   "op": ">=", "threshold": "t", "threshold_value": 0.5,
                                   "unit": "", "source": "", "met": True}],
                     "weights": [["cpu_compute", 0.5]]},
         "window_mono_ns": [1, 2], "problems": []}
_MANIFEST = {"run_id": "r", "complete": False, "argv": ["pytest"],
             "servers": {"a": {"argv": ["x"], "base_url": "http://h:1", "startup_s": 1.0}},
             "nodes": {"n": {"offset_start_ns": 1, "clock_uncertainty_ns": 2}},
             "clock_anchor": {"mono_ns": 1, "wall_ns": 2},
             "incomplete_reasons": [{"kind": "interrupted", "detail": ""}]}
FUZZ = settings(max_examples=300, derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(mutated(_RECORD))
def test_fuzz_a_record_reads_or_is_named(d: dict) -> None:
    try:
        RequestRecord.from_dict(d, "requests.jsonl:1")
    except FormatError as exc:
        assert str(exc).startswith("requests.jsonl:1: key '"), exc


@FUZZ
@given(mutated(_CASE))
def test_fuzz_a_case_line_reads_or_is_named(d: dict) -> None:
    try:
        check_read_parts(CaseLine.from_dict(d, "cases.jsonl:1"), "cases.jsonl:1")
    except FormatError as exc:
        assert str(exc).startswith("cases.jsonl:1: key '"), exc


@FUZZ
@given(mutated(_MANIFEST))
def test_fuzz_a_manifest_reads_or_is_named(d: dict) -> None:
    try:
        check_manifest(d, "manifest.json")
    except FormatError as exc:
        assert str(exc).startswith("manifest.json: key '"), exc


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_any_bytes_as_a_jsonl_file_read_or_are_named(tmp_path_factory, data) -> None:
    path = tmp_path_factory.mktemp("fz") / "requests.jsonl"
    path.write_bytes(data)
    lines = JsonLines(path)
    try:
        for n, d in lines.read():
            RequestRecord.from_dict(d, f"{path}:{n}")
    except FormatError as exc:
        assert str(exc).startswith(f"{path}:"), exc


@settings(max_examples=60, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data(), which=st.sampled_from(["requests.jsonl", "cases.jsonl"]))
def test_fuzz_a_mutated_line_in_a_run_analyses_or_is_named(pristine, tmp_path_factory, data,
                                                           which) -> None:
    """Past the readers: the whole analysis (every case's metrics, ledger and verdict)
    of a run folder with one mutated line finishes, or stops at the named error."""
    from strata_plugin.analysis.case_summary import analyze_run

    run = Path(shutil.copytree(pristine, tmp_path_factory.mktemp("fz") / "run"))
    path = run / which
    lines = path.read_text().splitlines()
    lines[0] = json.dumps(data.draw(mutated(json.loads(lines[0]))))
    path.write_text("\n".join(lines) + "\n")
    try:
        analyze_run(run, parallel=False)
    except FormatError as exc:
        assert str(exc).startswith(f"{path}:1: key '"), exc

"""The CI files (Bencher JSON, OpenMetrics metrics.txt, github-action-benchmark JSON),
parsed back with each format's own rules; and server errors failing a test."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from strata_plugin.report.ci_outputs import (
    BIGGER,
    CI_FILES,
    CI_METRICS,
    SMALLER,
    CiCase,
    bencher_json,
    github_benchmark_json,
    openmetrics_text,
)
from tests.sse_script_server import Reply, ScriptServer, Seen, sse

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def run(cpu_report) -> Path:
    return cpu_report  # tests/conftest.py: the CPU run's report, written once a session


def headlines(run: Path) -> dict[str, dict]:
    s = json.loads((run / "summary.json").read_text())
    return {c["case_id"]: c["metrics"] for c in s["cases"]}


@pytest.mark.integration
def test_every_ci_file_is_written_beside_benchmark_json(run):
    assert (run / "benchmark.json").exists()
    for name in CI_FILES:
        assert (run / name).stat().st_size > 0, name


def test_bencher_json_follows_bmf_and_carries_the_headline(run):
    bmf = json.loads((run / "bencher.json").read_text())
    heads = headlines(run)
    assert set(bmf) == {f"strata::{cid}" for cid in heads}
    for bench, measures in bmf.items():
        assert measures, bench
        for slug, metric in measures.items():
            # BMF: each measure an object with a numeric "value", optional lower/upper.
            assert len(slug) <= 64 and slug == slug.lower() and "_" not in slug
            assert isinstance(metric["value"], float)
            assert set(metric) <= {"value", "lower_value", "upper_value"}
            if "upper_value" in metric:
                assert metric["lower_value"] <= metric["value"] <= metric["upper_value"]
    for cid, h in heads.items():
        got = bmf[f"strata::{cid}"]
        assert got["ttft-p99-ms"]["value"] == pytest.approx(h["ttft_p99_ms"])
        assert got["output-tok-s"]["value"] == pytest.approx(h["output_tok_s"])
        assert got["n-errors"]["value"] == 0.0


def test_metrics_txt_parses_as_openmetrics_with_values_in_base_units(run):
    text = (run / "metrics.txt").read_text()
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    heads = headlines(run)
    ttft = families["strata_ttft_p99_seconds"]
    assert ttft.type == "gauge" and ttft.unit == "seconds"
    by_case = {s.labels["case_id"]: s.value for s in ttft.samples}
    assert set(by_case) == set(heads)
    for cid, h in heads.items():
        assert by_case[cid] == pytest.approx(h["ttft_p99_ms"] / 1000)
    tok_family = families["strata_output_tokens_per_second"]
    tok = {s.labels["case_id"]: s.value for s in tok_family.samples}
    assert tok == pytest.approx({cid: h["output_tok_s"] for cid, h in heads.items()})


def test_github_benchmark_files_split_by_direction(run):
    smaller = json.loads((run / "github-benchmark-smaller.json").read_text())
    bigger = json.loads((run / "github-benchmark-bigger.json").read_text())
    for entries in (smaller, bigger):
        assert entries
        for e in entries:
            assert set(e) == {"name", "unit", "value", "extra"}
            assert isinstance(e["name"], str) and isinstance(e["unit"], str)
            assert isinstance(e["value"], float) and math.isfinite(e["value"])
        assert len({e["name"] for e in entries}) == len(entries)  # names are the series keys
    assert any(e["name"] == "light ttft_p99_ms" and e["unit"] == "ms" for e in smaller)
    assert any(e["name"] == "light output_tok_s" for e in bigger)
    assert not {e["name"] for e in smaller} & {e["name"] for e in bigger}
    direction = {m.key: m.better for m in CI_METRICS}
    assert all(direction[e["name"].split(" ")[-1]] == SMALLER for e in smaller)
    assert all(direction[e["name"].split(" ")[-1]] == BIGGER for e in bigger)


def test_awkward_case_ids_survive_every_format():
    cid = 'mixed "a" b\\c\nd'
    case = CiCase(cid, "cfg 1", {"ttft_p99_ms": 12.5, "output_tok_s": 3.0, "n_errors": 0,
                                 "slo": "text is skipped", "request_s": float("nan")}, {})
    fams = {f.name: f for f in text_string_to_metric_families(openmetrics_text([case]))}
    (sample,) = fams["strata_ttft_p99_seconds"].samples
    assert sample.labels == {"case_id": 'mixed_"a"_b\\c_d', "config_id": "cfg_1"}
    assert sample.value == pytest.approx(0.0125)
    assert "strata_requests_per_second" not in fams  # NaN is left out, never written
    line = next(x for x in openmetrics_text([case]).splitlines() if x.startswith("strata_ttft"))
    assert " " not in line.rsplit(" ", 1)[0]  # GitLab keys a metric by the text before a space
    assert bencher_json([case]) == {f"strata::{cid}": {
        "ttft-p99-ms": {"value": 12.5}, "output-tok-s": {"value": 3.0},
        "n-errors": {"value": 0.0}}}
    assert [e["name"] for e in github_benchmark_json([case], BIGGER)] == [f"{cid} output_tok_s"]


def test_no_cases_gives_valid_empty_files():
    assert list(text_string_to_metric_families(openmetrics_text([]))) == []
    assert bencher_json([]) == {} and github_benchmark_json([], SMALLER) == []


# --- server errors fail the test unless the case allows them --------------------------

PROFILE = """
name = "errors-test"
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
from strata_plugin import Workload

def test_strict(strata):
    strata.run(Workload("s", isl=8, osl=2, requests=6), scale=False)

def test_allows_any(strata):
    strata.run(Workload("a", isl=8, osl=2, requests=6), scale=False, allow_errors=True)

def test_allows_http_status(strata):
    strata.run(Workload("h", isl=8, osl=2, requests=6), scale=False,
               allow_errors=("http_status",))

def test_allows_another_class(strata):
    strata.run(Workload("o", isl=8, osl=2, requests=6), scale=False, allow_errors=("timeout",))

def test_no_errors(strata):
    strata.run(Workload("n", isl=9, osl=2, requests=3), scale=False)
"""


class FailingReply:
    """llama.cpp /completion; every third 8-token prompt gets a 500 (9-token ones never)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.eights = 0
        self.failed = 0

    def __call__(self, seen: Seen) -> Reply:
        if seen.method == "GET":
            return Reply([(0.0, b"ok")], framing="length", content_type="text/plain")
        body = seen.json
        if len(body["prompt"]) == 8:
            with self.lock:
                self.eights += 1
                fail = self.eights % 3 == 0
                self.failed += fail
            if fail:
                return _error()
        return _tokens(body)


def _error() -> Reply:
    return Reply([(0.0, b'{"error": "boom"}')], status=500, framing="length",
                 content_type="application/json")


def _tokens(body: dict) -> Reply:
    n = body["n_predict"]
    items = [(0.002, sse({"content": "ab", "tokens": [400 + i], "stop": False}))
             for i in range(n)]
    items.append((0.002, sse({"content": "", "stop": True, "stop_type": "limit",
                              "tokens_evaluated": len(body["prompt"]), "tokens_predicted": n,
                              "timings": {"prompt_n": len(body["prompt"]), "prompt_ms": 1.0,
                                          "predicted_n": n, "predicted_ms": 2.0}})))
    return Reply(items)


@pytest.mark.integration
def test_server_errors_fail_the_test_unless_allowed(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeini(f"""
[pytest]
strata_profile = {pytester.path / "profile.toml"}
strata_reports_dir = {pytester.path / "reports"}
""")
    (pytester.path / "profile.toml").write_text(PROFILE)
    pytester.makepyfile(test_cases=CASES)
    reply = FailingReply()
    with ScriptServer(reply) as srv:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA",
                                               f"--strata-server-url={srv.url}",
                                               "--strata-run-id=e1")
    out = result.stdout.str()
    assert reply.failed == 8, reply.failed  # 2 of each 8-token case's 6
    # One failure each, judged when the test's body ends (never a pass plus a teardown
    # error): the strict case and the one allowing another class.
    result.assert_outcomes(passed=3, failed=2)
    assert "FAILED test_cases.py::test_strict" in out
    assert "FAILED test_cases.py::test_allows_another_class" in out
    assert "ERROR at teardown" not in out
    assert "server errors the case does not allow" in out
    assert ("case test_cases.py::test_strict: 2 of 6 requests failed "
            "(http_status: 2)") in out
    for name in ("test_allows_any", "test_allows_http_status", "test_no_errors"):
        assert f"FAILED test_cases.py::{name}" not in out
    # Every format is still written, with the failures counted.
    run = pytester.path / "reports" / "e1"
    om = {f.name: f for f in text_string_to_metric_families((run / "metrics.txt").read_text())}
    errs = {s.labels["case_id"]: s.value for s in om["strata_failed_requests"].samples}
    assert errs["test_cases.py::test_no_errors"] == 0
    assert errs["test_cases.py::test_strict"] == 2


def test_an_unknown_allowed_class_is_a_clear_error():
    from strata_plugin.load.case_runner import CaseRunner, CaseSetup
    from strata_plugin.load.client import Timeouts
    from strata_plugin.load.workload import TokenSpace, Workload

    setup = CaseSetup("http://127.0.0.1:9", "llamacpp", "c", TokenSpace(10, 20), Timeouts())
    runner = CaseRunner(setup, record=lambda r: None, mark=lambda *a: None,
                        add_case=lambda line: None)
    with pytest.raises(ValueError, match=r"unknown error class\(es\) \['http_500'\]"):
        runner.run(Workload("x", isl=1, osl=1), allow_errors=("http_500",))

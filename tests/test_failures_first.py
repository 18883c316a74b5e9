"""Failures first: a server answering HTTP 500, a URL where nothing listens, a server
answering plain JSON. Each is a real pytest run in a subprocess against a real socket
(tests/sse_script_server.py, or a port nobody listens on); the terminal, report.md's
first lines and manifest.json must say what happened."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from strata_plugin.analysis.failures import failed_verdict, failures_of, mostly_failed
from strata_plugin.analysis.thresholds import value
from strata_plugin.formats.records import RequestError, RequestRecord
from strata_plugin.run.server import check_server_url
from tests.sse_script_server import Reply, ScriptServer, Seen

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

PROFILE = """
name = "first-minutes"
[server]
engine = "other"
api = "completions"
health_timeout_s = 300
token_id_range = [300, 1000]
[telemetry]
interval_s = 0.1
baseline_s = 0
cooldown_s = 0
collectors = ["proc"]
"""

WORKLOAD = "--strata-workload=isl=8,osl=2,concurrency=2,requests=4"


def _rec(i: int, error: RequestError | None, phase: str = "measured") -> RequestRecord:
    return RequestRecord(request_id=f"c/{phase}/{i}", case_id="c", phase=phase,
                         api="completions", scheduled_ns=i, dispatched_ns=1000 + i,
                         error=error)


E500 = RequestError("http_status", 'HTTP 500: {"error": "boom"}', 500)


# --- the share: just below and at it -----------------------------------------------------

def test_requests_failed_at_the_share_and_not_just_below():
    assert value("requests_failed_share") == 0.5
    below = [_rec(i, E500 if i < 49 else None) for i in range(100)]
    at = [_rec(i, E500 if i < 50 else None) for i in range(100)]
    assert mostly_failed(below) is None
    f = mostly_failed(at)
    assert f is not None and (f.n_failed, f.n_total) == (50, 100)
    assert mostly_failed([_rec(0, E500), _rec(1, None)]) is not None  # 1 of 2
    assert mostly_failed([_rec(0, E500), _rec(1, None), _rec(2, None)]) is None  # 1 of 3


def test_the_verdict_names_classes_counts_and_the_first_message():
    recs = [_rec(2, RequestError("timeout", "no data for read_s=60 s")), _rec(0, E500),
            _rec(1, E500), _rec(3, None)]
    f = failures_of(recs)
    assert f is not None and f.by_class == (("http_status", 2), ("timeout", 1))
    assert f.first_message == 'HTTP 500: {"error": "boom"}'  # the earliest dispatched
    v = failed_verdict(f)
    assert v.classes == ("requests_failed",) and not v.inconclusive and v.confidence == 1.0
    assert v.summary() == "requests_failed"
    assert v.notes[0] == ('3 of 4 requests failed (http_status: 2, timeout: 1); first: '
                          'HTTP 500: {"error": "boom"}')
    (ev,) = v.evidence
    assert (ev.metric, ev.value, ev.op, ev.threshold, ev.met) == (
        "failed_share", 0.75, ">=", "requests_failed_share", True)


def test_requests_cut_short_by_an_interrupt_are_not_failures():
    cut = RequestError("interrupted", "interrupted (Ctrl-C or SIGTERM) while in flight")
    f = failures_of([_rec(0, cut), _rec(1, cut), _rec(2, None)])
    assert f is not None and (f.n_failed, f.n_total) == (0, 1) and not f.mostly_failed


def test_a_case_stopped_by_its_warmups_is_judged_by_them():
    f = failures_of([_rec(0, E500, "warmup"), _rec(1, E500, "warmup")])
    assert f is not None and f.mostly_failed and f.phase == "warmup"
    assert f.line().startswith("2 of 2 warm-up requests failed")
    assert failures_of([]) is None


# --- URLs ------------------------------------------------------------------------------

@pytest.mark.parametrize("url, says", [
    ("http://127.0.0.1:", "has no port after ':'"),
    ("http://127.0.0.1:abc", "the port is not a number"),
    ("http://127.0.0.1:99999", "the port is not a number"),
    ("127.0.0.1:8000", "is not an http:// or https:// URL"),
    ("http://:8000", "has no host"),
    ("http://127.0.0.1:8000/v1", "ends in /v1"),
])
def test_a_malformed_url_is_named(url, says):
    with pytest.raises(ValueError, match=says):
        check_server_url(url)


def test_good_urls_pass():
    assert check_server_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert check_server_url("https://[::1]:8443") == "https://[::1]:8443"
    assert check_server_url("http://host.example/serve") == "http://host.example/serve"


# --- real runs in a subprocess ---------------------------------------------------------

def _setup(pytester, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("CI_NO_PROGRESS", "1")
    pytester.makeini(f"""
[pytest]
strata_profile = {pytester.path / "profile.toml"}
strata_reports_dir = {pytester.path / "reports"}
""")
    (pytester.path / "profile.toml").write_text(PROFILE)


#: Plugins of this repository's test environment a user's run does not load (hypothesis
#: alone costs seconds of imports on a busy 2-core host).
NOT_A_USERS = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark")


def _run(pytester, url: str, run_id: str):
    t0 = time.monotonic()
    result = pytester.runpytest_subprocess(*NOT_A_USERS, f"--strata-server-url={url}",
                                           WORKLOAD, f"--strata-run-id={run_id}")
    return result, time.monotonic() - t0, pytester.path / "reports" / run_id


def _outputs(run: Path) -> tuple[dict, list[str]]:
    manifest = json.loads((run / "manifest.json").read_text())
    report = (run / "report.md").read_text().splitlines()
    return manifest, report


def _health_then(reply: Reply):
    def answer(seen: Seen) -> Reply:
        if seen.method == "GET":
            return Reply([(0.0, b"ok")], framing="length", content_type="text/plain")
        return reply
    return answer


def _assert_failed_run(result, run: Path, *, says: str) -> dict:
    out = result.stdout.str()
    manifest, report = _outputs(run)
    assert manifest["complete"] is False
    reason = manifest["incomplete_reason"]
    assert "requests_failed: 4 of 4 requests failed" in reason and says in reason, reason
    # report.md: the first lines after the title say so, before any table
    head = "\n".join(report[:4])
    assert "**Run incomplete:**" in head and "requests_failed" in head and says in head, head
    summary = next(i for i, line in enumerate(report) if line == "## Summary")
    row = next(line for line in report[summary:] if line.startswith("| [`"))
    assert "| requests_failed |" in row and "4 of 4 requests failed" in row, row
    for cls in ("input_starved", "headroom", "cpu_compute"):
        assert cls not in row
    # the terminal: the run's own lines say it
    assert f"run incomplete: {reason}" in out
    return manifest


@pytest.mark.integration
def test_a_server_answering_http_500(pytester, monkeypatch):
    _setup(pytester, monkeypatch)
    err = Reply([(0.0, b'{"error": {"message": "model crashed", "code": 500}}')], status=500,
                framing="length", content_type="application/json")
    with ScriptServer(_health_then(err)) as srv:
        result, _, run = _run(pytester, srv.url, "h500")
    _assert_failed_run(result, run, says="HTTP 500")
    assert "model crashed" in json.loads((run / "manifest.json").read_text())[
        "incomplete_reason"]


@pytest.mark.integration
def test_a_server_error_body_is_shown_not_obeyed(pytester, monkeypatch):
    # Escape sequences (window title, clear screen), a bidi override and a CR LF faking a
    # line of output: the terminal and report.md show them as escapes, on one line.
    _setup(pytester, monkeypatch)
    body = ("{\"error\": \"boom\x1b]0;pwned\x07\x1b[2J\u202eevil\r\nPASSED fake line\"}"
            ).encode()
    err = Reply([(0.0, body)], status=500, framing="length", content_type="application/json")
    with ScriptServer(_health_then(err)) as srv:
        result, _, run = _run(pytester, srv.url, "hostile")
    _assert_failed_run(result, run, says="HTTP 500")
    out = result.stdout.str() + result.stderr.str()
    report = (run / "report.md").read_text()
    for text in (out, report):
        assert "\x1b" not in text and "\u202e" not in text and "\r" not in text
        assert not any(line.startswith("PASSED fake line") for line in text.splitlines())
    shown = "boom\\x1b]0;pwned\\x07\\x1b[2J\\u202eevil"
    assert f"run incomplete: case adhoc: requests_failed: 4 of 4 requests failed " \
           f"(http_status: 4); first: HTTP 500: {{\"error\": \"{shown} PASSED fake line\"}}" in out
    assert "adhoc/measured/0: http_status: HTTP 500: " in out  # the case's own failure
    assert "**Run incomplete:** " in report and shown in report


@pytest.mark.integration
def test_a_server_answering_plain_json(pytester, monkeypatch):
    _setup(pytester, monkeypatch)
    body = json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [
        {"index": 0, "text": "hi there", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 8, "completion_tokens": 2}}).encode()
    plain = Reply([(0.0, body)], framing="length", content_type="application/json")
    with ScriptServer(_health_then(plain)) as srv:
        result, _, run = _run(pytester, srv.url, "plain")
    _assert_failed_run(result, run, says="not_streaming")
    reason = json.loads((run / "manifest.json").read_text())["incomplete_reason"]
    assert "Content-Type application/json" in reason and "truncated_stream" not in reason
    recs = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    assert [r["error"]["cls"] for r in recs] == ["not_streaming"] * 4


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on return: nothing listens there


@pytest.mark.integration
def test_a_url_where_nothing_listens_fails_in_seconds(pytester, monkeypatch):
    _setup(pytester, monkeypatch)
    port = _dead_port()
    result, took_s, run = _run(pytester, f"http://127.0.0.1:{port}", "dead")
    out = result.stdout.str()
    assert took_s < 10, took_s  # the whole pytest run; the profile's health timeout is 300 s
    assert "(after 0.0 s)" in out  # Strata's own wait: none
    assert result.ret != 0
    assert (f"Strata could not reach the server at http://127.0.0.1:{port}: it tried GET "
            f"http://127.0.0.1:{port}/health and the connection to 127.0.0.1:{port} was "
            "refused: nothing listens on that port") in out
    assert "strata_plugin/" not in out and "Traceback" not in out
    assert "ServerStartError" not in out and "log tail" not in out
    manifest, report = _outputs(run)
    assert manifest["complete"] is False
    assert "could not reach the server" in manifest["incomplete_reason"]
    head = "\n".join(report[:4])
    assert "**Run incomplete:**" in head and "was refused" in head, head
    assert "run incomplete: " in out


@pytest.mark.integration
def test_a_url_without_a_port_is_a_usage_error(pytester, monkeypatch):
    _setup(pytester, monkeypatch)
    t0 = time.monotonic()
    result = pytester.runpytest_subprocess(*NOT_A_USERS, "--strata-server-url=http://127.0.0.1:",
                                           WORKLOAD)
    assert time.monotonic() - t0 < 10
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert ("--strata-server-url (ini: strata_server_url): 'http://127.0.0.1:' has no port "
            "after ':'") in err
    assert "Traceback" not in err + result.stdout.str()
    assert not (pytester.path / "reports").exists()  # nothing started, nothing written

"""An SSE event storm is bounded by the request's own size: at most
``EVENTS_PER_TOKEN x max_tokens + EXTRA_EVENTS`` events (strata_plugin/limits.py), then the
request ends as ``too_many_events`` with the events before the bound kept, and the run
goes on.

On 449ac52 a server sending 50k valid token events a second per stream had every event
kept (a million a request): requests.jsonl 162 MB, pytest 2.4 GB, SIGINT ignored for 10 s,
then no report. Here the storm is a real server on 127.0.0.1 (tests/sse_storm_server.py)
at 50,000 events a second; the bound itself is held just below and just above on
``StreamCore``, and hypothesis draws the storms.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import default_signals
import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_plugin.limits import EVENTS_PER_TOKEN, EXTRA_EVENTS, max_events
from strata_plugin.load.client import RequestSpec, Timeouts, send_streaming
from strata_plugin.load.client.core import StreamCore
from strata_plugin.load.client.errors import StreamError
from strata_plugin.load.client.flavours import flavour
from strata_plugin.load.client.mux import StreamMux
from strata_plugin.load.generator import Job, LoadParams, run_load
from tests.sse_script_server import within
from tests.sse_storm_server import StormServer

TIMEOUTS = Timeouts(connect_s=2, read_s=5, total_s=30)


def _ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


TOKEN = _ev({"choices": [{"index": 0, "text": " x"}]})
FINISH = _ev({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
DONE = b"data: [DONE]\n\n"


def _core(max_tokens: int) -> StreamCore:
    return StreamCore(flavour("completions").parser(), 1 << 20, max_events(max_tokens))


def test_the_bound_is_four_events_a_token_plus_sixteen():
    assert (EVENTS_PER_TOKEN, EXTRA_EVENTS) == (4, 16)
    assert max_events(1) == 20 and max_events(1024) == 4112


@pytest.mark.parametrize("max_tokens", [1, 8, 300])
@pytest.mark.parametrize("extra, ok", [(0, True), (1, False)])
def test_a_stream_of_exactly_the_bound_is_read_and_one_event_more_is_refused(
        max_tokens, extra, ok):
    """Tokens, the finish chunk and [DONE] all count: bound - 2 tokens + 2 ends cleanly;
    a token more is too_many_events, with the events up to the bound kept."""
    bound = max_events(max_tokens)
    core = _core(max_tokens)
    body = TOKEN * (bound - 2 + extra) + FINISH + DONE
    if ok:
        core.feed(body, 1)
        assert core.done and len(core.events) == bound - 2
    else:
        with pytest.raises(StreamError) as err:
            core.feed(body, 1)
        assert err.value.cls == "too_many_events"
        assert err.value.message.startswith(f"more than {bound} events")
        # every event up to the bound was taken: its tokens and the finish chunk
        assert len(core.events) == bound - 1 and core.parser.saw_finish


@settings(derandomize=True, database=None, deadline=None, max_examples=150)
@given(max_tokens=st.integers(1, 64), n=st.integers(0, 600),
       pieces=st.lists(st.integers(1, 4096), min_size=1, max_size=8))
def test_any_storm_keeps_at_most_the_bound(max_tokens, n, pieces):
    """However many events come and however the reads cut them, the core keeps at most
    max_events(max_tokens) and raises too_many_events exactly when the server sent more."""
    bound = max_events(max_tokens)
    core = _core(max_tokens)
    body = TOKEN * n + FINISH + DONE
    at, raised = 0, None
    for size in pieces * (len(body) // max(1, sum(pieces)) + 1):
        if at >= len(body):
            break
        try:
            core.feed(body[at:at + size], 1)
        except StreamError as e:
            raised = e
            break
        at += size
    if raised is None and at < len(body):
        try:
            core.feed(body[at:], 1)
        except StreamError as e:
            raised = e
    assert len(core.events) <= bound
    if n + 2 > bound:
        assert raised is not None and raised.cls == "too_many_events"
    else:
        assert raised is None and core.done and len(core.events) == n


@pytest.mark.parametrize("driver", ["thread", "mux"])
def test_a_storm_of_50k_events_a_second_ends_the_request_at_the_bound(driver):
    spec = RequestSpec("r1", "case", "measured", max_tokens=16, prompt="hi")
    with StormServer(rate=50_000, duration_s=20) as srv, requests.Session() as s:
        def go():
            if driver == "thread":
                return send_streaming(s, srv.url, "completions", spec,
                                      scheduled_ns=time.monotonic_ns(), timeouts=TIMEOUTS)
            with StreamMux() as mux:
                return mux.send_streaming(s, srv.url, "completions", spec,
                                          scheduled_ns=time.monotonic_ns(), timeouts=TIMEOUTS)

        t0 = time.monotonic()
        rec = within(10, go)
        took = time.monotonic() - t0
    assert rec.error is not None and rec.error.cls == "too_many_events", rec.error
    assert len(rec.events) == max_events(16) == 80
    # the first 20 ms batch (1,000 events) already passes the bound; the storm runs 20 s
    assert took < 4.0, took


def test_a_storm_on_every_request_ends_each_and_the_load_goes_on():
    """run_load over the loop: every request of the storm ends at its bound, in well under
    a second each, and the load returns with a record for each."""
    jobs = [Job(RequestSpec(f"r{i}", "case", "measured", max_tokens=8, prompt="hi"), None)
            for i in range(6)]
    with StormServer(rate=50_000, duration_s=20) as srv:
        t0 = time.monotonic()
        res = within(20, lambda: run_load(jobs, LoadParams(
            base_url=srv.url, api="completions", concurrency=2, timeouts=TIMEOUTS,
            processes=1)))
        took = time.monotonic() - t0
    assert [r.error.cls if r.error else None for r in res.records] == ["too_many_events"] * 6
    assert all(len(r.events) == max_events(8) for r in res.records)
    assert took < 5.0, took


# --- a whole run against the storm: it goes on, Ctrl-C works, the report is written ------

ROOT = Path(__file__).resolve().parents[1]
PROFILE = """
name = "storm-test"
[server]
engine = "other"
api = "completions"
health_timeout_s = 30
token_id_range = [300, 1000]
[telemetry]
interval_s = 0.5
baseline_s = 0
cooldown_s = 0
collectors = ["proc"]
"""


def _pytest_argv(tmp_path: Path, url: str, workload: str) -> list[str]:
    (tmp_path / "profile.toml").write_text(PROFILE)
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
            "no:hypothesispytest", f"--strata-profile={tmp_path / 'profile.toml'}",
            f"--strata-reports-dir={tmp_path / 'reports'}", f"--strata-server-url={url}",
            f"--strata-workload={workload}", "--strata-run-id=storm"]


@pytest.mark.integration
def test_a_run_against_a_storm_ends_with_its_report(tmp_path):
    """Four requests, each met by 50k events a second: on 449ac52 77 s, 1.7 GB RSS and a
    164 MB requests.jsonl; now each ends at its bound and the run writes its report,
    the case named requests_failed with the class."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CI_NO_PROGRESS="1")
    with StormServer(rate=50_000, duration_s=20) as srv:
        t0 = time.monotonic()
        out = subprocess.run(_pytest_argv(tmp_path, srv.url, "isl=8,osl=16,concurrency=2,"
                                          "requests=4"),
                             cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120, check=False)
        took = time.monotonic() - t0
    run = tmp_path / "reports" / "storm"
    recs = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    assert [r["error"]["cls"] for r in recs] == ["too_many_events"] * 4, out.stdout[-2000:]
    assert all(len(r["events"]) == max_events(16) for r in recs)
    assert (run / "requests.jsonl").stat().st_size < 200_000
    assert (run / "report.md").exists() and (run / "summary.json").exists()
    reason = json.loads((run / "manifest.json").read_text())["incomplete_reason"]
    assert "requests_failed: 4 of 4 requests failed" in reason and "too_many_events" in reason
    assert took < 60, took


@pytest.mark.integration
def test_ctrl_c_during_a_storm_stops_the_run_at_once_and_keeps_the_report(tmp_path):
    """A long case (400 requests, each a storm cut at its bound): SIGINT a second in ends
    the run within seconds (on 449ac52 it was ignored for 10 s, then no report)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CI_NO_PROGRESS="1")
    with StormServer(rate=50_000, duration_s=20) as srv:
        proc = subprocess.Popen(_pytest_argv(tmp_path, srv.url, "isl=8,osl=16,concurrency=2,"
                                             "requests=400"),
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                preexec_fn=default_signals.restore)
        try:
            deadline = time.monotonic() + 60
            while srv.streams < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert srv.streams >= 4, "the storm never started"
            proc.send_signal(signal.SIGINT)
            t_sig = time.monotonic()
            out, _ = proc.communicate(timeout=60)
            took = time.monotonic() - t_sig
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 2, out[-3000:]  # pytest's "interrupted"
    assert took < 15, took
    run = tmp_path / "reports" / "storm"
    assert (run / "report.md").exists(), out[-3000:]
    recs = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    assert 0 < len(recs) < 400
    assert {r["error"]["cls"] for r in recs} <= {"too_many_events", "interrupted"}
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["complete"] is False and "interrupted" in manifest["incomplete_reason"]

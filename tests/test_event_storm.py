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
import time

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
from strata_plugin.load.generator import Job, run_load
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
    assert took < 1.0, took  # the first 20 ms batch (1,000 events) already passes the bound


def test_a_storm_on_every_request_ends_each_and_the_load_goes_on():
    """run_load over the loop: every request of the storm ends at its bound, in well under
    a second each, and the load returns with a record for each."""
    jobs = [Job(RequestSpec(f"r{i}", "case", "measured", max_tokens=8, prompt="hi"), None)
            for i in range(6)]
    with StormServer(rate=50_000, duration_s=20) as srv:
        t0 = time.monotonic()
        res = within(20, lambda: run_load(jobs, base_url=srv.url, api="completions",
                                          concurrency=2, timeouts=TIMEOUTS, processes=1))
        took = time.monotonic() - t0
    assert [r.error.cls if r.error else None for r in res.records] == ["too_many_events"] * 6
    assert all(len(r.events) == max_events(8) for r in res.records)
    assert took < 5.0, took

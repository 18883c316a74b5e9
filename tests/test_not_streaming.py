"""A complete reply that is not an event stream (HTTP 200, JSON, 0 SSE events) is named
``not_streaming`` with its content type, through both drivers and every framing; the same
bytes sent as ``text/event-stream`` stay a ``truncated_stream``."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from sse_script_server import Reply, ScriptServer

from strata_plugin.formats.records import RequestRecord
from strata_plugin.load.client import RequestSpec, Timeouts

Send = Callable[..., RequestRecord]
SPEC = RequestSpec("r1", "case", "measured", max_tokens=2, prompt="hello")
BODY = json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [
    {"index": 0, "text": "hi there", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 2}}).encode()


def _plain(send: Send, url: str) -> RequestRecord:
    import requests

    with requests.Session() as s:
        return send(s, url, "completions", SPEC, scheduled_ns=0,
                    timeouts=Timeouts(connect_s=2, read_s=5))


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
def test_a_json_reply_is_not_streaming(send: Send, framing: str) -> None:
    reply = Reply(items=[(0, BODY)], framing=framing, content_type="application/json")
    with ScriptServer(reply) as srv:
        rec = _plain(send, srv.url)
    assert rec.error is not None and rec.error.cls == "not_streaming", rec.error
    msg = rec.error.message
    assert msg.startswith(f"HTTP 200 with Content-Type application/json: a complete reply of "
                          f"{len(BODY)} bytes and 0 SSE events, not a stream")
    assert '"text": "hi there"' in msg  # what it sent instead, for the reader
    assert rec.events == () and rec.extra["n_sse_events"] == 0


def test_the_same_bytes_as_an_event_stream_are_a_truncated_stream(send: Send) -> None:
    reply = Reply(items=[(0, BODY)], framing="length", content_type="text/event-stream")
    with ScriptServer(reply) as srv:
        rec = _plain(send, srv.url)
    assert rec.error is not None and rec.error.cls == "truncated_stream", rec.error

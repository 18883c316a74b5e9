"""Hostile servers against both client drivers: each ends within its timeouts, with a
record, and with the error class the server earned.

Every case is a real server on 127.0.0.1 (tests/crafted_server.py) sending exact bytes:
wrong JSON types, invalid UTF-8, NUL bytes, a 5 MB line, a stream or a head cut short, a
reset, a server that accepts and never answers, a non-streaming JSON reply, a gzip body,
bad status and header lines, a chunk size that is not hex. Both drivers (a thread
reading ``requests``' response, and the selector loop) must give the same class, and
``run_load`` (the loop's closed loop, ``run_slots``) must return too: on main at d626c9b a
malformed event left it waiting forever.

One difference is kept and shown: the thread driver's chunked decoding is http.client's,
which takes a ``0x``-prefixed chunk size (``int(x, 16)``); the loop's refuses it.

The bound asserted is ``total_s + 1 s`` per request (``total_s`` = 1.5 s, ``read_s`` =
0.5 s: the timeout cases wait their timeouts out, so they are kept short).
``python -m tests.test_crafted_server`` prints the table (case, driver, class, seconds)
kept in docs/client.md.
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import requests

from strata_plugin.formats.records import RequestRecord
from strata_plugin.load.client import RequestSpec, Timeouts, send_streaming
from strata_plugin.load.client.mux import StreamMux
from strata_plugin.load.generator import Job, LoadParams, run_load
from tests.crafted_server import Crafted, CraftedServer, chunk, head
from tests.sse_script_server import within

TIMEOUTS = Timeouts(connect_s=0.5, read_s=0.5, total_s=1.5)
BOUND_S = TIMEOUTS.total_s + 1.0  # every case ends within this, in both drivers
SPEC = RequestSpec("r1", "case", "measured", max_tokens=3, prompt="hello")

SSE_CLOSE = head("200 OK", "Content-Type: text/event-stream", "Connection: close")
SSE_CHUNKED = head("200 OK", "Content-Type: text/event-stream", "Transfer-Encoding: chunked")


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


TOKEN = ev({"content": "a", "tokens": [1], "stop": False})
END = ev({"content": "", "stop": True, "stop_type": "limit", "tokens_predicted": 3})


def stream(*events: bytes, end: str = "close") -> Crafted:
    """An unframed SSE body (Connection: close) carrying ``events``."""
    return Crafted([(0, SSE_CLOSE), *((0.01, e) for e in events)], end=end)


def chunked(*events: bytes, last: bool = True, end: str = "close") -> Crafted:
    body = [(0.01, chunk(e)) for e in events]
    if last:
        body.append((0, b"0\r\n\r\n"))
    return Crafted([(0, SSE_CHUNKED), *body], end=end)


@dataclass(frozen=True)
class Case:
    name: str
    reply: Crafted
    cls: str | None  # the error class both drivers must record (None: a good stream)
    api: str = "llamacpp"
    thread_cls: str | None = "same"  # where the thread driver differs, and why (docstring)

    def expected(self, driver: str) -> str | None:
        return self.cls if driver == "mux" or self.thread_cls == "same" else self.thread_cls


_GZ = gzip.compress(TOKEN + END)
_JSON_REPLY = b'{"content": "abc", "stop": true, "stop_type": "limit"}'

CASES = (
    Case("good stream (control)", stream(TOKEN, TOKEN, TOKEN, END), None),
    Case("llama.cpp content is a number", stream(TOKEN, ev({"content": 5, "stop": False}), END),
         "malformed_event"),
    Case("llama.cpp content is null", stream(ev({"content": None, "stop": False}), END),
         "malformed_event"),
    Case("chat delta.content is a list",
         stream(ev({"choices": [{"delta": {"content": ["x"]}}]}), b"data: [DONE]\n\n"),
         "malformed_event", api="chat"),
    Case("chat delta is a list",
         stream(ev({"choices": [{"delta": ["x"]}]}), b"data: [DONE]\n\n"),
         "malformed_event", api="chat"),
    Case("completions text is an object",
         stream(ev({"choices": [{"text": {"a": 1}}]}), b"data: [DONE]\n\n"),
         "malformed_event", api="completions"),
    Case("sglang text is a number",
         stream(ev({"text": 7, "meta_info": {"completion_tokens": 1}}), b"data: [DONE]\n\n"),
         "malformed_event", api="sglang"),
    Case("sglang meta_info is a list",
         stream(ev({"text": "a", "meta_info": [1]}), b"data: [DONE]\n\n"),
         "malformed_event", api="sglang"),
    Case("invalid UTF-8 in an event", stream(TOKEN, b'data: {"content": "\xff\xfe"}\n\n', END),
         "malformed_event"),
    Case("invalid UTF-8, multi-line event",
         stream(TOKEN, b'event: message\ndata: {"content": "\xc3("}\n\n', END),
         "malformed_event"),
    Case("NUL bytes in an event", stream(TOKEN, b'data: {"content": "a\x00b"}\n\n', END),
         "malformed_event"),
    Case("a 5 MB line", stream(TOKEN, b"data: " + b"x" * (5 * 2**20) + b"\n\n", END),
         "event_too_large"),
    Case("cut mid-event (unframed)", stream(TOKEN, b'data: {"content": "a", "tok'),
         "truncated_stream"),
    Case("cut mid-event (chunked)", chunked(TOKEN, b'data: {"content": "a", "tok', last=False),
         "reset"),
    Case("cut in the status line", Crafted([(0, b"HTTP/1.1 20")]), "reset"),
    Case("cut in the headers",
         Crafted([(0, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-A: b")]),
         "reset"),
    Case("reset mid-stream", stream(TOKEN, end="reset"), "reset"),
    Case("accepts, never answers", Crafted(answer=False), "timeout"),
    Case("stalls mid-stream", stream(TOKEN, end="hang"), "timeout"),
    Case("trickles past total_s", Crafted([(0, SSE_CLOSE), *[(0.25, TOKEN)] * 12]), "timeout"),
    Case("non-streaming JSON reply",
         Crafted([(0, head("200 OK", "Content-Type: application/json",
                           f"Content-Length: {len(_JSON_REPLY)}")), (0, _JSON_REPLY)]),
         "not_streaming"),
    Case("gzip body", Crafted([(0, head("200 OK", "Content-Type: text/event-stream",
                                        "Content-Encoding: gzip", "Connection: close")),
                                (0, _GZ)]),
         "malformed_response"),
    Case("status line with a non-ASCII digit",
         Crafted([(0, "HTTP/1.1 2\u00b20 OK\r\nContent-Type: text/event-stream\r\n\r\n"
                   .encode("latin-1")), (0, TOKEN + END)]),
         "malformed_response"),
    Case("status line not HTTP", Crafted([(0, b"SSH-2.0-OpenSSH_9.6\r\n\r\n")]),
         "malformed_response"),
    Case("header line without a colon",
         Crafted([(0, b"HTTP/1.1 200 OK\r\nnot a header\r\nConnection: close\r\n\r\n"),
                  (0, TOKEN + END)]),
         "malformed_response"),
    Case("Content-Length +5",
         Crafted([(0, head("200 OK", "Content-Type: text/event-stream", "Content-Length: +5")),
                  (0, b"data:")]),
         "malformed_response"),
    Case("chunk size not hex", Crafted([(0, SSE_CHUNKED), (0, b"xyz\r\n" + TOKEN + b"\r\n")]),
         "reset"),
    # The thread driver's chunked decoding is http.client's, whose int(size, 16) takes a
    # "0x" prefix: it reads this stream; the loop's decoder (chunked.py) refuses it.
    Case("chunk size 0x-prefixed",
         Crafted([(0, SSE_CHUNKED), *((0, b"0x%x\r\n%s\r\n" % (len(e), e)) for e in (TOKEN, END)),
                  (0, b"0\r\n\r\n")]),
         "reset", thread_cls=None),
)

Driver = Callable[..., RequestRecord]


def _run(case: Case, driver: str) -> tuple[RequestRecord, float]:
    with CraftedServer(case.reply) as srv, requests.Session() as s:
        def go() -> RequestRecord:
            if driver == "thread":
                return send_streaming(s, srv.url, case.api, SPEC, scheduled_ns=time.monotonic_ns(),
                                      timeouts=TIMEOUTS)
            with StreamMux() as mux:
                return mux.send_streaming(s, srv.url, case.api, SPEC,
                                          scheduled_ns=time.monotonic_ns(), timeouts=TIMEOUTS)

        t0 = time.monotonic()
        rec = within(BOUND_S + 5, go)
        return rec, time.monotonic() - t0


@pytest.mark.parametrize("driver", ["thread", "mux"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_server_ends_in_time_with_its_class(case: Case, driver: str) -> None:
    rec, took = _run(case, driver)
    cls = rec.error.cls if rec.error is not None else None
    print(f"| {case.name} | {driver} | {cls or 'ok'} | {took:.2f} |")
    assert took <= BOUND_S, f"{case.name}: {took:.2f} s > {BOUND_S} s"
    assert cls == case.expected(driver), f"{case.name} ({driver}): {rec.error}"
    if cls in ("malformed_event", "malformed_response"):
        assert rec.error is not None and "Error:" not in rec.error.message  # no exception text


def test_run_load_returns_on_a_malformed_event() -> None:
    """The original hang: a number for text, three requests through run_slots."""
    reply = stream(TOKEN, ev({"content": 5, "stop": False}), END)
    jobs = [Job(RequestSpec(f"r{i}", "case", "measured", max_tokens=3, prompt="hi"), None)
            for i in range(3)]
    with CraftedServer(reply) as srv:
        t0 = time.monotonic()
        res = within(BOUND_S + 5, lambda: run_load(jobs, LoadParams(
            base_url=srv.url, api="llamacpp", concurrency=2, timeouts=TIMEOUTS)))
        took = time.monotonic() - t0
    assert took <= BOUND_S
    assert [r.error.cls if r.error else None for r in res.records] == ["malformed_event"] * 3
    assert all(len(r.events) == 1 for r in res.records)  # the token before it is kept


def main() -> None:
    """Print the table (markdown) for docs/client.md."""
    print(f"bound per request: total_s + 1 s = {BOUND_S:g} s (read_s={TIMEOUTS.read_s:g}, "
          f"total_s={TIMEOUTS.total_s:g}); Python {sys.version.split()[0]}")
    print("| case | thread driver | loop (mux) | seconds (thread / mux) |")
    print("| --- | --- | --- | --- |")
    for case in CASES:
        got = [_run(case, d) for d in ("thread", "mux")]
        classes = [r.error.cls if r.error else "ok" for r, _ in got]
        print(f"| {case.name} | `{classes[0]}` | `{classes[1]}` | "
              f"{got[0][1]:.2f} / {got[1][1]:.2f} |")


if __name__ == "__main__":
    main()

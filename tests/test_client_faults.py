"""Broken streams become recorded failures, quickly, with bounded memory; never a hang."""

from __future__ import annotations

import socket
import threading
import time
import tracemalloc
from collections.abc import Callable

import pytest
import requests
from sse_script_server import Reply, ScriptServer, free_port, sse, within

from strata_plugin.formats.records import RequestRecord
from strata_plugin.load.client import RequestSpec, Timeouts
from strata_plugin.load.client.mux import StreamMux

SPEC = RequestSpec("r1", "case", "measured", max_tokens=3, prompt="hello")
TOKEN = sse({"index": 0, "content": " x", "tokens": [1], "stop": False})
END = sse({"index": 0, "content": "", "stop": True, "stop_type": "limit", "tokens_predicted": 3})
CHAT_TOKEN = sse({"id": "c", "choices": [{"index": 0, "delta": {"content": "x"}}]})


Send = Callable[..., RequestRecord]




def _send(
    send: Send,
    url: str,
    api: str = "llamacpp",
    timeouts: Timeouts | None = None,
    headers: dict[str, str] | None = None,
    limit_s: float = 10,
) -> tuple[RequestRecord, float]:
    def go() -> RequestRecord:
        with requests.Session() as s:
            return send(
                s,
                url,
                api,
                SPEC,
                scheduled_ns=time.monotonic_ns(),
                timeouts=timeouts or Timeouts(read_s=5),
                headers=headers,
            )

    t0 = time.monotonic()
    rec = within(limit_s, go)
    return rec, time.monotonic() - t0


def _error(rec: RequestRecord) -> str:
    assert rec.error is not None, "expected a failed request"
    return rec.error.cls


def test_non_json_event_is_malformed(send: Send) -> None:
    items = [(0, TOKEN), (0, b"data: {not json at all\n\n"), (0, TOKEN), (0, END)]
    with ScriptServer(Reply(items=items)) as srv:
        rec, _ = _send(send, srv.url)
    assert _error(rec) == "malformed_event"
    assert len(rec.events) == 1  # what came before the bad event is kept


def test_stream_of_another_api_is_named_not_silently_empty(send: Send) -> None:
    # An OpenAI-compatible server attached with api = "llamacpp": every event parses as
    # JSON, none as a llama.cpp token.
    chunk = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": " x"}]}
    items = [(0, sse(chunk))] * 3 + [(0, sse("[DONE]"))]
    with ScriptServer(Reply(items=items)) as srv:
        rec, _ = _send(send, srv.url, api="llamacpp")
    assert _error(rec) == "no_tokens"
    assert rec.error is not None
    msg = rec.error.message
    assert msg.startswith(
        "3 SSE events, 0 tokens parsed as llamacpp; does the server speak llamacpp?"
    ), msg
    assert '"object":"text_completion"' in msg  # the raw first event, as sent
    # The same stream read as what it is works.
    with ScriptServer(Reply(items=items)) as srv:
        ok, _ = _send(send, srv.url, api="completions")
    assert ok.ok and ok.events, ok.error


def test_a_stream_that_finished_without_tokens_is_not_an_api_mismatch(send: Send) -> None:
    # llama.cpp stopping at once (an EOS first) sends a finish and no token: not no_tokens.
    with ScriptServer(Reply(items=[(0, END)])) as srv:
        rec, _ = _send(send, srv.url)
    assert rec.error is None or rec.error.cls != "no_tokens", rec.error


@pytest.mark.parametrize(("framing", "cls"), [("chunked", "reset"), ("close", "truncated_stream")])
def test_stream_cut_mid_event(send: Send, framing: str, cls: str) -> None:
    # Chunked: the connection closes without the last chunk (the framing breaks: reset).
    # Unframed: the body just ends, inside an event (truncated).
    items = [(0, TOKEN), (0.05, b'data: {"index":0,"content":" y","tok')]
    with ScriptServer(Reply(items=items, framing=framing, end="cut")) as srv:
        rec, took = _send(send, srv.url)
    assert _error(rec) == cls, rec.error
    assert len(rec.events) == 1 and took < 2


def test_chunked_body_ending_inside_an_event_is_truncated(send: Send) -> None:
    items = [(0, TOKEN), (0, b'data: {"index":0,"content":" y"}\n')]  # no blank line
    with ScriptServer(Reply(items=items, framing="chunked")) as srv:
        rec, _ = _send(send, srv.url)
    assert _error(rec) == "truncated_stream"
    assert "inside an event" in rec.error.message  # type: ignore[union-attr]


@pytest.mark.parametrize("framing", ["chunked", "close"])
def test_stream_without_terminal_event_is_truncated(send: Send, framing: str) -> None:
    with ScriptServer(Reply(items=[(0, TOKEN), (0, TOKEN)], framing=framing)) as srv:
        rec, _ = _send(send, srv.url)
    assert _error(rec) == "truncated_stream"
    assert len(rec.events) == 2 and rec.done_ns is not None


def test_a_bug_while_building_the_record_is_still_a_record(send: Send, monkeypatch) -> None:
    """Any exception on the way to the record is a ``client`` record naming it: the thread
    driver's send_streaming never raises, and the loop never loses the request (on d626c9b
    the first raised out of send_streaming and the second waited forever)."""

    class Broken:
        @staticmethod
        def sha256(_: bytes) -> None:
            raise RuntimeError("boom in the record")

    monkeypatch.setattr("strata_plugin.load.client.attempt.hashlib", Broken)
    with ScriptServer(Reply(items=[(0, TOKEN), (0, END)])) as srv:
        rec, took = _send(send, srv.url, limit_s=5)
    assert _error(rec) == "client"
    assert "RuntimeError: boom in the record" in rec.error.message  # type: ignore[union-attr]
    assert rec.request_id == SPEC.request_id and rec.dispatched_ns > 0 and took < 2


def test_connection_reset_mid_stream(send: Send) -> None:
    with ScriptServer(Reply(items=[(0, TOKEN), (0.05, TOKEN)], end="reset")) as srv:
        rec, _ = _send(send, srv.url)
    assert _error(rec) == "reset"


def test_stalled_stream_times_out(send: Send) -> None:
    items = [(0, TOKEN), (30, TOKEN)]  # the second token never comes in time
    with ScriptServer(Reply(items=items)) as srv:
        rec, took = _send(send, srv.url, timeouts=Timeouts(read_s=0.5), limit_s=5)
    assert _error(rec) == "timeout"
    # ~0.5 s; the upper bound leaves a busy host (a 1 s garbage-collector pass, a late
    # thread) its room and still refuses a read timeout that did not fire (30 s)
    assert 0.45 < took < 3.0, took
    assert len(rec.events) == 1


def test_total_timeout_bounds_a_trickling_stream(send: Send) -> None:
    items = [(0.1, TOKEN)] * 40  # never silent for read_s, but far longer than total_s
    with ScriptServer(Reply(items=items)) as srv:
        rec, took = _send(send, srv.url, timeouts=Timeouts(read_s=5, total_s=0.6), limit_s=5)
    assert _error(rec) == "timeout"
    assert 0.55 < took < 3.0, took  # the stream alone would run 4 s


def test_no_response_headers_times_out(send: Send) -> None:
    with ScriptServer(Reply(items=[(0, TOKEN)], head_delay_s=30)) as srv:
        rec, took = _send(send, srv.url, timeouts=Timeouts(read_s=0.5), limit_s=5)
    assert _error(rec) == "timeout" and 0.45 < took < 3.0, took  # headers: 30 s
    assert rec.first_byte_ns is None


def test_http_500_with_body(send: Send) -> None:
    body = b'{"error":{"code":500,"message":"CUDA out of memory","type":"server_error"}}'
    reply = Reply(items=[(0, body)], status=500, framing="length", content_type="application/json")
    with ScriptServer(reply) as srv:
        rec, _ = _send(send, srv.url)
    assert _error(rec) == "http_status"
    assert rec.error is not None and rec.error.http_status == 500
    assert "CUDA out of memory" in rec.error.message
    assert rec.events == () and rec.first_byte_ns is not None


def test_in_band_error_event(send: Send) -> None:
    err = sse({"error": {"code": 400, "message": "context length exceeded", "type": "x"}})
    with ScriptServer(Reply(items=[(0, CHAT_TOKEN), (0, err)])) as srv:
        rec, _ = _send(send, srv.url, api="chat")
    assert _error(rec) == "http_status"
    assert rec.error is not None and rec.error.http_status == 400
    assert "context length" in rec.error.message


def test_huge_event_is_refused_with_bounded_memory(send: Send) -> None:
    limit = 1024 * 1024
    block = b"x" * 65536
    items = [(0, TOKEN), (0, b'data: {"content":"')] + [(0, block)] * 512  # a 32 MiB event
    with ScriptServer(Reply(items=items, framing="close")) as srv:
        tracemalloc.start()
        try:
            rec, took = _send(send, srv.url, timeouts=Timeouts(read_s=5, max_event_bytes=limit))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        sent = srv.seen[0].sent_bytes
    assert _error(rec) == "event_too_large"
    assert len(rec.events) == 1
    # The client stopped near the limit: it never held the 32 MiB event.
    assert peak < 6 * limit, peak
    assert rec.extra["n_bytes"] < 2 * limit
    assert sent < 32 * 1024 * 1024
    assert took < 5


def test_connection_refused(send: Send) -> None:
    rec, took = _send(send, f"http://127.0.0.1:{free_port()}")
    assert _error(rec) == "connect"
    assert rec.first_byte_ns is None and took < 2


def test_connect_timeout_is_a_timeout() -> None:
    # No unroutable address here (tests stay on 127.0.0.1): map the exceptions directly.
    from urllib3.exceptions import ConnectTimeoutError, MaxRetryError

    from strata_plugin.load.client.attempt import send_error as _send_error

    t = Timeouts(connect_s=0.3)
    assert _send_error(requests.exceptions.ConnectTimeout("x"), t).cls == "timeout"
    inner = MaxRetryError(None, "/", ConnectTimeoutError("slow"))  # type: ignore[arg-type]
    assert _send_error(requests.exceptions.ConnectionError(inner), t).cls == "timeout"
    assert _send_error(requests.exceptions.InvalidURL("bad"), t).cls == "client"


def test_secrets_never_reach_errors(send: Send) -> None:
    secret = "sk-live-0123456789"
    url = f"http://user:pw-{secret}@127.0.0.1:{free_port()}"
    rec, _ = _send(send, url, headers={"Authorization": f"Bearer {secret}", "X-Key": secret})
    assert rec.error is not None
    assert secret not in rec.to_json()


def _closes_before_answering() -> socket.socket:
    """A listener that reads each request and closes without a byte of response, until
    it is closed."""
    lst = socket.create_server(("127.0.0.1", 0))
    lst.settimeout(0.1)  # a blocked accept() is not woken by close(): look again

    def serve() -> None:
        while lst.fileno() != -1:
            try:
                conn, _ = lst.accept()
            except TimeoutError:
                continue
            except OSError:  # closed: the test is over
                return
            with conn:
                conn.recv(65536)

    threading.Thread(target=serve, daemon=True).start()
    return lst


def test_a_header_that_is_no_credential_is_not_hidden_from_messages(send: Send) -> None:
    # "Connection: close" is sent with every request of a case without keep-alive; its
    # value is a word of the client's own message and must stay one.
    lst = _closes_before_answering()
    with lst:
        url = f"http://127.0.0.1:{lst.getsockname()[1]}"
        rec, _ = _send(send, url, headers={"Connection": "close", "Accept": "text/event-stream"})
    assert rec.error is not None
    assert rec.error.message.startswith("connection closed before a response"), rec.error
    assert "***" not in rec.error.message


def test_credentials_a_server_echoes_are_hidden(send: Send) -> None:
    # A gateway that quotes what it was sent: the bearer token, the Basic password and the
    # API key are hidden wherever they appear; the rest of its words are kept.
    from strata_plugin.configure.credentials import UrlAuth

    token, password, key = "sk-live-0123456789", "hunter2-pw", "k3y-abcdef"
    basic = UrlAuth("alice", password).header()
    body = (f'{{"error":"token {token} refused; Authorization: {basic}; password {password}; '
            f'api key {key}; Connection: close"}}').encode()
    reply = Reply(items=[(0, body)], status=401, framing="length",
                  content_type="application/json")
    with ScriptServer(reply) as srv:
        rec, _ = _send(send, srv.url, headers={"Authorization": f"Bearer {token}",
                                               "Proxy-Authorization": basic, "X-API-Key": key,
                                               "Connection": "close"})
    assert rec.error is not None and rec.error.http_status == 401
    msg = rec.error.message
    for secret in (token, password, key, basic):
        assert secret not in msg, msg
    assert "refused" in msg and "Connection: close" in msg and "api key ***" in msg, msg


def test_secret_values_are_the_credential_headers_only() -> None:
    from strata_plugin.configure.credentials import UrlAuth, secret_values

    basic = UrlAuth("alice", "hunter2-pw").header()
    got = secret_values({"Authorization": "Bearer abcd", "Connection": "close",
                         "Content-Type": "application/json", "Cookie": "sid=s3ss10n; x=1",
                         "Proxy-Authorization": basic, "Accept": "text/event-stream"})
    assert set(got) == {"Bearer abcd", "abcd", "sid=s3ss10n; x=1", "s3ss10n", basic,
                        basic.split(" ")[1], "alice:hunter2-pw", "hunter2-pw"}
    # a part of three characters would hide those letters in every word; the whole
    # header value is hidden whatever its length
    assert secret_values({"Authorization": "Bearer abc"}) == ("Bearer abc",)
    assert got[0] == max(got, key=len)  # the whole value goes before its parts


def test_keep_alive_connection_is_reused(send: Send) -> None:
    items = [(0, TOKEN)] * 3 + [(0, END)]
    with ScriptServer(Reply(items=items)) as srv:

        def three() -> list[RequestRecord]:
            with requests.Session() as s:
                return [
                    send(s, srv.url, "llamacpp", SPEC, scheduled_ns=time.monotonic_ns())
                    for _ in range(3)
                ]

        recs = within(10, three)
        assert all(r.ok for r in recs), [r.error for r in recs]
        assert [len(r.events) for r in recs] == [3, 3, 3]
        assert srv.connections == 1


def test_mux_serves_many_streams_at_once() -> None:
    items = [(0.05, TOKEN), (0.1, TOKEN), (0.1, TOKEN), (0, END)]
    with ScriptServer(Reply(items=items)) as srv, StreamMux() as mux:
        out: list[RequestRecord] = []

        def one() -> None:
            with requests.Session() as s:
                out.append(
                    mux.send_streaming(
                        s, srv.url, "llamacpp", SPEC, scheduled_ns=time.monotonic_ns()
                    )
                )

        threads = [threading.Thread(target=one) for _ in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        seen = list(srv.seen)
    assert len(out) == 40 and all(r.ok for r in out), [r.error for r in out if not r.ok]
    # Stamps follow the server's sends (same clock). Held-back events would be
    # a whole 100 ms gap late; a busy shared host may delay a few by some ms.
    sent = sorted(ns for sn in seen for ns in sn.sent_ns[:3])
    got = sorted(e.t_ns for r in out for e in r.events)
    assert len(got) == len(sent) == 120
    lag = sorted(g - s for g, s in zip(got, sent, strict=True))
    assert lag[60] < 5_000_000 and lag[108] < 15_000_000, [x / 1e6 for x in lag[::12]]


def test_mux_forgets_finished_streams() -> None:
    items = [(0, TOKEN)] * 3 + [(0, END)]
    with ScriptServer(Reply(items=items)) as srv, StreamMux() as mux:

        def many() -> list[RequestRecord]:
            with requests.Session() as s:
                return [
                    mux.send_streaming(s, srv.url, "llamacpp", SPEC, scheduled_ns=0)
                    for _ in range(150)
                ]

        recs = within(30, many)
        assert all(r.ok for r in recs)
        assert len(mux._heap) <= 65  # not one entry per request until read_s expires


def test_mux_close_ends_open_streams() -> None:
    with ScriptServer(Reply(items=[(0, TOKEN), (30, TOKEN)])) as srv:
        mux = StreamMux().__enter__()
        box: list[RequestRecord] = []

        def one() -> None:
            with requests.Session() as s:
                box.append(mux.send_streaming(s, srv.url, "llamacpp", SPEC, scheduled_ns=0))

        t = threading.Thread(target=one)
        t.start()
        time.sleep(0.3)
        within(5, mux.close)
        t.join(5)
    assert box and _error(box[0]) == "client" and len(box[0].events) == 1


@pytest.mark.parametrize("warmups", [1, 0])
def test_a_case_against_a_server_of_another_api_fails_with_the_clients_words(
    warmups: int,
) -> None:
    # The case fails where it starts, with the client's message, not later with a
    # TypeError on metrics that were never measured; every request is still recorded.
    from strata_plugin.load.case_runner import CaseRunner, CaseSetup, NoTokens
    from strata_plugin.load.workload import TokenSpace, Workload

    chunk = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": " x"}]}
    items = [(0, sse(chunk))] * 5 + [(0, sse("[DONE]"))]
    recorded: list[RequestRecord] = []
    with ScriptServer(Reply(items=items)) as srv:
        setup = CaseSetup(srv.url, "llamacpp", "c", TokenSpace(10, 100), Timeouts(read_s=5))
        runner = CaseRunner(setup, record=recorded.append, mark=lambda *a: None,
                            add_case=lambda line: None)
        w = Workload("w", isl=8, osl=4, concurrency=1, requests=2, warmups=warmups)
        with pytest.raises(NoTokens, match=r"^5 SSE events, 0 tokens parsed as llamacpp; "
                           r"does the server speak llamacpp\? first event: \{"):
            runner.run(w, scale=False)
    assert len(recorded) == (1 if warmups else 2)  # a warm-up stops it before the measured load
    assert all(r.error is not None and r.error.cls == "no_tokens" for r in recorded)

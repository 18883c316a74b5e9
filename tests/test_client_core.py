"""The byte-level pieces: chunked decoding and event splitting, at every split point."""

from __future__ import annotations

import json

import pytest

from strata_plugin.load.client.chunked import ChunkedDecoder, ChunkError
from strata_plugin.load.client.core import StreamCore, last_boundary
from strata_plugin.load.client.errors import StreamError
from strata_plugin.load.client.llamacpp import LlamaCppParser
from strata_plugin.load.client.openai import OpenAIParser


def _chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def test_chunked_decoder_at_every_split() -> None:
    body = [b"data: one\n\n", b"data: t", b"wo\n\n", b"x" * 300]
    wire = _chunked(*body).replace(b"\r\n", b";ext=1\r\n", 1)  # a chunk extension too
    for cut in range(len(wire) + 1):
        d = ChunkedDecoder()
        out = d.feed(wire[:cut]) + d.feed(wire[cut:])
        assert out == b"".join(body), cut
        assert d.complete and d.extra == 0


def test_chunked_decoder_byte_by_byte_and_trailers() -> None:
    wire = b"5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\nGET"
    d = ChunkedDecoder()
    out = b"".join(d.feed(wire[i : i + 1]) for i in range(len(wire)))
    assert out == b"hello" and d.complete and d.extra == 3


@pytest.mark.parametrize("wire", [b"zz\r\nabc\r\n", b"3\r\nabcXY", b"9" * 5000])
def test_chunked_decoder_rejects_broken_framing(wire: bytes) -> None:
    with pytest.raises(ChunkError):
        ChunkedDecoder().feed(wire)


def test_last_boundary() -> None:
    assert last_boundary(b"data: a\n\ndata: b") == 9
    assert last_boundary(b"data: a\r\n\r\n") == 11
    assert last_boundary(b"data: a\r\rx") == 9
    assert last_boundary(b"data: a\ndata: b\n") == -1


def _llama(i: int) -> bytes:
    return b"data: " + json.dumps({"content": f"t{i}", "tokens": [i], "stop": False}).encode()


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_core_stamps_each_event_with_the_read_that_completed_it(eol: bytes) -> None:
    stream = _llama(0) + eol * 2 + _llama(1) + eol * 2
    for cut in range(1, len(stream)):
        core = StreamCore(LlamaCppParser(), 1 << 20)
        core.feed(stream[:cut], 100)
        core.feed(stream[cut:], 200)
        stamps = [e.t_ns for e in core.events]
        # an event is complete once the empty line's first byte is in
        first_end = len(_llama(0)) + len(eol) + 1
        second_end = len(stream) - len(eol) + 1
        want = [100 if cut >= first_end else 200, 100 if cut >= second_end else 200]
        assert stamps == want, cut
        assert core.parser.output_text == "t0t1"


#: Every way to end a line and then the empty line that ends an event (the SSE spec:
#: a line ends in CRLF, LF or CR). CR then LF is one CRLF, so it is not a pair.
EOLS = (b"\n", b"\r\n", b"\r")
BLANKS = [(a, b) for a in EOLS for b in EOLS if not (a == b"\r" and b.startswith(b"\n"))]


@pytest.mark.parametrize(("eol", "blank"), BLANKS, ids=[repr(a + b) for a, b in BLANKS])
def test_core_splits_events_at_every_line_ending_the_spec_allows(eol: bytes, blank: bytes) -> None:
    # e.g. "data: ...\n\r\n": the line ends in LF, the empty line in CRLF.
    stream = _llama(0) + eol + blank + _llama(1) + eol + blank
    # An event is complete once the empty line's first byte is in.
    first_end = len(_llama(0)) + len(eol) + 1
    second_end = len(stream) - len(blank) + 1
    for cut in range(1, len(stream)):
        core = StreamCore(LlamaCppParser(), 1 << 20)
        core.feed(stream[:cut], 100)
        core.feed(stream[cut:], 200)
        stamps = [e.t_ns for e in core.events]
        want = [100 if cut >= first_end else 200, 100 if cut >= second_end else 200]
        assert stamps == want, cut
        assert core.parser.output_text == "t0t1", cut
        assert core.n_bytes == len(stream)


def test_core_keeps_the_first_event_raw() -> None:
    core = StreamCore(LlamaCppParser(), 1 << 20)
    core.feed(_llama(0) + b"\n\n" + _llama(1) + b"\n\n", 1)
    assert core.first_event == _llama(0)[len(b"data: ") :].decode()


def test_core_bounds_an_event_that_never_ends() -> None:
    core = StreamCore(OpenAIParser(), 1000)
    core.feed(b"data: {", 1)
    with pytest.raises(StreamError) as e:
        for _ in range(20):
            core.feed(b"x" * 100, 2)
    assert e.value.cls == "event_too_large"
    assert core._plen <= 1100  # held at most the bound plus one read


def test_core_end_of_body_inside_an_event() -> None:
    core = StreamCore(LlamaCppParser(), 1 << 20)
    core.feed(_llama(0) + b"\n\n" + b'data: {"cont', 1)
    with pytest.raises(StreamError, match="inside an event"):
        core.end_of_body(2)
    assert len(core.events) == 1 and core.eof_ns == 2


def test_core_ignores_comments_and_keeps_ttft_for_tokens_only() -> None:
    core = StreamCore(OpenAIParser(), 1 << 20)
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    tok = {"choices": [{"index": 0, "delta": {"content": "hi"}}]}
    core.feed(b": ping\n\n", 1)
    core.feed(b"data: " + json.dumps(role).encode() + b"\n\n", 2)
    core.feed(b"event: message\ndata: " + json.dumps(tok).encode() + b"\n\n", 3)
    core.feed(b"data: [DONE]\n\n", 4)
    assert [(e.t_ns, e.n_tokens) for e in core.events] == [(3, 1)]
    assert core.done_ns == 4

"""Property tests over what a server controls: the response head, the chunked framing, the
SSE bytes and every field of an event. Whatever it sends, the client either reads it or
raises its own error type (HeadError, ChunkError, StreamError), never another exception,
and nothing but strings and numbers reaches a record.

Hypothesis runs derandomized (a fixed seed derived from each test) with no example
database, so a CI run is the same every time; ``max_examples`` keeps the whole file
under 5 s of CPU on this host. Explicit examples pin the inputs the audit of d626c9b found.
"""

from __future__ import annotations

import itertools
import json

import pytest
import requests
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from strata_plugin.formats.records import RequestRecord
from strata_plugin.load.client.attempt import Attempt
from strata_plugin.load.client.chunked import ChunkedDecoder, ChunkError
from strata_plugin.load.client.core import StreamCore
from strata_plugin.load.client.errors import StreamError
from strata_plugin.load.client.flavours import API_FLAVOURS, flavour
from strata_plugin.load.client.http1 import HeadError, parse_head
from strata_plugin.load.client.spec import RequestSpec, Timeouts

FAST = settings(derandomize=True, database=None, deadline=None, max_examples=100,
                suppress_health_check=[HealthCheck.too_slow])
HEX = "0123456789abcdefABCDEF"


def _splits(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given offsets (taken modulo its length, sorted)."""
    at = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *at, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


# --- the chunked decoder -------------------------------------------------------------

def _encode(payloads: list[bytes], exts: list[str], pad: list[int]) -> bytes:
    out = []
    for i, p in enumerate(payloads):
        size = "0" * pad[i % len(pad)] + f"{len(p):x}"
        ext = exts[i % len(exts)]
        out.append(f"{size}{ext}\r\n".encode() + p + b"\r\n")
    return b"".join(out) + b"0\r\n\r\n"


@FAST
@given(
    payloads=st.lists(st.binary(min_size=1, max_size=300), max_size=8),
    exts=st.lists(st.sampled_from(["", ";a=b", " ;x", ';n="q"']), min_size=1, max_size=3),
    pad=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 10**6), max_size=12),
)
def test_chunked_split_anywhere_gives_the_same_bytes(payloads, exts, pad, cuts) -> None:
    wire = _encode(payloads, exts, pad)
    d = ChunkedDecoder()
    got = b"".join(d.feed(part) for part in _splits(wire, cuts))
    assert got == b"".join(payloads)
    assert d.complete and d.extra == 0


@FAST
@given(garbage=st.binary(max_size=200), cuts=st.lists(st.integers(0, 10**6), max_size=6))
def test_chunked_garbage_is_a_chunk_error_or_bytes(garbage: bytes, cuts: list[int]) -> None:
    d = ChunkedDecoder()
    try:
        for part in _splits(garbage, cuts):
            assert isinstance(d.feed(part), bytes)
    except ChunkError:
        pass


@FAST
@given(size=st.text(alphabet=HEX + "xX+-_ \t\u00b2\u0660g", min_size=1, max_size=4))
@example(size="+1a")
@example(size=" 1a")
@example(size="0x1a")
@example(size="1_a")
def test_a_chunk_size_is_hex_digits_only(size: str) -> None:
    """RFC 9112 section 7.1: chunk-size = 1*HEXDIG; on d626c9b int(x, 16) took the rest."""
    digits = size.rstrip(" \t")
    hex_only = digits != "" and all(c in HEX for c in digits)
    payload = b"z" * (int(digits, 16) if hex_only else 0x1A)
    wire = size.encode() + b"\r\n" + payload + b"\r\n0\r\n\r\n"
    d = ChunkedDecoder()
    try:
        out = d.feed(wire)
    except ChunkError:
        assert not hex_only, size
        return
    assert hex_only, f"{size!r} was taken as a chunk size"
    assert out == payload and d.complete


@pytest.mark.parametrize("ext", [";a=b", " ;x=1", ";"])
def test_chunk_extensions_are_still_allowed(ext: str) -> None:
    wire = f"5{ext}\r\n".encode() + b"hello\r\n0\r\n\r\n"
    d = ChunkedDecoder()
    assert d.feed(wire) == b"hello" and d.complete


# --- the response head ----------------------------------------------------------------

_TOKEN_CHARS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-ABCXYZ0123456789", min_size=1,
                       max_size=12)
_VALUE_CHARS = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF,
                                              blacklist_characters="\x7f"), max_size=20)


@FAST
@given(
    status=st.integers(200, 599),
    headers=st.lists(st.tuples(_TOKEN_CHARS, _VALUE_CHARS), max_size=6),
    cuts=st.lists(st.integers(0, 10**6), max_size=6),
    body=st.binary(max_size=40),
)
def test_head_split_anywhere_parses_the_same(status, headers, cuts, body) -> None:
    headers = [(k, v) for k, v in headers
               if k.lower() not in ("content-length", "transfer-encoding")]
    raw = (f"HTTP/1.1 {status} R\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
           + "\r\n").encode("latin-1")
    full, used = parse_head(raw + body)
    assert full is not None and full.status == status and used == len(raw)
    buf = b""
    for part in _splits(raw + body, cuts):
        buf += part
        head, n = parse_head(buf)
        if head is not None:
            assert head == full and n == used
            break
        assert n == 0 and len(buf) < len(raw)
    else:
        raise AssertionError("the head never completed")


@FAST
@given(garbage=st.binary(max_size=300))
@example(garbage="HTTP/1.1 2\u00b20 OK\r\n\r\n".encode("latin-1"))
@example(garbage=b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n")
@example(garbage=b"HTTP/1.1 200 OK\r\nContent-Length: 5_0\r\n\r\n")
def test_head_garbage_is_a_head_error_or_a_head(garbage: bytes) -> None:
    try:
        head, n = parse_head(garbage + b"\r\n\r\n")
    except HeadError:
        return
    assert head is None or (100 <= head.status <= 999 and 0 < n <= len(garbage) + 4)
    if head is not None and head.length is not None:
        assert head.length >= 0


@FAST
@given(code=st.text(alphabet="0123456789\u00b2\u00b3\u00b9 +-_x", min_size=1, max_size=4))
@example(code="2\u00b20")
def test_a_status_code_is_three_ascii_digits(code: str) -> None:
    """RFC 9112 section 4: status-code = 3DIGIT. On d626c9b "2\u00b20".isdigit() let it
    through to int(), whose ValueError the loop recorded as a ``client`` bug."""
    raw = f"HTTP/1.1 {code} OK\r\n\r\n".encode("latin-1")
    good = len(code) == 3 and all(c in "0123456789" for c in code)
    try:
        head, _ = parse_head(raw)
    except HeadError:
        assert not good, code
        return
    assert good, code
    assert head is None or head.status == int(code)  # None: a 1xx, the real head follows


# --- the SSE parsers ------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=8,
)
_text = st.one_of(st.text(max_size=6), _json)
_num = st.one_of(st.integers(0, 50), _json)
_usage = st.one_of(st.fixed_dictionaries({}, optional={
    "completion_tokens": _num, "prompt_tokens": _num,
    "prompt_tokens_details": st.one_of(st.fixed_dictionaries({}, optional={"cached_tokens": _num}),
                                       _json),
    "completion_tokens_details": st.one_of(
        st.fixed_dictionaries({}, optional={"reasoning_tokens": _num}), _json),
}), _json)
_timings = st.one_of(st.fixed_dictionaries({}, optional={
    k: _num for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n")}),
    _json)
_choice = st.one_of(st.fixed_dictionaries({}, optional={
    "delta": st.one_of(st.fixed_dictionaries({}, optional={
        "content": _text, "reasoning_content": _text, "reasoning": _text, "role": _text}),
        _json),
    "text": _text,
    "finish_reason": st.one_of(st.sampled_from([None, "stop", "length"]), _json),
}), _json)
_EVENTS = {
    "chat": st.fixed_dictionaries({}, optional={
        "choices": st.one_of(st.lists(_choice, max_size=2), _json), "usage": _usage,
        "timings": _timings}),
    "llamacpp": st.fixed_dictionaries({}, optional={
        "content": _text, "tokens": st.one_of(st.lists(st.integers(0, 9), max_size=3), _json),
        "stop": st.one_of(st.booleans(), _json), "stop_type": st.one_of(
            st.sampled_from(["limit", "eos", "word"]), _json),
        "tokens_predicted": _num, "tokens_evaluated": _num, "tokens_cached": _num,
        "timings": _timings, "truncated": _json}),
    "sglang": st.fixed_dictionaries({}, optional={
        "text": _text, "meta_info": st.one_of(st.fixed_dictionaries({}, optional={
            "completion_tokens": _num, "prompt_tokens": _num, "cached_tokens": _num,
            "spec_verify_ct": _num, "finish_reason": st.one_of(
                st.sampled_from([None, "stop", {"type": "length"}]), _json)}), _json)}),
}
_EVENTS["completions"] = _EVENTS["chat"]
assert set(_EVENTS) == set(API_FLAVOURS)
SPEC = RequestSpec("r", "c", "measured", max_tokens=4, prompt="p")
_SESSION = requests.Session()


def _check_record(a: Attempt) -> RequestRecord:
    """The record builds and round-trips, and carries only plain types."""
    rec = a.record()
    assert rec.error is None or rec.error.cls != "client", rec.error
    again = RequestRecord.from_json(rec.to_json())
    assert again.output_text == rec.output_text
    assert rec.finish_reason is None or isinstance(rec.finish_reason, str)
    for v in (rec.usage.prompt_tokens, rec.usage.completion_tokens, rec.usage.cached_tokens):
        assert v is None or (isinstance(v, int) and not isinstance(v, bool))
    if rec.timings is not None:
        for v in vars(rec.timings).values():
            assert v is None or (isinstance(v, int | float) and not isinstance(v, bool))
    assert all(isinstance(e.n_tokens, int) and e.n_tokens > 0 for e in rec.events)
    return rec


@pytest.mark.parametrize("api", API_FLAVOURS)
@settings(FAST, max_examples=50)
@given(data=st.data())
def test_any_event_fields_are_read_or_malformed(api: str, data: st.DataObject) -> None:
    """Every field a parser reads, with any JSON type: a token, nothing, or a StreamError
    of the server's making; then a record that builds. (d626c9b: TypeError in record(),
    AttributeError in the parsers, both recorded as ``client`` or never recorded.)"""
    events = data.draw(st.lists(_EVENTS[api], min_size=1, max_size=4))
    a = Attempt(_SESSION, "http://127.0.0.1:9", api, SPEC, 0, Timeouts(), None)
    for i, obj in enumerate(events):
        raw = json.dumps(obj, allow_nan=True)
        try:
            a.core.feed(f"data: {raw}\n\n".encode(), i + 1)
        except StreamError as e:
            assert e.cls in ("malformed_event", "http_status"), e
            a.error = e
            break
    _check_record(a)


@pytest.mark.parametrize("api", ["llamacpp", "chat"])
@FAST
@given(blob=st.binary(max_size=200), cuts=st.lists(st.integers(0, 10**6), max_size=5))
@example(blob=b'data: {"content": "\xff"}\n\n', cuts=[])
@example(blob=b'event: message\ndata: {"content": "\xc3("}\n\n', cuts=[])
def test_any_bytes_in_the_body_are_read_or_a_stream_error(api: str, blob: bytes,
                                                          cuts: list[int]) -> None:
    """Raw body bytes (invalid UTF-8, NUL, CR, lone fields) through StreamCore, split
    anywhere: parsed, or a StreamError (d626c9b: UnicodeDecodeError, recorded as ``client``)."""
    core = StreamCore(flavour(api).parser(), 4096)
    try:
        for i, part in enumerate(_splits(blob, cuts)):
            core.feed(part, i + 1)
        core.end_of_body(10**6)
    except StreamError as e:
        assert e.cls != "client"


def _stream(api: str, texts: list[str]) -> bytes:
    if api == "llamacpp":
        evs = [{"content": t, "tokens": [1], "stop": False} for t in texts]
        evs.append({"content": "", "stop": True, "stop_type": "limit"})
    else:
        evs = [{"choices": [{"index": 0, "delta": {"content": t}}]} for t in texts]
        evs.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    lines = [f"data: {json.dumps(e)}" for e in evs]
    return ("\n\n".join(lines) + "\n\ndata: [DONE]\n\n").encode()


@pytest.mark.parametrize("api", ["llamacpp", "chat"])
@FAST
@given(texts=st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=6),
       cuts=st.lists(st.integers(0, 10**6), max_size=8),
       crlf=st.booleans())
def test_a_stream_split_anywhere_gives_the_same_text(api: str, texts: list[str],
                                                     cuts: list[int], crlf: bool) -> None:
    wire = _stream(api, texts)
    if crlf:
        wire = wire.replace(b"\n", b"\r\n")
    core = StreamCore(flavour(api).parser(), 4096)
    for i, part in enumerate(_splits(wire, cuts)):
        core.feed(part, i + 1)
    assert core.done
    assert core.parser.output_text == "".join(texts)
    assert sum(e.n_tokens for e in core.events) == len(texts)


@pytest.mark.parametrize(("lines", "length"), [
    (["Content-Length: 5"], 5),
    (["Content-Length: 5, 5"], 5),  # RFC 9110 section 8.6: a list of one value repeated
    (["Content-Length: 5", "Content-Length: 5"], 5),
    (["Content-Length: 5", "Content-Length: 6"], None),
    (["Content-Length: +5"], None),
    (["Content-Length: 5_0"], None),
    (["Content-Length: -1"], None),
    (["Content-Length: "], None),
])
def test_content_length_is_digits(lines: list[str], length: int | None) -> None:
    raw = ("HTTP/1.1 200 OK\r\n" + "".join(f"{x}\r\n" for x in lines) + "\r\n").encode()
    if length is None:
        with pytest.raises(HeadError, match="Content-Length"):
            parse_head(raw)
    else:
        head, _ = parse_head(raw)
        assert head is not None and head.length == length

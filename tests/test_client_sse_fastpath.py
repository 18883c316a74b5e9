"""The client's two shortcuts give exactly what the general parsers give.

``single_line_events`` skips sseclient for blocks whose every event is one
``data:`` line, and ``ChunkedDecoder.feed`` skips its state machine for a read
that is exactly one whole chunk. Both are checked against the general path on
thousands of seeded random inputs built from every SSE line kind and framing
shape, so a difference in any corner (a colon in the data, a space, an empty
value, a comment, two blank lines) fails here.
"""

from __future__ import annotations

import itertools
import random

from sseclient import SSEClient

from strata_plugin.load.client.chunked import ChunkedDecoder
from strata_plugin.load.client.core import StreamCore, single_line_events
from strata_plugin.load.client.openai import OpenAIParser

_VALUES = ["", " ", "x", " lead", "a:b", "data: inner", '{"a": 1}', "é ü", "[DONE]", ":"]
_LINES = [
    lambda v: "data: " + v,
    lambda v: "data:" + v,
    lambda v: "data",
    lambda v: ": comment " + v,
    lambda v: "event: " + v,
    lambda v: "id: " + v,
    lambda v: "retry: 5",
    lambda v: "",
]


def _random_block(rng: random.Random) -> bytes:
    """One or more events, LF-only, ending at an event boundary (what _parse receives)."""
    events = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.5:  # the common shape, often
            lines = ["data: " + rng.choice(_VALUES)]
        else:
            lines = [rng.choice(_LINES)(rng.choice(_VALUES)) for _ in range(rng.randint(1, 3))]
        events.append("\n".join(lines) + "\n\n")
    return "".join(events).encode()


def _sseclient(block: bytes) -> list[tuple[str, str]]:
    return [(e.event, e.data) for e in SSEClient((block,)).events()]


def test_single_line_events_equals_sseclient_on_random_blocks() -> None:
    rng = random.Random(17)
    taken = 0
    for _ in range(5000):
        block = _random_block(rng)
        datas = single_line_events(block)
        if datas is None:
            continue
        taken += 1
        assert [("message", d.decode()) for d in datas] == _sseclient(block), block
    assert taken > 1000  # the shortcut was exercised, not only refused


def test_single_line_events_takes_the_servers_shape_and_refuses_the_rest() -> None:
    one = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    assert single_line_events(one) == [one[6:-2]]
    assert single_line_events(one * 3) == [one[6:-2]] * 3
    assert single_line_events(b"data: \n\n") == [b""]
    for other in (b"data:x\n\n", b": ping\n\n", b"event: error\ndata: x\n\n",
                  b"data: a\ndata: b\n\n", b"data: a\n\n\n", b"data: a\n\n: c\n\n"):
        assert single_line_events(other) is None, other


def test_core_gives_the_same_tokens_and_stamps_through_either_path() -> None:
    """The same events once as whole reads (shortcut) and once split mid-event (general)."""
    chunks = [b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % i for i in range(5)]
    chunks.append(b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')

    def run(reads: list[bytes]) -> tuple:
        core = StreamCore(OpenAIParser(), 1 << 20)
        for t, r in enumerate(reads):
            core.feed(r, t)
        return [(e.t_ns, e.n_tokens, e.kind) for e in core.events], core.done_ns, \
            core.parser.output_text

    whole = run(chunks)
    split = []
    for c in chunks:
        split += [c[:7], c[7:]]
    split_run = run(split)
    assert whole[2] == split_run[2] == "t0t1t2t3t4"
    assert [n for _, n, _ in whole[0]] == [n for _, n, _ in split_run[0]] == [1] * 5
    # each event is stamped with the read that completed it: read k, or read 2k+1 when split
    assert [t for t, _, _ in whole[0]] == [0, 1, 2, 3, 4]
    assert [t for t, _, _ in split_run[0]] == [1, 3, 5, 7, 9]
    assert whole[1] == 5 and split_run[1] == 11


SIZES, HEADS = (1, 5, 15, 16, 200, 4096), ("%x", "%X", "%04x")


def _part(size: int, head: str, ext: bool, letter: int) -> bytes:
    line = head % size + (";ext=1" if ext else "")
    return line.encode() + b"\r\n" + bytes([97 + letter]) * size + b"\r\n"


def _wire(rng: random.Random) -> bytes:
    parts = [_part(rng.choice(SIZES), rng.choice(HEADS), rng.random() < 0.2, rng.randrange(26))
             for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.3:
        parts.append(b"0\r\n\r\n")
    return b"".join(parts)


def _same_both_ways(wire: bytes) -> None:
    fast, slow = ChunkedDecoder(), ChunkedDecoder()
    out_fast = fast.feed(wire)
    out_slow = b"".join(slow.feed(wire[i : i + 1]) for i in range(len(wire)))
    assert out_fast == out_slow, wire
    assert (fast.complete, fast.extra) == (slow.complete, slow.extra), wire
    # and the state left behind reads the next chunk the same way
    nxt = b"3\r\nabc\r\n"
    assert fast.feed(nxt) == slow.feed(nxt)


def test_chunked_whole_chunk_shortcut_equals_byte_by_byte_decoding() -> None:
    """Every one-chunk shape (size, size line, extension, with and without the last
    chunk), then 1,000 random wires of one to three chunks (the first 1,000 of the 3,000
    this test drew before, which took 2-11 s on these loaded 2 cores, most of it the
    byte-by-byte reference, and left each shape to chance)."""
    for size, head, ext, last in itertools.product(SIZES, HEADS, (False, True), (False, True)):
        _same_both_ways(_part(size, head, ext, 0) + (b"0\r\n\r\n" if last else b""))
    rng = random.Random(5)
    for _ in range(1000):
        _same_both_ways(_wire(rng))

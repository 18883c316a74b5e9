"""From body bytes to token events: split at event boundaries, parse, stamp.

Both drivers (the blocking reader and the multiplexing loop) push each read
here with its arrival time. Only complete events are parsed, so each event is
stamped with the read that completed it, and an unfinished event is held as a
list of parts whose size is bounded by ``max_event_bytes``, and the events of one
response are bounded by its ``max_tokens`` (``max_events``: limits.EVENTS_PER_TOKEN per
token plus EXTRA_EVENTS), so a server's event storm ends the request as
``too_many_events`` instead of growing the record without end. sseclient parses
them, except the one shape every streaming LLM server sends per token (each
event one ``data:`` line), whose result is known without it
(:func:`single_line_events`).

Lines may end in CRLF, LF or CR (the SSE spec, "Event stream interpretation"), and
an event ends at an empty line, so ``\n\r\n`` or ``\r\n\n`` end one too; sseclient
splits only on three same-kind pairs. Line ends are therefore made LF here first; when
a read ends in CR, an LF that starts the next read is the rest of that CRLF.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sseclient import SSEClient

from strata_plugin.formats.records import TokenEvent
from strata_plugin.limits import EVENTS_PER_TOKEN, EXTRA_EVENTS
from strata_plugin.load.client.errors import StreamError
from strata_plugin.load.client.parse_base import BaseParser


def last_boundary(buf: bytes) -> int:
    """Index just past the last blank line (an SSE event end) in ``buf``, or -1.

    The same three line-ending pairs sseclient splits on.
    """
    i = buf.rfind(b"\n\n")
    j = buf.rfind(b"\r\n\r\n")
    k = buf.rfind(b"\r\r")
    return max(i + 2 if i >= 0 else -1, j + 4 if j >= 0 else -1, k + 2 if k >= 0 else -1)


def single_line_events(block: bytes) -> list[bytes] | None:
    """The data of each event when every event in ``block`` is one ``data: `` line, else None.

    That is what streaming LLM servers send per token, and for it the event
    sseclient would give is known without it: type ``message``, the data after
    ``"data: "``. Skipping sseclient there parses an event in 5 us instead of 9
    on this host; every other block (several lines to an event, comments,
    ``event:`` / ``id:`` fields, blank lines in a row) goes through sseclient.
    ``block`` is LF-only and ends at an event boundary (``StreamCore._take``);
    ``tests/test_client_sse_fastpath.py`` holds this to sseclient's output.
    """
    if not block.startswith(b"data: "):
        return None
    if block.find(b"\n") == len(block) - 2:
        return [block[6:-2]]
    parts = block[:-2].split(b"\n\n")
    for p in parts:
        if not p.startswith(b"data: ") or b"\n" in p:
            return None
    return [p[6:] for p in parts]


class StreamCore:
    """The parse state of one response body."""

    def __init__(self, parser: BaseParser, max_event_bytes: int,
                 max_events: int | None = None) -> None:
        self.parser = parser
        self.max_event_bytes = max_event_bytes
        #: events this stream may carry (limits.max_events of its max_tokens); None: any
        self.max_events = max_events
        self._n_events = 0
        # Made here, one by one (~1 us each), so that finishing a record is
        # cheap when hundreds of fixed-length streams end at the same moment.
        self.events: list[TokenEvent] = []
        #: Called once, with its arrival stamp, when the stream's token count reaches
        #: ``token_mark`` (whichever thread reads the stream); then cleared. Tokens are
        #: counted only while it is set.
        self.on_token_mark: Callable[[int], None] | None = None
        self.token_mark = 1
        self._counted = 0
        self.first_ns: int | None = None  # first body byte
        self.done_ns: int | None = None  # terminal event (or EOF after a finish reason)
        self.eof_ns: int | None = None  # the body ended (cleanly), complete or not
        self.n_bytes = 0
        self._parts: list[bytes] = []  # the unfinished event
        self._plen = 0
        self._tail = b""  # its last 3 bytes, to find a boundary split across reads
        self._cr = False  # the last read ended in CR: an LF first in the next is its pair
        self.first_event: str | None = None  # the raw data of the first event, for errors

    @property
    def done(self) -> bool:
        return self.done_ns is not None

    @property
    def held(self) -> bytes:
        """The body bytes not yet parsed as events (a reply that is not a stream)."""
        return b"".join(self._parts)

    def feed(self, chunk: bytes, t_ns: int) -> None:
        """One read of body bytes that arrived at ``t_ns``."""
        if self.first_ns is None:
            self.first_ns = t_ns
        self.n_bytes += len(chunk)
        if self.done_ns is not None:
            return  # after the terminal event nothing counts
        if not self._parts and not self._cr and chunk.endswith(b"\n\n") and b"\r" not in chunk:
            self._parse(chunk, t_ns)  # whole events and nothing held: what _take would do
            return
        if self._cr:  # the last read ended in CR: an LF here completes that CRLF
            self._cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if b"\r" in chunk:
            self._cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        self._take(chunk, t_ns)

    def _take(self, chunk: bytes, t_ns: int) -> None:
        """LF-only bytes: parse every complete event, hold the rest."""
        probe = self._tail + chunk
        end = last_boundary(probe)
        if end < 0:
            self._hold(chunk)
            self._tail = probe[-3:]
            return
        cut = end - len(self._tail)
        block = b"".join((*self._parts, chunk[:cut])) if self._parts else chunk[:cut]
        rest = chunk[cut:]
        self._parts, self._plen, self._tail = [], 0, b""
        self._parse(block, t_ns)
        if rest and self.done_ns is None:
            self._hold(rest)
            self._tail = rest[-3:]

    def _hold(self, part: bytes) -> None:
        self._parts.append(part)
        self._plen += len(part)
        if self._plen > self.max_event_bytes:
            raise StreamError(
                "event_too_large",
                f"an event grew past max_event_bytes={self.max_event_bytes} without ending",
            )

    def _parse(self, block: bytes, t_ns: int) -> None:
        """The hot path: parse, stamp, append. Nothing else happens per event.

        (The ``try`` costs nothing until it catches: Python 3.11's exceptions are
        zero-cost. Bytes that are not UTF-8 are the server's error, like bad JSON.)
        """
        try:
            datas = single_line_events(block)
            if datas is not None:
                for d in datas:
                    self._event("message", d.decode(), t_ns)
                    if self.done_ns is not None:
                        return
                return
            for ev in SSEClient(iter((block,))).events():
                self._event(ev.event, ev.data, t_ns)
                if self.done_ns is not None:
                    return
        except UnicodeDecodeError as e:
            raise StreamError(
                "malformed_event",
                f"an event is not UTF-8 ({e.reason} at byte {e.start} of "
                f"{e.object[max(0, e.start - 20) : e.start + 20]!r})",
            ) from None

    def _event(self, kind: str, data: str, t_ns: int) -> None:
        if kind == "error":
            raise StreamError("http_status", f"server error event: {data[:300]}")
        self._n_events += 1
        if self.max_events is not None and self._n_events > self.max_events:
            raise StreamError(
                "too_many_events",
                f"more than {self.max_events} events: the server sent more than "
                f"{EVENTS_PER_TOKEN} per requested token (max_tokens) plus {EXTRA_EVENTS} "
                f"(limits.EVENTS_PER_TOKEN); {sum(e.n_tokens for e in self.events)} tokens "
                "in the events kept",
            )
        if self.first_event is None:
            self.first_event = data
        parser = self.parser
        toks = parser.feed(data)
        if toks:
            h = time.monotonic_ns()
            append = self.events.append
            for n, tk in toks:
                append(TokenEvent(t_ns, n, tk, h))
            if self.on_token_mark is not None:
                self._counted += sum(n for n, _ in toks)
                if self._counted >= self.token_mark:
                    mark, self.on_token_mark = self.on_token_mark, None
                    mark(t_ns)
        if parser.done:
            self.done_ns = t_ns

    def end_of_body(self, eof_ns: int) -> None:
        """The body ended cleanly at ``eof_ns``: complete, or truncated?"""
        self.eof_ns = eof_ns
        if self.done_ns is not None:
            return
        if any(p.strip() for p in self._parts):
            raise StreamError("truncated_stream", "the stream ended inside an event")
        if not self.parser.saw_finish:
            raise StreamError(
                "truncated_stream",
                f"the stream ended without its terminal event after {self.parser.n_events} events",
            )
        self.done_ns = eof_ns

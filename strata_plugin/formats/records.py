"""The request record: what one request did, event by event.

Every timestamp is ``time.monotonic_ns()`` (CLOCK_MONOTONIC, shared by all
processes of one host). A :class:`ClockAnchor` taken once per run turns a
monotonic time into wall-clock ns so request windows join telemetry samples.
Records are plain frozen dataclasses that round-trip through JSON, so the
offline report can rebuild everything from ``requests.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any

from strata_plugin.formats.typed import expected, reader_of

#: Error classes a failed request can carry. One vocabulary for every client.
ERROR_CLASSES = (
    "http_status",  # the server answered with a non-2xx status
    "connect",  # could not connect (refused, DNS)
    "timeout",  # a connect or read timed out (a stalled stream)
    "reset",  # the connection was reset or closed mid-stream
    "malformed_event",  # an SSE event that is not UTF-8 JSON of the expected shape and types
    "malformed_response",  # a response head or encoding that is not the HTTP/1.x we can read
    "truncated_stream",  # the stream ended without its terminal event
    "event_too_large",  # one event exceeded the size bound
    "too_many_events",  # more events than max_tokens allows (limits.max_events): a storm
    "no_tokens",  # events arrived but none parsed as a token: the server speaks another API
    "not_streaming",  # a complete reply that is not an event stream (HTTP 200, JSON, 0 events)
    "interrupted",  # Ctrl-C / SIGTERM while it was in flight: the events received so far
    "client",  # a bug or unexpected exception in the client itself
)


@dataclass(frozen=True)
class ClockAnchor:
    """A simultaneous reading of the monotonic and the wall clock."""

    mono_ns: int
    wall_ns: int

    @classmethod
    def now(cls) -> ClockAnchor:
        # Read wall between two monotonic reads and take the midpoint, so the
        # pairing error is at most half the (sub-microsecond) bracket.
        m0 = time.monotonic_ns()
        w = time.time_ns()
        m1 = time.monotonic_ns()
        return cls(mono_ns=(m0 + m1) // 2, wall_ns=w)

    def to_wall_ns(self, mono_ns: int) -> int:
        return self.wall_ns + (mono_ns - self.mono_ns)


@dataclass(frozen=True)
class TokenEvent:
    """One token-bearing SSE event: when its last byte arrived, how many tokens."""

    t_ns: int  # arrival (monotonic): when the bytes completing the event were read
    n_tokens: int
    kind: str = "content"  # "content" | "reasoning"
    handled_ns: int = 0  # when the client finished parsing it (self-check)


_TOKEN_EVENT_FIELDS = frozenset(f.name for f in dataclasses.fields(TokenEvent))


def _token_event(d: dict[str, Any], _new=object.__new__) -> TokenEvent:
    """A TokenEvent from its JSON dict. A run holds a million of them and a frozen
    dataclass's __init__ costs 3x a plain fill; a dict with exactly the fields (what
    to_json writes) is filled directly, anything else goes through __init__ (defaults,
    and a TypeError for an unknown key)."""
    if d.keys() == _TOKEN_EVENT_FIELDS:
        ev = _new(TokenEvent)
        ev.__dict__.update(d)
        return ev
    return TokenEvent(**d)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    source: str = "none"  # "usage" | "timings" | "tokenizer" | "none"


@dataclass(frozen=True)
class Timings:
    """llama.cpp's per-request ``timings`` object (server-side)."""

    prompt_n: int | None = None
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    cache_n: int | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None


@dataclass(frozen=True)
class EngineClocks:
    """The engine's own clocks for one request, as its response reported them (ms, each
    on the engine's clock; None where the engine did not report it).

    The client's clock says when bytes arrived; only the engine knows when it queued,
    prefilled and produced each token. The time ledger prefers these per-request figures
    to the case's means from ``/metrics`` histograms, and with ``token_ms`` it can tell
    the server's pace from the delivery of its tokens (a proxy that buffers the stream).
    Every engine fills the same fields: llama.cpp from its ``timings`` (per token with
    ``timings_per_token``), vLLM from ``--enable-per-request-metrics``, SGLang from
    ``meta_info``; ``source`` names which.
    """

    source: str  # what reported them, in the user's words ("vllm per-request metrics")
    queue_ms: float | None = None  # arrival in the engine -> its scheduler took it
    prefill_ms: float | None = None  # the engine's prompt processing, to its first token
    ttft_ms: float | None = None  # arrival in the engine -> first token, the engine's view
    decode_ms: float | None = None  # first -> last token, the engine's view
    mean_itl_ms: float | None = None
    #: when the engine produced each token-bearing event, ms after it produced the
    #: first (index i: the record's i-th event with n_tokens > 0); () where it does not
    #: stamp tokens
    token_ms: tuple[float, ...] = ()
    draft_tokens: int | None = None  # speculative decoding: tokens proposed
    accepted_tokens: int | None = None  # ... and accepted


@dataclass(frozen=True)
class RequestError:
    cls: str  # one of ERROR_CLASSES
    message: str
    http_status: int | None = None

    def __post_init__(self) -> None:
        if self.cls not in ERROR_CLASSES:
            raise ValueError(f"unknown error class {self.cls!r}")


@dataclass(frozen=True)
class ProcDelta:
    """Server-process counters read just before and just after one request."""

    cpu_s: float
    major_faults: int
    read_bytes: int
    shared: bool  # True when other requests were in flight (concurrency > 1)


@dataclass(frozen=True)
class RequestRecord:
    request_id: str
    case_id: str
    phase: str  # "warmup" | "measured"
    api: str
    scheduled_ns: int  # when the load generator meant to send it
    dispatched_ns: int  # when the HTTP request was handed to the socket
    first_byte_ns: int | None = None
    events: tuple[TokenEvent, ...] = ()
    done_ns: int | None = None  # stream end (terminal event or EOF)
    usage: Usage = field(default_factory=Usage)
    timings: Timings | None = None
    finish_reason: str | None = None
    output_text: str = ""
    output_sha256: str = ""
    error: RequestError | None = None
    isl: int | None = None  # requested input length
    osl: int | None = None  # requested output length
    proc: ProcDelta | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    engine: EngineClocks | None = None  # the engine's own clocks for this request
    server_request_id: str | None = None  # the engine's id (header or body), for its log

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "request record") -> RequestRecord:
        """The record from its parsed JSON, every field checked against its type (nested
        ones too): a wrong one raises ``FormatError`` naming ``where`` (``path:line``)
        and the key. ``usage`` null or absent reads as an empty Usage."""
        if type(d) is dict and d.get("usage") is None:
            d = {**d, "usage": {}}
        return _read_record(d, where, "")

    @classmethod
    def from_json(cls, line: str, where: str = "request record") -> RequestRecord:
        return cls.from_dict(json.loads(line), where)


def _events(v: Any, where: str, key: str) -> tuple[TokenEvent, ...]:
    """``events``: a run holds a million of them, so a whole, well-typed event (what
    to_json writes) is filled without the general reader; any other goes through it,
    and a wrong one is named."""
    if type(v) is not list and type(v) is not tuple:
        raise expected(where, key, "a list of token events", v)
    out = []
    slow = reader_of(TokenEvent)
    for i, e in enumerate(v):
        if (type(e) is dict and e.keys() == _TOKEN_EVENT_FIELDS and type(e["t_ns"]) is int
                and type(e["n_tokens"]) is int and type(e["kind"]) is str
                and type(e["handled_ns"]) is int):
            out.append(_token_event(e))
        else:
            out.append(slow(e, where, f"{key}[{i}]"))
    return tuple(out)


_read_record = reader_of(RequestRecord, {"events": _events})

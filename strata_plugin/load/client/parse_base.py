"""State every stream parser shares: text, usage, finish, and token counting by growth."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from strata_plugin.formats.records import EngineClocks, Timings, Usage
from strata_plugin.load.client.errors import StreamError

#: What ``feed`` returns for an event that carries no generated token.
NO_TOKENS: tuple[tuple[int, str], ...] = ()

_TIMING_KEYS = (
    "prompt_n",
    "prompt_ms",
    "predicted_n",
    "predicted_ms",
    "cache_n",
    "draft_n",
    "draft_n_accepted",
)


class BaseParser:
    """Accumulates one stream. Subclasses implement ``feed(data) -> ((n_tokens, kind), ...)``.

    ``done`` is set by the flavour's terminal event; ``saw_finish`` by a finish
    reason, which some servers send instead of a terminal marker.
    """

    def __init__(self) -> None:
        self.done = False
        self.saw_finish = False
        self.text_parts: list[str] = []
        self.reasoning_parts: list[str] = []
        self.finish_reason: str | None = None
        self.usage = Usage()
        self._timings: Timings | None = None
        #: the last ``timings`` object seen, made a Timings only when read (a stream with
        #: ``timings_per_token`` carries one per event: building each would cost 3 us)
        self._timings_raw: Any = None
        self.extra: dict[str, Any] = {}
        self.n_events = 0  # every SSE event with data, token-bearing or not
        #: the engine's own id for the request, from the body (OpenAI ``id``, SGLang
        #: ``meta_info.id``); the response header, where there is one, is the client's
        self.server_id: str | None = None
        #: the engine's per-request clocks once its response carried them
        #: (:meth:`engine_clocks` builds the record's :class:`EngineClocks`)
        self.engine: EngineClocks | None = None
        #: llama.cpp's cumulative ``predicted_ms`` of each token-bearing event
        #: (``timings_per_token``), one entry per token event the parser returned
        self.token_ms: list[float] = []
        self.token_clock_ok = True  # False once a token event came without its stamp

    def engine_clocks(self) -> EngineClocks | None:
        """The record's engine clocks: what the response reported, with the per-token
        production times where every token event carried one (relative to the first)."""
        eng = self.engine
        if eng is None and (t := self.timings) is not None:  # llama.cpp's OpenAI routes
            eng = llamacpp_clocks(t)
        if eng is None:
            return None
        tm = self.token_ms
        if tm and self.token_clock_ok:
            t0 = tm[0]
            return replace(eng, token_ms=tuple(round(t - t0, 3) for t in tm))
        return eng

    @property
    def timings(self) -> Timings | None:
        """llama.cpp's ``timings`` as the last event that carried them gave them."""
        if self._timings_raw is not None:
            self._timings, self._timings_raw = timings_of(self._timings_raw), None
        return self._timings

    @timings.setter
    def timings(self, t: Timings | None) -> None:
        self._timings, self._timings_raw = t, None

    def feed(self, data: str) -> tuple[tuple[int, str], ...]:
        raise NotImplementedError

    def load(self, data: str) -> dict[str, Any]:
        """Parse one event's JSON; an error object from the server becomes a StreamError."""
        self.n_events += 1
        try:
            obj = json.loads(data)
        except ValueError:
            raise StreamError("malformed_event", f"event is not JSON: {data[:200]!r}") from None
        if not isinstance(obj, dict):
            raise StreamError("malformed_event", f"event is not a JSON object: {data[:200]!r}")
        if obj.get("error") or obj.get("object") == "error":
            raise server_error(obj)
        return obj

    @property
    def output_text(self) -> str:
        return "".join(self.text_parts)

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning_parts)


def server_error(obj: dict[str, Any]) -> StreamError:
    """An in-band error event; classed as ``http_status`` with the code the server gave."""
    err = obj.get("error")
    if not isinstance(err, dict):
        err = obj if obj.get("object") == "error" else {"message": err}
    code = err.get("code")
    status = code if isinstance(code, int) else None
    msg = str(err.get("message") or err)[:300]
    return StreamError("http_status", f"server error event: {msg}", http_status=status)


def wrong_type(field: str, value: Any, data: str, expected: str = "a string") -> StreamError:
    """A field of the server's event with the wrong JSON type: the server's error.

    The parsers check the type of every field whose value they keep or iterate (one
    ``isinstance`` per field), so a number for a text never reaches the record.
    """
    return StreamError(
        "malformed_event", f"{field} is {json_type(value)}, not {expected}: {data[:200]!r}"
    )


def json_type(v: Any) -> str:
    """The JSON name of a parsed value's type, for error messages."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    return "a list" if isinstance(v, list) else "an object"


def timings_of(d: Any) -> Timings | None:
    """llama.cpp ``timings``; unknown keys ignored, missing ones (and values that are not
    numbers) left None, so nothing but numbers reaches the report's arithmetic."""
    if not isinstance(d, dict):
        return None
    kw: dict[str, Any] = {k: _number(d.get(k), k.endswith("_ms")) for k in _TIMING_KEYS}
    return Timings(**kw)


def llamacpp_clocks(t: Timings) -> EngineClocks:
    """llama.cpp's clocks from its final ``timings``: prefill (``prompt_ms``, the prompt's
    processing), decode (``predicted_ms``, first to last token: llama.cpp starts that
    clock when it samples the first token), drafts. It has no queue clock (a request
    waiting for a slot is in neither) and no arrival time."""
    n, dec = t.predicted_n, t.predicted_ms
    return EngineClocks(
        source="llama.cpp timings", prefill_ms=t.prompt_ms, decode_ms=dec,
        mean_itl_ms=dec / (n - 1) if dec is not None and n is not None and n >= 2 else None,
        draft_tokens=t.draft_n, accepted_tokens=t.draft_n_accepted)


def _number(v: Any, real: bool) -> int | float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int) or (real and isinstance(v, float) and v == v):
        return v
    return None


def as_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def as_ms(v: Any, scale: float = 1.0) -> float | None:
    """A finite non-negative number (times ``scale``: 1e3 for seconds) or None: what an
    engine's clock may put in the record; anything else is left out, not guessed."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
        return None
    ms = float(v) * scale
    return ms if ms != float("inf") else None


def as_id(v: Any) -> str | None:
    """An engine's request id: a non-empty string, at most 200 characters kept."""
    return v[:200] if isinstance(v, str) and v else None


def split_tokens(
    n: int, has_reasoning: bool, has_content: bool, fallback: str = "content"
) -> tuple[tuple[int, str], ...]:
    """Give a chunk's ``n`` tokens to its kinds: one to the answer when both appear.

    A chunk whose tokens produced no text yet (held back by the detokenizer)
    keeps the kind of the text before it (``fallback``).
    """
    if n <= 0:
        return NO_TOKENS
    if has_reasoning and has_content:
        if n == 1:
            return ((1, "reasoning"),)
        return ((n - 1, "reasoning"), (1, "content"))
    if has_reasoning:
        return ((n, "reasoning"),)
    if has_content:
        return ((n, "content"),)
    return ((n, fallback),)

"""State every stream parser shares: text, usage, finish, and token counting by growth.

The engine's own clocks (llama.cpp's ``timings``, vLLM's ``metrics``, SGLang's
``meta_info``) are optional fields a server may send wrong: each value is taken only as a
finite number >= 0 (a count: a whole number up to 2^53), and one that is not (a string, a
400-digit integer, Infinity, NaN) is dropped and counted with its reason in the record
(``extra.engine_clock_dropped``), so it never fails the request and never reaches
requests.jsonl as Infinity or NaN. (A clock longer than the request itself is a reading
of the record: analysis/engine_clocks.py.)
"""

from __future__ import annotations

import json
import math
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
        #: the engine's clock fields dropped, each with why ("metrics.queue_time_ms":
        #: "a string, not a number"): the record's ``extra.engine_clock_dropped``
        self.clock_dropped: dict[str, str] = {}

    def clock(self, obj: dict[str, Any], key: str, where: str, scale: float = 1.0
              ) -> float | None:
        """``obj[key]`` as ms (times ``scale``: 1e3 for seconds), or None: absent, or
        dropped with its reason under ``where``."""
        v = obj.get(key)
        if v is None:
            return None
        ms, why = clock_ms(v, scale)
        if why:
            self.clock_dropped[where] = why
        return ms

    def count(self, obj: dict[str, Any], key: str, where: str) -> int | None:
        """``obj[key]`` as a count of the engine's clocks (drafts, tokens), or None."""
        v = obj.get(key)
        if v is None:
            return None
        n, why = clock_count(v)
        if why:
            self.clock_dropped[where] = why
        return n

    def token_stamp(self, tm: Any, n: int) -> None:
        """The engine's stamp (``timings.predicted_ms``) of a token-bearing event of ``n``
        entries; one missing or unusable drops the token clock, never shifts it."""
        pm = tm.get("predicted_ms") if type(tm) is dict else None
        ms, why = clock_ms(pm) if pm is not None else (None, "")
        if ms is None:
            if why:
                self.clock_dropped["timings.predicted_ms (per token)"] = why
            self.token_clock_ok = False
        else:
            self.token_ms.extend([ms] * n)

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
            self._timings = timings_of(self._timings_raw, self.clock_dropped)
            self._timings_raw = None
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


def timings_of(d: Any, dropped: dict[str, str] | None = None) -> Timings | None:
    """llama.cpp ``timings``; unknown keys ignored, missing ones left None, and values
    that are not finite numbers >= 0 (counts: whole numbers) dropped, each with its
    reason into ``dropped``, so nothing but numbers reaches the report's arithmetic."""
    if not isinstance(d, dict):
        return None
    kw: dict[str, Any] = {}
    for k in _TIMING_KEYS:
        v = d.get(k)
        if v is None:
            kw[k] = None
            continue
        kw[k], why = clock_ms(v) if k.endswith("_ms") else clock_count(v)
        if why and dropped is not None:
            dropped[f"timings.{k}"] = why
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


#: a count past this is not a float's exact integer: no engine counts that far
_COUNT_MAX = 2**53


def clock_ms(v: Any, scale: float = 1.0) -> tuple[float | None, str]:
    """``v`` times ``scale`` as a finite float >= 0, or (None, why not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None, f"{json_type(v)}, not a number"
    try:
        ms = float(v) * scale
    except OverflowError:  # an integer past a float's range
        return None, f"a {len(str(abs(v)))}-digit integer, past a float's range"
    if not math.isfinite(ms):
        return None, f"{v!r}{'' if scale == 1.0 else ' (scaled)'}, not a finite number"
    if ms < 0:
        return None, f"{v!r}, negative"
    return ms, ""


def clock_count(v: Any) -> tuple[int | None, str]:
    """``v`` as a whole number from 0 to 2^53, or (None, why not)."""
    if isinstance(v, bool) or not isinstance(v, int):
        return None, f"{json_type(v)}, not a whole number"
    if v < 0:
        return None, f"{v}, negative"
    if v > _COUNT_MAX:
        digits = len(str(v))
        return None, (f"a {digits}-digit integer, past 2^53" if digits > 20 else
                      f"{v}, past 2^53")
    return v, ""




def as_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


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

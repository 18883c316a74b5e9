"""State every stream parser shares: text, usage, finish, and token counting by growth."""

from __future__ import annotations

import json
from typing import Any

from strata_plugin.formats.records import Timings, Usage
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
        self.timings: Timings | None = None
        self.extra: dict[str, Any] = {}
        self.n_events = 0  # every SSE event with data, token-bearing or not

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
    return Timings(**{k: _number(d.get(k), k.endswith("_ms")) for k in _TIMING_KEYS})


def _number(v: Any, real: bool) -> int | float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int) or (real and isinstance(v, float) and v == v):
        return v
    return None


def as_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


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

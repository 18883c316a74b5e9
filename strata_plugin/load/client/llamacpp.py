"""llama.cpp's native /completion: one event per token, each with the server's timings.

With ``timings_per_token`` every token event carries the slot's cumulative ``timings``
(llama.cpp tools/server/README.md, ``/completion`` options); its ``predicted_ms`` is
when the server produced that token, ms after it produced the first (the embedded
build's stream reads 0.001 on the first token event and grows by the decode pace).
That stamp is the server's token clock: with it the ledger tells the server's pace
from the delivery of its tokens (analysis/delivery.py). The final event's timings give
the request's prefill (``prompt_ms``) and decode (``predicted_ms``) clocks.
"""

from __future__ import annotations

from typing import Any

from strata_plugin.formats.records import Usage
from strata_plugin.load.client.parse_base import (
    NO_TOKENS,
    BaseParser,
    as_int,
    llamacpp_clocks,
    timings_of,
    wrong_type,
)
from strata_plugin.load.client.spec import RequestSpec

PATH = "/completion"

# llama.cpp's stop_type (and the older stopped_* flags) in OpenAI's words.
_FINISH = {"limit": "length", "eos": "stop", "word": "stop"}


def body(spec: RequestSpec) -> dict[str, Any]:
    prompt: Any = spec.prompt if spec.prompt is not None else list(spec.prompt_token_ids or ())
    b: dict[str, Any] = {
        "prompt": prompt,  # a list of ints is taken as token ids
        "n_predict": spec.max_tokens,
        "temperature": spec.temperature,
        "stream": True,
        # the server's cumulative timings on every token event: its token clock
        "timings_per_token": True,
        "return_tokens": True,  # ids per event: exact tokens per chunk
    }
    if spec.ignore_eos:
        b["ignore_eos"] = True
    if spec.cache_prompt is not None:
        b["cache_prompt"] = spec.cache_prompt
    if spec.seed is not None:
        b["seed"] = spec.seed
    if spec.model is not None:
        b["model"] = spec.model
    return b


class LlamaCppParser(BaseParser):
    """Tokens per event from the ``tokens`` array, else one per non-empty ``content``."""

    def feed(self, data: str) -> tuple[tuple[int, str], ...]:
        if data == "[DONE]":
            self.done = True
            return NO_TOKENS
        obj = self.load(data)
        content = obj.get("content", "")
        if type(content) is not str:  # llama.cpp always sends a string
            raise wrong_type("content", content, data)
        toks = obj.get("tokens")
        if toks is not None and type(toks) is not list:
            raise wrong_type("tokens", toks, data, "a list")
        stop = obj.get("stop") is True
        if stop and content and content == self.output_text:
            content, toks = "", None  # a final event repeating the whole text
        if content:
            self.text_parts.append(content)
        n = len(toks) if isinstance(toks, list) and toks else (1 if content else 0)
        if n:  # the server's stamp of this token event (timings_per_token)
            self.token_stamp(obj.get("timings"), 1)
        if stop:
            self._finish(obj, data)
        return ((n, "content"),) if n else NO_TOKENS

    def _finish(self, obj: dict[str, Any], data: str) -> None:
        self.done = True
        self.saw_finish = True
        st = obj.get("stop_type")
        if st is not None and type(st) is not str:
            raise wrong_type("stop_type", st, data)
        if st is None:
            if obj.get("stopped_limit"):
                st = "limit"
            elif obj.get("stopped_eos"):
                st = "eos"
            elif obj.get("stopped_word"):
                st = "word"
        if st is not None:
            self.extra["stop_type"] = st
            self.finish_reason = _FINISH.get(st)
        t = timings_of(obj.get("timings"), self.clock_dropped)
        self.timings = t
        if t is not None:
            self.engine = llamacpp_clocks(t)
        slot = as_int(obj.get("id_slot"))
        if slot is not None and slot >= 0:  # its log names the slot ("slot ... id  N")
            self.extra["id_slot"] = slot
        prompt = as_int(obj.get("tokens_evaluated"))
        if prompt is None and t is not None and t.prompt_n is not None:
            prompt = t.prompt_n + (t.cache_n or 0)
        completion = as_int(obj.get("tokens_predicted"))
        if completion is None and t is not None:
            completion = t.predicted_n
        if prompt is not None or completion is not None:
            self.usage = Usage(
                prompt_tokens=prompt,
                completion_tokens=completion,
                cached_tokens=t.cache_n if t is not None else None,
                source="timings",
            )
        # tokens_cached is the slot's KV length (prompt + output), not a cache
        # hit count: kept for reference, never used as cached_tokens.
        if as_int(obj.get("tokens_cached")) is not None:
            self.extra["tokens_cached"] = obj["tokens_cached"]
        if obj.get("truncated"):
            self.extra["truncated"] = True


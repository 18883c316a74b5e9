"""OpenAI-compatible /v1/chat/completions and /v1/completions (vLLM, SGLang, llama.cpp).

Per request, beside the text and usage: the engine's id (every chunk's ``id``); vLLM's
per-request clocks (``metrics`` on the final usage chunk, served with
``--enable-per-request-metrics``: vllm/entrypoints/generate/base/serving.py,
``build_per_request_timing_metrics``); llama.cpp's ``timings`` (on every chunk when the
request asks ``timings_per_token``, which the case runner does for a llama.cpp engine).
SGLang's OpenAI routes carry the id and usage only.
"""

from __future__ import annotations

from typing import Any

from strata_plugin.formats.records import EngineClocks, Usage
from strata_plugin.load.client.parse_base import (
    NO_TOKENS,
    BaseParser,
    as_id,
    as_int,
    split_tokens,
    wrong_type,
)
from strata_plugin.load.client.spec import RequestSpec

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


def _common(spec: RequestSpec) -> dict[str, Any]:
    body: dict[str, Any] = {
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
        "stream": True,
        # continuous_usage_stats gives a cumulative completion_tokens on every
        # chunk (vLLM, SGLang), so multi-token chunks are counted exactly.
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if spec.model is not None:
        body["model"] = spec.model
    if spec.seed is not None:
        body["seed"] = spec.seed
    if spec.ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = spec.max_tokens
    return body


def chat_body(spec: RequestSpec) -> dict[str, Any]:
    body = _common(spec)
    if spec.messages is not None:
        body["messages"] = [{"role": r, "content": c} for r, c in spec.messages]
    elif spec.prompt is not None:
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        raise ValueError("the chat API takes a text prompt or messages, not prompt_token_ids")
    return body


def completions_body(spec: RequestSpec) -> dict[str, Any]:
    if spec.messages is not None:
        raise ValueError("the completions API takes a prompt, not chat messages")
    body = _common(spec)
    body["prompt"] = spec.prompt if spec.prompt is not None else list(spec.prompt_token_ids or ())
    return body


class OpenAIParser(BaseParser):
    """Counts the growth of per-chunk usage when every text chunk has one, else one
    token per non-empty delta (a usage arriving only with the last text chunk, as
    llama.cpp sends it, is a total, not a count for that chunk).

    The role-only first chunk and the usage-only last chunk carry no token.
    """

    def __init__(self) -> None:
        super().__init__()
        # True while every chunk with text also carried a cumulative usage
        # (continuous_usage_stats): then tokens per chunk = growth of the count.
        self._per_chunk_usage = True
        self._count = 0  # last cumulative completion_tokens seen on a chunk
        self._kind = "content"  # kind of the last text seen

    def feed(self, data: str) -> tuple[tuple[int, str], ...]:
        if data == "[DONE]":
            self.done = True
            return NO_TOKENS
        obj = self.load(data)
        if self.server_id is None:
            self.server_id = as_id(obj.get("id"))
        has_r = has_c = False
        choices = obj.get("choices")
        if choices is None:
            choices = ()
        elif type(choices) is not list:
            raise wrong_type("choices", choices, data, "a list")
        # One type check per field kept (OpenAI's schema: content is a string or null).
        for ch in choices:
            if type(ch) is not dict:
                raise wrong_type("a choice", ch, data, "an object")
            delta = ch.get("delta")
            if delta is not None:
                if type(delta) is not dict:
                    raise wrong_type("delta", delta, data, "an object")
                r = delta.get("reasoning_content") or delta.get("reasoning")
                c = delta.get("content")
            else:
                r, c = None, ch.get("text")
            if r is not None:
                if type(r) is not str:
                    raise wrong_type("delta.reasoning", r, data)
                if r:
                    self.reasoning_parts.append(r)
                    has_r = True
            if c is not None:
                if type(c) is not str:
                    raise wrong_type("text" if delta is None else "delta.content", c, data)
                if c:
                    self.text_parts.append(c)
                    has_c = True
            fr = ch.get("finish_reason")
            if fr is not None:
                if type(fr) is not str:
                    raise wrong_type("finish_reason", fr, data)
                if fr:
                    self.finish_reason = fr
                    self.saw_finish = True
        tm = obj.get("timings")  # llama.cpp: the last chunk's, or every chunk's per token
        if tm is not None:
            self._timings_raw = tm
        m = obj.get("metrics")  # vLLM --enable-per-request-metrics, on the last chunk
        if m is not None:
            self._take_metrics(m, data)
        fallback = self._kind
        if has_c:
            self._kind = "content"
        elif has_r:
            self._kind = "reasoning"
        usage = obj.get("usage")
        total = None
        if isinstance(usage, dict) and usage:
            self._take_usage(usage)
            total = as_int(usage.get("completion_tokens"))
        if (has_r or has_c) and total is None:
            self._per_chunk_usage = False  # this server does not count per chunk
        if total is not None and self._per_chunk_usage and obj.get("choices"):
            n, self._count = total - self._count, max(total, self._count)
            out = split_tokens(n, has_r, has_c, fallback)
        elif has_r or has_c:
            out = split_tokens(int(has_r) + int(has_c), has_r, has_c)
        else:
            return NO_TOKENS
        if out:  # the server's stamp of these token events (llama.cpp timings_per_token)
            self.token_stamp(tm, len(out))
        return out

    def _take_metrics(self, m: object, data: str) -> None:
        """vLLM's per-request metrics (vllm/entrypoints/generate/base/protocol.py,
        ``PerRequestMetrics``; engine-core monotonic timestamps, in ms): ``queue_time_ms``
        queued -> scheduled, ``time_to_first_token_ms`` scheduled -> first token (its
        prefill, despite the name), ``generation_time_ms`` first -> last token,
        ``mean_itl_ms`` that over the tokens after the first; ``speculative_decoding``
        (``--per-request-spec-decode-metrics``) the drafts proposed and accepted."""
        if type(m) is not dict:
            raise wrong_type("metrics", m, data, "an object")
        q = self.clock(m, "queue_time_ms", "metrics.queue_time_ms")
        pf = self.clock(m, "time_to_first_token_ms", "metrics.time_to_first_token_ms")
        dec = self.clock(m, "generation_time_ms", "metrics.generation_time_ms")
        itl = self.clock(m, "mean_itl_ms", "metrics.mean_itl_ms")
        sd = m.get("speculative_decoding")
        drafts = accepted = None
        if isinstance(sd, dict):
            sdw = "metrics.speculative_decoding."
            drafts = self.count(sd, "num_draft_tokens", sdw + "num_draft_tokens")
            accepted = self.count(sd, "num_accepted_draft_tokens",
                                  sdw + "num_accepted_draft_tokens")
            for k in ("mean_acceptance_length", "draft_acceptance_rate"):
                v = self.clock(sd, k, sdw + k)
                if v is not None:
                    self.extra[f"spec_{k}"] = v
        if all(x is None for x in (q, pf, dec, itl, drafts, accepted)):
            return  # an empty metrics object: nothing measured for this request
        self.engine = EngineClocks(
            source="vllm per-request metrics", queue_ms=q, prefill_ms=pf,
            ttft_ms=q + pf if q is not None and pf is not None else None,
            decode_ms=dec, mean_itl_ms=itl, draft_tokens=drafts, accepted_tokens=accepted)

    def _take_usage(self, u: dict[str, Any]) -> None:
        details = u.get("prompt_tokens_details") or {}
        cached = as_int(details.get("cached_tokens")) if isinstance(details, dict) else None
        self.usage = Usage(
            prompt_tokens=as_int(u.get("prompt_tokens")),
            completion_tokens=as_int(u.get("completion_tokens")),
            cached_tokens=cached,
            source="usage",
        )
        cdet = u.get("completion_tokens_details")
        if isinstance(cdet, dict) and as_int(cdet.get("reasoning_tokens")) is not None:
            self.extra["reasoning_tokens"] = cdet["reasoning_tokens"]

"""SGLang's native /generate: cumulative text, token counts and clocks in ``meta_info``.

What ``meta_info`` carries per request (sgl-project/sglang,
python/sglang/srt/managers/tokenizer_manager.py, ``TokenizerManager._handle_batch_output``
and ``_calculate_spec_decoding_metrics``; python/sglang/srt/observability/
req_time_stats.py, ``SchedulerReqTimeStats.convert_to_output_meta_info`` and
``APIServerReqTimeStats.convert_to_output_meta_info``):

* always: ``id`` (the request id its log uses), ``prompt_tokens``, ``completion_tokens``,
  ``cached_tokens``, ``finish_reason``;
* with ``--enable-metrics``, on every chunk: ``queue_time`` (s, the scheduler's wait
  queue to its first forward), ``forward_entry_time`` and ``prefill_finished_time``
  (wall-clock s); on the last: ``request_received_ts`` (wall-clock s),
  ``first_token_latency`` (s, received -> first token, on the API server's own clock),
  ``inference_time`` and ``decode_throughput`` (tokens/s: ``(completion_tokens - 1) /
  (finished - first token)``, the inverse of its time per output token,
  ``APIServerReqTimeStats.get_decode_throughput``);
* on the last chunk: ``e2e_latency`` (s, received -> finished);
* with speculative decoding, on the last: ``spec_verify_ct``, ``spec_num_proposed_drafts``,
  ``spec_num_correct_drafts`` (older releases: ``spec_draft_token_num``,
  ``spec_accept_token_num``).

It stamps no token: there is no per-token clock.
"""

from __future__ import annotations

import math
from typing import Any

from strata_plugin.formats.records import EngineClocks, Usage
from strata_plugin.load.client.errors import StreamError
from strata_plugin.load.client.parse_base import (
    NO_TOKENS,
    BaseParser,
    as_id,
    as_int,
    wrong_type,
)
from strata_plugin.load.client.spec import RequestSpec

PATH = "/generate"


def body(spec: RequestSpec) -> dict[str, Any]:
    sp: dict[str, Any] = {"max_new_tokens": spec.max_tokens, "temperature": spec.temperature}
    if spec.ignore_eos:
        sp["ignore_eos"] = True
        sp["min_new_tokens"] = spec.max_tokens
    if spec.seed is not None:
        sp["sampling_seed"] = spec.seed
    b: dict[str, Any] = {"sampling_params": sp, "stream": True}
    if spec.prompt is not None:
        b["text"] = spec.prompt
    else:
        b["input_ids"] = list(spec.prompt_token_ids or ())
    if spec.model is not None:
        b["model"] = spec.model
    return b


class SGLangParser(BaseParser):
    """Tokens per chunk = growth of ``meta_info.completion_tokens``.

    Text is cumulative by default; with the server's incremental streaming
    option it is a delta. A chunk that does not extend the text so far is
    taken as a delta from then on.
    """

    def __init__(self) -> None:
        super().__init__()
        self._count = 0
        self._incremental = False
        self._so_far = ""

    def feed(self, data: str) -> tuple[tuple[int, str], ...]:
        if data == "[DONE]":
            self.done = True
            return NO_TOKENS
        obj = self.load(data)
        text = obj.get("text", "")
        if type(text) is not str:  # SGLang always sends a string
            raise wrong_type("text", text, data)
        new = ""
        if text:
            if not self._incremental and text.startswith(self._so_far):
                new = text[len(self._so_far) :]
            else:
                self._incremental = True
                new = text
            if new:
                self.text_parts.append(new)
                self._so_far += new
        meta = obj.get("meta_info")
        if meta is None:
            meta = {}
        elif type(meta) is not dict:
            raise wrong_type("meta_info", meta, data, "an object")
        if self.server_id is None:
            self.server_id = as_id(meta.get("id"))
        total = as_int(meta.get("completion_tokens"))
        if total is not None:
            n, self._count = total - self._count, max(total, self._count)
            self._take_meta(meta)
        else:
            n = 1 if new else 0
        self._take_finish(meta.get("finish_reason"), data)
        if self.saw_finish:
            self._take_clocks(meta)
        return ((n, "content"),) if n > 0 else NO_TOKENS

    def _take_meta(self, meta: dict[str, Any]) -> None:
        self.usage = Usage(
            prompt_tokens=as_int(meta.get("prompt_tokens")),
            completion_tokens=as_int(meta.get("completion_tokens")),
            cached_tokens=as_int(meta.get("cached_tokens")),
            source="usage",
        )
        if as_int(meta.get("spec_verify_ct")) is not None:
            self.extra["spec_verify_ct"] = meta["spec_verify_ct"]

    def _take_clocks(self, meta: dict[str, Any]) -> None:
        """The last chunk's clocks (see the module docstring); wall-clock differences
        are of one host's clock, converted from the same perf_counter by SGLang."""
        def ms(key: str, scale: float = 1e3) -> float | None:
            return self.clock(meta, key, f"meta_info.{key}", scale)

        def count(*keys: str) -> int | None:
            key = next((k for k in keys if meta.get(k) is not None), keys[0])
            return self.count(meta, key, f"meta_info.{key}")

        fwd, pf_end = ms("forward_entry_time"), ms("prefill_finished_time")
        recv = ms("request_received_ts")
        prefill = self._span(fwd, pf_end, "forward_entry_time -> prefill_finished_time")
        # The engine's own first-token latency where it sends one (one clock, the first
        # token as its API server saw it); else the span of two converted wall stamps.
        ttft = ms("first_token_latency")
        if ttft is None:
            ttft = self._span(recv, pf_end, "request_received_ts -> prefill_finished_time")
        n = as_int(meta.get("completion_tokens"))
        tput = ms("decode_throughput", 1.0)
        decode = itl = None
        if n and n > 1 and tput:
            # SGLang's rate counts the tokens after the first: n - 1 of them in the decode.
            decode, itl = (n - 1) / tput * 1e3, 1e3 / tput
            if not math.isfinite(decode):  # a rate so near zero the time is past a float
                self.clock_dropped["meta_info.decode_throughput"] = (
                    f"{tput!r} tokens/s gives no finite decode time")
                decode = itl = None
        drafts = count("spec_num_proposed_drafts", "spec_draft_token_num")
        accepted = count("spec_num_correct_drafts", "spec_accept_token_num")
        e2e = ms("e2e_latency")
        if e2e is not None:
            self.extra["engine_e2e_ms"] = round(e2e, 3)
        clocks: dict[str, Any] = dict(queue_ms=ms("queue_time"), prefill_ms=prefill,
                                      ttft_ms=ttft, decode_ms=decode, mean_itl_ms=itl,
                                      draft_tokens=drafts,
                                      accepted_tokens=accepted)
        if any(v is not None for v in clocks.values()):
            self.engine = EngineClocks(source="sglang meta_info", **clocks)

    def _span(self, start: float | None, end: float | None, what: str) -> float | None:
        """``end - start`` of two wall-clock stamps (ms), dropped where it runs backwards."""
        if start is None or end is None:
            return None
        if end < start:
            self.clock_dropped[f"meta_info.{what}"] = f"{end - start:.6g} ms, negative"
            return None
        return end - start

    def _take_finish(self, fr: Any, data: str) -> None:
        if not fr:
            return
        kind = fr.get("type") if isinstance(fr, dict) else fr
        if type(kind) is not str:
            raise wrong_type("meta_info.finish_reason", kind, data, "a string (or {type})")
        if kind == "abort":
            msg = str(fr.get("message") if isinstance(fr, dict) else fr)[:300]
            status = as_int(fr.get("status_code")) if isinstance(fr, dict) else None
            raise StreamError("http_status", f"server aborted the request: {msg}", status)
        self.finish_reason = kind
        self.saw_finish = True

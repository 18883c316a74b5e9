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
  (wall-clock s); on the last: ``request_received_ts`` (wall-clock s), ``inference_time``
  and ``decode_throughput`` (tokens/s over first token -> finish);
* on the last chunk: ``e2e_latency`` (s, received -> finished);
* with speculative decoding, on the last: ``spec_verify_ct``, ``spec_num_proposed_drafts``,
  ``spec_num_correct_drafts`` (older releases: ``spec_draft_token_num``,
  ``spec_accept_token_num``).

It stamps no token: there is no per-token clock.
"""

from __future__ import annotations

from typing import Any

from strata_plugin.formats.records import EngineClocks, Usage
from strata_plugin.load.client.errors import StreamError
from strata_plugin.load.client.parse_base import (
    NO_TOKENS,
    BaseParser,
    as_id,
    as_int,
    as_ms,
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
        fwd = as_ms(meta.get("forward_entry_time"), 1e3)
        pf_end = as_ms(meta.get("prefill_finished_time"), 1e3)
        recv = as_ms(meta.get("request_received_ts"), 1e3)
        prefill = pf_end - fwd if pf_end is not None and fwd is not None else None
        ttft = pf_end - recv if pf_end is not None and recv is not None else None
        n = as_int(meta.get("completion_tokens"))
        tput = as_ms(meta.get("decode_throughput"))
        decode = n / tput * 1e3 if n and tput else None
        drafts = as_int(meta.get("spec_num_proposed_drafts", meta.get("spec_draft_token_num")))
        accepted = as_int(meta.get("spec_num_correct_drafts",
                                   meta.get("spec_accept_token_num")))
        e2e = as_ms(meta.get("e2e_latency"), 1e3)
        if e2e is not None:
            self.extra["engine_e2e_ms"] = round(e2e, 3)
        clocks: dict[str, Any] = dict(queue_ms=as_ms(meta.get("queue_time"), 1e3),
                      prefill_ms=prefill if prefill is None or prefill >= 0 else None,
                      ttft_ms=ttft if ttft is None or ttft >= 0 else None,
                      decode_ms=decode, draft_tokens=drafts, accepted_tokens=accepted)
        if any(v is not None for v in clocks.values()):
            self.engine = EngineClocks(source="sglang meta_info", **clocks)

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

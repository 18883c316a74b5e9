"""SGLang's native /generate: cumulative text, token counts in ``meta_info``."""

from __future__ import annotations

from typing import Any

from strata_plugin.formats.records import Usage
from strata_plugin.load.client.errors import StreamError
from strata_plugin.load.client.parse_base import NO_TOKENS, BaseParser, as_int, wrong_type
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
        total = as_int(meta.get("completion_tokens"))
        if total is not None:
            n, self._count = total - self._count, max(total, self._count)
            self._take_meta(meta)
        else:
            n = 1 if new else 0
        self._take_finish(meta.get("finish_reason"), data)
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

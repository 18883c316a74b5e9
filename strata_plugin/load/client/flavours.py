"""The four API flavours: where to POST, what body, which parser."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from strata_plugin.load.client import llamacpp, openai, sglang
from strata_plugin.load.client.parse_base import BaseParser
from strata_plugin.load.client.spec import API_FLAVOURS, RequestSpec


@dataclass(frozen=True)
class Flavour:
    path: str
    body: Callable[[RequestSpec], dict[str, Any]]
    parser: Callable[[], BaseParser]


FLAVOURS: dict[str, Flavour] = {
    "chat": Flavour(openai.CHAT_PATH, openai.chat_body, openai.OpenAIParser),
    "completions": Flavour(openai.COMPLETIONS_PATH, openai.completions_body, openai.OpenAIParser),
    "llamacpp": Flavour(llamacpp.PATH, llamacpp.body, llamacpp.LlamaCppParser),
    "sglang": Flavour(sglang.PATH, sglang.body, sglang.SGLangParser),
}
assert tuple(FLAVOURS) == API_FLAVOURS


def flavour(api: str) -> Flavour:
    try:
        return FLAVOURS[api]
    except KeyError:
        raise ValueError(f"unknown api {api!r}; expected one of {API_FLAVOURS}") from None


def merge_body(body: dict[str, Any], extra: Iterable[tuple[str, object]]) -> dict[str, Any]:
    """Merge ``extra_body`` into ``body``; nested dicts merge key by key, anything else replaces."""
    out = dict(body)
    for key, value in extra:
        cur = out.get(key)
        if isinstance(cur, dict) and isinstance(value, dict):
            out[key] = merge_body(cur, value.items())
        else:
            out[key] = value
    return out


def build_body(api: str, spec: RequestSpec) -> tuple[str, dict[str, Any]]:
    """The path and JSON body for ``spec``; ValueError when the API cannot take it."""
    f = flavour(api)
    return f.path, merge_body(f.body(spec), spec.extra_body)

"""What to send and how long to wait: the inputs of one streaming request."""

from __future__ import annotations

from dataclasses import dataclass

from strata_plugin.configure.engines import API_FLAVOURS

__all__ = ["API_FLAVOURS", "RequestSpec", "Timeouts"]


@dataclass(frozen=True)
class RequestSpec:
    """One request as the workload means it; the flavour module turns it into a body."""

    request_id: str
    case_id: str
    phase: str  # "warmup" | "measured"
    max_tokens: int  # exact output length wanted (OSL)
    prompt: str | None = None  # text prompt, or
    prompt_token_ids: tuple[int, ...] | None = None  # token-ID prompt where the API takes them
    ignore_eos: bool = True  # exact output lengths: ignore_eos / min_tokens per backend
    temperature: float = 0.0
    seed: int | None = None
    cache_prompt: bool | None = None  # llama.cpp: False to force a cold prefix
    isl: int | None = None  # requested input length, copied onto the record
    model: str | None = None
    extra_body: tuple[tuple[str, object], ...] = ()  # merged into the JSON body
    #: chat: the conversation as (role, content) pairs (load/chat_prompts.py), instead of
    #: ``prompt`` as one user message
    messages: tuple[tuple[str, str], ...] | None = None

    def __post_init__(self) -> None:
        given = [x is not None for x in (self.prompt, self.prompt_token_ids, self.messages)]
        if sum(given) != 1:
            raise ValueError("RequestSpec needs exactly one of prompt, prompt_token_ids or "
                             "messages")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True)
class Timeouts:
    """Every wait is bounded, so a stalled server becomes a recorded error, not a hang."""

    connect_s: float = 10.0
    read_s: float = 60.0  # max silence between two reads of the stream
    total_s: float | None = None  # whole-request bound
    max_event_bytes: int = 4 * 1024 * 1024

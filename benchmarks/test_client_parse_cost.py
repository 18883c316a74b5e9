"""The client's parse cost per event, with and without the server's per-token timings.

Not a pass/fail test: it prints figures. llama.cpp's ``timings_per_token`` (which the
client now asks for: the server's token clock) makes every token event carry the slot's
cumulative ``timings`` object, so each event is larger (~390 bytes against ~150) and the
parser keeps one number from it. This measures what that costs where it matters: the
hot path from one read's bytes to a stamped token event (``StreamCore.feed``: the
single-line SSE shortcut, ``json.loads``, the flavour's parser, the event), for a
256-token llama.cpp stream in the two shapes the embedded llama-server sends (its
build's output, read and copied), one event per read as the server writes them:

* ``final``: ``timings`` on the final event only (``timings_per_token`` false, what the
  client asked before);
* ``per_token``: ``timings`` on every token event (``timings_per_token`` true).

The two run alternately (``ROUNDS`` rounds, each stream parsed ``REPEATS`` times), on
one thread, so they share the host's load; figures are medians over rounds of the
microseconds per token event, and their ratio. The OpenAI shape (a vLLM chunk, the
final one carrying ``metrics``) is printed beside them for scale. Run it with::

    pytest benchmarks/test_client_parse_cost.py --benchmark-only -s
"""

from __future__ import annotations

import json
import os
import statistics
import time

from strata_plugin.load.client.core import StreamCore
from strata_plugin.load.client.llamacpp import LlamaCppParser
from strata_plugin.load.client.openai import OpenAIParser

N_TOKENS = 256
ROUNDS = int(os.environ.get("STRATA_BENCH_ROUNDS", "15"))
REPEATS = int(os.environ.get("STRATA_BENCH_REPEATS", "20"))


def _timings(n: int, predicted_ms: float) -> dict:
    return {"cache_n": 0, "prompt_n": 32, "prompt_ms": 58.908, "prompt_per_token_ms": 1.84,
            "prompt_per_second": 543.2, "predicted_n": n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": round(predicted_ms / n, 4),
            "predicted_per_second": round(n / max(predicted_ms, 1e-3) * 1e3, 4)}


def llamacpp_stream(per_token: bool) -> list[bytes]:
    """The embedded llama-server's /completion stream, one SSE event per token."""
    out = []
    for i in range(N_TOKENS):
        ev: dict = {"index": 0, "content": " tok", "tokens": [300 + i % 700], "stop": False,
                    "id_slot": -1, "tokens_predicted": i + 1, "tokens_evaluated": 32}
        if per_token:
            ev["timings"] = _timings(i + 1, 0.001 + 9.87 * i)
        out.append(b"data: " + json.dumps(ev, separators=(",", ":")).encode() + b"\n\n")
    final = {"index": 0, "content": "", "tokens": [], "id_slot": 1, "stop": True,
             "model": "tiny-llama.gguf", "tokens_predicted": N_TOKENS, "tokens_evaluated": 32,
             "stop_type": "limit", "stopping_word": "", "tokens_cached": 32 + N_TOKENS,
             "truncated": False, "timings": _timings(N_TOKENS, 9.87 * (N_TOKENS - 1))}
    out.append(b"data: " + json.dumps(final, separators=(",", ":")).encode() + b"\n\n")
    return out


def vllm_stream() -> list[bytes]:
    """vLLM's /v1/completions chunks with continuous usage; the last with ``metrics``."""
    out = []
    for i in range(N_TOKENS):
        ev = {"id": "cmpl-5e0c41aa", "object": "text_completion", "created": 1796187778,
              "model": "tiny-llama", "choices": [{"index": 0, "text": " tok", "logprobs": None,
                                                  "finish_reason": None, "stop_reason": None}],
              "usage": {"prompt_tokens": 32, "total_tokens": 33 + i, "completion_tokens": i + 1}}
        out.append(b"data: " + json.dumps(ev, separators=(",", ":")).encode() + b"\n\n")
    final = {"id": "cmpl-5e0c41aa", "object": "text_completion", "created": 1796187778,
             "model": "tiny-llama", "choices": [],
             "usage": {"prompt_tokens": 32, "total_tokens": 32 + N_TOKENS,
                       "completion_tokens": N_TOKENS},
             "metrics": {"time_to_first_token_ms": 31.2, "generation_time_ms": 2520.4,
                         "queue_time_ms": 7.7, "mean_itl_ms": 9.88, "tokens_per_second": 99.1}}
    out.append(b"data: " + json.dumps(final, separators=(",", ":")).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def _us_per_event(make_parser, reads: list[bytes]) -> float:
    """Microseconds per token event to parse the stream ``REPEATS`` times."""
    t0 = time.perf_counter()
    n = 0
    for _ in range(REPEATS):
        core = StreamCore(make_parser(), 1 << 20)
        for k, b in enumerate(reads):
            core.feed(b, k)
        n += len(core.events)
    return (time.perf_counter() - t0) / n * 1e6


def test_client_parse_cost(benchmark) -> None:
    shapes = {"llamacpp final": (LlamaCppParser, llamacpp_stream(False)),
              "llamacpp per_token": (LlamaCppParser, llamacpp_stream(True)),
              "vllm completions": (OpenAIParser, vllm_stream())}
    sizes = {k: statistics.median(len(b) for b in v[1][:-2]) for k, v in shapes.items()}
    got: dict[str, list[float]] = {k: [] for k in shapes}

    def rounds() -> None:
        for r in range(ROUNDS):
            order = list(shapes) if r % 2 == 0 else list(reversed(shapes))
            for k in order:
                got[k].append(_us_per_event(*shapes[k]))

    benchmark.pedantic(rounds, rounds=1, iterations=1)
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"\nparse cost per token event, medians of {ROUNDS} rounds x {REPEATS} streams of "
          f"{N_TOKENS} events:")
    for k in shapes:
        print(f"  {k:<20} {med[k]:6.2f} us/event  ({sizes[k]:.0f} bytes/event)")
    print(f"  per_token / final    {med['llamacpp per_token'] / med['llamacpp final']:.2f}x")
    # the token clock itself: every token event stamped, the first at 0
    core = StreamCore(LlamaCppParser(), 1 << 20)
    for k, b in enumerate(shapes["llamacpp per_token"][1]):
        core.feed(b, k)
    clocks = core.parser.engine_clocks()
    assert clocks is not None and len(clocks.token_ms) == N_TOKENS == len(core.events)

"""Each API flavour: the body we send and the parse of a realistic recorded stream."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable

import pytest
import requests
from sse_script_server import Reply, ScriptServer, within

from strata_plugin.formats.records import RequestRecord, Timings, Usage
from strata_plugin.load.client import API_FLAVOURS, RequestSpec
from strata_plugin.load.client.flavours import build_body

Send = Callable[..., RequestRecord]




def _send(
    send: Send, url: str, api: str, spec: RequestSpec, headers: dict[str, str] | None = None
) -> RequestRecord:
    def go() -> RequestRecord:
        with requests.Session() as s:
            return send(s, url, api, spec, scheduled_ns=time.monotonic_ns(), headers=headers)

    return within(10, go)


def _spec(**kw: object) -> RequestSpec:
    base: dict[str, object] = dict(
        request_id="r7", case_id="c", phase="measured", max_tokens=4, prompt="Hi", isl=2
    )
    base.update(kw)
    return RequestSpec(**base)  # type: ignore[arg-type]


def _play(lines: list[str]) -> Reply:
    return Reply(items=[(0.0, f"data: {line}\n\n".encode()) for line in lines])


# --- llama.cpp /completion -------------------------------------------------

# The shape of the embedded llama-server's stream with timings_per_token (its build, run
# and read: every token event carries the slot's cumulative timings; predicted_ms is
# 0.001 on the first token and grows by the decode pace).
def _tok(content: str, tok: int, n: int, predicted_ms: float) -> str:
    return json.dumps({
        "index": 0, "content": content, "tokens": [tok], "stop": False, "id_slot": -1,
        "tokens_predicted": n, "tokens_evaluated": 9,
        "timings": {"cache_n": 3, "prompt_n": 6, "prompt_ms": 10.5,
                    "prompt_per_token_ms": 1.75, "prompt_per_second": 571.4,
                    "predicted_n": n, "predicted_ms": predicted_ms,
                    "predicted_per_token_ms": 0.0, "predicted_per_second": 0.0}},
        separators=(",", ":"))


LLAMA_STREAM = [
    _tok(" Paris", 12366, 1, 0.001),
    _tok(" is", 374, 2, 2.348),
    _tok(" the", 279, 3, 28.009),
    _tok(" capital", 6864, 4, 41.2),
    '{"index":0,"content":"","tokens":[],"id_slot":0,"stop":true,"model":"gpt-3.5-turbo",'
    '"tokens_predicted":4,"tokens_evaluated":9,"generation_settings":{"n_predict":4,'
    '"seed":4294967295,"temperature":0.0,"ignore_eos":true,"stream":true},'
    '"prompt":"<s> The capital of France is","has_new_line":false,"truncated":false,'
    '"stop_type":"limit","stopping_word":"","tokens_cached":12,'
    '"timings":{"cache_n":3,"prompt_n":6,"prompt_ms":10.5,"prompt_per_token_ms":1.75,'
    '"prompt_per_second":571.4,"predicted_n":4,"predicted_ms":41.2,'
    '"predicted_per_token_ms":10.3,"predicted_per_second":97.1,"draft_n":6,'
    '"draft_n_accepted":3}}',
]


def test_llamacpp_stream(send: Send) -> None:
    with ScriptServer(_play(LLAMA_STREAM)) as srv:
        rec = _send(send, srv.url, "llamacpp", _spec(cache_prompt=False, seed=42))
    assert rec.ok, rec.error
    assert [e.n_tokens for e in rec.events] == [1, 1, 1, 1]
    assert {e.kind for e in rec.events} == {"content"}
    assert rec.output_text == " Paris is the capital"
    assert rec.output_sha256 == hashlib.sha256(rec.output_text.encode()).hexdigest()
    assert rec.finish_reason == "length"
    assert rec.usage == Usage(
        prompt_tokens=9, completion_tokens=4, cached_tokens=3, source="timings"
    )
    assert rec.timings == Timings(
        prompt_n=6,
        prompt_ms=10.5,
        predicted_n=4,
        predicted_ms=41.2,
        cache_n=3,
        draft_n=6,
        draft_n_accepted=3,
    )
    assert rec.extra["stop_type"] == "limit"
    assert rec.extra["tokens_cached"] == 12  # kept apart: it is the KV length, not a hit count
    # the server's clocks: its prefill and decode from the final timings, and when it
    # produced each token event, ms after the first (predicted_ms less the first's 0.001)
    eng = rec.engine
    assert eng is not None and eng.source == "llama.cpp timings"
    assert (eng.prefill_ms, eng.decode_ms, eng.queue_ms) == (10.5, 41.2, None)
    assert eng.mean_itl_ms == pytest.approx(41.2 / 3)
    assert eng.token_ms == (0.0, 2.347, 28.008, 41.199)
    assert (eng.draft_tokens, eng.accepted_tokens) == (6, 3)
    assert rec.server_request_id is None and rec.extra["id_slot"] == 0  # no id; the slot
    assert rec.isl == 2 and rec.osl == 4 and rec.api == "llamacpp"
    body = srv.seen[0].json
    assert srv.seen[0].path == "/completion"
    assert body["prompt"] == "Hi" and body["n_predict"] == 4 and body["ignore_eos"] is True
    assert body["cache_prompt"] is False and body["timings_per_token"] is True
    assert body["stream"] is True and body["seed"] == 42 and body["return_tokens"] is True


def test_llamacpp_old_flags_and_no_tokens_array(send: Send) -> None:
    lines = [
        '{"content":"a","stop":false}',
        '{"content":"","stop":false}',  # a token that made no text yet: not counted
        '{"content":"b","stop":false}',
        '{"content":"","stop":true,"stopped_eos":true,"stopped_limit":false,'
        '"tokens_predicted":3,"tokens_evaluated":4,"timings":{"prompt_n":4,"predicted_n":3}}',
    ]
    with ScriptServer(_play(lines)) as srv:
        rec = _send(send, srv.url, "llamacpp", _spec(prompt=None, prompt_token_ids=(1, 2, 3, 4)))
    assert rec.ok, rec.error
    assert [e.n_tokens for e in rec.events] == [1, 1]
    assert rec.finish_reason == "stop"
    assert rec.usage.completion_tokens == 3 and rec.usage.cached_tokens is None
    assert srv.seen[0].json["prompt"] == [1, 2, 3, 4]


# --- OpenAI chat (vLLM shapes) ---------------------------------------------

_HEAD = '{"id":"chatcmpl-9f1c","object":"chat.completion.chunk","created":1736400000,'
_HEAD += '"model":"Qwen/Qwen3-8B","choices":'


def _chat(delta: str, finish: str = "null", usage: str = "") -> str:
    u = f',"usage":{usage}' if usage else ""
    return _HEAD + f'[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{finish}}}]{u}}}'


CHAT_STREAM = [
    _chat('{"role":"assistant","content":""}'),
    _chat('{"content":"Hello"}'),
    _chat('{"content":" world"}'),
    _chat('{"content":"!"}'),
    _chat('{"content":" Bye"}', finish='"length"'),
    '{"id":"chatcmpl-9f1c","object":"chat.completion.chunk","created":1736400000,'
    '"model":"Qwen/Qwen3-8B","choices":[],"usage":{"prompt_tokens":11,"total_tokens":15,'
    '"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":8}}}',
    "[DONE]",
]


def test_chat_stream_with_final_usage(send: Send) -> None:
    headers = {"Authorization": "Bearer sk-secret-value"}
    with ScriptServer(_play(CHAT_STREAM)) as srv:
        rec = _send(send, srv.url, "chat", _spec(model="Qwen/Qwen3-8B", seed=1), headers)
    assert rec.ok, rec.error
    assert [e.n_tokens for e in rec.events] == [1, 1, 1, 1]  # the role chunk is not a token
    assert rec.output_text == "Hello world! Bye"
    assert rec.finish_reason == "length"
    assert rec.usage == Usage(
        prompt_tokens=11, completion_tokens=4, cached_tokens=8, source="usage"
    )
    assert rec.timings is None
    seen = srv.seen[0]
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == "Bearer sk-secret-value"
    assert seen.headers["accept-encoding"] == "identity"
    body = seen.json
    assert body["messages"] == [{"role": "user", "content": "Hi"}]
    assert body["model"] == "Qwen/Qwen3-8B" and body["max_tokens"] == 4
    assert body["ignore_eos"] is True and body["min_tokens"] == 4
    assert body["stream_options"]["include_usage"] is True
    assert "sk-secret" not in rec.to_json()


def test_chat_continuous_usage_counts_multi_token_chunks(send: Send) -> None:
    u = '{{"prompt_tokens":5,"total_tokens":{t},"completion_tokens":{c}}}'
    lines = [
        _chat('{"role":"assistant","content":""}', usage=u.format(t=5, c=0)),
        _chat('{"reasoning_content":"Hmm"}', usage=u.format(t=6, c=1)),
        _chat('{"reasoning_content":" so"}', usage=u.format(t=9, c=4)),  # spec decode: 3
        _chat('{"content":""}', usage=u.format(t=10, c=5)),  # held back by the detokenizer
        _chat('{"content":"Yes"}', finish='"length"', usage=u.format(t=11, c=6)),
        '{"id":"x","choices":[],"usage":{"prompt_tokens":5,"total_tokens":11,'
        '"completion_tokens":6,"completion_tokens_details":{"reasoning_tokens":4}}}',
        "[DONE]",
    ]
    with ScriptServer(_play(lines)) as srv:
        rec = _send(send, srv.url, "chat", _spec(max_tokens=6))
    assert rec.ok, rec.error
    assert [(e.n_tokens, e.kind) for e in rec.events] == [
        (1, "reasoning"),
        (3, "reasoning"),
        (1, "reasoning"),
        (1, "content"),
    ]
    assert sum(e.n_tokens for e in rec.events) == rec.usage.completion_tokens == 6
    assert rec.extra["reasoning_tokens"] == 4
    assert rec.output_text == "Yes" and rec.extra["reasoning_text"] == "Hmm so"


def test_chat_vllm_reasoning_field_and_llamacpp_timings(send: Send) -> None:
    lines = [
        _chat('{"role":"assistant","content":null,"reasoning":"Think"}'),
        _chat('{"content":"Done"}'),
        _HEAD + '[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"completion_tokens":2,'
        '"prompt_tokens":3,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":0}},'
        '"timings":{"cache_n":0,"prompt_n":3,"prompt_ms":4.0,"predicted_n":2,"predicted_ms":8.0}}',
        "[DONE]",
    ]
    with ScriptServer(_play(lines)) as srv:
        rec = _send(send, srv.url, "chat", _spec(max_tokens=2))
    assert rec.ok, rec.error
    assert [e.kind for e in rec.events] == ["reasoning", "content"]
    assert rec.finish_reason == "stop"
    assert rec.timings is not None and rec.timings.predicted_ms == 8.0
    assert rec.usage.completion_tokens == 2 and rec.usage.cached_tokens == 0


def test_chat_usage_only_on_the_last_text_chunk_is_a_total() -> None:
    from strata_plugin.load.client.openai import OpenAIParser

    p = OpenAIParser()
    usage = '{"completion_tokens":3,"prompt_tokens":2,"total_tokens":5}'
    counts = [
        p.feed(_chat('{"content":"a"}')),
        p.feed(_chat('{"content":"b"}')),
        p.feed(_chat('{"content":"c"}', finish='"length"', usage=usage)),
        p.feed("[DONE]"),
    ]
    assert counts == [((1, "content"),)] * 3 + [()]
    assert p.usage.completion_tokens == 3 and p.done


# --- OpenAI completions ----------------------------------------------------

COMPLETIONS_STREAM = [
    '{"id":"cmpl-3a","object":"text_completion","created":1736400001,"model":"m",'
    '"choices":[{"index":0,"text":" one","logprobs":null,"finish_reason":null,'
    '"stop_reason":null}],"usage":null}',
    '{"id":"cmpl-3a","object":"text_completion","created":1736400001,"model":"m",'
    '"choices":[{"index":0,"text":" two","logprobs":null,"finish_reason":null,'
    '"stop_reason":null}],"usage":null}',
    '{"id":"cmpl-3a","object":"text_completion","created":1736400001,"model":"m",'
    '"choices":[{"index":0,"text":" three","logprobs":null,"finish_reason":"length",'
    '"stop_reason":null}],"usage":null}',
    '{"id":"cmpl-3a","object":"text_completion","created":1736400001,"model":"m",'
    '"choices":[],"usage":{"prompt_tokens":4,"total_tokens":7,"completion_tokens":3}}',
    "[DONE]",
]


def test_completions_stream_with_token_prompt(send: Send) -> None:
    with ScriptServer(_play(COMPLETIONS_STREAM)) as srv:
        spec = _spec(prompt=None, prompt_token_ids=(101, 102, 103, 104), max_tokens=3)
        rec = _send(send, srv.url, "completions", spec)
    assert rec.ok, rec.error
    assert len(rec.events) == 3 and rec.output_text == " one two three"
    assert rec.usage == Usage(prompt_tokens=4, completion_tokens=3, source="usage")
    assert rec.finish_reason == "length"
    body = srv.seen[0].json
    assert srv.seen[0].path == "/v1/completions"
    assert body["prompt"] == [101, 102, 103, 104] and body["max_tokens"] == 3


# --- SGLang /generate ------------------------------------------------------


def _sgl(text: str, ids: list[int], n: int, finish: str = "null") -> str:
    meta = {
        "id": "8c1f0e",
        "finish_reason": json.loads(finish),
        "prompt_tokens": 6,
        "weight_version": "default",
        "completion_tokens": n,
        "cached_tokens": 5,
        "e2e_latency": 0.01 * n,
    }
    return json.dumps({"text": text, "output_ids": ids, "meta_info": meta, "index": 0})


SGLANG_STREAM = [
    _sgl(" The", [578], 1),
    _sgl(" The sky", [578, 13180], 2),
    _sgl(" The sky is blue", [578, 13180, 374, 6437], 4),  # two tokens in one chunk
    _sgl(" The sky is blue.", [578, 13180, 374, 6437, 13], 5, '{"type":"length","length":5}'),
    "[DONE]",
]


def test_sglang_generate_cumulative_text(send: Send) -> None:
    with ScriptServer(_play(SGLANG_STREAM)) as srv:
        rec = _send(send, srv.url, "sglang", _spec(max_tokens=5, seed=3))
    assert rec.ok, rec.error
    assert [e.n_tokens for e in rec.events] == [1, 1, 2, 1]
    assert rec.output_text == " The sky is blue."
    assert rec.finish_reason == "length"
    assert rec.usage == Usage(prompt_tokens=6, completion_tokens=5, cached_tokens=5, source="usage")
    body = srv.seen[0].json
    assert srv.seen[0].path == "/generate"
    assert body["text"] == "Hi" and body["stream"] is True
    sp = body["sampling_params"]
    assert sp["max_new_tokens"] == 5 and sp["min_new_tokens"] == 5 and sp["ignore_eos"] is True


def test_sglang_incremental_text_and_input_ids(send: Send) -> None:
    lines = [_sgl("Hel", [1], 1), _sgl("lo", [2], 2), _sgl("!", [3], 3, '"stop"'), "[DONE]"]
    with ScriptServer(_play(lines)) as srv:
        rec = _send(
            send, srv.url, "sglang", _spec(prompt=None, prompt_token_ids=(7, 8), max_tokens=3)
        )
    assert rec.ok, rec.error
    assert rec.output_text == "Hello!" and rec.finish_reason == "stop"
    assert srv.seen[0].json["input_ids"] == [7, 8]


# --- bodies ------------------------------------------------------------------


def test_extra_body_merges_nested() -> None:
    extra = (("sampling_params", {"top_k": 1}), ("rid", "abc"), ("stream", True))
    _, body = build_body("sglang", _spec(extra_body=extra))
    assert body["sampling_params"]["top_k"] == 1 and body["sampling_params"]["max_new_tokens"] == 4
    assert body["rid"] == "abc"
    _, body = build_body("chat", _spec(extra_body=(("stream_options", {"include_usage": False}),)))
    assert body["stream_options"] == {"include_usage": False, "continuous_usage_stats": True}


def test_ignore_eos_off_drops_min_tokens() -> None:
    for api in API_FLAVOURS:
        _, body = build_body(api, _spec(ignore_eos=False))
        assert "ignore_eos" not in json.dumps(body) and "min_" not in json.dumps(body), api


def test_bad_specs_raise_before_sending() -> None:
    with pytest.raises(ValueError, match="chat API"):
        build_body("chat", _spec(prompt=None, prompt_token_ids=(1,)))
    with pytest.raises(ValueError, match="unknown api"):
        build_body("tgi", _spec())
    with pytest.raises(ValueError):
        _spec(prompt=None)


def test_record_round_trips_through_json(send: Send) -> None:
    with ScriptServer(_play(LLAMA_STREAM)) as srv:
        rec = _send(send, srv.url, "llamacpp", _spec())
    assert RequestRecord.from_json(rec.to_json()) == rec

"""Each engine's own per-request clocks, parsed into ``EngineClocks``, and its request id.

The streams are shaped as each engine's source writes them (cited per test); the real
llama-server and vLLM streams are read by tests/test_delivery_live.py and
tests/test_vllm_engine_clocks.py. SGLang has no server here: its shapes follow
sgl-project/sglang python/sglang/srt/managers/tokenizer_manager.py
(``TokenizerManager._handle_batch_output``, ``_calculate_spec_decoding_metrics``) and
python/sglang/srt/observability/req_time_stats.py (``convert_to_output_meta_info``).
"""

from __future__ import annotations

import json
import time

import pytest
import requests
from sse_script_server import Reply, ScriptServer, within

from strata_plugin.formats.records import EngineClocks, RequestRecord
from strata_plugin.load.client import RequestSpec
from strata_plugin.load.client.errors import StreamError
from strata_plugin.load.client.llamacpp import LlamaCppParser
from strata_plugin.load.client.openai import OpenAIParser
from strata_plugin.load.client.sglang import SGLangParser


def _spec(**kw: object) -> RequestSpec:
    base: dict[str, object] = dict(
        request_id="r1", case_id="c", phase="measured", max_tokens=3, prompt="Hi", isl=2)
    base.update(kw)
    return RequestSpec(**base)  # type: ignore[arg-type]


def _send(send, url: str, api: str, spec: RequestSpec) -> RequestRecord:
    def go() -> RequestRecord:
        with requests.Session() as s:
            return send(s, url, api, spec, scheduled_ns=time.monotonic_ns())

    return within(10, go)


def _reply(lines: list[str], headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(items=[(0.0, f"data: {x}\n\n".encode()) for x in lines], headers=headers)


def _feed(parser, lines: list[str]) -> list[tuple[tuple[int, str], ...]]:
    return [parser.feed(x) for x in lines]


# --- vLLM: --enable-per-request-metrics ------------------------------------------------
# vllm/entrypoints/openai/completion/serving.py: the final usage chunk (choices [], dumped
# with exclude_none) carries ``metrics`` = PerRequestMetrics
# (vllm/entrypoints/generate/base/protocol.py) built by build_per_request_timing_metrics
# (vllm/entrypoints/generate/base/serving.py) from the engine core's timestamps.

_V = ('{"id":"cmpl-5e0c41aa","object":"text_completion","created":1796187778,'
      '"model":"tiny-llama","choices":[{"index":0,"text":"%s","logprobs":null,'
      '"finish_reason":%s,"stop_reason":null}],"usage":{"prompt_tokens":4,"total_tokens":%d,'
      '"completion_tokens":%d}}')
VLLM_METRICS = {"time_to_first_token_ms": 31.25, "generation_time_ms": 40.5,
                "queue_time_ms": 7.75, "mean_itl_ms": 20.25, "tokens_per_second": 41.7}


def _vllm_stream(metrics: dict | None) -> list[str]:
    final = {"id": "cmpl-5e0c41aa", "object": "text_completion", "created": 1796187778,
             "model": "tiny-llama", "choices": [],
             "usage": {"prompt_tokens": 4, "total_tokens": 7, "completion_tokens": 3}}
    if metrics is not None:
        final["metrics"] = metrics
    return [_V % (" a", "null", 5, 1), _V % (" b", "null", 6, 2), _V % (" c", '"length"', 7, 3),
            json.dumps(final, separators=(",", ":")), "[DONE]"]


def test_vllm_per_request_metrics_on_the_final_chunk(send) -> None:
    with ScriptServer(_reply(_vllm_stream(VLLM_METRICS))) as srv:
        rec = _send(send, srv.url, "completions", _spec())
    assert rec.ok, rec.error
    assert rec.engine == EngineClocks(
        source="vllm per-request metrics", queue_ms=7.75, prefill_ms=31.25,
        ttft_ms=7.75 + 31.25, decode_ms=40.5, mean_itl_ms=20.25)
    assert rec.server_request_id == "cmpl-5e0c41aa"  # the id its log's request ids start with
    assert RequestRecord.from_json(rec.to_json()) == rec


def test_vllm_without_the_flag_has_no_engine_clocks(send) -> None:
    """A server started without --enable-per-request-metrics: no ``metrics`` key; an
    empty object (nothing measured) is the same: nothing is made up."""
    for metrics in (None, {}):
        with ScriptServer(_reply(_vllm_stream(metrics))) as srv:
            rec = _send(send, srv.url, "completions", _spec())
        assert rec.ok and rec.engine is None, metrics
        assert rec.server_request_id == "cmpl-5e0c41aa"


def test_vllm_spec_decode_acceptance_per_request() -> None:
    """--per-request-spec-decode-metrics summary: metrics.speculative_decoding
    (SpeculativeDecodingMetrics: num_draft_tokens, num_accepted_draft_tokens, ...)."""
    sd = {"mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.625,
          "acceptance_histogram": [1, 0, 2, 1], "num_spec_steps": 4,
          "num_accepted_draft_tokens": 5, "num_draft_tokens": 8, "num_spec_tokens": 2}
    p = OpenAIParser()
    _feed(p, _vllm_stream({**VLLM_METRICS, "speculative_decoding": sd}))
    eng = p.engine_clocks()
    assert eng is not None and (eng.draft_tokens, eng.accepted_tokens) == (8, 5)
    assert p.extra["spec_draft_acceptance_rate"] == 0.625
    # the acceptance alone (timing metrics off, spec metrics on) is still the engine's
    p = OpenAIParser()
    _feed(p, _vllm_stream({"speculative_decoding": sd}))
    eng = p.engine_clocks()
    assert eng is not None and eng.queue_ms is None and eng.accepted_tokens == 5


def test_vllm_metrics_of_the_wrong_type_or_values_are_not_kept() -> None:
    p = OpenAIParser()
    _feed(p, _vllm_stream({"queue_time_ms": -1.0, "time_to_first_token_ms": "12",
                           "generation_time_ms": True, "mean_itl_ms": 3.0}))
    eng = p.engine_clocks()
    assert eng is not None
    assert (eng.queue_ms, eng.prefill_ms, eng.decode_ms, eng.mean_itl_ms) == (
        None, None, None, 3.0)
    with pytest.raises(StreamError, match="metrics is a list"):
        OpenAIParser().feed('{"id":"x","choices":[],"metrics":[1]}')


def test_request_id_header_without_a_body_id(send) -> None:
    """llama.cpp's native stream has no id; a gateway's X-Request-Id is the one there is.
    Where the body has the engine's own, that is the record's and the header is kept apart."""
    llama = ['{"content":"a","tokens":[5],"stop":false}',
             '{"content":"","stop":true,"stop_type":"limit","tokens_predicted":1}']
    hdr = (("X-Request-Id", "gw-77"),)
    with ScriptServer(_reply(llama, hdr)) as srv:
        rec = _send(send, srv.url, "llamacpp", _spec(max_tokens=1))
    assert rec.ok and rec.server_request_id == "gw-77"
    with ScriptServer(_reply(_vllm_stream(None), hdr)) as srv:
        rec = _send(send, srv.url, "completions", _spec())
    assert rec.server_request_id == "cmpl-5e0c41aa" and rec.extra["x_request_id"] == "gw-77"


# --- llama.cpp: timings_per_token --------------------------------------------------------


def _tok(text: str, predicted_ms: object, timings: bool = True) -> str:
    ev: dict = {"content": text, "tokens": [1], "stop": False}
    if timings:
        ev["timings"] = {"prompt_n": 4, "prompt_ms": 58.9, "predicted_n": 1,
                         "predicted_ms": predicted_ms}
    return json.dumps(ev)


LLAMA_END = ('{"content":"","tokens":[],"id_slot":1,"stop":true,"stop_type":"limit",'
             '"tokens_predicted":3,"tokens_evaluated":4,"timings":{"cache_n":0,"prompt_n":4,'
             '"prompt_ms":58.908,"predicted_n":3,"predicted_ms":28.009}}')


def test_llamacpp_token_clock_is_dropped_when_one_token_event_lacks_it() -> None:
    """Every token event must carry its stamp for ``token_ms`` to index the record's
    token events; one without it (an older build, a proxy rewriting) drops the token
    clock, never shifts it. The final timings still give prefill and decode."""
    p = LlamaCppParser()
    _feed(p, [_tok("a", 0.001), _tok("b", 2.3, timings=False), _tok("c", 28.0), LLAMA_END])
    eng = p.engine_clocks()
    assert eng is not None and eng.token_ms == ()
    assert (eng.prefill_ms, eng.decode_ms) == (58.908, 28.009)
    p = LlamaCppParser()
    _feed(p, [_tok("a", 0.001), _tok("b", "2.3"), _tok("c", 28.0), LLAMA_END])
    assert p.engine_clocks().token_ms == ()
    p = LlamaCppParser()
    _feed(p, [_tok("a", 0.001), _tok("b", 2), _tok("c", 28.0), LLAMA_END])
    assert p.engine_clocks().token_ms == (0.0, 1.999, 27.999)


# The embedded llama-server's /v1/completions stream with timings_per_token (its build, run
# and read): every chunk carries the cumulative timings, the last the usage too.
_LO = ('{"choices":[{"text":"%s","index":0,"logprobs":null,"finish_reason":%s}],'
       '"created":1796187778,"model":"tiny-llama.gguf","system_fingerprint":"b0-unknown",'
       '"object":"text_completion",%s"id":"chatcmpl-sp4KDfS6","timings":{"cache_n":3,'
       '"prompt_n":1,"prompt_ms":28.031,"prompt_per_token_ms":28.031,'
       '"prompt_per_second":35.67,"predicted_n":%d,"predicted_ms":%s,'
       '"predicted_per_token_ms":0.0,"predicted_per_second":0.0}}')
_USAGE = ('"usage":{"completion_tokens":3,"prompt_tokens":4,"total_tokens":7,'
          '"prompt_tokens_details":{"cached_tokens":3}},')
LLAMA_OPENAI = [_LO % (" Me", "null", "", 1, "0.001"), _LO % (" well", "null", "", 2, "4.193"),
                _LO % (" was", "null", "", 3, "12.28"),
                _LO % ("", '"length"', _USAGE, 3, "12.28"), "[DONE]"]


def test_llamacpp_openai_route_per_chunk_timings(send) -> None:
    with ScriptServer(_reply(LLAMA_OPENAI)) as srv:
        rec = _send(send, srv.url, "completions", _spec())
    assert rec.ok, rec.error
    assert len(rec.events) == 3
    assert rec.timings is not None and rec.timings.predicted_ms == 12.28
    assert rec.engine == EngineClocks(source="llama.cpp timings", prefill_ms=28.031,
                                      decode_ms=12.28, mean_itl_ms=6.14,
                                      token_ms=(0.0, 4.192, 12.279))
    assert rec.server_request_id == "chatcmpl-sp4KDfS6"


# --- SGLang: meta_info ------------------------------------------------------------------


def _meta(n: int, finish: object = None, **more: object) -> dict:
    meta = {"id": "b1f0c7d2e8", "finish_reason": finish, "prompt_tokens": 6,
            "weight_version": "default", "num_retractions": 0, "reasoning_tokens": 0,
            "completion_tokens": n, "cached_tokens": 0}
    meta.update(more)
    return meta


# with --enable-metrics, every chunk: the scheduler's time stats (wall-clock s; queue_time s)
_SCHED = {"forward_entry_time": 1796187778.250, "prefill_finished_time": 1796187778.290,
          "queue_time": 0.0125, "prefill_waiting_latency": 0.001,
          "prefill_launch_latency": 0.030}
# the last chunk: e2e_latency always; the API server's stats with --enable-metrics;
# the spec-decode counts with a speculative algorithm
_FINAL = {"e2e_latency": 0.125, "request_received_ts": 1796187778.230,
          "api_server_dispatch_finish_ts": 1796187778.236,
          "response_sent_to_client_ts": 1796187778.340, "request_finished_ts": 1796187778.355,
          "inference_time": 0.105, "decode_throughput": 40.0,
          "spec_accept_rate": 0.5, "spec_accept_length": 1.5, "spec_num_correct_drafts": 2,
          "spec_num_proposed_drafts": 4, "spec_verify_ct": 2}


def _sgl(text: str, n: int, meta: dict) -> str:
    return json.dumps({"text": text, "output_ids": list(range(n)), "meta_info": meta})


def test_sglang_meta_info_clocks_with_enable_metrics(send) -> None:
    lines = [_sgl(" a", 1, _meta(1, **_SCHED)), _sgl(" a b", 2, _meta(2, **_SCHED)),
             _sgl(" a b c", 3, _meta(3, {"type": "length", "length": 3}, **_SCHED, **_FINAL)),
             "[DONE]"]
    with ScriptServer(_reply(lines)) as srv:
        rec = _send(send, srv.url, "sglang", _spec())
    assert rec.ok, rec.error
    eng = rec.engine
    assert eng is not None and eng.source == "sglang meta_info"
    assert eng.queue_ms == pytest.approx(12.5)
    assert eng.prefill_ms == pytest.approx(40.0, abs=1e-3)  # forward entry -> prefill done
    assert eng.ttft_ms == pytest.approx(60.0, abs=1e-3)  # received -> prefill done
    # SGLang's decode_throughput is (n - 1) / (finished - first token): 2 tokens at 40/s
    assert eng.decode_ms == pytest.approx(50.0) and eng.mean_itl_ms == pytest.approx(25.0)
    assert (eng.draft_tokens, eng.accepted_tokens) == (4, 2)
    assert eng.token_ms == ()  # SGLang stamps no token
    assert rec.extra["engine_e2e_ms"] == 125.0 and rec.extra["spec_verify_ct"] == 2
    assert rec.server_request_id == "b1f0c7d2e8"


def test_sglang_first_token_latency_is_the_engines_ttft_where_sent() -> None:
    """0.5.23 sends first_token_latency (received -> first token, one clock): it is the
    TTFT, not the span of two converted wall stamps (60 ms here); one token, no decode."""
    p = SGLangParser()
    _feed(p, [_sgl("x", 1, _meta(1, "stop", **_SCHED, **_FINAL, first_token_latency=0.058))])
    eng = p.engine_clocks()
    assert eng is not None and eng.ttft_ms == pytest.approx(58.0)
    assert eng.decode_ms is None and eng.mean_itl_ms is None


def test_sglang_without_enable_metrics_and_older_spec_names() -> None:
    """Without --enable-metrics only e2e_latency is timed: no engine clock part is made
    from it; the older releases' spec-decode names are read too."""
    p = SGLangParser()
    _feed(p, [_sgl("x", 1, _meta(1)), _sgl("x y", 2, _meta(2, "stop", e2e_latency=0.08))])
    assert p.engine_clocks() is None and p.extra["engine_e2e_ms"] == 80.0
    p = SGLangParser()
    _feed(p, [_sgl("x", 1, _meta(1, "stop", spec_draft_token_num=6, spec_accept_token_num=3,
                                  spec_verify_ct=3))])
    eng = p.engine_clocks()
    assert eng is not None and (eng.draft_tokens, eng.accepted_tokens) == (6, 3)


# --- an engine clock field sent wrong: dropped, counted, the request stands ---------------
# The fields are optional: a wrong one costs that clock (named in the record's
# extra.engine_clock_dropped with its reason), never the request, and never reaches
# requests.jsonl as Infinity or NaN.

BIG = "9" * 400  # a 400-digit integer: JSON allows it, a float cannot hold it


def _vllm_raw(metrics_json: str) -> list[str]:
    lines = _vllm_stream({"queue_time_ms": 0})
    lines[3] = lines[3].replace('"metrics":{"queue_time_ms":0}', f'"metrics":{metrics_json}')
    assert metrics_json in lines[3]
    return lines


@pytest.mark.parametrize("value, why", [
    (BIG, "a 400-digit integer, past a float's range"),
    ('"7.75"', "a string, not a number"),
    ("Infinity", "inf, not a finite number"),
    ("NaN", "nan, not a finite number"),
    ("-1", "-1, negative"),
])
def test_a_bad_vllm_clock_field_is_dropped_and_counted_not_a_client_error(send, value, why):
    metrics = ('{"queue_time_ms":' + value + ',"time_to_first_token_ms":31.25,'
               '"generation_time_ms":40.5,"mean_itl_ms":20.25}')
    with ScriptServer(_reply(_vllm_raw(metrics))) as srv:
        rec = _send(send, srv.url, "completions", _spec())
    assert rec.ok, rec.error
    assert len(rec.events) == 3 and rec.output_text == " a b c"
    assert rec.engine is not None and rec.engine.queue_ms is None
    assert (rec.engine.prefill_ms, rec.engine.decode_ms) == (31.25, 40.5)
    assert rec.extra["engine_clock_dropped"] == {"metrics.queue_time_ms": why}
    line = rec.to_json()
    assert "Infinity" not in line and "NaN" not in line
    assert RequestRecord.from_json(line) == rec


def test_a_good_vllm_clock_drops_nothing(send) -> None:
    """The control: an integer clock at the edge of the float range is a clock."""
    metrics = '{"queue_time_ms":0,"time_to_first_token_ms":' + str(2**53) + "}"
    with ScriptServer(_reply(_vllm_raw(metrics))) as srv:
        rec = _send(send, srv.url, "completions", _spec())
    assert rec.ok and "engine_clock_dropped" not in rec.extra
    assert rec.engine is not None and rec.engine.prefill_ms == float(2**53)


def test_bad_vllm_draft_counts_are_dropped_and_counted() -> None:
    p = OpenAIParser()
    sd = ('{"num_draft_tokens":' + BIG + ',"num_accepted_draft_tokens":-3,'
          '"draft_acceptance_rate":"high"}')
    _feed(p, _vllm_raw('{"queue_time_ms":7.75,"speculative_decoding":' + sd + "}"))
    eng = p.engine_clocks()
    assert eng is not None and (eng.queue_ms, eng.draft_tokens, eng.accepted_tokens) == (
        7.75, None, None)
    assert p.clock_dropped == {
        "metrics.speculative_decoding.num_draft_tokens": "a 400-digit integer, past 2^53",
        "metrics.speculative_decoding.num_accepted_draft_tokens": "-3, negative",
        "metrics.speculative_decoding.draft_acceptance_rate": "a string, not a number"}
    assert "spec_draft_acceptance_rate" not in p.extra


def test_llamacpp_timings_of_infinity_or_400_digits_are_dropped(send) -> None:
    end = LLAMA_END.replace('"predicted_ms":28.009', '"predicted_ms":Infinity').replace(
        '"prompt_n":4', f'"prompt_n":{BIG}')
    assert "Infinity" in end and BIG in end
    toks = [_tok("a", 0.001), _tok("b", 2.3), _tok("c", 28.0)]
    with ScriptServer(_reply([*toks, end])) as srv:
        rec = _send(send, srv.url, "llamacpp", _spec())
    assert rec.ok, rec.error
    assert rec.timings is not None
    assert (rec.timings.predicted_ms, rec.timings.prompt_n, rec.timings.prompt_ms) == (
        None, None, 58.908)
    assert rec.extra["engine_clock_dropped"] == {
        "timings.predicted_ms": "inf, not a finite number",
        "timings.prompt_n": "a 400-digit integer, past 2^53"}
    assert "Infinity" not in rec.to_json()
    # the token clock of the events is the engine's still
    assert rec.engine is not None and rec.engine.token_ms == (0.0, 2.299, 27.999)


def test_a_400_digit_token_stamp_drops_the_token_clock_not_the_request(send) -> None:
    toks = [_tok("a", 0.001), _tok("b", 2.3).replace("2.3", BIG), _tok("c", 28.0)]
    with ScriptServer(_reply([*toks, LLAMA_END])) as srv:
        rec = _send(send, srv.url, "llamacpp", _spec())
    assert rec.ok, rec.error
    assert rec.engine is not None and rec.engine.token_ms == ()
    assert rec.engine.decode_ms == 28.009
    assert rec.extra["engine_clock_dropped"] == {
        "timings.predicted_ms (per token)": "a 400-digit integer, past a float's range"}


def test_sglang_clocks_past_a_float_are_dropped_and_counted(send) -> None:
    sched = {**_SCHED, "forward_entry_time": 0}
    final = {**_FINAL, "decode_throughput": 5e-324}
    last = _sgl(" a b c", 3, _meta(3, {"type": "length", "length": 3}, **sched, **final))
    last = last.replace('"forward_entry_time": 0', f'"forward_entry_time": {BIG}')
    assert BIG in last
    with ScriptServer(_reply([_sgl(" a", 1, _meta(1)), last, "[DONE]"])) as srv:
        rec = _send(send, srv.url, "sglang", _spec())
    assert rec.ok, rec.error
    eng = rec.engine
    assert eng is not None and eng.prefill_ms is None and eng.decode_ms is None
    assert eng.ttft_ms == pytest.approx(60.0, abs=1e-3)  # received -> prefill done
    assert rec.extra["engine_clock_dropped"] == {
        "meta_info.decode_throughput": "5e-324 tokens/s gives no finite decode time",
        "meta_info.forward_entry_time": "a 400-digit integer, past a float's range"}
    assert "Infinity" not in rec.to_json()


def test_sglang_stamps_that_run_backwards_are_counted() -> None:
    p = SGLangParser()
    back = {**_SCHED, "prefill_finished_time": _SCHED["forward_entry_time"] - 0.5}
    _feed(p, [_sgl("x", 1, _meta(1, "stop", **back, **_FINAL))])
    eng = p.engine_clocks()
    assert eng is not None and eng.prefill_ms is None and eng.ttft_ms is None
    assert p.clock_dropped["meta_info.forward_entry_time -> prefill_finished_time"] == (
        "-500 ms, negative")

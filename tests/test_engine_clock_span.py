"""An engine clock longer than the request the client timed is left out of the analysis
and counted (analysis/engine_clocks.py, applied where analysis/run_folder.py reads
requests.jsonl); requests.jsonl keeps what the engine sent.

The span is the client's own: dispatch to the stream's end. The bound is that span plus
ENGINE_CLOCK_SLACK_MS and 1000 ppm, tested just inside and just past it.
"""

from __future__ import annotations

import pytest

from strata_plugin.analysis.engine_clocks import dropped_line, within_request
from strata_plugin.analysis.metrics import request_metrics
from strata_plugin.analysis.run_folder import read_records
from strata_plugin.formats.records import EngineClocks, RequestRecord, Timings, TokenEvent
from strata_plugin.limits import ENGINE_CLOCK_SLACK_MS

MS = 1_000_000
T0 = 10**12


def _rec(rid: str = "r1", predicted_ms: float = 60.0, prompt_ms: float = 20.0,
         engine: EngineClocks | None = None, dropped: dict | None = None) -> RequestRecord:
    """A request the client timed at 100 ms (dispatch to the stream's end), 3 tokens."""
    events = tuple(TokenEvent(T0 + k * MS, 1) for k in (30, 60, 90))
    return RequestRecord(rid, "c", "measured", "llamacpp", T0, T0, first_byte_ns=T0 + 30 * MS,
                         events=events, done_ns=T0 + 100 * MS,
                         timings=Timings(prompt_n=8, prompt_ms=prompt_ms, predicted_n=3,
                                         predicted_ms=predicted_ms),
                         engine=engine, extra={"engine_clock_dropped": dropped} if dropped
                         else {})


MOST = 100 * 1.001 + ENGINE_CLOCK_SLACK_MS  # 105.1 ms


def test_a_clock_within_the_request_is_kept_one_past_it_left_out_and_named():
    inside = _rec(predicted_ms=MOST - 0.01)
    assert within_request(inside) is inside
    past = within_request(_rec(predicted_ms=MOST + 0.01))
    assert past.timings == Timings(prompt_n=8, prompt_ms=20.0, predicted_n=3)
    assert past.extra["engine_clock_dropped"] == {
        "timings.predicted_ms": "105.11 ms, past the 100 ms the client timed the request for"}


def test_seconds_given_as_milliseconds_leave_no_server_rate_of_zero(tmp_path):
    """An engine reporting 60 s where 60 ms is meant (or 1e300): read back, the server's
    decode rate is not there, instead of 0.05 tokens/s shown as "0"; the file keeps it."""
    path = tmp_path / "requests.jsonl"
    recs = [_rec("a", predicted_ms=60_000.0), _rec("b", predicted_ms=1e300), _rec("c")]
    path.write_text("".join(r.to_json() + "\n" for r in recs))
    got = {r.request_id: r for r in read_records(path)[0]["c"]}
    assert request_metrics(got["a"]).server_decode_tok_s is None
    assert request_metrics(got["b"]).server_decode_tok_s is None
    assert request_metrics(got["c"]).server_decode_tok_s == pytest.approx(3 * 1000 / 60)
    assert "1e+300" in path.read_text()  # what the engine sent stays in the raw file
    assert dropped_line(got.values()) == (
        "the engine's own clocks: fields left out in 2 of 3 requests (the requests stand): "
        "timings.predicted_ms in 2 (60000 ms, past the 100 ms the client timed the request "
        "for)")


def test_engine_clocks_and_token_stamps_past_the_request_are_left_out():
    eng = EngineClocks("vllm per-request metrics", queue_ms=5.0, prefill_ms=20_000.0,
                       decode_ms=60.0, token_ms=(0.0, 30.0, 200.0))
    got = within_request(_rec(engine=eng, dropped={"metrics.mean_itl_ms": "a string, "
                                                   "not a number"}))
    assert got.engine == EngineClocks("vllm per-request metrics", queue_ms=5.0,
                                      decode_ms=60.0)
    assert sorted(got.extra["engine_clock_dropped"]) == [
        "engine.prefill_ms", "engine.token_ms", "metrics.mean_itl_ms"]  # the client's kept


def test_the_case_note_counts_what_the_client_dropped_too():
    recs = [_rec("a", dropped={"metrics.queue_time_ms": "a string, not a number"}),
            _rec("b", dropped={"metrics.queue_time_ms": "a 400-digit integer, past a "
                               "float's range"}), _rec("c")]
    assert dropped_line(recs) == (
        "the engine's own clocks: fields left out in 2 of 3 requests (the requests stand): "
        "metrics.queue_time_ms in 2 (a string, not a number)")
    assert dropped_line([_rec("c")]) is None


def test_a_case_whose_engine_reported_seconds_says_so_in_its_verdict_notes(tmp_path):
    """A run folder's requests.jsonl with two records whose decode clock is 1000x their
    own length (seconds where ms are meant): the case's analysis leaves them out of the
    server's decode rate and its verdict notes count them."""
    import json

    from bundle_factory import CaseSpec, RunSpec, make_run

    from strata_plugin.analysis.case_summary import analyze_run

    run = make_run(tmp_path, RunSpec(cases=[CaseSpec("c1", n_requests=8)]))
    path = run / "requests.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    measured = [d for d in lines if d["phase"] == "measured"]
    good = analyze_run(run).analyses[0]
    for d in measured[:2]:
        d["timings"]["predicted_ms"] *= 1000
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    got = analyze_run(run).analyses[0]
    note = next(n for n in got.verdict.notes if n.startswith("the engine's own clocks"))
    assert note.startswith("the engine's own clocks: fields left out in 2 of 8 requests "
                           "(the requests stand): timings.predicted_ms in 2 (")
    assert not any(n.startswith("the engine's own clocks") for n in good.verdict.notes)
    # the six requests left give the server's decode rate; the two are not in it
    assert got.metrics.server_decode_tok_s == pytest.approx(
        good.metrics.server_decode_tok_s, rel=0.2)

"""Metric definitions on hand-built records with exact timestamps."""

from __future__ import annotations

import math

import pytest

from strata_plugin.analysis.metrics import (
    AB_HEADLINE,
    AB_INTERFERENCE,
    HEADLINE_DISTRIBUTIONS,
    HEADLINE_SCALARS,
    HEADLINE_STATS,
    CaseMetrics,
    Distribution,
    Slo,
    acceptance,
    case_metrics,
    headline,
    higher_is_worse,
    metric_label,
    request_metrics,
)
from strata_plugin.analysis.request_values import METRICS, check_metric, unit
from strata_plugin.formats.records import RequestError, RequestRecord, Timings, TokenEvent, Usage

MS = 1_000_000  # ns per ms
T0 = 5_000_000 * MS  # an arbitrary monotonic origin: nothing may assume 0


def ev(ms: float, n: int = 1, kind: str = "content") -> TokenEvent:
    return TokenEvent(t_ns=T0 + int(ms * MS), n_tokens=n, kind=kind)


def rec(
    *,
    rid: str = "r0",
    phase: str = "measured",
    at_ms: float = 0.0,
    queue_ms: float = 0.0,
    first_byte_ms: float | None = None,
    events: tuple[tuple[float, int] | tuple[float, int, str], ...] = (),
    done_ms: float | None = None,
    **kw: object,
) -> RequestRecord:
    """A record dispatched at T0 + at_ms; event and done times are relative to it."""
    base = at_ms
    return RequestRecord(
        request_id=rid,
        case_id="case",
        phase=phase,
        api="chat",
        scheduled_ns=T0 + int((base - queue_ms) * MS),
        dispatched_ns=T0 + int(base * MS),
        first_byte_ns=None if first_byte_ms is None else T0 + int((base + first_byte_ms) * MS),
        events=tuple(ev(base + e[0], *e[1:]) for e in events),  # type: ignore[arg-type]
        done_ns=None if done_ms is None else T0 + int((base + done_ms) * MS),
        **kw,  # type: ignore[arg-type]
    )


# --- per request -------------------------------------------------------------


def test_exact_timings_from_events():
    r = rec(
        queue_ms=5,
        first_byte_ms=80,
        events=((100, 1), (150, 1), (200, 2), (250, 1)),
        done_ms=260,
    )
    m = request_metrics(r)
    assert m.ok and m.error_class is None
    assert m.queue_ms == 5.0
    assert m.ttfb_ms == 80.0
    assert m.ttft_ms == 100.0
    assert m.ttfo_ms == 100.0
    assert m.e2e_ms == 250.0  # last token, not done_ns
    assert m.e2e_incl_queue_ms == 255.0
    assert (m.n_out, m.n_out_source, m.n_out_events, m.n_events) == (5, "events", 5, 4)
    assert m.tpot_ms == pytest.approx((250 - 100) / (5 - 1))  # 37.5
    assert m.chunk_gaps_ms == (50.0, 50.0, 50.0)
    assert m.chunk_gap_tokens == (1, 2, 1)
    assert m.e2e_per_token_ms == 50.0
    assert m.start_ns == r.dispatched_ns
    assert m.end_ns == T0 + 260 * MS


def test_events_out_of_order_are_timed_in_arrival_order():
    """A record edited or merged by hand may list events out of order: the metrics are
    those of the same events in time order."""
    in_order = request_metrics(rec(events=((100, 1), (150, 1), (200, 2), (250, 1))))
    shuffled = request_metrics(rec(events=((200, 2), (100, 1), (250, 1), (150, 1))))
    assert shuffled == in_order


def test_server_usage_count_wins_and_is_recorded():
    r = rec(
        events=((100, 1), (150, 1), (200, 2), (250, 1)),
        usage=Usage(completion_tokens=9, source="usage"),
    )
    m = request_metrics(r)
    assert (m.n_out, m.n_out_source, m.n_out_events) == (9, "usage", 5)
    assert m.tpot_ms == pytest.approx(150 / 8)


def test_timings_predicted_n_used_when_usage_missing():
    r = rec(events=((10, 1), (30, 1), (50, 1)), timings=Timings(predicted_n=5))
    m = request_metrics(r)
    assert (m.n_out, m.n_out_source) == (5, "timings")
    assert m.tpot_ms == pytest.approx(40 / 4)


def test_reasoning_then_content_splits_ttft_and_ttfo():
    r = rec(
        events=((100, 1, "reasoning"), (120, 1, "reasoning"), (300, 1), (340, 1)),
        done_ms=350,
    )
    m = request_metrics(r)
    assert m.ttft_ms == 100.0
    assert m.ttfo_ms == 300.0
    assert m.tpot_ms == pytest.approx((340 - 100) / 3)  # reasoning tokens are output tokens
    assert m.chunk_gaps_ms == (20.0, 180.0, 40.0)


def test_only_reasoning_has_no_ttfo():
    m = request_metrics(rec(events=((100, 1, "reasoning"), (120, 1, "reasoning"))))
    assert m.ttft_ms == 100.0
    assert m.ttfo_ms is None


def test_role_only_and_usage_only_chunks_do_not_count():
    r = rec(first_byte_ms=20, events=((20, 0), (100, 1), (140, 1), (141, 0)), done_ms=150)
    m = request_metrics(r)
    assert m.ttfb_ms == 20.0
    assert m.ttft_ms == 100.0
    assert m.e2e_ms == 140.0
    assert m.chunk_gaps_ms == (40.0,)
    assert m.n_events == 2


def test_tpot_undefined_below_two_tokens_or_one_chunk():
    one = request_metrics(rec(events=((100, 1),), done_ms=110))
    assert one.n_out == 1 and one.tpot_ms is None
    assert one.e2e_ms == 100.0
    # all tokens in one chunk: no time span, so no decode pace (not 0 ms)
    lump = request_metrics(rec(events=((100, 4),)))
    assert lump.n_out == 4 and lump.tpot_ms is None
    assert lump.chunk_gaps_ms == ()


def test_no_tokens_e2e_falls_back_to_done():
    m = request_metrics(rec(first_byte_ms=30, done_ms=90))
    assert m.ttft_ms is None and m.ttfo_ms is None and m.tpot_ms is None
    assert m.e2e_ms == 90.0
    assert m.n_out == 0 and m.e2e_per_token_ms is None


def test_error_record_keeps_what_was_measured():
    r = rec(
        first_byte_ms=80,
        events=((100, 1), (130, 1)),
        error=RequestError(cls="timeout", message="read timed out"),
    )
    m = request_metrics(r)
    assert not m.ok
    assert m.error_class == "timeout"
    assert m.ttft_ms == 100.0 and m.e2e_ms == 130.0
    connect = request_metrics(rec(error=RequestError(cls="connect", message="refused")))
    assert connect.ttfb_ms is None and connect.e2e_ms is None
    assert connect.end_ns == connect.start_ns


def test_prompt_tokens_cached_apart_from_computed():
    m = request_metrics(
        rec(usage=Usage(prompt_tokens=1000, cached_tokens=768, completion_tokens=3, source="usage"))
    )
    assert (m.prompt_tokens, m.cached_tokens, m.computed_prompt_tokens) == (1000, 768, 232)
    assert m.prompt_source == "usage"
    # llama.cpp timings only: prompt_n excludes cache hits
    t = request_metrics(rec(timings=Timings(prompt_n=232, cache_n=768)))
    assert (t.prompt_tokens, t.cached_tokens, t.computed_prompt_tokens) == (1000, 768, 232)
    assert t.prompt_source == "timings"
    # no cache report: cached and computed are unknown, not zero
    u = request_metrics(rec(usage=Usage(prompt_tokens=1000, source="usage")))
    assert (u.prompt_tokens, u.cached_tokens, u.computed_prompt_tokens) == (1000, None, None)


def test_server_timings_rates():
    r = rec(
        events=((300, 1), (320, 1)),
        timings=Timings(prompt_n=500, prompt_ms=250.0, predicted_n=100, predicted_ms=2000.0),
    )
    m = request_metrics(r)
    assert m.server_prefill_tok_s == pytest.approx(2000.0)
    assert m.server_decode_tok_s == pytest.approx(50.0)
    assert m.ttft_minus_server_prompt_ms == pytest.approx(50.0)
    assert (
        request_metrics(rec(timings=Timings(prompt_n=5, prompt_ms=0.0))).server_prefill_tok_s
        is None
    )


def test_metrics_survive_a_json_round_trip():
    r = rec(
        queue_ms=3,
        first_byte_ms=10,
        events=((20, 1, "reasoning"), (45, 2), (70, 1)),
        done_ms=71,
        usage=Usage(prompt_tokens=12, completion_tokens=4, cached_tokens=0, source="usage"),
        timings=Timings(prompt_n=12, prompt_ms=8.0, draft_n=4, draft_n_accepted=3),
    )
    assert request_metrics(RequestRecord.from_json(r.to_json())) == request_metrics(r)


# --- speculative acceptance -------------------------------------------------------


def test_acceptance_is_sum_over_sum_not_mean_of_ratios():
    small = rec(rid="a", timings=Timings(draft_n=10, draft_n_accepted=9))  # 0.9
    big = rec(rid="b", timings=Timings(draft_n=1000, draft_n_accepted=100))  # 0.1
    got = acceptance([small, big])
    assert got == pytest.approx(109 / 1010)
    mean_of_ratios = (0.9 + 0.1) / 2
    assert not math.isclose(got, mean_of_ratios)


def test_acceptance_undefined_without_drafts():
    assert acceptance([]) is None
    assert acceptance([rec(), rec(timings=Timings(prompt_n=3))]) is None
    assert acceptance([rec(timings=Timings(draft_n=0))]) is None


def test_acceptance_missing_accepted_means_zero():
    # llama.cpp leaves draft_n_accepted out when it is 0
    r = rec(timings=Timings(draft_n=5))
    assert request_metrics(r).draft_accepted == 0
    assert acceptance([r, rec(timings=Timings(draft_n=5, draft_n_accepted=5))]) == 0.5


# --- per case ----------------------------------------------------------------------


def _measured_pair() -> list[RequestRecord]:
    u = Usage(prompt_tokens=100, cached_tokens=40, completion_tokens=10, source="usage")
    return [
        rec(rid="m1", at_ms=1000, events=((50, 1), (140, 9)), done_ms=150, usage=u),
        rec(rid="m2", at_ms=1100, events=((80, 1), (390, 9)), done_ms=400, usage=u),
    ]


def test_warmups_excluded_from_throughput_and_window():
    warm = [
        rec(rid=f"w{i}", phase="warmup", at_ms=i * 10, events=((5, 1000),), done_ms=6)
        for i in range(3)
    ]
    cm = case_metrics(warm + _measured_pair())
    assert cm.n_warmup == 3
    assert (cm.n_requests, cm.n_ok, cm.n_errors) == (2, 2, 0)
    # window: first measured dispatch (1000 ms) to last measured end (1500 ms)
    assert cm.window_s == pytest.approx(0.5)
    assert cm.total_output_tokens == 20
    assert cm.output_tok_s == pytest.approx(40.0)
    assert cm.input_tok_s == pytest.approx(400.0)
    assert cm.input_cached_tok_s == pytest.approx(160.0)
    assert cm.input_computed_tok_s == pytest.approx(240.0)
    assert cm.request_s == pytest.approx(4.0)
    assert cm.ttft.n == 2
    assert (cm.ttft.min, cm.ttft.max) == (50.0, 80.0)
    assert cm.ttft.p50 == pytest.approx(65.0)
    assert cm.n_out_sources == (("usage", 2),)
    assert cm.goodput_fraction is None and cm.goodput_req_s is None  # no SLO


def test_explicit_window_replaces_denominator():
    cm = case_metrics(_measured_pair(), window_ns=(T0, T0 + 2000 * MS))
    assert cm.window_s == pytest.approx(2.0)
    assert cm.output_tok_s == pytest.approx(10.0)


def test_chunk_gaps_pooled_with_tokens():
    cm = case_metrics(_measured_pair())
    assert cm.chunk_gap.n == 2
    assert (cm.chunk_gap.min, cm.chunk_gap.max) == (90.0, 310.0)
    assert cm.chunk_gap_per_token.max == pytest.approx(310.0 / 9)
    # tpot: (140-50)/9 = 10 and (390-80)/9
    assert cm.tpot.min == pytest.approx(10.0)


def test_goodput_counts_errors_in_denominator():
    good1 = rec(rid="g1", at_ms=0, events=((100, 1), (200, 1)), done_ms=200)  # tpot 100
    good2 = rec(rid="g2", at_ms=0, events=((150, 1), (250, 1)), done_ms=250)
    slow = rec(rid="s", at_ms=0, events=((900, 1), (1000, 1)), done_ms=1000)  # ttft 900
    failed = rec(
        rid="e",
        at_ms=0,
        done_ms=50,
        error=RequestError(cls="http_status", message="503", http_status=503),
    )
    cm = case_metrics([good1, good2, slow, failed], slo=Slo(ttft_ms=500, tpot_ms=150))
    assert (cm.n_requests, cm.n_ok, cm.n_errors) == (4, 3, 1)
    assert cm.errors_by_class == (("http_status", 1),)
    assert cm.goodput_fraction == pytest.approx(2 / 4)  # not 2/3
    assert cm.window_s == pytest.approx(1.0)
    assert cm.goodput_req_s == pytest.approx(2.0)
    assert cm.success_fraction == pytest.approx(3 / 4)
    assert cm.slo == "ttft_ms<=500;tpot_ms<=150"
    # the failed request is not in the latency distributions
    assert cm.ttft.n == 3


def test_slo_tpot_passes_when_tpot_undefined_but_ttft_must_exist():
    one_token = rec(events=((100, 1),), done_ms=100)
    no_token = rec(rid="z", done_ms=100)
    assert Slo(tpot_ms=1).met_by(request_metrics(one_token))
    assert not Slo(ttft_ms=1000).met_by(request_metrics(no_token))
    assert Slo(e2e_ms=100).met_by(request_metrics(one_token))
    assert not Slo(e2e_ms=99.9).met_by(request_metrics(one_token))


def test_case_spec_acceptance_and_server_rates_aggregate_as_sums():
    a = rec(
        rid="a",
        events=((10, 1), (20, 1)),
        timings=Timings(
            prompt_n=100,
            prompt_ms=10.0,
            predicted_n=10,
            predicted_ms=100.0,
            draft_n=10,
            draft_n_accepted=9,
        ),
    )
    b = rec(
        rid="b",
        events=((10, 1), (20, 1)),
        timings=Timings(
            prompt_n=900,
            prompt_ms=990.0,
            predicted_n=90,
            predicted_ms=900.0,
            draft_n=1000,
            draft_n_accepted=100,
        ),
    )
    cm = case_metrics([a, b])
    assert cm.spec_acceptance == pytest.approx(109 / 1010)
    assert cm.server_prefill_tok_s == pytest.approx(1000 / 1000 * 1000)  # sum n / sum ms
    assert cm.server_decode_tok_s == pytest.approx(100 / 1000 * 1000)


def test_unknown_cache_report_leaves_cached_throughput_undefined():
    recs = [
        rec(rid="a", events=((10, 1),), usage=Usage(prompt_tokens=10, cached_tokens=5)),
        rec(rid="b", at_ms=10, events=((10, 1),), usage=Usage(prompt_tokens=10)),
    ]
    cm = case_metrics(recs)
    assert cm.total_prompt_tokens == 20
    assert cm.total_cached_tokens is None
    assert cm.input_cached_tok_s is None and cm.input_computed_tok_s is None
    assert cm.input_tok_s == pytest.approx(20 / 0.02)


def test_empty_case():
    cm = case_metrics([])
    assert isinstance(cm, CaseMetrics)
    assert cm.n_requests == 0 and cm.window_s is None
    assert cm.ttft == Distribution(n=0)
    assert cm.output_tok_s is None and cm.request_s is None
    h = headline(cm)
    assert h["n_requests"] == 0
    assert "ttft_p50_ms" not in h


def test_headline_is_flat_stable_and_scalar():
    recs = [
        *_measured_pair(),
        rec(rid="e", at_ms=1200, error=RequestError(cls="reset", message="peer reset")),
        rec(rid="w", phase="warmup", events=((5, 1),)),
    ]
    recs[0] = rec(
        rid="m1",
        at_ms=1000,
        events=((50, 1), (140, 9)),
        done_ms=150,
        usage=Usage(prompt_tokens=100, cached_tokens=40, completion_tokens=10, source="usage"),
        timings=Timings(draft_n=4, draft_n_accepted=2),
    )
    h = headline(case_metrics(recs, slo=Slo(ttft_ms=60)))
    for key in (
        "ttft_p50_ms",
        "ttft_p99_ms",
        "tpot_p50_ms",
        "tpot_p95_ms",
        "output_tok_s",
        "input_tok_s",
        "goodput_fraction",
        "n_errors",
        "spec_acceptance",
        "chunk_gap_p99_ms",
        "queue_p50_ms",
        "ttfo_mean_ms",
    ):
        assert key in h, key
    assert all(isinstance(v, int | float | str) and v is not None for v in h.values())
    assert h["n_errors"] == 1
    assert h["errors_by_class"] == "reset:1"
    assert h["goodput_fraction"] == pytest.approx(1 / 3)
    assert h["spec_acceptance"] == 0.5
    assert h["slo"] == "ttft_ms<=60"
    assert all(k == k.lower() and " " not in k for k in h)


# --- edges of each per-request field ------------------------------------------------


def test_identity_fields_are_the_records():
    r = rec(rid="r7", phase="warmup", events=((10, 1),), finish_reason="length")
    m = request_metrics(r)
    assert (m.request_id, m.case_id, m.phase, m.finish_reason) == ("r7", "case", "warmup", "length")


@pytest.mark.parametrize(
    ("usage", "timings", "want"),
    [
        # a count with no source named is the server's usage block
        (Usage(completion_tokens=3), None, (3, "usage")),
        (Usage(completion_tokens=3, source="tokenizer"), None, (3, "tokenizer")),
        (Usage(completion_tokens=3, source="timings"), Timings(predicted_n=7), (3, "timings")),
        (Usage(), Timings(predicted_n=7), (7, "timings")),
        (Usage(), Timings(prompt_n=4), (2, "events")),  # timings without a count
        (Usage(), None, (2, "events")),
    ],
)
def test_output_token_count_and_its_source(usage, timings, want):
    m = request_metrics(rec(events=((10, 1), (20, 1)), usage=usage, timings=timings))
    assert (m.n_out, m.n_out_source) == want
    assert m.n_out_events == 2


@pytest.mark.parametrize(
    ("usage", "timings", "want"),
    [
        # (prompt, cached, computed, source)
        (Usage(), None, (None, None, None, "none")),
        (Usage(), Timings(predicted_n=3), (None, None, None, "none")),
        (Usage(prompt_tokens=10), None, (10, None, None, "usage")),
        (Usage(prompt_tokens=10, source="tokenizer"), None, (10, None, None, "tokenizer")),
        # llama.cpp timings without a cache report: cache unknown, prompt_n was computed
        (Usage(), Timings(prompt_n=5), (5, None, 5, "timings")),
        (Usage(), Timings(prompt_n=5, cache_n=0), (5, 0, 5, "timings")),
        # usage has the prompt, timings the cache hits: computed from both
        (Usage(prompt_tokens=10), Timings(prompt_n=4, cache_n=6), (10, 6, 4, "usage")),
        # usage without a cache report: computed is what the server says it computed
        (Usage(prompt_tokens=10), Timings(prompt_n=4), (10, None, 4, "usage")),
        (
            Usage(prompt_tokens=10, cached_tokens=8),
            Timings(prompt_n=4, cache_n=6),
            (10, 8, 2, "usage"),
        ),
    ],
)
def test_prompt_token_counts_and_their_source(usage, timings, want):
    m = request_metrics(rec(events=((10, 1),), usage=usage, timings=timings))
    assert (m.prompt_tokens, m.cached_tokens, m.computed_prompt_tokens, m.prompt_source) == want


def test_one_token_request_has_e2e_per_token_but_no_tpot():
    m = request_metrics(rec(events=((100, 1),), done_ms=120))
    assert m.e2e_per_token_ms == 100.0
    assert m.tpot_ms is None


def test_sub_millisecond_server_prompt_still_has_a_rate():
    """A prompt served from the cache takes well under 1 ms; its rate is still defined."""
    m = request_metrics(rec(events=((10, 1),), timings=Timings(prompt_n=5, prompt_ms=0.5)))
    assert m.server_prefill_tok_s == pytest.approx(10_000.0)


@pytest.mark.parametrize(
    ("predicted_n", "predicted_ms", "want"),
    [(None, 100.0, None), (0, 100.0, None), (1, 50.0, None), (2, 100.0, 20.0), (3, 100.0, 30.0)],
)
def test_server_decode_rate_needs_two_decoded_tokens(predicted_n, predicted_ms, want):
    t = Timings(predicted_n=predicted_n, predicted_ms=predicted_ms)
    got = request_metrics(rec(events=((10, 1),), timings=t)).server_decode_tok_s
    assert got == (None if want is None else pytest.approx(want))


@pytest.mark.parametrize(
    ("timings", "done_ms", "want"),
    [
        # e2e 300 (last token), server 50 + 200: 50 ms no server clock accounts for
        (Timings(prompt_ms=50.0, predicted_ms=200.0), 310, 50.0),
        (Timings(prompt_ms=50.0, predicted_ms=249.5), 310, 0.5),
        # the server's clocks cover more than the client saw: clamped at 0, not negative
        (Timings(prompt_ms=100.0, predicted_ms=250.0), 310, 0.0),
        (Timings(prompt_ms=50.0), 310, None),
        (Timings(predicted_ms=200.0), 310, None),
        (None, 310, None),
    ],
)
def test_outside_server_time(timings, done_ms, want):
    m = request_metrics(rec(events=((100, 1), (300, 1)), done_ms=done_ms, timings=timings))
    assert m.e2e_ms == 300.0
    assert m.outside_server_ms == (None if want is None else pytest.approx(want))


def test_outside_server_time_undefined_without_e2e():
    """Server timings but no stream end (a lost connection): nothing to subtract from."""
    m = request_metrics(
        rec(
            timings=Timings(prompt_ms=5.0, predicted_ms=5.0),
            error=RequestError(cls="reset", message="peer reset"),
        )
    )
    assert m.e2e_ms is None and m.outside_server_ms is None


@pytest.mark.parametrize(
    ("timings", "want"),
    [
        (Timings(draft_n=4, draft_n_accepted=3), (4, 3, 0.75)),
        (Timings(draft_n=4), (4, 0, 0.0)),  # llama.cpp omits 0 accepted
        (Timings(draft_n=0), (0, 0, None)),
        # no speculative decoding: not "0 accepted"
        (Timings(prompt_n=3, draft_n_accepted=2), (None, None, None)),
        (None, (None, None, None)),
    ],
)
def test_request_spec_acceptance(timings, want):
    m = request_metrics(rec(events=((10, 1),), timings=timings))
    assert (m.draft_n, m.draft_accepted, m.spec_acceptance) == want


def test_acceptance_of_a_single_drafted_token():
    assert acceptance([rec(timings=Timings(draft_n=1, draft_n_accepted=1))]) == 1.0


# --- SLOs ---------------------------------------------------------------------------


def test_slo_is_set_by_any_limit():
    assert not Slo().is_set()
    assert Slo(tpot_ms=5).is_set()
    assert Slo(ttft_ms=1, tpot_ms=2, e2e_ms=3, ttfo_ms=4).is_set()


def test_slo_limits_are_inclusive():
    m = request_metrics(rec(events=((100, 1), (150, 1), (200, 1)), done_ms=200))
    assert m.tpot_ms == 50.0
    assert Slo(tpot_ms=50.0).met_by(m)
    assert not Slo(tpot_ms=49.9).met_by(m)
    assert Slo(ttft_ms=100.0).met_by(m) and not Slo(ttft_ms=99.9).met_by(m)


# --- per case: each aggregate at its edge ---------------------------------------------


def test_case_without_measured_requests_has_no_goodput_fraction():
    warm = rec(phase="warmup", events=((10, 1),))
    for recs in ([], [warm]):
        cm = case_metrics(recs, slo=Slo(ttft_ms=100))
        assert cm.goodput_fraction is None and cm.goodput_req_s is None
        assert cm.success_fraction is None


def test_case_without_slo_leaves_goodput_undefined():
    recs = _measured_pair()
    for slo in (None, Slo()):
        cm = case_metrics(recs, slo=slo)
        assert cm.goodput_fraction is None and cm.goodput_req_s is None
        assert cm.slo == ""


def test_case_totals_and_sources():
    u = Usage(prompt_tokens=100, cached_tokens=40, completion_tokens=10, source="usage")
    recs = [
        rec(rid="a", events=((50, 1), (150, 1)), done_ms=150, usage=u),
        rec(
            rid="b",
            events=((50, 1), (250, 1)),
            done_ms=250,
            timings=Timings(prompt_n=30, cache_n=70),
        ),
    ]
    cm = case_metrics(recs)
    assert cm.total_prompt_tokens == 200
    assert cm.total_cached_tokens == 110
    assert cm.total_computed_prompt_tokens == 90
    assert cm.prompt_sources == (("timings", 1), ("usage", 1))
    assert cm.n_out_sources == (("events", 1), ("usage", 1))
    # e2e per token: 150 / 10 and 250 / 2
    assert (cm.e2e_per_token.min, cm.e2e_per_token.max) == (15.0, 125.0)


def test_case_server_prefill_rate_pairs_tokens_with_their_time():
    """A request whose prompt time is missing adds neither tokens nor time; one with 0 prompt
    tokens (everything cached) adds its time."""
    recs = [
        rec(rid="a", events=((10, 1),), timings=Timings(prompt_n=100, prompt_ms=50.0)),
        rec(rid="b", events=((10, 1),), timings=Timings(prompt_n=100)),
        rec(rid="c", events=((10, 1),), timings=Timings(prompt_n=100, prompt_ms=0.0)),
        rec(rid="d", events=((10, 1),), timings=Timings(prompt_n=0, prompt_ms=50.0)),
    ]
    assert case_metrics(recs).server_prefill_tok_s == pytest.approx(100 / 100 * 1000)


@pytest.mark.parametrize(("n_b", "want"), [(1, 118.0), (2, 60.0), (3, 60.5)])
def test_case_server_decode_rate_skips_single_token_decodes(n_b, want):
    """One decoded token shows no decode pace: it stays out of the pooled rate (tokens and
    time both); two tokens count."""
    recs = [
        rec(rid="a", events=((10, 1),), timings=Timings(predicted_n=118, predicted_ms=1000.0)),
        rec(rid="b", events=((10, 1),), timings=Timings(predicted_n=n_b, predicted_ms=1000.0)),
    ]
    assert case_metrics(recs).server_decode_tok_s == pytest.approx(want)


def test_headline_joins_error_classes():
    recs = [
        rec(rid="a", error=RequestError(cls="reset", message="x")),
        rec(rid="b", error=RequestError(cls="timeout", message="x")),
        rec(rid="c", error=RequestError(cls="timeout", message="x")),
    ]
    assert headline(case_metrics(recs))["errors_by_class"] == "reset:1,timeout:2"


# --- names, units and directions ----------------------------------------------------------

#: Every metric name a table, a gate or an A/B verdict reads, with its unit and the
#: direction that is worse. A flipped direction turns a regression into an improvement.
NAMES = {
    # per-request latencies and their headline stats
    "ttft_ms": ("ms", True),
    "ttfo_ms": ("ms", True),
    "ttfb_ms": ("ms", True),
    "tpot_ms": ("ms", True),
    "e2e_ms": ("ms", True),
    "queue_ms": ("ms", True),
    "e2e_incl_queue_ms": ("ms", True),
    "e2e_per_token_ms": ("ms", True),
    "server_prompt_ms": ("ms", True),
    "server_decode_ms": ("ms", True),
    "ttft_minus_server_prompt_ms": ("ms", True),
    "outside_server_ms": ("ms", True),
    "tpot_p50_ms": ("ms", True),
    "tpot_p95_ms": ("ms", True),
    "tpot_p99_ms": ("ms", True),
    "chunk_gap_p99_ms": ("ms", True),
    "chunk_gap_max_ms": ("ms", True),
    "ttft_p50_ms": ("ms", True),
    "ttft_p95_ms": ("ms", True),
    "e2e_p95_ms": ("ms", True),
    # rates
    "output_tok_s": ("tok/s", False),
    "input_tok_s": ("tok/s", False),
    "input_computed_tok_s": ("tok/s", False),
    "input_cached_tok_s": ("tok/s", False),
    "server_prefill_tok_s": ("tok/s", False),
    "server_decode_tok_s": ("tok/s", False),
    "request_s": ("req/s", False),
    "goodput_req_s": ("req/s", False),
    "generation_tokens_per_s": ("", False),  # a Prometheus-style rate
    # dimensionless, better upwards
    "n_out": ("", False),
    "spec_acceptance": ("", False),
    "goodput_fraction": ("", False),
    "success_fraction": ("", False),
    # worse upwards, no unit of their own
    "n_errors": ("", True),
    "stall_ms_per_request": ("", True),
    "stall_with_prefill_ms_per_request": ("", True),
    "proc_cpu_s": ("s", True),
    "proc_major_faults": ("faults", True),
    "proc_read_mb": ("MB", True),
}


@pytest.mark.parametrize(("name", "want_unit", "worse_up"), [(k, *v) for k, v in NAMES.items()])
def test_metric_unit_and_direction(name, want_unit, worse_up):
    """The unit a table prints (request_values.unit: metric_unit, or the process delta's)."""
    assert unit(name) == want_unit
    assert higher_is_worse(name) is worse_up


def test_every_compared_metric_has_a_pinned_direction():
    """A new request metric or A/B row must be added to NAMES, direction decided."""
    compared = set(METRICS) | set(AB_HEADLINE) | set(AB_INTERFERENCE)
    compared |= {n for n in HEADLINE_SCALARS if n.endswith("_s") or n.endswith("fraction")}
    # window_s is the measured span, not compared
    compared -= {"window_s"}
    assert compared - set(NAMES) == set()


def test_the_per_request_gap_tuple_is_not_a_comparable_metric():
    """``chunk_gaps_ms`` holds every gap of a request: a gate or comparison asked for it
    gets the list of metrics, not a TypeError from float() on a tuple."""
    assert "chunk_gaps_ms" not in METRICS and "tpot_ms" in METRICS
    with pytest.raises(ValueError, match="unknown request metric 'chunk_gaps_ms'"):
        check_metric("chunk_gaps_ms")


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("chunk_gap", "ITL (chunk gap)"),
        ("output_tok_s", "output tok/s"),
        ("chunk_gap_p99_ms", "ITL (chunk gap) p99 (ms)"),
        ("ttft_p50_ms", "TTFT p50 (ms)"),
        ("tpot_max_ms", "TPOT max (ms)"),
        ("e2e_p95_ms", "e2e p95 (ms)"),  # no label of its own: the key's stem
        ("queue_mean_ms", "queue mean (ms)"),
        ("e2e_p97_ms", "e2e_p97_ms"),  # not a headline stat: the name as is
        ("server_decode_tok_s", "server_decode_tok_s"),
    ],
)
def test_metric_label(name, label):
    assert metric_label(name) == label


def test_every_headline_key_has_a_label_naming_its_stat():
    for dist in HEADLINE_DISTRIBUTIONS:
        for stat in HEADLINE_STATS:
            label = metric_label(f"{dist}_{stat}_ms")
            assert label.endswith(f" {stat} (ms)"), label

"""Delivery told apart from the server's pace (analysis/delivery.py) and what the ledger,
the interference analysis and the verdict make of it.

Records are built with a known production (the server's token clock: a token every
``pace`` ms, with its own stalls where asked) and a known delivery (a path constant, a
buffer flushed every ``flush`` ms, jitter): the split must give them back, and each
threshold flips just past it (``delivery_gap_min_ms``, ``delivery_burst_events``,
``delivery_running_frac``; ``delivery_frac`` in test_thresholds.py).
"""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest

from strata_plugin.analysis import interference
from strata_plugin.analysis.delivery import CLUMPING, TOKEN_CLOCK, request_delivery
from strata_plugin.analysis.ledger import (
    DECODE_PARTS,
    TTFT_PARTS,
    case_ledger,
    request_ledger,
    stall_spans,
)
from strata_plugin.analysis.rules import classify
from strata_plugin.analysis.run_states import STATES, RunStates
from strata_plugin.analysis.thresholds import value
from strata_plugin.formats.records import (
    ClockAnchor,
    EngineClocks,
    RequestRecord,
    TokenEvent,
)
from strata_plugin.load.client.loopstats import PROBE_S
from tests.test_attribution import CPU_CLEAN

MS = 1_000_000
T0 = 10_000 * MS
ANCHOR = ClockAnchor(mono_ns=0, wall_ns=0)
SEND, BEFORE, PREFILL = 0.5, 3.0, 20.0


def stream(*, n: int = 60, pace: float = 10.0, flush: float = 0.0, phase: float = 0.0,
           path: float = 2.0, jitter: dict[int, float] | None = None,
           server_pauses: dict[int, float] | None = None, clock: bool = True,
           dispatched_ms: float = 0.0, rid: str = "r0") -> RequestRecord:
    """A request whose server made its first token ``SEND + BEFORE + PREFILL`` ms after
    dispatch and one more every ``pace`` ms (plus ``server_pauses``); each reached the
    client ``path`` ms later, held to the next multiple of ``flush`` ms (a buffering
    proxy, its grid ``phase`` ms off dispatch), plus ``jitter`` ms (event -> ms)."""
    jitter, server_pauses = jitter or {}, server_pauses or {}
    made, t = [], 0.0
    for i in range(n):
        if i:
            t += pace + server_pauses.get(i, 0.0)
        made.append(t)
    start = dispatched_ms + SEND + BEFORE + PREFILL
    events = []
    for i, m in enumerate(made):
        a = start + m + path
        if flush:
            a = phase + math.ceil((a - phase) / flush) * flush
        events.append(TokenEvent(t_ns=T0 + round((a + jitter.get(i, 0.0)) * MS),
                                 n_tokens=1))
    engine = EngineClocks(source="llama.cpp timings", prefill_ms=PREFILL,
                          decode_ms=made[-1], token_ms=tuple(made) if clock else ())
    d0 = T0 + int(dispatched_ms * MS)
    return RequestRecord(
        request_id=rid, case_id="c", phase="measured", api="llamacpp",
        scheduled_ns=d0, dispatched_ns=d0, first_byte_ns=d0 + MS, events=tuple(events),
        done_ns=events[-1].t_ns + MS, engine=engine,
        extra={"sent_ns": d0 + int(SEND * MS)})


def states_running(frac: float, end_ms: float = 5_000.0, step_ms: float = 20.0) -> RunStates:
    """Run-state samples every ``step_ms``: the server running ``frac`` of each interval,
    asleep the rest."""
    t_ms = np.arange(0.0, end_ms + step_ms, step_ms)
    cum = np.zeros((len(t_ms), len(STATES)))
    cum[:, STATES.index("running")] = frac * t_ms / 1e3
    cum[:, STATES.index("sleeping")] = (1 - frac) * t_ms / 1e3
    return RunStates(t=(T0 + t_ms * MS).astype(np.int64), cum=cum, busy_ref_cores=1.0)


def _closes(led) -> None:
    assert abs(sum(v for _, v in led.parts) - led.wall_ms) <= led.clock_error_ms
    assert abs(sum(led.part(p) for p in DECODE_PARTS) - led.decode_ms) <= 1e-6
    assert abs(sum(led.part(p) for p in TTFT_PARTS) - led.ttft_ms) <= led.clock_error_ms
    assert all(v >= -1e-9 for k, v in led.parts if k != "residual_ttft"), led.parts


# --- the split itself ------------------------------------------------------------------------


def test_a_buffered_stream_is_delivery_at_the_servers_pace_not_a_stall() -> None:
    """A token every 10 ms, flushed every 100 ms: bursts of 10 events; per flush the
    client waits 100 ms of which the server's next token took 10: 90% of the decode is
    delivery, the rest the server's compute, no stall, nothing unexplained."""
    rec = stream(pace=10.0, flush=100.0)
    dv = request_delivery(rec)
    assert dv.evidence == TOKEN_CLOCK and dv.pace_ms == pytest.approx(10.0)
    assert set(dv.bursts[1:-1]) == {10} and set(dv.flush_ms) == {100.0}
    led = request_ledger(rec)
    _closes(led)
    assert led.part("delivery") / led.decode_ms == pytest.approx(0.9, abs=0.02)
    assert led.part("decode_compute") / led.decode_ms == pytest.approx(0.1, abs=0.02)
    assert led.n_stalls == 0 and led.part("residual_decode") == 0.0
    # the same stream without the server's token clock: the old reading, gaps as stalls
    blind = request_ledger(stream(pace=10.0, flush=100.0, clock=False))
    assert blind.part("delivery") == 0.0 and blind.n_stalls > 0
    assert blind.part("residual_decode") / blind.decode_ms > 0.8


def test_a_direct_stream_with_jitter_under_the_floor_has_no_delivery() -> None:
    rng = random.Random(3)
    floor = value("delivery_gap_min_ms")
    jit = {i: rng.uniform(0, 0.45 * floor) for i in range(60)}  # gaps within +-0.9 floor
    led = request_ledger(stream(jitter=jit))
    _closes(led)
    assert led.part("delivery") == 0.0 and led.part("ttft_delivery") == 0.0
    assert led.n_stalls == 0
    assert led.part("decode_compute") == pytest.approx(led.decode_ms)


@pytest.mark.parametrize(("factor", "counted"), [(0.98, False), (1.02, True)])
def test_a_gap_is_delivery_just_past_the_floor(factor, counted) -> None:
    """Token 30 arrives ``factor`` x the floor late (made on time): its gap's excess over
    the production is delivery just past ``delivery_gap_min_ms``, not under it; the next
    gap, shorter than its production by as much, gives nothing back (not negative)."""
    floor = value("delivery_gap_min_ms")
    dv = request_delivery(stream(jitter={i: factor * floor for i in range(30, 31)}),
                          clock_error_ms=0.0)
    assert (dv.gap_ms[29] > 0) is counted
    if counted:
        assert dv.gap_ms[29] == pytest.approx(factor * floor, abs=1e-3)
    assert dv.gap_ms[30] == 0.0 and sum(dv.gap_ms) == dv.gap_ms[29]


def test_the_clients_own_clock_error_raises_the_floor() -> None:
    floor = value("delivery_gap_min_ms")
    late = {30: 2 * floor}
    assert request_delivery(stream(jitter=late), clock_error_ms=0.0).gap_ms[29] > 0
    assert request_delivery(stream(jitter=late), clock_error_ms=3 * floor).gap_ms[29] == 0


def test_a_server_stall_on_its_own_clock_is_a_stall_not_delivery() -> None:
    """The server itself took 200 ms more for token 20 (its clock says so): the gap is
    the server's (a stall against its own pace), none of it delivery."""
    led = request_ledger(stream(server_pauses={20: 200.0}))
    _closes(led)
    assert led.part("delivery") == 0.0
    assert led.n_stalls == 1 and led.part("residual_decode") == pytest.approx(200.0, abs=0.01)


def test_a_held_first_token_is_delivery_in_ttft_not_the_servers_queue() -> None:
    """Two requests whose first token a 100 ms flush held 74.5 and 34.5 ms: beyond the
    path's constant (the least any of its tokens was held: under one token's time) that
    hold is ttft_delivery, not the way there (before_server) and not a front-end wait
    in server_queue, where it went without the server's token clock."""
    def case(clock: bool):
        recs = [stream(flush=100.0, phase=p, rid=f"r{k}", dispatched_ms=1000.0 * k,
                       clock=clock) for k, p in enumerate((0.0, 60.0))]
        return case_ledger("c", "decode_x", {"osl": 60}, recs)

    cl, pace = case(True), 10.0
    held = [r.part("ttft_delivery") for r in cl.requests]
    assert held[0] == pytest.approx(74.5 - 4.5, abs=0.01)  # token 7 waited 4.5 ms
    assert held[1] == pytest.approx(34.5 - 4.5, abs=0.01)
    for r in cl.requests:
        _closes(r)
        assert r.part("server_queue") < pace
        assert BEFORE + 2.0 <= r.part("before_server") < BEFORE + 2.0 + pace
    blind = case(False)
    assert max(r.part("server_queue") for r in blind.requests) == pytest.approx(40.0, abs=0.01)


# --- without a token clock: clumping, weaker ---------------------------------------------


def _clumped(burst: int, n: int = 60, pace: float = 10.0) -> RequestRecord:
    """No token clock; the events arrive ``burst`` at a time (one read), ``burst * pace``
    apart: what a buffer flushing every ``burst * pace`` ms does."""
    return stream(n=n, pace=pace, flush=burst * pace, clock=False)


def test_clumped_reads_while_the_server_runs_are_delivery_inferred() -> None:
    n_min = int(value("delivery_burst_events"))
    running = states_running(0.9)
    dv = request_delivery(_clumped(n_min), states=running, anchor=ANCHOR)
    assert dv.evidence == CLUMPING and dv.pace_ms == pytest.approx(10.0, abs=0.5)
    led = request_ledger(_clumped(n_min), states=running, anchor=ANCHOR)
    _closes(led)
    assert led.part("delivery") / led.decode_ms == pytest.approx((n_min - 1) / n_min,
                                                                 abs=0.05)
    assert led.n_stalls == 0
    # one event fewer in each read is not a clump
    assert request_delivery(_clumped(n_min - 1), states=running, anchor=ANCHOR).evidence == ""


@pytest.mark.parametrize(("frac", "inferred"), [(0.98, False), (1.0, True)])
def test_clumping_needs_the_server_running_through_the_gap(frac, inferred) -> None:
    share = value("delivery_running_frac") * frac
    dv = request_delivery(_clumped(5), states=states_running(share), anchor=ANCHOR)
    assert (dv.evidence == CLUMPING) is inferred


def states_held(frac: float, state: str = "throttled", end_ms: float = 5_000.0,
                step_ms: float = 20.0) -> RunStates:
    """Run-state samples: the server's threads held from a CPU (``state``) ``frac`` of
    each interval, running the rest."""
    t_ms = np.arange(0.0, end_ms + step_ms, step_ms)
    cum = np.zeros((len(t_ms), len(STATES)))
    cum[:, STATES.index(state)] = frac * t_ms / 1e3
    cum[:, STATES.index("running")] = (1 - frac) * t_ms / 1e3
    return RunStates(t=(T0 + t_ms * MS).astype(np.int64), cum=cum, busy_ref_cores=1.0)


@pytest.mark.parametrize("state", ["waiting", "throttled", "stalled"])
@pytest.mark.parametrize(("frac", "servers"), [(0.98, False), (1.02, True)])
def test_a_token_held_while_the_server_could_not_run_is_the_servers(state, frac,
                                                                     servers) -> None:
    """The token clock stamps a token in the engine's loop; its HTTP thread sends it.
    Under a CPU quota the whole tree is held after the stamp (the fault suite's
    cpu_limited arm: late gaps held 85-100% of their time read 15% of TPOT/ITL as
    delivery and named outside_server). At the threshold the gap is the server's stall;
    just under it, the path's delivery, as a buffering proxy's on a busy host is."""
    rec = stream(pace=10.0, flush=100.0)
    held = states_held(value("delivery_server_held_frac") * frac, state)
    dv = request_delivery(rec, states=held, anchor=ANCHOR)
    assert dv.evidence == TOKEN_CLOCK
    if servers:
        assert dv.total_ms == 0.0 and "the server's own sender" in dv.note
    else:
        assert dv.total_ms > 0.8 * (rec.events[-1].t_ns - rec.events[0].t_ns) / MS
        assert dv.note == ""


@pytest.mark.parametrize(("frac", "servers"), [(0.98, False), (1.02, True)])
def test_the_ledger_books_a_held_senders_gaps_as_the_servers_stalls(frac, servers) -> None:
    rec = stream(pace=10.0, flush=100.0)
    held = states_held(value("delivery_server_held_frac") * frac, "throttled")
    led = request_ledger(rec, states=held, anchor=ANCHOR)
    _closes(led)
    assert (led.part("delivery") == 0.0) is servers
    assert (led.part("stall_throttled") > 0.5 * led.decode_ms) is servers


def test_one_late_read_within_the_clients_own_lag_is_not_the_path() -> None:
    """A 100 ms hiccup of the client's loop (its probe saw 101.5 ms at worst) is one late
    read in each stream in flight: the fault suite's C=32 clean arm read it as 16% of
    TPOT/ITL delivered late and named outside_server. It is the client's. A flush
    pattern (two late reads or more) stays delivery whatever the client's lag, and a late
    read past the lag plus the probe's interval stays too."""
    probe = PROBE_S * 1e3
    one = stream(pace=5.0, n=60, server_pauses={}, jitter={k: 100.0 for k in range(30, 60)})
    dv = request_delivery(one)
    assert dv.total_ms == pytest.approx(100.0, abs=1.0)  # without the client's lag: the path
    for lag, path in ((100.0 - probe + 0.5, False), (100.0 - probe - 0.5, True)):
        dv = request_delivery(one, client_lag_max_ms=lag)
        assert (dv.total_ms > 0) is path, lag
        assert ("the client's hiccup" in dv.note) is not path
    # two late reads: a pattern, the path's even with a large lag
    two = stream(pace=5.0, n=60, jitter={**{k: 40.0 for k in range(20, 40)},
                                         **{k: 80.0 for k in range(40, 60)}})
    assert request_delivery(two, client_lag_max_ms=500.0).total_ms == pytest.approx(
        80.0, abs=1.0)
    # a client that fell behind: every late read is its own, the single one too
    led = request_ledger(one, client_late=True, client_lag_max_ms=200.0)
    assert led.part("delivery") == pytest.approx(100.0, abs=1.0)
    led = request_ledger(one, client_lag_max_ms=200.0)
    assert led.part("delivery") == 0.0


def test_clumping_without_run_state_is_not_inferred_and_says_so() -> None:
    led = request_ledger(_clumped(5))
    assert led.part("delivery") == 0.0
    assert any("not assessed as delivery: no run-state samples" in m for m in led.merged)


# --- the case: interference and the verdict ----------------------------------------------


def _buffered_case(clock: bool = True, flush: float = 100.0):
    """Two streams at a time (C=2), each dispatched while the other decodes (a prefill in
    flight during the other's gaps), through a buffer flushed every ``flush`` ms."""
    return [stream(n=40, flush=flush, clock=clock, rid=f"r{k}", dispatched_ms=150.0 * k,
                   phase=0.0) for k in range(6)]


def test_delivered_gaps_are_not_interference_stalls() -> None:
    recs = _buffered_case()
    cl = case_ledger("c", "decode_x", {"osl": 40, "concurrency": 2}, recs)
    blind = interference.analyze("c", recs)
    seen = interference.analyze("c", recs, delivered=cl.delivered_gaps())
    assert blind.prefill_stall_frac > value("prefill_stall_frac")  # the old misreading
    assert seen.stall_ms_per_request == pytest.approx(0.0, abs=1e-6)
    assert seen.median_ms_per_token == pytest.approx(10.0, abs=0.5)


def test_the_verdict_names_delivery_outside_the_server_with_its_evidence() -> None:
    recs = _buffered_case()
    cl = case_ledger("c", "decode_x", {"osl": 40, "concurrency": 2}, recs)
    sig = cl.signals()
    assert sig["delivery_frac"] == pytest.approx(0.9, abs=0.03)
    assert "delivery_clumped_frac" not in sig
    v = classify(dataclasses.replace(CPU_CLEAN, **sig))
    assert v.classes[0] == "outside_server", v
    ev = [e for e in v.evidence if e.cls == "outside_server" and e.metric == "delivery_frac"]
    assert ev and ev[0].met
    assert "the server's own token clock" in cl.delivery.line()
    assert "bursts of 10 token events every 100 ms" in cl.delivery.line()
    # clumping alone: the same share, half the margin, and the line says it is weaker
    blind = case_ledger("c", "decode_x", {"osl": 40, "concurrency": 2},
                        _buffered_case(clock=False), states=states_running(0.9),
                        anchor=ANCHOR)
    bsig = blind.signals()
    assert "delivery_frac" not in bsig and bsig["delivery_clumped_frac"] > 0.7
    vb = classify(dataclasses.replace(CPU_CLEAN, **bsig))
    assert "outside_server" in vb.classes
    assert "weaker evidence" in blind.delivery.line()


def test_a_clean_case_with_the_token_clock_names_no_delivery() -> None:
    rng = random.Random(5)
    floor = value("delivery_gap_min_ms")
    recs = [stream(n=40, rid=f"r{k}", dispatched_ms=150.0 * k,
                   jitter={i: rng.uniform(0, 0.45 * floor) for i in range(40)})
            for k in range(6)]
    cl = case_ledger("c", "decode_x", {"osl": 40, "concurrency": 2}, recs)
    sig = cl.signals()
    assert sig["delivery_frac"] == 0.0
    assert "outside_server" not in classify(dataclasses.replace(CPU_CLEAN, **sig)).past_threshold


def test_a_late_clients_lag_is_its_time_not_an_error_bar() -> None:
    """A client held to a sliver of a core (the fault suite's client_bound arm) reads a
    stream made every 5 ms once per 100 ms CFS period, and its loop lag p99 (1.4 s there)
    is the stamps' error bound. As a floor it hid every late token, so the client's gaps
    read as stalls; where the client's own check says it fell behind, the lag is the
    client's time: delivery, and the verdict names the client with it."""
    recs = [stream(n=48, pace=5.0, flush=100.0, rid=f"r{k}", dispatched_ms=400.0 * k)
            for k in range(6)]
    kw = {"name": "decode_x", "params": {"osl": 48, "concurrency": 1},
          "records": recs, "clock_error_ms": 1400.0}
    hidden = case_ledger("c", **kw).signals()
    assert hidden["delivery_frac"] == 0.0  # the floor ate it
    seen = case_ledger("c", client_late=True, **kw)
    sig = seen.signals()
    assert sig["delivery_frac"] == pytest.approx(0.95, abs=0.03)
    assert seen.clock_error_ms() == 1400.0  # still stated as the stamps' error
    assert any("the client's own lateness" in m for m in seen.merged)
    v = classify(dataclasses.replace(CPU_CLEAN, client_bound=True, **sig))
    assert v.classes[0] == "client_bound", v
    assert v.lead.startswith("delivery to a client that fell behind"), v.lead
    # the same case, the client not flagged: the delivery is the path's
    v = classify(dataclasses.replace(CPU_CLEAN, **sig))
    assert v.classes[0] == "outside_server", v


def test_the_timeline_draws_the_stalls_its_ledger_counted() -> None:
    """The picture's stalls come from the ledger's own delivery split: the record alone
    does not carry the client's clock error or its self-check, and with the default floor
    the late client's case above drew no stall where its unflagged ledger counted one
    per read."""
    recs = [stream(n=48, pace=5.0, flush=100.0, rid=f"r{k}", dispatched_ms=400.0 * k)
            for k in range(6)]
    kw = {"name": "decode_x", "params": {"osl": 48, "concurrency": 1},
          "records": recs, "clock_error_ms": 1400.0}
    counted = {}
    for late in (False, True):
        led = case_ledger("c", client_late=late, **kw)
        by_id = {r.request_id: r for r in led.requests}
        drawn = [len(stall_spans(rec, None, None, by_id[rec.request_id].delivery))
                 for rec in recs]
        assert drawn == [by_id[rec.request_id].n_stalls for rec in recs], late
        counted[late] = sum(drawn)
    assert counted[False] >= 6 * 2  # a stall per 100 ms read (240 ms each), unflagged
    assert counted[True] == 0  # the late client's reads are delivery
    # without the ledger's split, the default floor draws the flagged ledger's picture
    assert sum(len(stall_spans(rec, None, None)) for rec in recs) == 0


def test_a_decode_case_answered_in_one_read_is_about_its_end_to_end_time() -> None:
    """A proxy that buffers whole responses (the set-aside ``attached_buffered`` arm's
    300 ms flush, 47 tokens made in about 150 ms): every answer reaches the client in one
    read, so TPOT/ITL holds no time and the verdict had nothing to rank ('inconclusive').
    The ledger is then about end-to-end time, where the wait for that read is delivery.
    One request with two reads keeps the case on TPOT/ITL."""
    whole = [stream(n=47, pace=3.0, flush=300.0, rid=f"r{k}", dispatched_ms=310.0 * k,
                    phase=310.0 * k) for k in range(6)]
    assert all(len({e.t_ns for e in r.events}) == 1 for r in whole)
    cl = case_ledger("c", "decode_x", {"osl": 47, "concurrency": 1}, whole)
    assert cl.metric == "e2e" and "one read" in cl.metric_why
    sig = cl.signals()
    assert sig["delivery_frac"] > 0.4  # the wait after the last token was made
    v = classify(dataclasses.replace(CPU_CLEAN, **sig))
    assert v.classes[0] == "outside_server", v
    split = [stream(n=47, pace=3.0, flush=100.0, rid="r9", dispatched_ms=3_000.0,
                    phase=3_000.0)]
    assert len({e.t_ns for e in split[0].events}) > 1
    assert case_ledger("c", "decode_x", {"osl": 47, "concurrency": 1},
                       whole + split).metric == "itl"

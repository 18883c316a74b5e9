"""The time ledger's identities and its reading of the server's run state.

Each request's parts must sum to its wall time (dispatch to last byte) within the clock
error the ledger states; a case's shares of TTFT, of the decode time and of end-to-end
time must each sum to 100%; a request built with a known split (send, time before the
server, prefill, pace, pauses) must give that split back; a gap is a stall just past
``ledger_stall_factor`` times its pace and not just under it; and the run-state reader
must tell a frozen server from a running, a waiting, a blocked and a sleeping one.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from strata_plugin.analysis.ledger import (
    DECODE_PARTS,
    PARTS,
    TTFT_PARTS,
    ServerClocks,
    case_ledger,
    case_metric,
    request_ledger,
    server_clocks,
)
from strata_plugin.analysis.run_states import RunStates, classify_intervals
from strata_plugin.analysis.thresholds import value
from strata_plugin.formats.cases import CaseLine
from strata_plugin.formats.records import ClockAnchor, RequestRecord, Timings, TokenEvent

MS = 1_000_000
T0 = 10_000 * MS
#: monotonic == wall here: the run-state samples and the records share one clock
ANCHOR = ClockAnchor(mono_ns=0, wall_ns=0)


def record(*, send_ms=0.5, before_ms=3.0, prefill_ms=20.0, pace_ms=10.0, n=30,
           pauses: dict[int, float] | None = None, tail_ms=1.0, rid="r0",
           timings: bool = True, burst: int = 1) -> RequestRecord:
    """A request with a known split: the first token ``send + before + prefill`` after
    dispatch, then ``n`` events ``pace * burst`` apart plus ``pauses`` (event index ->
    extra ms), then the tail."""
    pauses = pauses or {}
    t = T0 + int((send_ms + before_ms + prefill_ms) * MS)
    events = []
    for i in range(n):
        if i:
            t += int((pace_ms * burst + pauses.get(i, 0.0)) * MS)
        events.append(TokenEvent(t_ns=t, n_tokens=burst if i else 1))
    return RequestRecord(
        request_id=rid, case_id="c", phase="measured", api="openai", scheduled_ns=T0,
        dispatched_ns=T0, first_byte_ns=T0 + MS, events=tuple(events),
        done_ns=t + int(tail_ms * MS),
        timings=Timings(prompt_n=100, prompt_ms=prefill_ms, predicted_n=n,
                        predicted_ms=(t - events[0].t_ns) / MS) if timings else None,
        extra={"sent_ns": T0 + int(send_ms * MS)},
    )


def states_frozen(spans_ms: list[tuple[float, float]], start_ms=0.0, end_ms=2_000.0,
                  step_ms=20.0, threads=4.0) -> RunStates:
    """Run-state samples every ``step_ms``: the server runs its 4 threads, except inside
    ``spans_ms`` (ms after T0) where its cgroup is frozen and nothing advances."""
    t = np.arange(start_ms, end_ms + step_ms, step_ms)
    frozen = np.array([any(a <= x <= b for a, b in spans_ms) for x in t], float)
    run = np.zeros(len(t))
    for i in range(1, len(t)):
        run[i] = run[i - 1] + (0.0 if frozen[i] and frozen[i - 1] else threads * step_ms / 1e3)
    z = np.zeros(len(t))
    tn = (T0 + t * MS).astype(np.int64)
    return classify_intervals(tn, run, z, z, z, frozen, np.full(len(t), threads),
                              np.zeros(len(t)), int(tn[0]), int(tn[-1]))


def test_a_known_split_comes_back_part_by_part() -> None:
    led = request_ledger(record(pauses={10: 80.0, 20: 40.0}),
                         clocks=ServerClocks(queue_ms=2.0, queue_source="test"))
    p = dict(led.parts)
    assert p["client_send"] == pytest.approx(0.5)
    assert p["server_queue"] == pytest.approx(2.0)
    assert p["before_server"] == pytest.approx(1.0)
    assert p["prefill"] == pytest.approx(20.0)
    assert led.pace_ms == pytest.approx(10.0)
    assert p["decode_compute"] == pytest.approx(29 * 10.0)
    assert led.n_stalls == 2
    # no run state: the pauses are what no clock explains
    assert p["residual_decode"] == pytest.approx(120.0)
    assert p["tail"] == pytest.approx(1.0)
    assert any("no run-state samples" in m for m in led.merged)


def test_the_parts_sum_to_the_wall_time_within_the_stated_clock_error() -> None:
    rng = random.Random(7)
    for k in range(200):
        pauses = {rng.randrange(1, 40): rng.uniform(0, 300) for _ in range(rng.randrange(4))}
        rec = record(send_ms=rng.uniform(0, 2), before_ms=rng.uniform(0, 60),
                     prefill_ms=rng.uniform(0, 80), pace_ms=rng.uniform(2, 40),
                     n=rng.randrange(1, 40), pauses=pauses, tail_ms=rng.uniform(0, 5),
                     rid=f"r{k}")
        # a server clock that claims more than the client saw, now and then
        if k % 5 == 0 and rec.timings is not None:
            rec = RequestRecord(**{**rec.__dict__, "timings": Timings(
                prompt_ms=rec.timings.prompt_ms + 50.0, predicted_n=rec.timings.predicted_n,
                predicted_ms=rec.timings.predicted_ms)})
        led = request_ledger(rec, clocks=ServerClocks(queue_ms=rng.uniform(0, 30)),
                             states=states_frozen([(300, 400)], end_ms=4_000), anchor=ANCHOR,
                             clock_error_ms=0.3)
        assert led.clock_error_ms == value("ledger_clock_error_ms")  # the floor
        assert abs(sum(v for _, v in led.parts) - led.wall_ms) <= led.clock_error_ms
        assert abs(sum(led.part(p) for p in TTFT_PARTS) - led.ttft_ms) <= led.clock_error_ms
        assert abs(sum(led.part(p) for p in DECODE_PARTS) - led.decode_ms) <= 1e-6
        for name, v in led.parts:  # only the TTFT residual may be negative (an over-claim)
            assert v >= -1e-9 or name == "residual_ttft", (name, v)


def test_an_over_claiming_server_clock_is_a_negative_residual_not_a_negative_part() -> None:
    rec = record(before_ms=0.0, prefill_ms=20.0)
    rec = RequestRecord(**{**rec.__dict__, "timings": Timings(prompt_ms=35.0)})
    led = request_ledger(rec)
    assert led.part("before_server") == 0.0
    assert led.part("residual_ttft") == pytest.approx(-15.0)
    assert led.part("prefill") == pytest.approx(35.0)


@pytest.mark.parametrize(("pause_factor", "stall"), [(0.98, False), (1.02, True)])
def test_a_gap_is_a_stall_just_past_the_factor_times_its_pace(pause_factor, stall) -> None:
    factor = value("ledger_stall_factor")
    pace = 10.0
    extra = (factor * pause_factor - 1.0) * pace  # the gap = pace + extra
    led = request_ledger(record(pace_ms=pace, pauses={15: extra}))
    assert (led.n_stalls == 1) is stall
    assert (led.part("residual_decode") > 0) is stall


def test_stalls_during_a_freeze_are_the_server_stalled_and_nothing_is_left_unexplained():
    # token events 10 ms apart; frozen 500-700 ms after dispatch: the gap across it
    rec = record(before_ms=3.0, prefill_ms=20.0, pace_ms=10.0, n=60, pauses={30: 200.0})
    first = rec.events[0].t_ns
    gap_start = (rec.events[29].t_ns - T0) / MS
    states = states_frozen([(gap_start + 5, gap_start + 205)])
    led = request_ledger(rec, states=states, anchor=ANCHOR)
    assert led.n_stalls == 1
    assert led.part("stall_stalled") == pytest.approx(190.0, abs=25.0)
    assert led.part("residual_decode") == 0.0
    assert led.part("ttft_stalled") == 0.0
    assert first > T0


def test_a_freeze_before_the_first_token_is_taken_out_of_prefill_and_before_server():
    rec = record(before_ms=100.0, prefill_ms=100.0, n=5)  # first token at 200.5 ms
    led = request_ledger(rec, states=states_frozen([(40, 79), (140, 179)]), anchor=ANCHOR)
    # a 20 ms sampler reads each 40 ms freeze to within one sampling interval
    assert led.part("ttft_stalled") == pytest.approx(80.0, abs=20.0)
    assert led.part("prefill") == pytest.approx(60.0, abs=20.0)  # [100.5, 200.5]: 140-180
    assert led.part("before_server") == pytest.approx(60.0, abs=20.0)  # 40-80
    assert sum(v for _, v in led.parts) == pytest.approx(led.wall_ms)


def test_the_case_shares_sum_to_one_in_every_metric() -> None:
    recs = [record(rid=f"r{i}", before_ms=5.0 * i, pauses={5: 50.0 * (i % 3)}) for i in range(9)]
    cl = case_ledger("c", "decode_x", {"osl": 30}, recs,
                     clocks=ServerClocks(queue_ms=1.0, queue_source="t"))
    assert cl.metric == "itl"
    for seg in ("ttft", "itl", "e2e"):
        assert sum(s for _, s in cl.shares(seg)) == pytest.approx(1.0, abs=1e-9)
    assert sum(s for _, s in cl.weights()) == pytest.approx(1.0, abs=1e-3)
    assert {p for p, _ in cl.shares("e2e")} == set(PARTS)


def test_latency_before_the_server_is_its_share_of_ttft() -> None:
    # 100 ms of round trip before a 40 ms TTFT's server part: 70% of TTFT outside
    recs = [record(rid=f"r{i}", send_ms=0.3, before_ms=100.0, prefill_ms=40.0)
            for i in range(4)]
    cl = case_ledger("c", "decode_1k_1k_c32", {"osl": 30}, recs,
                     clocks=ServerClocks(queue_ms=0.0, queue_source="t"))
    sig = cl.signals()
    assert sig["outside_server_frac"] == pytest.approx(100.0 / 140.3, abs=1e-3)
    assert sig["queue_split"] is True
    assert sig["ledger_residual_frac"] == 0.0


def test_without_a_queue_clock_the_queue_share_is_ttft_outside_prefill_merged() -> None:
    cl = case_ledger("c", "e2e_case", {"osl": 30}, [record(before_ms=30.0, prefill_ms=10.0)])
    sig = cl.signals()
    assert sig["queue_split"] is False
    assert sig["server_queue_frac"] == sig["outside_server_frac"]
    assert any("server_queue in before_server" in m for m in cl.merged)


def test_without_any_prefill_clock_outside_server_is_not_claimed() -> None:
    cl = case_ledger("c", "e2e_case", {"osl": 30}, [record(timings=False)])
    assert "outside_server_frac" not in cl.signals()
    assert any("prefill in before_server" in m for m in cl.merged)


def test_littles_law_turns_the_waiting_count_into_a_queue_time() -> None:
    clocks = server_clocks([], waiting_mean=0.5, n_requests=40, window_s=4.0)
    assert clocks.queue_ms == pytest.approx(50.0)  # 0.5 waiting / 10 arrivals per s
    assert "Little" in clocks.queue_source
    assert server_clocks([], waiting_mean=None, n_requests=40, window_s=4.0).queue_ms is None


@pytest.mark.parametrize(("name", "osl", "metric"), [
    ("prefill_32k_1_c16", 1, "ttft"), ("long_context_128k_1k_c1", 1024, "ttft"),
    ("decode_1k_1k_c32", 1024, "itl"), ("chat_mix", 256, "e2e"), ("anything", 1, "ttft"),
])
def test_the_metric_a_case_is_about(name, osl, metric) -> None:
    assert case_metric(name, {"osl": osl})[0] == metric


def _states(**kw) -> RunStates:
    n = 11
    t = (T0 + np.arange(n) * 20 * MS).astype(np.int64)
    base = dict(run=np.arange(n) * 0.08, wait=np.zeros(n), d=np.zeros(n), stopped=np.zeros(n),
                frozen=np.zeros(n), threads=np.full(n, 4.0), s=np.zeros(n))
    base.update(kw)
    return classify_intervals(t, base["run"], base["wait"], base["d"], base["stopped"],
                              base["frozen"], base["threads"], base["s"], int(t[0]), int(t[-1]))


def _split(rs: RunStates, a: int = 5, b: int = 7) -> dict[str, float]:
    secs, covered = rs.over(T0 + a * 20 * MS, T0 + b * 20 * MS)
    return {k: v / covered for k, v in secs.items()}


def _stuck_run(n: int = 11) -> np.ndarray:
    run = np.arange(n) * 0.08
    run[6:] = run[5]  # nothing advances from sample 5
    return run


def test_run_state_reads_a_running_server_as_running() -> None:
    assert _split(_states())["running"] == pytest.approx(1.0)


def test_run_state_reads_the_freezer() -> None:
    frozen = np.zeros(11)
    frozen[5:8] = 1
    sp = _split(_states(run=_stuck_run(), frozen=frozen))
    assert sp["stalled"] == pytest.approx(1.0)


def test_run_state_reads_no_progress_while_awake_as_stalled_but_asleep_as_sleeping() -> None:
    awake = _split(_states(run=_stuck_run()))
    assert awake["stalled"] == pytest.approx(1.0)
    asleep = _split(_states(run=_stuck_run(), s=np.full(11, 4.0)))
    assert asleep["sleeping"] == pytest.approx(1.0) and asleep["stalled"] == 0.0


def test_run_state_reads_runnable_waiting_and_blocked_io() -> None:
    run = np.arange(11) * 0.08
    run[6:] = run[5] + (np.arange(5) + 1) * 0.02  # a quarter of the pace from sample 5
    wait = np.zeros(11)
    wait[6:] = (np.arange(5) + 1) * 0.06  # the rest runnable, waiting for a CPU
    sp = _split(_states(run=run, wait=wait))
    assert sp["running"] == pytest.approx(0.25) and sp["waiting"] == pytest.approx(0.75)
    d = np.zeros(11)
    d[5:8] = 3.0  # three of the four threads in D
    sp = _split(_states(run=run, d=d, s=np.full(11, 1.0)))
    assert sp["io"] == pytest.approx(0.75)


def test_run_state_reads_every_thread_stopped_as_stalled() -> None:
    stopped = np.zeros(11)
    stopped[5:8] = 4.0
    sp = _split(_states(run=_stuck_run(), stopped=stopped, s=np.full(11, 0.0)))
    assert sp["stalled"] == pytest.approx(1.0)
    assert ("all threads stopped (T)", pytest.approx(0.2)) in [
        (k, v) for k, v in _states(run=_stuck_run(), stopped=stopped).seen]


def test_the_way_there_is_the_floor_and_what_varies_with_load_is_the_servers() -> None:
    """A path delays every request alike; a server's front end under load does not. The
    case's least time before prefill stays before_server, the rest is server_queue."""
    recs = [record(rid=f"r{i}", before_ms=100.0 + extra) for i, extra in
            enumerate((0.0, 30.0, 60.0, 5.0))]
    cl = case_ledger("c", "decode_x", {"osl": 30, "concurrency": 4}, recs)
    assert cl.clocks.path_floor_ms == pytest.approx(100.0)
    assert [round(r.part("before_server"), 6) for r in cl.requests] == [100.0] * 4
    assert [round(r.part("server_queue"), 6) for r in cl.requests] == [0.0, 30.0, 60.0, 5.0]
    assert cl.queue_split()
    # the rules read the median request's share of its TTFT
    shares = sorted(100.0 / r.ttft_ms for r in cl.requests)
    assert cl.signals()["outside_server_frac"] == pytest.approx(
        (shares[1] + shares[2]) / 2, abs=1e-4)


def test_the_engines_own_histograms_are_its_queue_and_prefill_clocks() -> None:
    from types import SimpleNamespace as Row

    rows = [Row(source="prom", metric="queue_time_seconds_sum", delta=2.0),
            Row(source="prom", metric="queue_time_seconds_count", delta=10.0),
            Row(source="prom", metric="prefill_time_seconds_sum", delta=0.5),
            Row(source="prom", metric="prefill_time_seconds_count", delta=10.0)]
    clocks = server_clocks(rows, waiting_mean=3.0, n_requests=10, window_s=1.0)
    assert clocks.queue_ms == pytest.approx(200.0) and "histogram" in clocks.queue_source
    assert clocks.prefill_ms == pytest.approx(50.0)
    # records without a prefill of their own take the case's mean, and say so
    led = request_ledger(record(timings=False, before_ms=300.0, prefill_ms=0.0), clocks=clocks)
    assert led.part("prefill") == pytest.approx(50.0)
    assert led.part("server_queue") == pytest.approx(200.0)
    assert any("prefill: the case's mean" in m for m in led.merged)


def test_shares_over_repetitions_get_a_t_interval() -> None:
    from types import SimpleNamespace as Case

    from strata_plugin.report.ledger_md import repetition_rows

    def arm(arm: str, rep: int, before: float) -> Case:
        led = case_ledger(f"{arm}{rep}", "e2e_x", {"osl": 30},
                          [record(rid=f"{arm}{rep}", before_ms=before)])
        return Case(info=CaseLine(f"{arm}{rep}", ab_group="g", ab_arm=arm), ledger=led,
                    case_id=f"{arm}{rep}")

    cases = [arm("a", i, b) for i, b in enumerate((10.0, 12.0, 14.0))] + [arm("b", 0, 50.0)]
    rows = repetition_rows(cases)
    assert {r[1] for r in rows} == {"a"}  # one repetition of b: no interval
    before = next(r for r in rows if r[3] == "before_server")
    assert before[4] == "3" and " .. " in before[6]


def test_a_wait_booked_when_it_ends_is_moved_back_to_where_it_was() -> None:
    """The kernel books run_delay when a thread reaches a CPU and a quota's throttled time
    when the quota refills: a 0.1-core quota on a 100 ms period reads, on the 20 ms grid,
    as a 90 ms hold booked in one jump. The jump is placed back over the intervals before
    it (at most LAZY_SPAN_S), so the hold reads as 90% of the time, not one interval's
    worth; an increment that fits its interval stays there, one just over it spills."""
    from strata_plugin.analysis.run_states import LAZY_SPAN_S, spread_back

    t = (T0 + np.arange(11) * 20 * MS).astype(np.int64)
    room = np.full(10, 0.02)  # one core's worth of each 20 ms interval
    inc = np.zeros(10)
    inc[9] = 0.02  # exactly the room: stays
    assert spread_back(t, inc, room).tolist() == inc.tolist()
    inc[9] = 0.02 + 1e-6  # just over: the excess goes one interval back
    out = spread_back(t, inc, room)
    assert out[9] == pytest.approx(0.02) and out[8] == pytest.approx(1e-6)
    inc[9] = 0.2  # ten intervals' worth: spread back LAZY_SPAN_S (5 intervals), the rest dropped
    out = spread_back(t, inc, room)
    n_back = round(LAZY_SPAN_S / 0.02)
    assert out[10 - n_back:].tolist() == pytest.approx([0.02] * n_back)
    assert out[:10 - n_back].sum() == 0.0
    # the quota's pattern: 10 ms run, then a 90 ms hold booked at the refill, five times
    run = np.zeros(26)
    thr = np.zeros(26)
    for k in range(5):
        run[5 * k + 1:] += 0.01  # ran in the first interval of each period
        thr[5 * k + 5:] += 0.09  # the hold booked at the refill, one interval's jump
    tq = (T0 + np.arange(26) * 20 * MS).astype(np.int64)
    z = np.zeros(26)
    rs = classify_intervals(tq, run, z, z, z, z, np.full(26, 1.0), z, int(tq[0]), int(tq[-1]),
                            throttled_s=thr)
    secs, covered = rs.over(int(tq[0]), int(tq[-1]))
    # read interval by interval it was a fifth throttled and three fifths "stalled"; held
    # back first (the module's order), every period is the quota's
    assert secs["throttled"] / covered >= 0.9 and secs["stalled"] == 0.0


@pytest.mark.parametrize(("cause", "weight"), [
    ("decode:running", "compute"), ("prefill:running", "compute"),
    ("queue:running", "queueing"), ("decode:throttled", "cpu_throttled"),
    ("queue:waiting", "cpu_wait"), ("stall:sleeping", "server_sleeping"),
    ("stall:stopped", "server_stalled"), ("prefill:io", "io_page_faults"),
    ("outside:client_send", "client_bound"), ("outside:delivery", "outside_server"),
    ("outside:tail", "tail"), ("unexplained:residual_decode", "unexplained"),
])
def test_the_verdicts_weights_are_by_cause_not_by_clock(cause, weight) -> None:
    """A decode held by its quota weighs ``cpu_throttled``, as the verdict's lead says,
    where by clock it was all "decode at its pace" (``compute``)."""
    from strata_plugin.analysis.ledger import weight_of

    assert weight_of(cause) == weight


def spec_record(*, steps: int = 40, accepted: int = 3, step_ms: float = 12.0,
                inside_ms: float = 0.2, slow: dict[int, float] | None = None,
                clock: bool = True, drafts: bool = True) -> RequestRecord:
    """Speculative decoding as llama.cpp streams it: each verify step hands over
    ``accepted`` tokens as separate events ``inside_ms`` apart, one step every
    ``step_ms`` (plus ``slow``: step index -> extra ms); the server's token clock gives
    a step's events one production time."""
    from strata_plugin.formats.records import EngineClocks

    slow = slow or {}
    t, made_t, events, made = float(T0 + 24 * MS), 0.0, [], []
    for s in range(steps):
        if s:
            extra = slow.get(s, 0.0)
            t += (step_ms + extra - (accepted - 1) * inside_ms) * MS
            made_t += step_ms + extra
        for j in range(accepted if s else 1):
            if j:
                t += inside_ms * MS
            events.append(TokenEvent(t_ns=int(t), n_tokens=1))
            made.append(made_t)
    n = len(events)
    rec = record(n=2)
    return RequestRecord(
        request_id="s0", case_id="c", phase="measured", api="llamacpp",
        scheduled_ns=T0, dispatched_ns=T0, first_byte_ns=T0 + MS, events=tuple(events),
        done_ns=events[-1].t_ns + MS,
        timings=Timings(prompt_n=100, prompt_ms=20.0, predicted_n=n, predicted_ms=made_t,
                        draft_n=(steps - 1) * accepted if drafts else None,
                        draft_n_accepted=(steps - 1) * (accepted - 1) if drafts else None),
        engine=EngineClocks(source="llama.cpp timings", prefill_ms=20.0, decode_ms=made_t,
                            token_ms=tuple(made) if clock else ()),
        extra=rec.extra,
    )


@pytest.mark.parametrize("clock", [True, False])
def test_speculative_steps_are_decode_not_stalls(clock) -> None:
    """A verify step's tokens come together: the gap before a step is the step's compute
    for all of its tokens, the gaps inside it none of anyone's stall. Read per event, as
    before, the smoke matrix's speculative sweeps put 85-88% of TPOT/ITL in stalls."""
    led = request_ledger(spec_record(clock=clock))
    assert led.n_stalls == 0
    assert led.part("decode_compute") == pytest.approx(led.decode_ms, rel=1e-6)
    # a step that took 5x its time is still a stall, of its excess over one step
    led = request_ledger(spec_record(clock=clock, slow={20: 48.0}))
    assert led.n_stalls == 1
    assert led.part("residual_decode") == pytest.approx(48.0, abs=0.5)


def test_the_step_grouping_is_for_drafts_only() -> None:
    # the same stream from a server that says it drafted nothing: read per event
    led = request_ledger(spec_record(clock=False, drafts=False))
    assert led.n_stalls > 30 and led.part("residual_decode") > 0.8 * led.decode_ms


@pytest.mark.parametrize(("share", "grouped"), [(0.195, True), (0.205, False)])
def test_without_the_clock_a_steps_inside_is_a_gap_under_the_share_of_the_mean(
        share, grouped) -> None:
    from strata_plugin.analysis.ledger import STEP_GAP_SHARE

    assert STEP_GAP_SHARE == 0.2
    # 3 tokens per 12 ms step: a mean gap of 4 ms; the inside gaps at share x 4 ms
    led = request_ledger(spec_record(clock=False, inside_ms=share * 4.0))
    assert (led.n_stalls == 0) is grouped

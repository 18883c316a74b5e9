"""A stall is a stall wherever it falls (issue 42, item 2).

The server's threads stopped, traced or frozen are ``server_stalled`` in the queue, in
prefill, in decode and in the tail; waiting for a CPU is waiting before prefill and in
the tail as in decode. A server that did nothing for ``server_stalled_window_lead`` of
the window while requests were in flight is first whatever the case's headline (TTFT,
TPOT/ITL, end-to-end time), and whatever share of the metric the stalls show in: the
project's own ``ledger/freezer_third`` arm, whose freezes fell in TTFT, read
``cpu_compute`` "decode compute, 83% of TPOT/ITL" with the server frozen in a quarter
of its window.

The requests here come from a small model of a server (:func:`served`): one request's
prefill and tokens take run time, and a stop holds them all, so their wall times carry
the stops where they fell; the server's clock (``prompt_ms``) is wall time, as
llama.cpp's is.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from strata_plugin.analysis.ledger import case_ledger, request_ledger
from strata_plugin.analysis.rules import classify
from strata_plugin.analysis.run_states import RunStates, classify_intervals
from strata_plugin.analysis.thresholds import value
from strata_plugin.formats.records import RequestRecord, Timings, TokenEvent
from tests.test_attribution import CPU_CLEAN
from tests.test_ledger import ANCHOR, MS, T0, record, states_frozen

STEP_MS = 20.0


def stops(period_ms: float, stop_ms: float, end_ms: float, phase_ms: float = 0.0
          ) -> list[tuple[float, float]]:
    """[start, end) ms after T0 of a stop of ``stop_ms`` every ``period_ms``."""
    out, t = [], phase_ms
    while t < end_ms:
        out.append((t, t + stop_ms))
        t += period_ms
    return out


def _advance(t: float, need: float, spans: list[tuple[float, float]]) -> float:
    """The wall time (ms) at which ``need`` ms of run time from ``t`` is done, the server
    running except in ``spans``, which hold it."""
    for a, b in spans:
        if b <= t:
            continue
        if a > t:
            if t + need <= a:
                return t + need
            need -= a - t
        t = max(t, b)
    return t + need


def served(dispatch_ms: list[float], spans: list[tuple[float, float]], *,
           prefill_ms: float = 60.0, pace_ms: float = 10.0, n: int = 16,
           tail_ms: float = 1.0) -> list[RequestRecord]:
    """Requests served one at a time in dispatch order (C=1 each, no queue between
    them): ``prefill_ms`` of run time, then ``n`` tokens of ``pace_ms`` run time each,
    the stops holding each where it falls."""
    out = []
    free = 0.0
    for k, d in enumerate(dispatch_ms):
        start = max(d, free)
        first = _advance(start, prefill_ms, spans)
        t, events = first, [TokenEvent(t_ns=T0 + int(first * MS), n_tokens=1)]
        for _ in range(n - 1):
            t = _advance(t, pace_ms, spans)
            events.append(TokenEvent(t_ns=T0 + int(t * MS), n_tokens=1))
        done = _advance(t, tail_ms, spans)
        free = done
        out.append(RequestRecord(
            request_id=f"r{k}", case_id="c", phase="measured", api="openai",
            scheduled_ns=T0 + int(d * MS), dispatched_ns=T0 + int(d * MS),
            first_byte_ns=T0 + int(first * MS), events=tuple(events),
            done_ns=T0 + int(done * MS),
            timings=Timings(prompt_n=32, prompt_ms=first - start, predicted_n=n,
                            predicted_ms=t - first),
            extra={"sent_ns": T0 + int(d * MS)}))
    return out


def stopped_states(spans: list[tuple[float, float]], end_ms: float,
                   threads: float = 4.0) -> RunStates:
    """Every thread in state T inside ``spans`` (a debugger's or a profiler's stop,
    SIGSTOP), running otherwise: the runstate grid's samples every 20 ms."""
    t = np.arange(0.0, end_ms + STEP_MS, STEP_MS)
    held = np.array([any(a <= x < b for a, b in spans) for x in t], float)
    run = np.zeros(len(t))
    for i in range(1, len(t)):
        run[i] = run[i - 1] + (0.0 if held[i] and held[i - 1] else 2.0 * STEP_MS / 1e3)
    z = np.zeros(len(t))
    tn = (T0 + t * MS).astype(np.int64)
    return classify_intervals(tn, run, z, z, held * threads, z, np.full(len(t), threads),
                              z, int(tn[0]), int(tn[-1]))


HEADLINES = (("prefill_x", 1), ("decode_x", 16), ("mixed_x", 16))  # TTFT, TPOT/ITL, e2e


def _case(name: str, osl: int, recs, st, end_ms: float):
    led = case_ledger("c", name, {"osl": osl}, recs, states=st, anchor=ANCHOR,
                      window_ns=(T0, T0 + int(end_ms * MS)))
    # a CPU server busy with its own work: cpu_compute past threshold beside the ledger
    sig = dataclasses.replace(CPU_CLEAN, n_cores=2, server_threads=4,
                              server_cpu_cores=1.9, host_busy_cores=1.95, **led.signals())
    return led, classify(sig)


@pytest.mark.parametrize(("name", "osl"), HEADLINES)
def test_a_server_stopped_a_third_of_the_time_is_stalled_first_whatever_the_headline(
        name: str, osl: int) -> None:
    """150 ms of every 500 ms stopped (30%): the ledger's stall share is under its
    compute's in every headline, yet the stalls lead in each, by the window."""
    end = 6_000.0
    spans = stops(500.0, 150.0, end, phase_ms=40.0)
    recs = served([i * 220.0 for i in range(24)], spans)
    led, v = _case(name, osl, recs, stopped_states(spans, end), end)
    assert led.signals()["server_stalled_inflight_frac"] == pytest.approx(0.3, abs=0.03)
    assert led.stalled_share() < 0.5  # compute is the ledger's largest cause
    assert v.classes[0] == "server_stalled", (name, v)
    assert "of the window with requests in flight" in v.lead, v.lead
    assert any(e.threshold == "server_stalled_window_lead" and e.met for e in v.evidence)


def test_stalls_that_fell_in_ttft_lead_a_decode_case_the_freezer_third_arm() -> None:
    """The freezes fall where requests wait for their first token (dispatched in them);
    TPOT/ITL sees 0% of them, the window a quarter: first all the same, and the ledger's
    own largest cause said beside it."""
    end = 3_000.0
    spans = stops(600.0, 150.0, end)
    recs = served([a for a, _ in spans for _ in range(2)], spans, n=12)
    led, v = _case("decode_x", 12, recs, states_frozen(spans, end_ms=end), end)
    sig = led.signals()
    assert sig["server_stalled_frac"] < value("server_stalled_frac")  # TPOT/ITL hides it
    assert sig["server_stalled_inflight_frac"] >= value("server_stalled_window_lead")
    assert v.classes[0] == "server_stalled", v
    assert any("the ledger's largest cause of TPOT/ITL: cpu_compute" in n for n in v.notes)


@pytest.mark.parametrize(("frac", "first"), [(0.98, "cpu_compute"), (1.0, "server_stalled")])
def test_the_stall_leads_from_its_window_row(frac: float, first: str) -> None:
    """The same ledger (stalls 2% of TPOT/ITL, compute 83%) with the window just under
    and at ``server_stalled_window_lead``."""
    base = dataclasses.replace(
        CPU_CLEAN, n_cores=2, server_threads=4, server_cpu_cores=1.9, host_busy_cores=1.95,
        ledger_metric="itl", ledger_run_state=True,
        ledger_causes=(("decode:running", 0.83), ("decode:waiting", 0.15),
                       ("stall:stopped", 0.02)),
        server_stalled_frac=0.02, server_stalled_window_frac=0.255)
    v = classify(dataclasses.replace(
        base, server_stalled_inflight_frac=frac * value("server_stalled_window_lead")))
    assert v.classes[0] == first, v


def test_a_stall_between_requests_is_not_in_flight() -> None:
    """Frozen while no request was in flight: the window's stalled share, not the
    requests' (nothing waited on the server)."""
    end = 2_000.0
    recs = served([0.0, 1_200.0], [], n=10)  # the first ends by ~0.2 s
    st = states_frozen([(500.0, 1_000.0)], end_ms=end)
    led = case_ledger("c", "decode_x", {"osl": 10}, recs, states=st, anchor=ANCHOR,
                      window_ns=(T0, T0 + int(end * MS)))
    assert led.stalled_window_frac == pytest.approx(0.25, abs=0.02)
    assert led.stalled_inflight_frac == pytest.approx(0.0, abs=1e-9)


def test_a_stop_in_the_tail_is_a_stall_and_the_rest_of_the_tail_its_own() -> None:
    rec = record(n=5, tail_ms=200.0)  # the last token at 63.5 ms, the last byte 200 ms on
    last = (rec.events[-1].t_ns - T0) / MS
    led = request_ledger(rec, states=states_frozen([(last + 60, last + 140)]), anchor=ANCHOR)
    tail = {c: ms for seg, c, ms in led.causes if seg == "tail"}
    assert tail["stall:stopped"] == pytest.approx(80.0, abs=20.0)
    assert tail["outside:tail"] == pytest.approx(200.0 - tail["stall:stopped"])
    assert sum(tail.values()) == pytest.approx(led.part("tail"))
    e2e = case_ledger("c", "mixed_x", {"osl": 5}, [rec], states=states_frozen(
        [(last + 60, last + 140)]), anchor=ANCHOR)
    assert e2e.stalled_share() == pytest.approx(tail["stall:stopped"] / led.wall_ms)


def test_waiting_for_a_cpu_on_the_way_there_stays_the_way_there() -> None:
    """One request, 40 ms before prefill (the case's floor: the way there), the server's
    threads runnable without a CPU all that time: the path keeps its time. While a request
    is on the path the server's wait is other work's (tests/test_outside_server.py: a
    relay's 3 s read 2.67 s when the server's wait was taken from it)."""
    from tests.test_verdict_ledger import states

    rec = record(before_ms=40.0, prefill_ms=20.0, n=5)
    led = request_ledger(rec, states=states(run_cores=1.0, wait_cores=1.0), anchor=ANCHOR)
    assert led.part("before_server") == pytest.approx(40.0, abs=1e-6)
    assert led.part("ttft_waiting") == pytest.approx(0.0, abs=1e-6)
    assert sum(v for _, v in led.parts) == pytest.approx(led.wall_ms)


def test_a_stop_before_the_first_token_wins_over_its_delivery() -> None:
    """100 ms before prefill, 50 ms of it the first token's delivery delay (its token
    clock), 80 ms of it stopped: the stop is the server's (its own sender was stopped
    too), the delivery keeps only what the stop leaves, as in a decode gap."""
    from strata_plugin.analysis.delivery import TOKEN_CLOCK, RequestDelivery

    rec = record(before_ms=100.0, prefill_ms=20.0, n=5)  # before prefill: 0.5 .. 100.5 ms
    dv = RequestDelivery(evidence=TOKEN_CLOCK, gap_ms=(0.0,) * 4, first_ms=50.0)
    led = request_ledger(rec, states=states_frozen([(10.0, 89.0)]), anchor=ANCHOR,
                         delivery=dv)
    stalled = led.part("ttft_stalled")
    assert stalled == pytest.approx(80.0, abs=20.0)
    assert led.part("ttft_delivery") == pytest.approx(100.0 - stalled, abs=1e-6)
    assert led.part("before_server") == pytest.approx(0.0, abs=1e-6)
    assert sum(v for _, v in led.parts) == pytest.approx(led.wall_ms)

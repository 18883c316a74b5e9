"""Prefill-decode interference: stalls charged to what was in flight, and the verdict."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

import pytest

from strata_plugin.analysis.interference import analyze, signals
from strata_plugin.analysis.rules import classify
from strata_plugin.formats.records import RequestRecord, Timings, TokenEvent
from strata_plugin.load.case_runner import CaseRunner, CaseSetup, Injection, _InjectionClock
from strata_plugin.load.client import Timeouts
from strata_plugin.load.workload import TokenSpace, Workload
from tests.sse_script_server import Reply, ScriptServer, Seen, sse
from tests.test_attribution import CPU_CLEAN

MS = 1_000_000
#: A lightly loaded CPU host at concurrency 4: nothing else past threshold.
CLEAN = dataclasses.replace(CPU_CLEAN, chunk_gap_p99_p50=None)


def _stream(rid: str, dispatched_ms: float, token_ms: list[float], phase="measured",
            prompt_ms: float | None = None) -> RequestRecord:
    ev = tuple(TokenEvent(t_ns=int(t * MS), n_tokens=1) for t in token_ms)
    return RequestRecord(
        request_id=rid, case_id="c", phase=phase, api="llamacpp",
        scheduled_ns=int(dispatched_ms * MS), dispatched_ns=int(dispatched_ms * MS),
        first_byte_ns=ev[0].t_ns if ev else None, events=ev,
        done_ns=ev[-1].t_ns if ev else None,
        timings=Timings(prompt_ms=prompt_ms) if prompt_ms is not None else None)


def _decode(n_streams: int, stall: tuple[float, float] | None) -> list[RequestRecord]:
    """Streams at 10 ms a token from t=10 ms to 1 s; ``stall``: no token in (a, b)."""
    out = []
    for s in range(n_streams):
        ticks = [10.0 + 10 * k + s for k in range(100)]
        if stall is not None:
            ticks = [t for t in ticks if not stall[0] < t < stall[1]]
        out.append(_stream(f"c/measured/{s}", 0.0, ticks))
    return out


def test_a_stall_during_the_injected_prefill_is_charged_to_it():
    recs = _decode(4, (400.0, 700.0))
    inj = _stream("c/injected/0", 395.0, [702.0], phase="injected", prompt_ms=250.0)
    i = analyze("c", [*recs, inj])
    assert i.n_decode == 4 and i.n_overlapping == 4
    assert i.injected_ms == pytest.approx(307.0)
    assert i.injected_server_prompt_ms == pytest.approx(250.0)
    assert i.longest_stall_during == "injected"
    assert i.longest_stall_ms == pytest.approx(310.0, abs=10)
    # one gap of ~310 ms per stream, beyond the 10 ms median
    assert i.stall_injected_ms_per_request == pytest.approx(300.0, abs=10)
    assert i.stall_no_prefill_ms_per_request == 0.0
    assert i.ms_per_token_outside == pytest.approx(10.0, rel=0.01)
    assert i.ms_per_token_inside > 100
    assert i.interference_factor > 9
    # 4 streams x ~30 tokens that did not come during the ~300 ms prefill
    assert i.tokens_lost == pytest.approx(120, abs=10)
    assert "4 of 4 decode requests overlapped the injected prefill" in i.line()


def test_a_stall_with_no_prefill_in_flight_is_not_interference():
    recs = _decode(4, (400.0, 700.0))  # the same stall, nothing in flight
    i = analyze("c", recs)
    assert i.injected_id is None and i.interference_factor is None
    assert i.stall_no_prefill_ms_per_request == pytest.approx(300.0, abs=10)
    assert i.stall_with_prefill_ms_per_request == 0.0
    assert i.prefill_stall_share == 0.0
    verdict = classify(dataclasses.replace(CLEAN, **signals(i)))
    assert "prefill_decode_interference" not in verdict.classes + verdict.also_flagged


def test_treatment_is_judged_against_its_control():
    control = [analyze("c", _decode(4, None)) for _ in range(3)]
    stalled = analyze("c", [*_decode(4, (400.0, 700.0)),
                            _stream("c/injected/0", 395.0, [702.0], phase="injected")])
    # a control without stalls: the yardstick is one token time (10 ms), not zero
    sig = signals(stalled, control, 40.0, [10.0, 10.0, 10.0])
    assert sig["ab_prefill_stall_ratio"] == pytest.approx(29.75, rel=0.05)
    assert sig["ab_tail_pace_rise"] == pytest.approx(3.0)
    verdict = classify(dataclasses.replace(CLEAN, **sig))
    assert "prefill_decode_interference" in verdict.classes
    ev = {e.metric: e for e in verdict.evidence if e.cls == "prefill_decode_interference"}
    assert set(ev) == {"prefill_stall_frac", "ab_prefill_stall_ratio", "ab_tail_pace_rise"}
    # the control itself: no stalls, no interference
    c_sig = signals(control[0])
    assert c_sig["ab_prefill_stall_ratio"] is None
    assert "prefill_decode_interference" not in classify(
        dataclasses.replace(CLEAN, **c_sig)).classes


AB = dict(prefill_stall_frac=0.3, prefill_stall_share=0.2, ab_prefill_stall_ratio=5.0,
          ab_tail_pace_rise=1.0)


@pytest.mark.parametrize(("change", "fires"), [
    (dict(ab_prefill_stall_ratio=1.99), False),
    (dict(ab_prefill_stall_ratio=2.01), True),
    (dict(ab_tail_pace_rise=0.19), False),
    (dict(ab_tail_pace_rise=0.21), True),
    (dict(prefill_stall_frac=0.099), False),
    (dict(prefill_stall_frac=0.101), True),
    (dict(ab_tail_pace_rise=None), False),
    # the same window's pace, when the control comparison does not hold
    (dict(ab_tail_pace_rise=0.0, injected_pace_factor=0.99), False),
    (dict(ab_tail_pace_rise=0.0, injected_pace_factor=1.01), True),
    (dict(ab_tail_pace_rise=0.0, injected_pace_factor=5.0, prefill_stall_frac=0.099), False),
])
def test_ab_thresholds_just_below_and_above(change, fires):
    v = classify(dataclasses.replace(CLEAN, **{**AB, **change}))
    assert ("prefill_decode_interference" in v.classes + v.also_flagged) is fires


@pytest.mark.parametrize(("share", "fires"), [(0.49, False), (0.51, True)])
def test_without_a_control_the_stalls_must_coincide_with_prefills(share, fires):
    v = classify(dataclasses.replace(CLEAN, prefill_stall_frac=0.3, prefill_stall_share=share))
    assert ("prefill_decode_interference" in v.classes + v.also_flagged) is fires


def test_injection_clock_waits_for_every_stream():
    clock = _InjectionClock(3)
    clock.mark("a", 10)
    clock.mark("a", 11)  # the same stream twice counts once
    clock.mark("b", 20)
    assert not clock.ready.is_set() and clock.seen == 2
    clock.record(_stream("c", 0.0, [0.03]))
    assert clock.ready.is_set() and clock.ready_ns == 30_000
    with pytest.raises(ValueError, match="one of first_tokens, start"):
        Injection(Workload("w", isl=8, osl=1), 0.5, after="middle")
    with pytest.raises(ValueError, match=">= 0"):
        Injection(Workload("w", isl=8, osl=1), -1.0)


def test_a_record_counts_once_it_holds_the_token_mark():
    clock = _InjectionClock(1, token_mark=3)
    clock.record(_stream("a", 0.0, [0.01, 0.02]))  # two tokens: short of the mark
    assert not clock.ready.is_set()
    clock.record(_stream("b", 0.0, [0.01, 0.02, 0.03, 0.04]))
    assert clock.ready.is_set() and clock.ready_ns == 30_000  # its third token


@pytest.mark.parametrize(("at_output", "osl", "mark"), [
    (0.0, 64, 1), (0.25, 64, 16), (0.25, 65, 17), (0.5, 1, 1)])
def test_the_token_mark_is_the_share_of_the_load_osl_rounded_up(at_output, osl, mark):
    assert Injection(Workload("w", isl=8, osl=1), 0.0, at_output=at_output).token_mark(osl) == mark


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(at_output=1.0), r"in \[0, 1\)"), (dict(at_output=-0.1), r"in \[0, 1\)"),
    (dict(at_output=0.5, after="start"), "needs after='first_tokens'")])
def test_a_bad_output_share_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Injection(Workload("w", isl=8, osl=1), 0.0, **kwargs)


class _HeldDelay(float):
    """A reply item's delay that first waits for ``gate`` (``fallback_s`` at most).

    The script server adds each item's delay to the running due time (``due += delay``);
    a float subclass's ``__radd__`` runs first, so the stream pauses here and the items
    after it keep their spacing from the moment the gate opened.
    """

    gate: threading.Event
    fallback_s: float

    def __new__(cls, delay_s: float, gate: threading.Event, fallback_s: float = 5.0):
        self = super().__new__(cls, delay_s)
        self.gate, self.fallback_s = gate, fallback_s
        return self

    def __radd__(self, due: float) -> float:
        self.gate.wait(self.fallback_s)
        return max(due, time.monotonic()) + float(self)


def _slow_llama(hold_after: int) -> tuple[Callable[[Seen], Reply], threading.Event]:
    """llama.cpp /completion: 20 tokens 20 ms apart; a decode stream (isl 8) holds its
    tokens after the ``hold_after``-th until the injected request (isl 64) has arrived
    (5 s at most), so the injection always lands while every stream is decoding."""
    injected = threading.Event()

    def reply(seen: Seen) -> Reply:
        if seen.method == "GET":
            return Reply([(0.0, b"ok")], framing="length", content_type="text/plain")
        if len(seen.json["prompt"]) == 64:
            injected.set()
        n_out = min(20, seen.json["n_predict"])
        items = [(_HeldDelay(0.02, injected) if i == hold_after else 0.02,
                  sse({"content": "ab", "tokens": [400 + i], "stop": False}))
                 for i in range(n_out)]
        items.append((0.0, sse({"content": "", "stop": True, "stop_type": "limit",
                                "tokens_predicted": n_out,
                                "timings": {"prompt_n": len(seen.json["prompt"]),
                                            "prompt_ms": 5.0, "predicted_n": n_out}})))
        return Reply(items)

    return reply, injected


def test_injection_lands_a_fixed_delay_after_every_stream_has_a_first_token():
    marks, lines = [], []
    reply, injected = _slow_llama(hold_after=1)
    with ScriptServer(reply) as srv:
        runner = CaseRunner(
            CaseSetup(base_url=srv.url, api="llamacpp", config_id="c",
                      token_space=TokenSpace(300, 1000), timeouts=Timeouts(read_s=10)),
            record=lambda r: None, mark=lambda *m: marks.append(m), add_case=lines.append)
        w = Workload("decode", isl=8, osl=20, concurrency=4, requests=4, warmups=0)
        res = runner.run(w, inject=Injection(Workload("inj", isl=64, osl=1), 0.1))
    assert not res.problems, res.problems
    placed = lines[-1].injection
    firsts = sorted(min(e.t_ns for e in r.events) for r in res.records)
    assert placed["after"] == "first_tokens" and placed["steady_mono_ns"] == firsts[-1]
    (inj,) = res.injected
    delay_s = (inj.dispatched_ns - placed["steady_mono_ns"]) / 1e9
    # the offset, exact below; above, a loaded host's slack (the streams wait for it)
    assert 0.09 < delay_s < 0.1 + 2.0, delay_s
    assert injected.is_set()  # the streams were held for it, not let go by the fallback
    assert inj.dispatched_ns < min(r.done_ns for r in res.records)  # in steady decode
    names = {m[1] for m in marks if m[0] == "event"}
    assert {"decode_steady", f"inject:{inj.request_id}"} <= names


def test_injection_at_a_share_of_the_output_waits_for_every_streams_token_mark():
    lines = []
    reply, injected = _slow_llama(hold_after=10)
    with ScriptServer(reply) as srv:
        runner = CaseRunner(
            CaseSetup(base_url=srv.url, api="llamacpp", config_id="c",
                      token_space=TokenSpace(300, 1000), timeouts=Timeouts(read_s=10)),
            record=lambda r: None, mark=lambda *m: None, add_case=lines.append)
        w = Workload("decode", isl=8, osl=20, concurrency=4, requests=4, warmups=0)
        res = runner.run(w, inject=Injection(Workload("inj", isl=64, osl=1), 0.0,
                                             at_output=0.5))
    assert not res.problems, res.problems
    placed = lines[-1].injection
    assert placed["token_mark"] == 10
    # Every stream's 10th token (one per event here) is in; the last of them is the moment.
    assert placed["steady_mono_ns"] == max(r.events[9].t_ns for r in res.records)
    (inj,) = res.injected
    # offset 0, exact below; above, a loaded host's slack (the streams wait for it)
    assert 0 <= (inj.dispatched_ns - placed["steady_mono_ns"]) / 1e9 < 0.0 + 2.0
    assert injected.is_set()
    assert inj.dispatched_ns < min(r.done_ns for r in res.records)

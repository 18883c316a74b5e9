"""Steady state: the plateau of a closed loop found at the exact dispatch and drain times,
its figures free of the ramp and the drain; open loops; timeslices; the report section."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest
from bundle_factory import cpu_run

from strata_plugin.analysis.steady_state import span_figures, steady_state, timeslices
from strata_plugin.formats.records import RequestRecord, TokenEvent, Usage
from strata_plugin.report import write_report

MS = 1_000_000


def rec(i: int, start_ms: float, ttft_ms: float, n: int, tpot_ms: float,
        ok: bool = True) -> RequestRecord:
    t0 = int(start_ms * MS)
    events = tuple(TokenEvent(t_ns=t0 + int((ttft_ms + k * tpot_ms) * MS), n_tokens=1)
                   for k in range(n))
    return RequestRecord(
        request_id=f"c/measured/{i}", case_id="c", phase="measured", api="llamacpp",
        scheduled_ns=t0, dispatched_ns=t0, first_byte_ns=t0 + MS, events=events,
        done_ns=events[-1].t_ns + 1, usage=Usage(completion_tokens=n, source="usage"))


def closed_loop(slots: int = 4, per_slot: int = 10):
    """Each slot sends back to back. The first wave prefills together (slow TTFT); the
    last request of each slot decodes alone at the end (fast TPOT)."""
    recs, i = [], 0
    for s in range(slots):
        t = s * 2.0  # the dispatches of the first wave, 2 ms apart
        for k in range(per_slot):
            ttft = 400.0 if k == 0 else 50.0
            tpot = 5.0 if k == per_slot - 1 else 20.0
            n = 16 + s  # the slots end at different times
            recs.append(rec(i, t, ttft, n, tpot))
            t += ttft + (n - 1) * tpot + 0.5  # the next request after the last token
            i += 1
    return recs


def test_closed_loop_plateau_is_from_the_last_first_dispatch_to_the_first_slot_ending():
    recs = closed_loop()
    ss = steady_state(recs, concurrency=4)
    assert ss is not None and ss.plateau is not None and ss.level == 4
    p = ss.plateau
    assert p.start_ns == recs[30].dispatched_ns  # slot 3's first request: 4 in flight
    slot0_last = recs[9]
    assert p.end_ns == slot0_last.done_ns  # the drain starts as slot 0 ends
    # Every request inside started after the ramp: no 400 ms TTFT.
    assert p.ttft_p50_ms == pytest.approx(50.0) and p.ttft_p99_ms == pytest.approx(50.0)
    assert p.tpot_p50_ms == pytest.approx(20.0)
    # Not the first wave (4), nor what slots 1-3 still ran after slot 0 ended (2+2+3).
    assert p.n_inside == 40 - 4 - 7
    assert p.mean_in_flight == pytest.approx(4.0, abs=0.05)
    whole = span_figures(recs, ss.window_start_ns, ss.window_end_ns)
    assert whole.ttft_p99_ms > 300 and whole.tpot_p50_ms == pytest.approx(20.0)
    assert 0.5 < ss.share < 1.0


def test_a_level_held_only_briefly_is_no_plateau():
    # Two slots for 2 s, one of them touching a second request for 50 ms: 2 in flight
    # only for an instant of the window.
    recs = [rec(0, 0, 10, 100, 20), rec(1, 1950, 10, 3, 20)]
    ss = steady_state(recs, concurrency=2)
    assert ss is not None and ss.plateau is None and "too short" in ss.reason
    assert steady_state([], concurrency=2) is None


def test_level_is_capped_by_the_requests_and_never_reached_is_said():
    recs = [rec(0, 0, 10, 50, 10), rec(1, 600, 10, 50, 10)]  # never overlapping
    ss = steady_state(recs, concurrency=8)
    assert ss.level == 2 and ss.plateau is None and ss.reason == "in-flight never reached 2"


def test_open_loop_level_is_the_typical_in_flight_count():
    # Poisson-like: 1 in flight most of the time, 2 briefly.
    recs = [rec(i, i * 300.0, 10, 10, 20) for i in range(20)] + [rec(99, 905.0, 5, 3, 10)]
    ss = steady_state(recs, concurrency=1, arrival="poisson")
    assert ss.level == 1 and ss.plateau is not None
    assert ss.plateau.start_ns == 0 and ss.plateau.n_inside >= 19


def test_timeslices_partition_the_window():
    recs = closed_loop()
    slices = timeslices(recs, 0.5)
    ss = steady_state(recs, concurrency=4)
    assert slices[0].start_ns == ss.window_start_ns and slices[-1].end_ns == ss.window_end_ns
    assert all(a.end_ns == b.start_ns for a, b in pairwise(slices))
    assert sum(x.n_completed for x in slices) == len(recs)
    tokens = sum(len(r.events) for r in recs)
    assert sum(x.output_tok_s * x.duration_s for x in slices) == pytest.approx(tokens)
    with pytest.raises(ValueError, match="timeslice_s must be > 0"):
        timeslices(recs, 0)


@pytest.mark.integration
def test_report_has_plateau_beside_whole_and_asked_timeslices(tmp_path):
    run = cpu_run(tmp_path)
    lines = [json.loads(x) for x in (run / "cases.jsonl").read_text().splitlines()]
    for line in lines:
        if line["case_id"] == "light":
            line["timeslice_s"] = 2.0
    (run / "cases.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    write_report(run)
    text = (run / "report.md").read_text()
    sec = text[text.index("## Steady state"):text.index("## Thresholds")]
    row = next(x for x in sec.splitlines() if x.startswith("| `light` | 1 |"))
    assert " / " in row and "100%" in row
    assert "| `cpu_bound` | 4 | none: plateau too short" in sec
    ts = sec[sec.index("### Timeslices of `light` (2 s each)"):]
    assert len([x for x in ts.splitlines() if x.startswith("| ") and x[2].isdigit()]) == 4
    assert "Timeslices of `cpu_bound`" not in sec

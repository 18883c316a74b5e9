"""The load generator's self-check: a starved client is flagged, one hiccup is not."""

from __future__ import annotations

from dataclasses import replace

from strata_plugin.formats.records import RequestRecord, TokenEvent
from strata_plugin.load import own_quota
from strata_plugin.load.client.loopstats import LoopProbe, LoopStats
from strata_plugin.load.generator import (
    CLIENT_DELAY_SHARE,
    CLIENT_LATENESS_P99_MS,
    CLIENT_READ_BACKLOG_BYTES,
    CLIENT_THROTTLED_FRAC,
    CLIENT_TIMING_ERROR_MS,
    SelfCheck,
    self_check,
)

MS = 1_000_000


def _records(lateness_ms: list[float], *, lag_ms: float = 0.1,
             life_ms: float = 200.0) -> list[RequestRecord]:
    """Requests each ``life_ms`` long from dispatch to end, with 8 events."""
    out = []
    for i, late in enumerate(lateness_ms):
        t0 = i * 1000 * MS
        sent = t0 + int(late * MS)
        step = int(life_ms * MS) // 8
        events = tuple(TokenEvent(t_ns=sent + k * step, n_tokens=1,
                                  handled_ns=sent + k * step + int(lag_ms * MS))
                       for k in range(1, 9))
        out.append(RequestRecord(request_id=f"r{i}", case_id="c", phase="measured",
                                 api="llama", scheduled_ns=t0, dispatched_ns=sent,
                                 events=events, done_ns=sent + int(life_ms * MS)))
    return out


def test_an_on_time_client_is_not_flagged():
    sc = self_check(_records([0.2] * 24), client_cpu_cores=0.1)
    assert not sc.client_bound and sc.reasons == () and sc.late_requests == 0
    assert sc.dispatch_delay_share < 0.01


def test_one_hiccup_in_a_short_case_is_not_a_client_limit():
    """24 requests: the p99 is the maximum, so one 16 ms stall reads as p99 16 ms; it is
    0.3% of the requests' time and limited nothing."""
    sc = self_check(_records([0.2] * 23 + [16.0]), client_cpu_cores=0.1)
    assert sc.dispatch_lateness_p99_ms > CLIENT_LATENESS_P99_MS
    assert sc.late_requests == 1
    assert sc.dispatch_delay_share < CLIENT_DELAY_SHARE
    assert not sc.client_bound


def test_a_starved_client_is_flagged_with_its_share_and_counts():
    """A third of the requests held 150-300 ms by a client capped at 2% of a core."""
    late = [0.2] * 16 + [150.0, 300.0] * 4
    sc = self_check(_records(late), client_cpu_cores=0.02)
    assert sc.client_bound
    assert sc.late_requests == 8
    assert sc.dispatch_delay_share >= CLIENT_DELAY_SHARE
    assert "8 of 24 requests late" in sc.reasons[0]


def test_lateness_counts_against_how_long_requests_live():
    """The same 10 ms delays on every request: noise beside 2 s requests, a limit beside
    40 ms ones (a fast GPU server answering short prompts)."""
    late = [10.0] * 24
    assert not self_check(_records(late, life_ms=2000.0), client_cpu_cores=0.1).client_bound
    assert self_check(_records(late, life_ms=40.0), client_cpu_cores=0.1).client_bound


def test_slow_event_handling_and_cpu_flag_on_their_own():
    lagging = self_check(_records([0.2] * 24, lag_ms=9.0), client_cpu_cores=0.1)
    assert lagging.client_bound and lagging.late_events == 24 * 8
    assert lagging.handling_lag_share >= CLIENT_DELAY_SHARE
    assert "handling lag" in lagging.reasons[0]
    busy = self_check(_records([0.2] * 24), client_cpu_cores=0.95)
    assert busy.client_bound and "client CPU" in busy.reasons[0]


def test_handling_lag_with_the_loops_view_is_a_figure_not_a_reason():
    """Stamps are taken at the read: a parse preempted by another tenant moves none.
    With the loop's view, its own lag and the bytes waiting at a read decide."""
    recs = _records([0.2] * 24, lag_ms=9.0)
    clean = self_check(recs, client_cpu_cores=0.1, loop=_loop([0.3] * 100, backlog=[64] * 50))
    assert not clean.client_bound and abs(clean.handling_lag_p99_ms - 9.0) < 0.01
    behind = self_check(recs, client_cpu_cores=0.1,
                        loop=_loop([0.3] * 100, backlog=[CLIENT_READ_BACKLOG_BYTES * 2] * 100))
    assert behind.client_bound and "reads behind" in behind.reasons[0]


def test_a_few_slow_events_are_not_a_client_limit():
    """Twelve streams on two busy cores: 15 of 1,152 events handled 10 ms late (p99 over
    5 ms), 0.6% of the streams' time. The arrival stamps were barely moved."""
    recs = _records([0.2] * 144)  # 1,152 events
    slow = _records([0.2], lag_ms=10.0)[0]
    for i in range(2):
        recs[i] = slow
    recs[2] = replace(recs[2], events=recs[2].events[:7] + slow.events[:1])
    sc = self_check(recs, client_cpu_cores=0.15)
    assert sc.late_events == 17 and sc.handling_lag_p99_ms > 5.0
    assert sc.handling_lag_share < CLIENT_DELAY_SHARE
    assert not sc.client_bound


def _loop(lag_ms: list[float], backlog: list[int] = (), wake_ms: float = 0.0) -> LoopStats:
    """Probe samples of ``lag_ms`` each, ``wake_ms`` of which the host's late wake-up."""
    probe = LoopProbe()
    for x in lag_ms:
        probe.sample(int((x + wake_ms) * MS), int(x * MS))
    for n in backlog:
        probe.backlog(n)
    return probe.take()


def test_loop_lag_just_over_the_promise_is_flagged_with_its_figures():
    recs = _records([0.2] * 24)
    under = self_check(recs, client_cpu_cores=0.1,
                       loop=_loop([0.3] * 940 + [CLIENT_TIMING_ERROR_MS * 0.98] * 60))
    assert not under.client_bound
    assert under.timing_error_bound_ms is not None and under.timing_error_bound_ms < 5
    over = self_check(recs, client_cpu_cores=0.1,
                      loop=_loop([0.3] * 940 + [CLIENT_TIMING_ERROR_MS * 1.02] * 60,
                                 backlog=[200] * 50))
    assert over.client_bound and "loop lag p99 5.10 ms" in over.reasons[0]
    assert "read backlog p99 200 B" in over.reasons[0]  # the figures come with the flag
    assert "at 6% of the probes" in over.reasons[0]
    assert over.loop_lag_max_ms == 5.1 and over.read_backlog_max_bytes == 200


def test_own_lag_past_the_promise_at_a_few_probes_only_is_not_a_client_limit():
    """The share boundary (CLIENT_DELAY_SHARE of the probes), as for dispatch lateness:
    p99 over 5 ms in both windows, 4% of the probes over it in one, 6% in the other."""
    recs = _records([0.2] * 24)
    few = self_check(recs, client_cpu_cores=0.1, loop=_loop([0.3] * 960 + [6.5] * 40))
    assert few.loop_own_lag_p99_ms is not None and few.loop_own_lag_p99_ms > 5
    assert CLIENT_DELAY_SHARE == 0.05 and not few.client_bound
    many = self_check(recs, client_cpu_cores=0.1, loop=_loop([0.3] * 940 + [6.5] * 60))
    assert many.client_bound and "at 6% of the probes" in many.reasons[0]


def test_a_client_throttled_by_its_own_quota_is_flagged_only_when_it_ran_late():
    """The client's own cgroup throttled it in 5% of the CFS periods (the row that names a
    server CPU-limited) and the loop ran late: flagged, with the counts. Just under 5%, or
    throttled with the loop on time: not."""
    recs = _records([0.2] * 24)
    probe = LoopProbe()
    for lag in [0.3] * 99 + [40.0]:  # held off 40 ms once, its own work 0.1 ms each time
        probe.sample(int(lag * MS), int(0.1 * MS))
    late = probe.take()
    on_time = _loop([0.3] * 100)
    assert CLIENT_THROTTLED_FRAC == 0.05

    def check(throttled: int, loop: LoopStats) -> SelfCheck:
        return self_check(recs, client_cpu_cores=0.01, loop=loop,
                          throttling=own_quota.Throttling("cpu.stat", 1000, throttled))

    assert not check(49, late).client_bound
    flagged = check(50, late)
    assert flagged.client_bound and flagged.own_quota_throttled_frac == 0.05
    assert "throttled it in 50 of 1000 periods" in flagged.reasons[0]
    assert not check(900, on_time).client_bound


def test_a_host_that_wakes_the_loop_late_widens_the_bound_but_is_not_a_client_limit():
    sc = self_check(_records([0.2] * 24), client_cpu_cores=0.1,
                    loop=_loop([0.3] * 100, wake_ms=8.0))
    assert not sc.client_bound
    assert sc.timing_error_bound_ms is not None and sc.timing_error_bound_ms > 8
    assert sc.loop_own_lag_p99_ms is not None and sc.loop_own_lag_p99_ms < 0.5


def test_a_read_backlog_past_one_read_is_flagged():
    recs = _records([0.2] * 24)
    ok = self_check(recs, client_cpu_cores=0.1,
                    loop=_loop([0.3] * 100, backlog=[CLIENT_READ_BACKLOG_BYTES // 2] * 100))
    assert not ok.client_bound
    behind = self_check(recs, client_cpu_cores=0.1,
                        loop=_loop([0.3] * 100, backlog=[CLIENT_READ_BACKLOG_BYTES * 2] * 100))
    assert behind.client_bound and "reads behind" in behind.reasons[0]


def test_send_lag_counts_bytes_out_not_dispatch():
    """Dispatched on time but the request's bytes left 20 ms late: a client limit."""
    recs = [replace(r, extra={"sent_ns": r.scheduled_ns + 20 * MS}) for r in _records([0.2] * 24)]
    sc = self_check(recs, client_cpu_cores=0.1)
    assert sc.client_bound and "send lag" in sc.reasons[0] and sc.send_lag_p99_ms == 20.0
    fine = [replace(r, extra={"sent_ns": r.scheduled_ns + MS // 2}) for r in _records([0.2] * 24)]
    assert not self_check(fine, client_cpu_cores=0.1).client_bound

"""The self-check on a real run: a client kept from reading on time is flagged, a clean one not.

A loopback emitter in its own process streams to run_load. Clean: 16 streams of
50 events/s. Client-bound on purpose: 64 streams whose events come as fast as
the emitter can send them, 20 to a write (an interval of 0.1 ms), far more than
one Python loop parses (one event at a time, the emitter barely outran the
loop once the parse got cheaper), so bytes wait in the sockets and the loop
runs late.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from strata_plugin.load.client import RequestSpec, Timeouts
from strata_plugin.load.generator import (
    CLIENT_TIMING_ERROR_MS,
    Job,
    LoadParams,
    LoadResult,
    run_load,
)
from strata_plugin.testing.emitter import EmitterProcess, emitter_process, sent_stamps


@pytest.fixture(scope="module")
def emitter() -> Iterator[EmitterProcess]:
    with emitter_process() as em:
        yield em


def _run(em: EmitterProcess, streams: int, events: int, interval_s: float,
         burst: int = 1) -> LoadResult:
    extra = (("emit_interval_s", interval_s), ("emit_burst", burst))
    jobs = [Job(RequestSpec(f"s{i}", "live", "measured", events, prompt="x", extra_body=extra))
            for i in range(streams)]
    return run_load(jobs, LoadParams(base_url=em.url, api="chat", concurrency=streams,
                                     timeouts=Timeouts(connect_s=10, read_s=20)))


def test_a_clean_run_is_not_flagged(emitter: EmitterProcess) -> None:
    res = _run(emitter, 16, 50, 0.02)
    sc = res.self_check
    assert all(r.ok for r in res.records)
    assert sum(len(sent_stamps(r.output_text)) for r in res.records) == 16 * 50
    assert not sc.client_bound, sc.reasons
    # The stated bound may be wide on a busy shared host (late wake-ups); the loop's
    # own part of it is what a clean run keeps small.
    assert sc.loop_own_lag_p99_ms is not None
    assert sc.loop_own_lag_p99_ms < CLIENT_TIMING_ERROR_MS
    assert sc.timing_error_bound_ms is not None and sc.send_lag_p99_ms is not None


def test_a_run_beyond_the_loop_is_flagged_with_its_figures(emitter: EmitterProcess) -> None:
    res = _run(emitter, 64, 600, 0.0001, burst=20)
    sc = res.self_check
    assert all(r.ok for r in res.records)  # late, not lost
    assert sc.client_bound, sc
    why = " ".join(sc.reasons)
    assert "loop lag p99" in why and "read backlog p99" in why, why
    assert sc.loop_own_lag_p99_ms is not None
    assert sc.loop_own_lag_p99_ms > CLIENT_TIMING_ERROR_MS
    # What the flag says is true: events were read late against their send stamps.
    late = sorted(e.t_ns - s for r in res.records
                  for s, e in zip(sent_stamps(r.output_text), r.events, strict=False))
    assert late[len(late) * 99 // 100] > CLIENT_TIMING_ERROR_MS * 1e6

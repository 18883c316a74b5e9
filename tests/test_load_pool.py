"""The pool on the run path: when run_load shards a case, and that it loses nothing doing so.

Against the loopback test emitter (its own process): records, per-request /proc
counters (the emitter's process tree, read in the workers), the token marks the mixed
A/B's injection clock waits on, progress, an open loop's arrival times and the
self-check per process all come through the pool as they do through one loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from strata_plugin.agent.procfs import TreeCounters
from strata_plugin.load import pool
from strata_plugin.load.client import RequestSpec, Timeouts
from strata_plugin.load.generator import Job, LoadParams, Progress, run_load
from strata_plugin.process_globals import STATE
from strata_plugin.testing.emitter import EmitterProcess, emitter_process, sent_stamps

T = Timeouts(connect_s=20, read_s=30)


@pytest.fixture(scope="module")
def emitter() -> Iterator[EmitterProcess]:
    with emitter_process() as em:
        yield em


@pytest.fixture(autouse=True)
def fresh_capacity(monkeypatch: pytest.MonkeyPatch) -> pool.Capacity:
    """Each test starts from the measured capacity: what an earlier test's loops taught
    the process (a busy host) is not this test's."""
    cap = pool.Capacity()
    monkeypatch.setattr(STATE, "loop_capacity", cap)
    return cap


def _jobs(n: int, events: int = 10, offsets: list[float] | None = None) -> list[Job]:
    extra = (("emit_interval_s", 0.02),)
    return [Job(RequestSpec(f"s{i}", "pool", "measured", events, prompt="x", extra_body=extra),
                None if offsets is None else offsets[i]) for i in range(n)]


def test_plan_switches_just_above_one_loops_capacity() -> None:
    cap = pool.Capacity()
    per = pool.STREAMS_PER_LOOP
    assert pool.plan("auto", per, cap, cpus=4).processes == 1
    assert pool.plan("auto", per + 1, cap, cpus=4).processes == 2
    assert pool.plan("auto", 4 * per + 1, cap, cpus=4).processes == 4  # one per CPU at most
    assert pool.plan("auto", 4 * per, cap, cpus=1).processes == 1  # one CPU: no pool
    assert pool.plan(1, 4 * per, cap, cpus=4).processes == 1  # forced: one loop
    assert pool.plan(3, 10, cap, cpus=1).processes == 3  # forced: the pool
    for bad in (0, "many", -2):
        with pytest.raises(ValueError, match=r"\[load\] processes"):
            pool.plan(bad, 10, cap, cpus=4)


def test_a_late_loop_teaches_the_session_a_smaller_capacity() -> None:
    cap = pool.Capacity()
    cap.observe([(200, None)])  # None: that loop kept its promise
    assert cap.streams == pool.STREAMS_PER_LOOP
    cap.observe([(200, 6.0)])  # a figure: the self-check found that loop's stamps late
    assert cap.streams == 100  # halved, at its share
    cap.observe([(300, 7.0)])  # a larger share, late: never raises the capacity
    assert cap.streams == 100
    assert pool.plan("auto", 100, cap, cpus=2).processes == 1
    assert pool.plan("auto", 101, cap, cpus=2).processes == 2
    assert "learned" in pool.plan("auto", 101, cap, cpus=2).why


def test_run_load_shards_past_one_loop_without_an_option(emitter: EmitterProcess) -> None:
    n = pool.STREAMS_PER_LOOP + 44  # 300 streams
    marks: dict[str, int] = {}
    got: list[str] = []
    progress = Progress(n)
    lock = threading.Lock()

    def mark(rid: str, t_ns: int) -> None:
        with lock:
            marks[rid] = t_ns

    res = run_load(_jobs(n), LoadParams(base_url=emitter.url, api="chat", concurrency=n,
                                        timeouts=T, counters=TreeCounters(emitter.pid),
                                        progress=progress,
                                        on_record=lambda r: got.append(r.request_id),
                                        on_token_mark=mark, token_mark=3))
    sc = res.self_check
    assert sc.engine == "pool" and sc.processes == 2 and sc.hosts == 1, sc
    assert f"{n} streams > {pool.STREAMS_PER_LOOP} streams a loop" in sc.placement
    assert [r.request_id for r in res.records] == [f"s{i}" for i in range(n)]
    assert all(r.ok for r in res.records), [r.error for r in res.records if not r.ok][:3]
    assert sum(len(sent_stamps(r.output_text)) for r in res.records) == n * 10  # 0 lost
    assert sorted(got) == sorted(r.request_id for r in res.records)
    assert progress.done == n and progress.errors == 0
    # The third token's arrival, as the loop stamped it, for every stream.
    assert marks == {r.request_id: r.events[2].t_ns for r in res.records}
    # Per-request counters of the emitter's process, read in the workers.
    assert all(r.proc is not None and r.proc.shared for r in res.records)
    assert sum(r.proc.cpu_s for r in res.records if r.proc) > 0
    # Every stamp on this host's timeline, inside the load's window.
    assert all(res.start_ns <= r.dispatched_ns <= r.done_ns <= res.end_ns
               for r in res.records if r.done_ns)
    # The self-check per process, and over all of them.
    assert [p["streams"] for p in sc.per_process] == [n // 2, n // 2]
    assert sum(p["requests"] for p in sc.per_process) == n
    assert all(p["loop_lag_p99_ms"] is not None and p["client_cpu_cores"] > 0
               for p in sc.per_process)
    assert sc.loop_lag_p99_ms is not None and sc.client_cpu_total_cores is not None
    assert sc.client_cpu_total_cores >= sc.client_cpu_cores > 0
    assert sc.incomplete is None
    print("per process:", [(p["streams"], p["client_cpu_cores"], p["loop_own_lag_p99_ms"],
                            p["stamps_late_ms"]) for p in sc.per_process],
          pool.session_capacity().why)


def test_one_loop_at_its_capacity(emitter: EmitterProcess) -> None:
    res = run_load(_jobs(8), LoadParams(base_url=emitter.url, api="chat", concurrency=8,
                                        timeouts=T, streams=pool.STREAMS_PER_LOOP))
    assert res.self_check.engine == "loop" and res.self_check.processes == 1
    assert "on one loop" in res.self_check.placement


def test_an_open_loop_keeps_its_arrival_times_through_the_pool(
        emitter: EmitterProcess) -> None:
    offsets = [0.05 * i for i in range(20)]
    res = run_load(_jobs(20, 5, offsets), LoadParams(base_url=emitter.url, api="chat",
                                                     concurrency=20, timeouts=T, processes=2))
    assert res.self_check.processes == 2
    late = []
    for off, r in zip(offsets, res.records, strict=True):
        assert r.ok
        assert r.scheduled_ns == res.start_ns + int(off * 1e9)  # dealt out, not re-timed
        late.append(r.dispatched_ns - r.scheduled_ns)
    # never early; on time as a rule (the median), and none two arrivals (100 ms) late:
    # one worker's late wake on a loaded host is not a lost arrival time
    assert min(late) >= 0 and sorted(late)[len(late) // 2] < 30_000_000, late
    assert max(late) < 100_000_000, late


@pytest.mark.integration  # 3.4 s of real waiting on the quiet VM
def test_a_worker_lost_mid_load_names_itself_and_nothing_hangs(
        emitter: EmitterProcess) -> None:
    with pool.ShardedStreamRunner(2) as runner:
        out = []
        t = threading.Thread(target=lambda: out.append(runner.run_sharded(
            [(j.spec, None) for j in _jobs(6, events=150)], emitter.url, "chat",
            concurrency=6, timeouts=T)))
        t.start()
        time.sleep(1.0)
        victim = runner.pids[1]
        runner._workers[1][0].kill()
        t.join(20)
        assert not t.is_alive()
    run = out[0]
    lost = [r for i, r in enumerate(run.records) if i % 2 == 1]
    assert all(r.error is not None and r.error.cls == "client" for r in lost)
    assert all(f"load worker process {victim}" in r.error.message for r in lost if r.error)
    assert all(r.ok for i, r in enumerate(run.records) if i % 2 == 0)
    assert run.shards[1].report is None and run.shards[1].lost
    assert run.shards[0].report is not None and run.shards[0].lost is None


def test_a_client_bound_worker_is_named_and_makes_the_load_client_bound() -> None:
    from strata_plugin.formats.records import RequestRecord
    from strata_plugin.load.client.loopstats import LoopStats
    from strata_plugin.load.generator import ShardView, sharded_check
    from strata_plugin.load.pool_worker import ShardReport

    def rec(i: int) -> RequestRecord:
        return RequestRecord(f"r{i}", "c", "measured", "chat", 1_000 + i, 1_000 + i,
                             done_ns=2_000_000_000 + i)

    quiet = LoopStats(lag_ns=(1_000_000,) * 100, own_ns=(100_000,) * 100)
    # Its own work 12 ms late at every probe: past the promised 5 ms (client_timing_error_ms)
    late = LoopStats(lag_ns=(12_000_000,) * 100, own_ns=(12_000_000,) * 100)
    views = [ShardView("process 0", "a", 2, (rec(0), rec(2)),
                        ShardReport(quiet, 0.1, 0, 10**9), None),
             ShardView("process 1", "b", 2, (rec(1), rec(3)),
                        ShardReport(late, 0.1, 0, 10**9), None)]
    sc = sharded_check([rec(i) for i in range(4)], views, engine="pool", placement="test")
    assert sc.client_bound
    assert any(r.startswith("process 1 (b): stamps late") for r in sc.reasons), sc.reasons
    assert not any(r.startswith("process 0") for r in sc.reasons)
    assert [p["client_bound"] for p in sc.per_process] == [False, True]
    assert sc.per_process[1]["stamps_late_ms"] == pytest.approx(12.0)
    # Just below the promise, the same worker is not named.
    ok = LoopStats(lag_ns=(4_900_000,) * 100, own_ns=(4_900_000,) * 100)
    views[1] = ShardView("process 1", "b", 2, (rec(1), rec(3)),
                          ShardReport(ok, 0.1, 0, 10**9), None)
    sc = sharded_check([rec(i) for i in range(4)], views, engine="pool", placement="test")
    assert not sc.client_bound and sc.per_process[1]["stamps_late_ms"] is None

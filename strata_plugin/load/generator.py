"""The load generator: closed and open loops, with a self-check of the client.

A benchmark client can itself be the bottleneck. Each run measures the client's
own CPU use, how late each request was dispatched against its schedule, and how
long after arrival each stream event was handled; a run where these exceed the
thresholds below is flagged ``client_bound`` rather than blamed on the server.
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial

import requests

from strata_plugin.analysis.stats import percentile
from strata_plugin.analysis.thresholds import value as threshold_value
from strata_plugin.formats.records import ProcDelta, RequestRecord
from strata_plugin.load import own_quota
from strata_plugin.load.client import RequestSpec, Timeouts, send_streaming
from strata_plugin.load.client.attempt import Attempt
from strata_plugin.load.client.loopstats import LoopStats
from strata_plugin.load.client.mux import StreamMux
from strata_plugin.load.client.slots import run_slots

#: Client self-check thresholds (the client is suspect above these), from the one table
#: (analysis/thresholds.py, with their sources).
#: 5 ms of dispatch lateness is a fraction of any TTFT worth measuring on a GPU
#: server; 0.85 of a core means the Python client has no headroom left.
CLIENT_LATENESS_P99_MS = threshold_value("client_lateness_p99_ms")
CLIENT_HANDLING_LAG_P99_MS = threshold_value("client_handling_lag_p99_ms")
CLIENT_CPU_CORES = threshold_value("client_cpu_cores")
#: The client's own delays limit a run only when they are a real part of the requests'
#: lives: summed dispatch lateness must also reach this share of the summed time from
#: schedule to end, and summed handling lag this share of the summed time from dispatch
#: to end. Measured on the local fault suite (dispatch): a load generator capped at 2%
#: of a core 0.085-0.23; every other arm, hypervisor steal and 3x oversubscribed slots
#: included, 0.001-0.011. (Handling lag: 12 streams on 2 busy cores, 15 of 1,152 events
#: 10 ms late, 0.6%.) A p99 over a few dozen requests is their maximum, so without the
#: share one scheduling hiccup would flag the client.
CLIENT_DELAY_SHARE = threshold_value("client_delay_share")
#: The timing error the client promises for its stamps: an event is stamped at most
#: this long after its bytes arrived. A stamp is taken when a read returns, so bytes
#: that wait in the socket while the loop is busy are stamped late and the stamps
#: cannot show it; the loop's lag (a 20 ms probe timer's lateness) can, and its p99 is
#: the run's stated timing error bound. The run is flagged client-bound when the part
#: of that lag the loop's own work caused has a p99 above this (a host too busy to
#: wake the loop on time widens the stated bound but is not the client's limit), when
#: a read finds more than CLIENT_READ_BACKLOG_BYTES waiting at p99 (more than one
#: read's worth), or when the send lag (scheduled -> the request's last byte out) p99
#: is above this for CLIENT_DELAY_SHARE of the requests' time.
CLIENT_TIMING_ERROR_MS = threshold_value("client_timing_error_ms")
CLIENT_READ_BACKLOG_BYTES = int(threshold_value("client_read_backlog_bytes"))
#: A client whose own cgroup throttled it in this share of the CFS periods, while the
#: loop or a send ran late past CLIENT_TIMING_ERROR_MS, is client-bound: the same row
#: that names a server CPU-limited by its quota (``cgroup_throttled_frac``).
CLIENT_THROTTLED_FRAC = threshold_value("cgroup_throttled_frac")

Counters = Callable[[], tuple[float, int, int]]  # (cpu_s, major_faults, read_bytes)


@dataclass(frozen=True)
class SelfCheck:
    client_cpu_cores: float  # client CPU seconds / wall seconds
    dispatch_lateness_p99_ms: float
    handling_lag_p99_ms: float
    client_bound: bool
    reasons: tuple[str, ...]
    late_requests: int = 0  # dispatched more than CLIENT_LATENESS_P99_MS after schedule
    late_events: int = 0  # handled more than CLIENT_HANDLING_LAG_P99_MS after arrival
    dispatch_delay_share: float = 0.0  # summed lateness / summed schedule-to-end time
    handling_lag_share: float = 0.0  # summed handling lag / summed dispatch-to-end time
    # The loop's view (None where requests ran in threads: HTTPS, a proxy).
    timing_error_bound_ms: float | None = None  # stamps are this late at p99: the loop lag
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    loop_own_lag_p99_ms: float | None = None  # the part the loop's own work caused
    read_backlog_p99_bytes: int | None = None  # bytes already waiting when a socket was read
    read_backlog_max_bytes: int | None = None
    send_lag_p99_ms: float | None = None  # scheduled -> the request's last byte out
    # The loop thread's own cgroup (None: no CPU quota files): share of the CFS periods
    # in the run that throttled it.
    own_quota_throttled_frac: float | None = None


@dataclass(frozen=True)
class LoadResult:
    records: tuple[RequestRecord, ...]
    start_ns: int
    end_ns: int
    self_check: SelfCheck


@dataclass(frozen=True)
class Job:
    spec: RequestSpec
    offset_s: float | None = None  # open loop: send this long after the start


class Progress:
    """Thread-safe counters that a reporter can poll while the load runs."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.errors, self.tokens = total, 0, 0, 0
        self.t0 = time.monotonic()
        self._lock = threading.Lock()

    def add(self, rec: RequestRecord) -> None:
        with self._lock:
            self.done += 1
            self.errors += 0 if rec.ok else 1
            self.tokens += sum(e.n_tokens for e in rec.events)

    def line(self) -> str:
        with self._lock:
            dt = max(1e-9, time.monotonic() - self.t0)
            return (f"{self.done}/{self.total} requests, {self.done / dt:.2f} req/s, "
                    f"{self.errors} errors, {self.tokens / dt:.1f} output tok/s")


def run_load(
    jobs: Sequence[Job],
    *,
    base_url: str,
    api: str,
    concurrency: int,
    timeouts: Timeouts,
    headers: dict[str, str] | None = None,
    counters: Counters | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    progress: Progress | None = None,
    on_token_mark: Callable[[str, int], None] | None = None,
    token_mark: int = 1,
    keep_alive: bool = False,
) -> LoadResult:
    """Send every job, at most ``concurrency`` in flight, and return their records.

    One loop thread sends every request and reads every stream
    (:mod:`strata_plugin.load.client.slots`); HTTPS or a proxy falls back to a
    thread per request. ``keep_alive`` reuses connections (a server's idle close
    is handled); off, every request has its own connection, as a new user would.
    ``on_token_mark(request_id, t_ns)`` is called as each stream's ``token_mark``-th
    token arrives (the first, by default; from the loop thread; keep it quick).
    """
    shared = concurrency > 1
    hdrs = dict(headers or {})
    if not keep_alive:
        hdrs["Connection"] = "close"

    def after(rec: RequestRecord, before: tuple[float, int, int]) -> RequestRecord:
        if counters is None:
            return rec
        now = counters()
        return replace(rec, proc=ProcDelta(cpu_s=now[0] - before[0],
                                           major_faults=now[1] - before[1],
                                           read_bytes=now[2] - before[2], shared=shared))

    def record(rec: RequestRecord) -> None:
        if on_record:
            on_record(rec)
        if progress:
            progress.add(rec)

    with StreamMux() as mux:
        if not mux.handles(base_url):
            return _run_in_threads(jobs, base_url, api, concurrency, timeouts, hdrs,
                                   counters, after, record)  # token marks: from records
        with requests.Session() as session:
            # Every request is prepared (requests: headers, body, auth) before the clock starts.
            attempts = [Attempt(session, base_url, api, j.spec, 0, timeouts, hdrs) for j in jobs]
            if on_token_mark is not None:
                for a in attempts:
                    a.core.on_token_mark = partial(on_token_mark, a.spec.request_id)
                    a.core.token_mark = token_mark
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            quota0 = own_quota.read(mux.thread_id)
            start_ns = time.monotonic_ns()
            mux.take_stats()  # samples from before the run are not the run's
            work = [(a, None if j.offset_s is None else start_ns + int(j.offset_s * 1e9))
                    for a, j in zip(attempts, jobs, strict=True)]
            records = tuple(run_slots(mux, work, concurrency, on_record=lambda _, r: record(r),
                                      before=counters, after=after))
            loop = mux.take_stats()
            throttling = own_quota.over(quota0, own_quota.read(mux.thread_id))
    end_ns = time.monotonic_ns()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return LoadResult(records, start_ns, end_ns,
                      self_check(records, cpu / max(1e-9, (end_ns - start_ns) / 1e9), loop,
                                 throttling))


def _run_in_threads(
    jobs: Sequence[Job],
    base_url: str,
    api: str,
    concurrency: int,
    timeouts: Timeouts,
    headers: dict[str, str],
    counters: Counters | None,
    after: Callable[[RequestRecord, tuple[float, int, int]], RequestRecord],
    record: Callable[[RequestRecord], None],
) -> LoadResult:
    """HTTPS or a proxy: ``requests`` sends and reads each request in a thread of its own."""
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    start_ns = time.monotonic_ns()
    local = threading.local()

    def one(job: Job) -> RequestRecord:
        if not hasattr(local, "s"):
            local.s = requests.Session()
        if job.offset_s is None:
            scheduled = time.monotonic_ns()
        else:
            scheduled = start_ns + int(job.offset_s * 1e9)
            delay = (scheduled - time.monotonic_ns()) / 1e9
            if delay > 0:
                time.sleep(delay)
        before = counters() if counters else None
        rec = send_streaming(local.s, base_url, api, job.spec, scheduled_ns=scheduled,
                             timeouts=timeouts, headers=headers)
        if before is not None:
            rec = after(rec, before)
        record(rec)
        return rec

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="strata-load") as pool:
        records = tuple(pool.map(one, jobs))
    end_ns = time.monotonic_ns()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return LoadResult(records, start_ns, end_ns,
                      self_check(records, cpu / max(1e-9, (end_ns - start_ns) / 1e9)))


def self_check(records: Sequence[RequestRecord], client_cpu_cores: float,
               loop: LoopStats | None = None,
               throttling: own_quota.Throttling | None = None) -> SelfCheck:
    lateness = [max(0, r.dispatched_ns - r.scheduled_ns) / 1e6 for r in records]
    lags = [max(0, e.handled_ns - e.t_ns) / 1e6 for r in records for e in r.events if e.handled_ns]
    lived_ms = sum(max(0, (r.done_ns or r.dispatched_ns) - r.dispatched_ns) / 1e6
                   for r in records)
    late_p99 = percentile(lateness, 99) if lateness else 0.0
    lag_p99 = percentile(lags, 99) if lags else 0.0
    late_ms = sum(lateness)
    late_share = late_ms / (late_ms + lived_ms) if late_ms else 0.0
    lag_share = sum(lags) / lived_ms if lived_ms else 0.0
    n_late = sum(x > CLIENT_LATENESS_P99_MS for x in lateness)
    n_lag = sum(x > CLIENT_HANDLING_LAG_P99_MS for x in lags)
    reasons = []
    if late_p99 > CLIENT_LATENESS_P99_MS and late_share >= CLIENT_DELAY_SHARE:
        reasons.append(f"dispatch lateness p99 {late_p99:.2f} ms > {CLIENT_LATENESS_P99_MS} ms, "
                       f"{late_share:.1%} of the requests' time ({n_late} of {len(lateness)} "
                       "requests late)")
    # Handling lag (parsed minus read) never moves a stamp: an event is stamped when its
    # read returns. It matters only by delaying the next read, which the loop measures
    # itself (its own lag, the bytes waiting at a read). So with the loop's view it is a
    # figure, not a reason: a host whose other tenants preempt the client between a read
    # and its parse (fault suite under a CPU hog: lag p99 80-136 ms, 9-12% of the streams'
    # time, with the loop's own lag under 9 ms and no backlog) has honest stamps. Without
    # that view (requests in threads) it is the only sign of reads falling behind.
    if (loop is None and lag_p99 > CLIENT_HANDLING_LAG_P99_MS
            and lag_share >= CLIENT_DELAY_SHARE):
        reasons.append(f"event handling lag p99 {lag_p99:.2f} ms > {CLIENT_HANDLING_LAG_P99_MS} "
                       f"ms, {lag_share:.1%} of the streams' time ({n_lag} of {len(lags)} "
                       "events late)")
    if client_cpu_cores > CLIENT_CPU_CORES:
        reasons.append(f"client CPU {client_cpu_cores:.2f} cores > {CLIENT_CPU_CORES}")
    sc = SelfCheck(client_cpu_cores, late_p99, lag_p99, False, (), n_late, n_lag,
                   late_share, lag_share)
    sends = [max(0, r.extra["sent_ns"] - r.scheduled_ns) / 1e6 for r in records
             if isinstance(r.extra.get("sent_ns"), int)]
    send_p99 = percentile(sends, 99) if sends else None
    if send_p99 is not None:
        sent_ms = sum(sends)
        share = sent_ms / (sent_ms + lived_ms) if sent_ms else 0.0
        if send_p99 > CLIENT_TIMING_ERROR_MS and share >= CLIENT_DELAY_SHARE:
            n = sum(x > CLIENT_TIMING_ERROR_MS for x in sends)
            reasons.append(f"send lag (scheduled -> bytes out) p99 {send_p99:.2f} ms > "
                           f"{CLIENT_TIMING_ERROR_MS} ms, {share:.1%} of the requests' time "
                           f"({n} of {len(sends)} requests)")
    if loop is not None and (loop.lag_ns or loop.reads):
        lag, lag_max, own = loop.lag_p99_ms(), loop.lag_max_ms(), loop.own_p99_ms()
        backlog = loop.backlog_p99_bytes()
        figures = (f"loop lag p99 {lag:.2f} ms (its own work {own:.2f} ms; max {lag_max:.1f} ms "
                   f"over {len(loop.lag_ns)} probes), read backlog p99 {backlog} B (max "
                   f"{loop.backlog_max} B over {loop.reads} reads)")
        # As for dispatch lateness: a p99 over ~100 probes is their second largest,
        # and one or two slow rounds in a short window limited nothing (the fault
        # suite's queueing arm: own lag p99 6.5 ms from 2 of 97 probes, 0.09 cores).
        over = loop.own_over_frac(CLIENT_TIMING_ERROR_MS)
        if own > CLIENT_TIMING_ERROR_MS and over >= CLIENT_DELAY_SHARE:
            reasons.append(f"stamps late: {figures}; its own work passed "
                           f"{CLIENT_TIMING_ERROR_MS} ms at {over:.0%} of the probes; the "
                           f"client promises {CLIENT_TIMING_ERROR_MS} ms")
        elif backlog > CLIENT_READ_BACKLOG_BYTES:
            reasons.append(f"reads behind: {figures}; more than "
                           f"{CLIENT_READ_BACKLOG_BYTES} B waiting at a read")
        sc = replace(sc, timing_error_bound_ms=lag, loop_lag_p99_ms=lag,
                     loop_lag_max_ms=lag_max, loop_own_lag_p99_ms=own,
                     read_backlog_p99_bytes=backlog,
                     read_backlog_max_bytes=loop.backlog_max)
    if throttling is not None and throttling.periods:
        late_ms = max(loop.lag_max_ms() if loop is not None else 0.0, send_p99 or 0.0)
        if throttling.frac >= CLIENT_THROTTLED_FRAC and late_ms > CLIENT_TIMING_ERROR_MS:
            reasons.append(f"the client's own CPU quota throttled it in "
                           f"{throttling.throttled} of {throttling.periods} periods "
                           f"({throttling.frac:.0%}; {throttling.where}); the loop or a send "
                           f"ran {late_ms:.1f} ms late")
        sc = replace(sc, own_quota_throttled_frac=throttling.frac)
    return replace(sc, send_lag_p99_ms=send_p99, client_bound=bool(reasons),
                   reasons=tuple(reasons))

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
from dataclasses import dataclass, fields, replace
from functools import partial
from typing import TYPE_CHECKING

import requests

from strata_plugin.analysis.stats import percentile
from strata_plugin.analysis.thresholds import value as threshold_value
from strata_plugin.formats.records import ProcDelta, RequestRecord
from strata_plugin.load import own_quota, pool
from strata_plugin.load.client import RequestSpec, Timeouts, send_streaming
from strata_plugin.load.client.attempt import Attempt
from strata_plugin.load.client.loopstats import LoopStats
from strata_plugin.load.client.mux import StreamMux
from strata_plugin.load.client.slots import run_slots

if TYPE_CHECKING:
    from strata_plugin.load.pool_worker import ShardReport

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
    # Where the load ran (load/pool.py, load/ray_engine.py): how many worker processes
    # and hosts carried it, why, and each one's own check (a dict a line of cases.jsonl
    # holds: process, host, streams, requests, client_cpu_cores, loop lag p99 and its own
    # part, read backlog p99, client_bound, reasons). The figures above are then over
    # every process: loop samples merged (LoopStats.merged), client_cpu_cores the
    # busiest process's (one interpreter lock each), client_cpu_total_cores their sum.
    processes: int = 1
    hosts: int = 1
    engine: str = "loop"  # "loop" | "pool" | "ray" | "threads"
    placement: str = ""  # why this many processes (load/pool.plan)
    per_process: tuple[dict, ...] = ()
    client_cpu_total_cores: float | None = None
    clock_alignment_error_ms: float | None = None  # Ray: the worst actor's offset error
    incomplete: str | None = None  # a worker, actor or node was lost mid-load: why
    # An open loop over workers: the rate its arrivals asked (requests over their span)
    # and the rate they were sent at (dispatches over theirs).
    rate_asked: float | None = None
    rate_achieved: float | None = None


@dataclass(frozen=True)
class LoadResult:
    records: tuple[RequestRecord, ...]
    start_ns: int
    end_ns: int  # when the last request ended (``window_end``): the case's window ends there
    self_check: SelfCheck


def window_end(records: Sequence[RequestRecord], loader_end_ns: int) -> int:
    """The measured window ends when its last request did, not when the loader returned.

    What follows the last request in the loader (its callbacks, closing the loop,
    joining workers, and the collector's first full pass once the loop hands its frozen
    objects back: ``gcpause``) is not the case's time. Counted, it is time with no
    request in flight: late in a whole fault-suite session (run ``s40-fault-2``, the
    process holding every earlier case's records) the loader returned 425 ms after the
    last request of a 1.1 s case ended, its window was 28% empty, and its verdict named
    ``input_starved`` where a relay's delay was the fault (the run before it: 24 ms).
    A request with no end (a timeout, a reset) keeps the loader's own end: when it
    stopped is unknown.
    """
    ends = [r.done_ns for r in records]
    if not ends or any(e is None for e in ends):
        return loader_end_ns
    return min(loader_end_ns, max(e for e in ends if e is not None))


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


@dataclass(frozen=True)
class LoadParams:
    """How one load is sent: where, how many at once, over how many processes, and who
    hears of each record and token mark (:func:`run_load`'s parameters)."""

    base_url: str
    api: str
    concurrency: int  # requests in flight at most
    timeouts: Timeouts
    headers: dict[str, str] | None = None
    counters: Counters | None = None  # the server's /proc, read around each request
    on_record: Callable[[RequestRecord], None] | None = None
    progress: Progress | None = None
    #: ``on_token_mark(request_id, t_ns)`` as each stream's ``token_mark``-th token arrives
    on_token_mark: Callable[[str, int], None] | None = None
    token_mark: int = 1
    keep_alive: bool = False  # reuse connections (off: one per request, as a new user)
    processes: int | str | None = "auto"  # worker processes: "auto" or a number
    streams: int | None = None  # streams expected at once (default: concurrency)

    def common(self) -> dict[str, object]:
        """The keywords every load engine takes (the Ray engine's contract,
        load/ray_engine.run_load_on_ray): all but ``processes`` and ``streams``."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("processes", "streams")}


def run_load(jobs: Sequence[Job], load: LoadParams) -> LoadResult:
    """Send every job, at most ``load.concurrency`` in flight, and return their records.

    One loop thread sends every request and reads every stream
    (:mod:`strata_plugin.load.client.slots`); HTTPS or a proxy falls back to a
    thread per request. ``keep_alive`` reuses connections (a server's idle close
    is handled); off, every request has its own connection, as a new user would.
    ``on_token_mark(request_id, t_ns)`` is called as each stream's ``token_mark``-th
    token arrives (the first, by default; from the loop thread; keep it quick).

    ``processes`` ("auto", the default, or a number) spreads the load over worker
    processes (load/pool.py) when ``streams`` (the streams expected at once; default
    ``concurrency``) are more than one loop keeps exact; records, per-request counters,
    token marks and progress come through the same callbacks (then from this thread).
    """
    base_url, api, timeouts = load.base_url, load.api, load.timeouts
    concurrency, streams, counters = load.concurrency, load.streams, load.counters
    on_token_mark, token_mark = load.on_token_mark, load.token_mark
    shared = concurrency > 1
    # No more streams than jobs (a case's few warm-ups stay on one loop).
    placed = pool.plan(load.processes, min(streams if streams is not None else concurrency,
                                           max(1, len(jobs))))

    hdrs = dict(load.headers or {})
    if not load.keep_alive:
        hdrs["Connection"] = "close"

    def after(rec: RequestRecord, before: tuple[float, int, int]) -> RequestRecord:
        if counters is None:
            return rec
        now = counters()
        return replace(rec, proc=ProcDelta(cpu_s=now[0] - before[0],
                                           major_faults=now[1] - before[1],
                                           read_bytes=now[2] - before[2], shared=shared))

    written: set[str] = set()  # request ids handed to on_record (kept on an interrupt)

    def record(rec: RequestRecord) -> None:
        written.add(rec.request_id)
        if load.on_record:
            load.on_record(rec)
        if load.progress:
            load.progress.add(rec)

    with StreamMux() as mux:
        if not mux.handles(base_url):
            return _run_in_threads(jobs, base_url, api, concurrency, timeouts, hdrs,
                                   counters, after, record)  # token marks: from records
        if placed.processes > 1:  # this loop idles meanwhile
            return _run_in_pool(jobs, base_url, api, concurrency, timeouts, hdrs, counters,
                                record, on_token_mark, token_mark, placed)
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
            try:
                records = tuple(run_slots(mux, work, concurrency,
                                          on_record=lambda _, r: record(r),
                                          before=counters, after=after))
            except KeyboardInterrupt:  # Ctrl-C / SIGTERM: keep what was seen, then stop
                keep_interrupted(mux, attempts, written, record)
                raise
            loop = mux.take_stats()
            throttling = own_quota.over(quota0, own_quota.read(mux.thread_id))
    end_ns = time.monotonic_ns()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    check = self_check(records, cpu / max(1e-9, (end_ns - start_ns) / 1e9), loop, throttling)
    pool.session_capacity().observe(
        [(streams if streams is not None else concurrency, stamps_late(loop))])
    return LoadResult(records, start_ns, window_end(records, end_ns),
                      replace(check, placement=placed.why))


def _run_in_pool(
    jobs: Sequence[Job],
    base_url: str,
    api: str,
    concurrency: int,
    timeouts: Timeouts,
    headers: dict[str, str],
    counters: Counters | None,
    record: Callable[[RequestRecord], None],
    on_token_mark: Callable[[str, int], None] | None,
    token_mark: int,
    placed: pool.Plan,
) -> LoadResult:
    """The load over ``placed.processes`` worker processes (load/pool.py), one self-check
    per process and one over all."""
    if counters is not None and not _pickles(counters):
        counters = None  # a caller's closure: the workers cannot call it
    with pool.ShardedStreamRunner(placed.processes) as runner:
        run = runner.run_sharded(
            [(j.spec, None if j.offset_s is None else int(j.offset_s * 1e9)) for j in jobs],
            base_url, api, concurrency=concurrency, timeouts=timeouts, headers=headers,
            on_record=record, on_token_mark=on_token_mark, token_mark=token_mark,
            counters=counters, shared=concurrency > 1)
    check = sharded_check(run.records, [ShardView.of(s, run.records) for s in run.shards],
                          engine="pool", placement=placed.why,
                          open_loop=any(j.offset_s is not None for j in jobs))
    pool.session_capacity().observe([(v["streams"], v.get("stamps_late_ms"))
                           for v in check.per_process])
    return LoadResult(tuple(run.records), run.start_ns, window_end(run.records, run.end_ns),
                      check)


def _pickles(obj: object) -> bool:
    import pickle

    try:
        pickle.dumps(obj)
    except Exception:
        return False
    return True


@dataclass(frozen=True)
class ShardView:
    """One worker's records and report, for its own self-check."""

    label: str  # "process 0", "actor 2"
    host: str
    streams: int
    records: tuple[RequestRecord, ...]
    report: ShardReport | None
    lost: str | None

    @classmethod
    def of(cls, s: pool.Shard, records: Sequence[RequestRecord], kind: str = "process"
           ) -> ShardView:
        return cls(f"{kind} {s.index}", s.host, s.slots, tuple(records[i] for i in s.jobs),
                   s.report, s.lost)


def open_rate(records: Sequence[RequestRecord]) -> tuple[float | None, float | None]:
    """(asked, achieved) requests/s of an open loop: n-1 over the span of the scheduled
    times, and over the span of the dispatches (requests sent at all)."""
    sched = sorted(r.scheduled_ns for r in records)
    sent = sorted(r.dispatched_ns for r in records if r.dispatched_ns)
    asked = (len(sched) - 1) / ((sched[-1] - sched[0]) / 1e9) if len(sched) > 1 and \
        sched[-1] > sched[0] else None
    got = (len(sent) - 1) / ((sent[-1] - sent[0]) / 1e9) if len(sent) > 1 and \
        sent[-1] > sent[0] else None
    return asked, got


def sharded_check(records: Sequence[RequestRecord], shards: Sequence[ShardView], *,
                  engine: str, placement: str, hosts: int | None = None,
                  clock_error_ms: float | None = None, open_loop: bool = False) -> SelfCheck:
    """The self-check of a load spread over workers: each worker's own (its records, its
    CPU over its wall time, its loop's samples, its cgroup), and one over all of them
    whose loop figures are the merged samples. Client-bound when any worker is: its
    reasons are named ("process 1 (host): ...")."""
    per: list[dict] = []
    loops = LoopStats()
    cpu_total = 0.0
    busiest = 0.0
    reasons: list[str] = []
    lost = []
    for v in shards:
        rep = v.report
        if rep is None:
            per.append({"process": v.label, "host": v.host, "streams": v.streams,
                        "requests": len(v.records), "lost": v.lost, "client_bound": None,
                        "reasons": []})
            lost.append(v.lost if v.lost and v.lost.startswith(v.label) else
                        f"{v.label}{f' ({v.host})' if v.host else ''}: {v.lost}")
            continue
        own = self_check(v.records, rep.cpu_cores, rep.loop, rep.throttling)
        loops = loops.merged(rep.loop)
        cpu_total += rep.cpu_cores
        busiest = max(busiest, rep.cpu_cores)
        name = f"{v.label}{f' ({v.host})' if v.host else ''}"
        reasons.extend(f"{name}: {r}" for r in own.reasons)
        per.append({"process": v.label, "host": v.host, "pid": rep.pid, "streams": v.streams,
                    "requests": len(v.records), "client_cpu_cores": round(rep.cpu_cores, 4),
                    "loop_lag_p99_ms": own.loop_lag_p99_ms,
                    "loop_own_lag_p99_ms": own.loop_own_lag_p99_ms,
                    "read_backlog_p99_bytes": own.read_backlog_p99_bytes,
                    "dispatch_lateness_p99_ms": round(own.dispatch_lateness_p99_ms, 4),
                    "handling_lag_p99_ms": round(own.handling_lag_p99_ms, 4),
                    "stamps_late_ms": stamps_late(rep.loop),
                    "client_bound": own.client_bound, "reasons": list(own.reasons),
                    "lost": v.lost, **getattr(rep, "extra", {})})
        if v.lost:
            lost.append(f"{name}: {v.lost}")
    whole = self_check(records, busiest, loops if (loops.lag_ns or loops.reads) else None)
    all_reasons = tuple(dict.fromkeys((*whole.reasons, *reasons)))
    n_hosts = hosts if hosts is not None else len({v.host for v in shards if v.host}) or 1
    asked, got = open_rate(records) if open_loop else (None, None)
    return replace(whole, rate_asked=asked, rate_achieved=got,
                   client_bound=bool(all_reasons), reasons=all_reasons,
                   processes=len(shards), hosts=n_hosts, engine=engine, placement=placement,
                   per_process=tuple(per), client_cpu_total_cores=round(cpu_total, 4),
                   clock_alignment_error_ms=clock_error_ms,
                   incomplete="; ".join(lost) or None)


def keep_interrupted(mux: StreamMux, attempts: Sequence[Attempt], written: set[str],
                     record: Callable[[RequestRecord], None]) -> None:
    """The loop stopped at once; every request that was sent and not yet recorded is
    recorded: the ones in flight with the error class ``interrupted`` and the events they
    had received, the ones that had just ended as they ended. Requests never sent are
    not requests the server saw, and are left out."""
    mux.interrupt()  # joins the loop: nothing touches the attempts after this
    for a in attempts:
        if a.dispatched_ns and a.spec.request_id not in written:
            record(a.record())


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
    return LoadResult(records, start_ns, window_end(records, end_ns),
                      replace(self_check(records, cpu / max(1e-9, (end_ns - start_ns) / 1e9)),
                              engine="threads"))


def stamps_late(loop: LoopStats | None) -> float | None:
    """The loop's own lag p99 (ms) when it flags the stamps late (as :func:`self_check`
    does: over the promised error at CLIENT_DELAY_SHARE of the probes), else None."""
    if loop is None or not loop.own_ns:
        return None
    own = loop.own_p99_ms()
    if own > CLIENT_TIMING_ERROR_MS and loop.own_over_frac(CLIENT_TIMING_ERROR_MS) >= \
            CLIENT_DELAY_SHARE:
        return own
    return None


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

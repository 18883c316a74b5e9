"""A case's streams spread over worker processes, and when to do it.

One Python process stamps every event under one interpreter lock: past a few hundred
streams its loop falls behind the bytes (docs/client.md, "Capacity"). The pool runs the
same loop (:mod:`strata_plugin.load.pool_worker`) in several processes: worker ``w``
gets every ``n``-th job and its share of the in-flight slots, sends its records back as
they finish, then its loop's own samples (the self-check's LoopStats), its CPU and its
cgroup's throttling. ``CLOCK_MONOTONIC`` is one clock for every process of a host, so
every worker's stamps sit on the caller's timeline unchanged, and an open loop's
scheduled times (absolute, on that clock) stay exact: the arrivals are dealt out, not
re-timed, so the offered rate is the sum over the workers.

When: :func:`plan` (``[load] processes = "auto"``, the default) from two measured
figures, the streams one loop keeps within the client's promised timing error and what
the session's self-checks saw since (:class:`Capacity`), at most one process per usable
CPU. A number forces it (1: one loop).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path

from strata_plugin.analysis.thresholds import value as threshold_value
from strata_plugin.formats.records import RequestError, RequestRecord
from strata_plugin.load.client.loopstats import LoopStats
from strata_plugin.load.client.spec import RequestSpec, Timeouts
from strata_plugin.load.pool_worker import Batch, ShardReport
from strata_plugin.process_globals import STATE

#: The older API's job: (spec, scheduled_ns on CLOCK_MONOTONIC); <= 0: as soon as a slot frees.
Job = tuple[RequestSpec, int]
#: A run's job: (spec, ns after the run's start; None: as soon as a slot frees).
OffsetJob = tuple[RequestSpec, "int | None"]

#: Streams one loop is given before the pool is used. Measured with the closed-loop
#: capacity benchmark (benchmarks/test_client_capacity.py -k closed_loop; docs/client.md,
#: "Capacity"; 50 events/s a stream, the emitter on the same 2 cores): one loop's
#: handling-delay p99 was 1.1-1.4 ms at 256 streams and 1.8-2.3 ms at 512 on a quiet
#: host, but 4.9 ms at 256 and 37.8 ms at 512 while another session's llama-server shared
#: the host: 256 is the most streams at which one loop kept the client's promised 5 ms
#: (client_timing_error_ms) on a busy host. Also each process's share in the pool.
STREAMS_PER_LOOP = 256
#: A process whose own loop lag p99 passed the promised timing error at ``s`` streams
#: teaches the session that a loop holds at most ``s * LEARN_FACTOR`` on this host.
LEARN_FACTOR = 0.5
MIN_STREAMS_PER_LOOP = 16
CLIENT_TIMING_ERROR_MS = threshold_value("client_timing_error_ms")
#: How long a worker process may take to import and report ready (a cold start on a
#: busy 2-core host: ~1 s here).
READY_TIMEOUT_S = 60.0
#: How long a Ctrl-C waits for the workers' records of their requests in flight.
INTERRUPT_GRACE_S = 3.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # where strata_plugin is importable
_MODULE = "strata_plugin.load.pool_worker"


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Capacity:
    """Streams one loop keeps exact on this host: the measured default, lowered by what
    the session's self-checks show (a process whose own loop lag p99 passed the promised
    timing error at its share of the streams)."""

    def __init__(self, streams: int = STREAMS_PER_LOOP) -> None:
        self.streams = streams
        self.why = (f"{streams} streams a loop (measured: docs/client.md, Capacity)")
        self._lock = threading.Lock()

    def observe(self, shares: Sequence[tuple[int, float | None]]) -> None:
        """``(streams, own loop lag p99 ms if the self-check found the stamps late, else
        None)`` of each process of a finished load."""
        for streams, own in shares:
            if own is None or streams < 2:
                continue
            learned = max(MIN_STREAMS_PER_LOOP, int(streams * LEARN_FACTOR))
            with self._lock:
                if learned < self.streams:
                    self.streams = learned
                    self.why = (f"{learned} streams a loop (learned: a loop at {streams} "
                                f"streams had its own lag p99 {own:.1f} ms > "
                                f"{CLIENT_TIMING_ERROR_MS} ms)")


def session_capacity() -> Capacity:
    """The session's (this process's) capacity: what the self-checks taught it so far
    (``process_globals.STATE.loop_capacity``, made on first use)."""
    if STATE.loop_capacity is None:
        STATE.loop_capacity = Capacity()
    return STATE.loop_capacity


@dataclass(frozen=True)
class Plan:
    processes: int
    why: str


def plan(setting: int | str | None, streams: int, capacity: Capacity | None = None,
         cpus: int | None = None) -> Plan:
    """How many processes carry ``streams`` concurrent streams.

    ``setting``: a number forces it (1: one loop); "auto" or None: one loop up to the
    capacity, else one process per capacity's worth, at most one per usable CPU.
    """
    if isinstance(setting, int) and not isinstance(setting, bool):
        if setting < 1:
            raise ValueError(f"[load] processes: expected \"auto\" or a number >= 1, got {setting}")
        return Plan(min(setting, max(1, streams)), f"processes = {setting} (forced)")
    if setting not in (None, "auto"):
        raise ValueError(f"[load] processes: expected \"auto\" or a number >= 1, "
                         f"got {setting!r}")
    # Looked up at call time, not bound as a default: the session's capacity may be
    # replaced (a fresh one per test) after this module is imported.
    cap = session_capacity() if capacity is None else capacity
    cpus = usable_cpus() if cpus is None else cpus
    per = cap.streams
    if streams <= per or cpus < 2:
        return Plan(1, f"auto: {streams} streams on one loop ({cap.why}"
                       f"{'; one usable CPU' if cpus < 2 and streams > per else ''})")
    n = min(cpus, math.ceil(streams / per))
    return Plan(n, f"auto: {streams} streams > {cap.why}: {n} processes "
                   f"(at most one per usable CPU, {cpus})")


def deal(n_jobs: int, concurrency: int, processes: int) -> tuple[list[list[int]], list[int]]:
    """Job indices and in-flight slots of each of ``processes`` workers: every n-th job
    (arrivals keep their own times), the slots shared as evenly as integers allow."""
    n = max(1, min(processes, concurrency))
    shares = [concurrency // n + (1 if w < concurrency % n else 0) for w in range(n)]
    return [list(range(w, n_jobs, n)) for w in range(n)], shares


@dataclass(frozen=True)
class Shard:
    """One worker's part of a run: which jobs, how many slots, what it reported."""

    index: int
    jobs: tuple[int, ...]
    slots: int
    report: ShardReport | None  # None: it died or never answered
    lost: str | None = None  # why its unfinished requests are errors
    host: str = ""


@dataclass(frozen=True)
class PoolRun:
    records: list[RequestRecord]
    shards: tuple[Shard, ...]
    start_ns: int  # the start every worker was given (open-loop offsets count from it)
    end_ns: int


class ShardedStreamRunner:
    """Worker processes kept alive across runs (start-up ~0.2-1 s a process; started
    together, and the run's clock starts only when all have reported ready)."""

    def __init__(self, processes: int) -> None:
        if processes < 1:
            raise ValueError("processes must be >= 1")
        self.processes = processes
        self._workers: list[tuple[subprocess.Popen[bytes], Connection]] = []
        self.hosts: list[str] = []
        #: The workers' loop lag and read backlog during the last ``run``, merged.
        self.loop_stats = LoopStats()

    def __enter__(self) -> ShardedStreamRunner:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
        try:
            for _ in range(self.processes):
                ours, theirs = socket.socketpair()
                proc = subprocess.Popen(
                    [sys.executable, "-m", _MODULE, str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)
                theirs.close()
                self._workers.append((proc, Connection(ours.detach())))
            for proc, conn in self._workers:
                if not conn.poll(READY_TIMEOUT_S):
                    raise RuntimeError(f"load worker process {proc.pid} did not start within "
                                       f"{READY_TIMEOUT_S:.0f} s")
                msg = conn.recv()
                if not (isinstance(msg, tuple) and msg[0] == "ready"):
                    raise RuntimeError(f"load worker process {proc.pid}: unexpected {msg!r}")
                self.hosts.append(str(msg[2]))
        except (EOFError, OSError) as e:
            self.__exit__()
            raise RuntimeError(f"a load worker process failed to start: {e}") from e
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        failed = bool(exc and exc[0] is not None)  # Ctrl-C, an error: mid-batch workers
        for proc, conn in self._workers:          # would not read the stop: end them now
            with contextlib.suppress(OSError):
                conn.send(None)
            if failed:
                proc.kill()
        for proc, conn in self._workers:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            conn.close()
        self._workers = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p, _ in self._workers]

    def cpu_s(self) -> float:
        """CPU seconds the live workers have used so far (Linux /proc; 0 elsewhere)."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for proc, _ in self._workers:
            try:
                with open(f"/proc/{proc.pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            except (OSError, IndexError, ValueError):
                continue
        return total

    def run(
        self,
        jobs: Sequence[Job],
        base_url: str,
        api: str,
        *,
        concurrency: int,
        timeouts: Timeouts = Timeouts(),
        headers: Mapping[str, str] | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
    ) -> list[RequestRecord]:
        """Records in job order (the older API: absolute times; ``run_sharded`` gives the
        shards too)."""
        return self.run_sharded([(s, t if t > 0 else None) for s, t in jobs], base_url, api,
                                concurrency=concurrency, timeouts=timeouts, headers=headers,
                                on_record=on_record, absolute=True).records

    def run_sharded(
        self,
        jobs: Sequence[OffsetJob],
        base_url: str,
        api: str,
        *,
        concurrency: int,
        timeouts: Timeouts = Timeouts(),
        headers: Mapping[str, str] | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
        on_token_mark: Callable[[str, int], None] | None = None,
        token_mark: int = 1,
        counters: Callable[[], tuple[float, int, int]] | None = None,
        shared: bool = True,
        absolute: bool = False,
    ) -> PoolRun:
        """Send every job, ``concurrency`` in flight over the workers.

        Every worker prepares its requests first; the clock starts when all have
        (``PoolRun.start_ns``), and a job's offset counts from there (``absolute``: the
        offsets are CLOCK_MONOTONIC times). ``on_record`` and ``on_token_mark`` run in
        this thread as the workers' messages arrive. ``counters`` must pickle (it runs in
        the workers, around each request). A worker that dies leaves ``client`` error
        records, naming it, for its unfinished jobs.
        """
        if not self._workers:
            raise RuntimeError("use ShardedStreamRunner as a context manager")
        parts, shares = deal(len(jobs), concurrency, len(self._workers))
        hdrs = dict(headers or {})
        self.loop_stats = LoopStats()
        live: dict[Connection, int] = {}
        reports: dict[int, ShardReport] = {}
        lost: dict[int, str] = {}
        for w, idx in enumerate(parts):
            proc, conn = self._workers[w]
            batch = Batch([jobs[i] for i in idx], base_url, api, shares[w], timeouts, hdrs,
                          token_mark if on_token_mark is not None else None, counters, shared)
            try:
                conn.send(batch)
            except OSError as e:
                lost[w] = f"load worker process {proc.pid} could not take its jobs: {e}"
                continue
            live[conn] = w
        out: list[RequestRecord | None] = [None] * len(jobs)
        self._await_prepared(live, lost)
        start_ns = time.monotonic_ns()
        for conn in list(live):
            try:
                conn.send(("go", 0 if absolute else start_ns))
            except OSError as e:
                w = live.pop(conn)
                lost[w] = f"load worker process {self._workers[w][0].pid} went away: {e}"
        try:
            self._collect(live, parts, out, reports, lost, on_record, on_token_mark)
        except KeyboardInterrupt:  # Ctrl-C / SIGTERM: the workers keep what they saw
            self._interrupt(live, parts, out, reports, lost, on_record)
            raise
        records = []
        for i, rec in enumerate(out):
            if rec is None:
                w = i % len(parts)
                rec = lost_record(jobs[i], api, lost.get(w, "the worker running this request "
                                                          "sent no record"),
                                  0 if absolute else start_ns)
                if on_record is not None:
                    on_record(rec)
            records.append(rec)
        shards = tuple(Shard(w, tuple(idx), shares[w], reports.get(w), lost.get(w),
                             self.hosts[w] if w < len(self.hosts) else "")
                       for w, idx in enumerate(parts))
        return PoolRun(records, shards, start_ns, time.monotonic_ns())

    def _interrupt(self, live: dict[Connection, int], parts: list[list[int]],
                   out: list[RequestRecord | None], reports: dict[int, ShardReport],
                   lost: dict[int, str], on_record: Callable[[RequestRecord], None] | None
                   ) -> None:
        """Stop every live worker (SIGINT: each records its requests in flight as
        ``interrupted``) and take their last records, for at most INTERRUPT_GRACE_S."""
        for w in live.values():
            with contextlib.suppress(OSError):
                os.kill(self._workers[w][0].pid, signal.SIGINT)
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        while live and time.monotonic() < deadline:
            with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: still bounded
                self._collect(live, parts, out, reports, lost, on_record, None,
                              until=deadline)

    def _collect(self, live: dict[Connection, int], parts: list[list[int]],
                 out: list[RequestRecord | None], reports: dict[int, ShardReport],
                 lost: dict[int, str], on_record: Callable[[RequestRecord], None] | None,
                 on_token_mark: Callable[[str, int], None] | None,
                 until: float | None = None) -> None:
        """Take the workers' messages until every one is done or lost (or ``until``)."""
        while live and (until is None or time.monotonic() < until):
            ready = wait(list(live), timeout=1.0)
            if not ready:
                for gone, w in list(live.items()):
                    proc = self._workers[w][0]
                    if proc.poll() is not None:
                        lost[w] = (f"load worker process {proc.pid} exited "
                                   f"({proc.returncode}) mid-case")
                        del live[gone]
                continue
            for conn in ready:
                assert isinstance(conn, Connection)
                w = live[conn]
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    proc = self._workers[w][0]
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=1)
                    lost[w] = (f"load worker process {proc.pid} died mid-case "
                               f"(exit {proc.returncode})")
                    del live[conn]
                    continue
                if msg == "done":
                    del live[conn]
                elif msg[0] == "recs":
                    for local_i, rec in msg[1]:
                        out[parts[w][local_i]] = rec
                        if on_record is not None:
                            on_record(rec)
                elif msg[0] == "mark":
                    if on_token_mark is not None:
                        on_token_mark(msg[1], msg[2])
                elif msg[0] == "stats":
                    reports[w] = msg[1]
                    self.loop_stats = self.loop_stats.merged(msg[1].loop)

    def _await_prepared(self, live: dict[Connection, int], lost: dict[int, str]) -> None:
        """Wait until every live worker has prepared its requests (or died)."""
        waiting = dict(live)
        while waiting:
            for conn in wait(list(waiting), timeout=READY_TIMEOUT_S) or list(waiting):
                assert isinstance(conn, Connection)
                w = waiting.pop(conn)
                try:
                    ok = conn.poll(0) and conn.recv() == ("prepared",)
                except (EOFError, OSError):
                    ok = False
                if not ok:
                    lost[w] = (f"load worker process {self._workers[w][0].pid} did not "
                               "prepare its requests")
                    del live[conn]


def lost_record(job: OffsetJob, api: str, reason: str, start_ns: int = 0) -> RequestRecord:
    """A request whose worker went away before its record came: a ``client`` error."""
    spec, off = job
    return RequestRecord(
        request_id=spec.request_id, case_id=spec.case_id, phase=spec.phase, api=api,
        scheduled_ns=time.monotonic_ns() if off is None else start_ns + off, dispatched_ns=0,
        error=RequestError("client", reason), isl=spec.isl, osl=spec.max_tokens)


def default_processes(concurrency: int) -> int:
    """One process per STREAMS_PER_LOOP streams, at most one per usable CPU (the
    benchmarks' pool size; :func:`plan` is what a run uses)."""
    return max(1, min(usable_cpus(), math.ceil(concurrency / STREAMS_PER_LOOP)))


def run_streams(
    jobs: Sequence[Job],
    base_url: str,
    api: str,
    *,
    concurrency: int,
    processes: int | None = None,
    timeouts: Timeouts = Timeouts(),
    headers: Mapping[str, str] | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> list[RequestRecord]:
    """Send every job over ``processes`` workers (started and stopped here); records in order."""
    n = processes if processes is not None else default_processes(concurrency)
    with ShardedStreamRunner(min(n, max(1, concurrency))) as runner:
        return runner.run(jobs, base_url, api, concurrency=concurrency, timeouts=timeouts,
                          headers=headers, on_record=on_record)

"""One pool worker: its share of a case's streams on one StreamMux loop, and what it saw.

The same function runs in a worker process of the local pool
(:mod:`strata_plugin.load.pool`, started as ``python -m strata_plugin.load.pool_worker FD``:
a plain subprocess, so the parent's ``__main__`` is never re-imported and no threaded
parent is forked) and in a Ray actor (:mod:`strata_plugin.load.ray_engine`). Either way
the worker runs :func:`run_batch` and hands messages to an ``emit`` callable:

* ``("prepared",)`` once every request is prepared (headers, body: before the clock
  starts, as one loop does); the worker then waits for the parent's go, which names the
  start on the worker's own clock (an open loop's arrivals are offsets from it);
* ``("recs", [(index, RequestRecord), ...])`` as requests finish (every FLUSH_S);
* ``("mark", request_id, t_ns)`` when a stream's ``token_mark``-th token arrives (from the
  loop thread, at once: the mixed A/B's injection clock waits on it);
* ``("stats", ShardReport)``: the loop's own lag and backlog samples (LoopStats, the same
  samples one loop's self-check reads), the worker's CPU seconds, its cgroup's
  throttling, over the batch;
* ``"done"``.

On SIGINT (Ctrl-C at the terminal, or the parent stopping the run) a worker keeps what
was seen, as one loop does: its requests in flight are recorded with the error class
``interrupted`` and the events they received, sent, then ``"done"``, and it exits.

The process worker's FD is its end of a socketpair carrying pickled messages: it sends
``("ready", pid, host)`` once imported, then takes batches until it reads ``None``.
"""

from __future__ import annotations

import gc
import os
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

import requests

from strata_plugin.formats.records import ProcDelta, RequestRecord
from strata_plugin.load import own_quota
from strata_plugin.load.client.attempt import Attempt
from strata_plugin.load.client.loopstats import LoopStats
from strata_plugin.load.client.mux import StreamMux
from strata_plugin.load.client.send import send_streaming
from strata_plugin.load.client.slots import run_slots
from strata_plugin.load.client.spec import RequestSpec, Timeouts

#: How often a worker sends its finished records back.
FLUSH_S = 0.25

#: Records pickled per message. One ``pickle.dumps`` holds the GIL from start to end,
#: so a whole flush in one message (up to ~10k token events when hundreds of
#: streams end together) held the loop off for tens of ms.
SEND_RECORDS = 4

#: (spec, when to send it: ns after the start the parent names; None: as soon as a slot
#: frees, a closed loop)
Job = tuple[RequestSpec, "int | None"]
Emit = Callable[[Any], None]
WaitGo = Callable[[], int]  # blocks until the parent says go; the start, on this clock


@dataclass(frozen=True)
class Batch:
    """What one worker runs: its jobs and slots, and how to report."""

    jobs: list[Job]
    base_url: str
    api: str
    slots: int
    timeouts: Timeouts
    headers: dict[str, str]
    token_mark: int | None = None  # emit a "mark" at this token of each stream
    #: Per-request server counters, read in this worker around each request; a
    #: picklable callable (agent/procfs.TreeCounters) or None.
    counters: Callable[[], tuple[float, int, int]] | None = None
    shared: bool = True  # ProcDelta.shared: other requests were in flight


@dataclass(frozen=True)
class ShardReport:
    """One worker over one batch: its loop's samples, its CPU, where it ran."""

    loop: LoopStats
    cpu_s: float
    start_ns: int  # this worker's CLOCK_MONOTONIC
    end_ns: int
    throttling: own_quota.Throttling | None = None
    pid: int = 0
    host: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cpu_cores(self) -> float:
        return self.cpu_s / max(1e-9, (self.end_ns - self.start_ns) / 1e9)


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_batch(emit: Emit, mux: StreamMux, b: Batch, wait_go: WaitGo) -> None:
    """``b.slots`` requests in flight, in order, each sent when its time has come.

    The mux's loop sends and reads them all (``run_slots``); the calling thread only
    ships the finished records every FLUSH_S, then the loop's samples, then "done".
    """
    lock = threading.Lock()
    finished: list[tuple[int, RequestRecord]] = []
    written: set[int] = set()  # indices recorded (kept on an interrupt)

    def on_record(i: int, rec: RequestRecord) -> None:
        with lock:
            finished.append((i, rec))
            written.add(i)

    def flush() -> None:
        with lock:
            batch = finished[:]
            finished.clear()
        for i in range(0, len(batch), SEND_RECORDS):
            emit(("recs", batch[i:i + SEND_RECORDS]))

    counters = b.counters

    def after(rec: RequestRecord, before: tuple[float, int, int]) -> RequestRecord:
        assert counters is not None
        now = counters()
        return replace(rec, proc=ProcDelta(cpu_s=now[0] - before[0],
                                           major_faults=now[1] - before[1],
                                           read_bytes=now[2] - before[2], shared=b.shared))

    with requests.Session() as session:
        if not mux.handles(b.base_url, session):
            emit(("prepared",))
            base = _until(wait_go())
            cpu0, quota0, start_ns = _cpu_s(), own_quota.read(mux.thread_id), time.monotonic_ns()
            for i, (spec, off) in enumerate(b.jobs):  # HTTPS: one by one, in this thread
                at = time.monotonic_ns() if off is None else base + off
                if off is not None and (wait := (at - time.monotonic_ns()) / 1e9) > 0:
                    time.sleep(wait)
                on_record(i, send_streaming(session, b.base_url, b.api, spec, scheduled_ns=at,
                                            timeouts=b.timeouts, headers=b.headers))
                flush()
        else:
            attempts = [Attempt(session, b.base_url, b.api, spec, 0, b.timeouts, b.headers)
                        for spec, _ in b.jobs]
            if b.token_mark is not None:
                for a in attempts:
                    a.core.on_token_mark = partial(_mark, emit, a.spec.request_id)
                    a.core.token_mark = b.token_mark
            emit(("prepared",))
            base = _until(wait_go())
            cpu0, quota0, start_ns = _cpu_s(), own_quota.read(mux.thread_id), time.monotonic_ns()
            work = [(a, None if off is None else base + off)
                    for a, (_, off) in zip(attempts, b.jobs, strict=True)]
            mux.take_stats()  # samples from before the batch are not the batch's
            try:
                run_slots(mux, work, b.slots, on_record=on_record, tick_s=FLUSH_S,
                          on_tick=flush, before=counters,
                          after=after if counters is not None else None)
            except KeyboardInterrupt:  # Ctrl-C, or the parent's SIGINT: keep what was seen
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                mux.interrupt()  # in-flight requests: class "interrupted", their events kept
                for i, a in enumerate(attempts):
                    if a.dispatched_ns and i not in written:
                        on_record(i, a.record())
                flush()
                emit("done")
                raise
    flush()
    end_ns = time.monotonic_ns()
    emit(("stats", ShardReport(mux.take_stats(), _cpu_s() - cpu0, start_ns, end_ns,
                               own_quota.over(quota0, own_quota.read(mux.thread_id)),
                               os.getpid(), socket.gethostname())))
    emit("done")


def _until(start_ns: int) -> int:
    """Wait for the start the parent named (a Ray driver names one a little ahead, so
    that every actor has its go before it); a closed loop starts there too."""
    while (left := (start_ns - time.monotonic_ns()) / 1e9) > 0:
        time.sleep(left)
    return start_ns


def _mark(emit: Emit, request_id: str, t_ns: int) -> None:
    emit(("mark", request_id, t_ns))


def serve(conn: Connection) -> None:
    """Run each batch the parent sends until it sends None or goes away."""
    # Keep the collector off the imports; records leave every FLUSH_S, so the
    # heap it scans stays small. Shorter GIL slices: while this thread pickles
    # and ships a batch, the loop gets the GIL back within 0.5 ms instead of 5.
    gc.freeze()
    sys.setswitchinterval(0.0005)
    # The parent stops a batch with SIGINT (load/pool.py), whatever this process inherited:
    # a harness started in the background of a script (`pytest ... &`) has SIGINT ignored,
    # and its workers with it, so a SIGTERM to the run (which the harness turns into
    # Ctrl-C) reached no worker and their requests in flight went unrecorded.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    send_lock = threading.Lock()

    def emit(msg: Any) -> None:  # the loop thread (marks) and this one (records) both send
        with send_lock:
            conn.send(msg)

    with StreamMux() as mux:
        emit(("ready", os.getpid(), socket.gethostname()))
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return
            if msg is None:
                return
            try:
                run_batch(emit, mux, msg, lambda: int(conn.recv()[1]))
            except (OSError, EOFError, KeyboardInterrupt):
                return  # the parent went away, or stopped the run


if __name__ == "__main__":
    # Through the module's own name, so what it pickles (ShardReport) names that module,
    # not __main__.
    from strata_plugin.load import pool_worker

    pool_worker.serve(Connection(int(sys.argv[1])))

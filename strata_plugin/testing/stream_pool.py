"""Spread streams over worker processes so stamping keeps up at high concurrency.

One Python process stamps every event under one GIL. Each worker process
(:mod:`strata_plugin.testing.stream_worker`) runs its share of the streams on
one :class:`StreamMux` loop (which sends every request and reads every body; no
thread per request) and sends its RequestRecords back through a socketpair as
they complete, then its loop's lag and backlog samples (``loop_stats``).
``CLOCK_MONOTONIC`` is shared by all processes, so the stamps of every worker
sit on one timeline.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path

from strata_plugin.formats.records import RequestError, RequestRecord
from strata_plugin.load.client.loopstats import LoopStats
from strata_plugin.load.client.spec import RequestSpec, Timeouts

Job = tuple[RequestSpec, int]  # (spec, scheduled_ns); scheduled_ns <= 0: as soon as a slot frees

#: Streams one worker process is given before another process is started.
STREAMS_PER_PROCESS = 128
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # where strata_plugin is importable


def default_processes(concurrency: int) -> int:
    """One process per STREAMS_PER_PROCESS streams, at most one per CPU."""
    return max(1, min(os.cpu_count() or 1, math.ceil(concurrency / STREAMS_PER_PROCESS)))


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
    """Send every job, ``concurrency`` in flight over ``processes`` workers; records in job order.

    A closed loop: worker ``w`` gets every ``processes``-th job and its share
    of the concurrency, and starts a job when one of its slots is free and the
    job's ``scheduled_ns`` has come.
    """
    n = processes if processes is not None else default_processes(concurrency)
    with ShardedStreamRunner(min(n, max(1, concurrency))) as runner:
        return runner.run(
            jobs,
            base_url,
            api,
            concurrency=concurrency,
            timeouts=timeouts,
            headers=headers,
            on_record=on_record,
        )


class ShardedStreamRunner:
    """Worker processes kept alive across runs (start-up costs ~0.2 s a process)."""

    def __init__(self, processes: int) -> None:
        if processes < 1:
            raise ValueError("processes must be >= 1")
        self.processes = processes
        self._workers: list[tuple[subprocess.Popen[bytes], Connection]] = []
        #: The workers' loop lag and read backlog during the last ``run``, merged.
        self.loop_stats = LoopStats()

    def __enter__(self) -> ShardedStreamRunner:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p
        )
        try:
            for _ in range(self.processes):
                ours, theirs = socket.socketpair()
                proc = subprocess.Popen(
                    [sys.executable, "-m", "strata_plugin.testing.stream_worker",
                     str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    env=env,
                )
                theirs.close()
                self._workers.append((proc, Connection(ours.detach())))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for _, conn in self._workers:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc, conn in self._workers:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            conn.close()
        self._workers = []

    def cpu_s(self) -> float:
        """CPU seconds the live workers have used so far (Linux /proc; 0 elsewhere).

        For the client self-check: the workers' CPU is not in this process's rusage.
        """
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
        if not self._workers:
            raise RuntimeError("use ShardedStreamRunner as a context manager")
        n = min(len(self._workers), max(1, concurrency))
        shares = [concurrency // n + (1 if w < concurrency % n else 0) for w in range(n)]
        hdrs = dict(headers or {})
        self.loop_stats = LoopStats()
        live: dict[Connection, list[int]] = {}
        for w in range(n):
            _, conn = self._workers[w]
            idx = list(range(w, len(jobs), n))
            try:
                conn.send(([jobs[i] for i in idx], base_url, api, shares[w], timeouts, hdrs))
            except OSError:
                continue  # a dead worker: its jobs come back as errors
            live[conn] = idx
        out: list[RequestRecord | None] = [None] * len(jobs)
        while live:
            for conn in wait(list(live)):
                idx = live[conn]
                try:
                    msg = conn.recv()
                except (EOFError, OSError):  # the worker died: its missing records are errors
                    del live[conn]
                    continue
                if msg == "done":
                    del live[conn]
                    continue
                if isinstance(msg, tuple) and msg[0] == "stats":
                    self.loop_stats = self.loop_stats.merged(msg[1])
                    continue
                for local_i, rec in msg:
                    out[idx[local_i]] = rec
                    if on_record is not None:
                        on_record(rec)
        return [rec if rec is not None else _lost(jobs[i], api) for i, rec in enumerate(out)]


def _lost(job: Job, api: str) -> RequestRecord:
    spec, scheduled = job
    return RequestRecord(
        request_id=spec.request_id,
        case_id=spec.case_id,
        phase=spec.phase,
        api=api,
        scheduled_ns=scheduled,
        dispatched_ns=0,
        error=RequestError("client", "the worker process running this request died"),
        isl=spec.isl,
        osl=spec.max_tokens,
    )

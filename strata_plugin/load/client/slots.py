"""A closed loop driven by the mux itself: at most ``slots`` requests in flight.

When a request ends, its callback (in the loop thread) starts the next one at
once: no thread is woken to send it, so opening new streams never competes with
reading the open ones. A request with a scheduled time (an open loop) waits on
the loop's timer heap, not in a sleeping thread. Records reach the caller's
thread through a queue, where ``on_record`` runs (file writes, progress lines
stay out of the loop).

Every request also has a deadline, derived from its timeouts
(:func:`request_bound_s`) plus :data:`DEADLINE_SLACK_S`: the loop ends each request
well before it (a timeout, a record), so only a client bug that loses a request can
reach it. Then the caller's thread records it as a ``client`` error naming the
deadline and gives its slot to the next request, so no bug can make a run wait forever.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from strata_plugin.formats.records import RequestRecord
from strata_plugin.load.client import fdtable
from strata_plugin.load.client.attempt import Attempt
from strata_plugin.load.client.errors import StreamError
from strata_plugin.load.client.mux import (  # noqa: F401 (EXTRA_EVENTS: part of this API)
    DEADLINE_SLACK_S,
    EXTRA_EVENTS,
    StreamMux,
    deadline_message,
    request_bound_s,
)

#: Hooks run in the loop thread around each request (per-request counters):
#: ``before()`` just before it is sent, ``after(record, before_value)`` as it ends.
Before = Callable[[], Any]
After = Callable[[RequestRecord, Any], RequestRecord]


def run_slots(
    mux: StreamMux,
    attempts: Sequence[tuple[Attempt, int | None]],
    slots: int,
    *,
    on_record: Callable[[int, RequestRecord], None] | None = None,
    on_tick: Callable[[], None] | None = None,
    tick_s: float = 0.25,
    before: Before | None = None,
    after: After | None = None,
    slack_s: float = DEADLINE_SLACK_S,
) -> list[RequestRecord]:
    """Run every ``(attempt, scheduled_ns)`` in order, ``slots`` at a time; records in order.

    ``scheduled_ns`` None: the request is sent as soon as a slot takes it (and
    that is its scheduled time); otherwise not before ``scheduled_ns``.
    ``on_record(index, record)`` and ``on_tick()`` run in the calling thread.
    A request whose record has not come ``request_bound_s + slack_s`` after it was
    due to start is recorded as a ``client`` error naming that deadline.
    """
    run = _SlotRun(mux, attempts, before, after, slack_s)
    n = len(attempts)
    fdtable.reserve(min(max(1, slots), n))  # the ramp never waits for the kernel's file table
    for _ in range(min(max(1, slots), n)):
        run.start_next()
    out: list[RequestRecord | None] = [None] * n

    def take() -> None:
        for i, rec in run.take():
            out[i] = rec
            if on_record is not None:
                on_record(i, rec)
        if on_tick is not None:
            on_tick()

    if n == 0:
        run.all_done.set()
    while not run.all_done.wait(tick_s):
        take()
        run.expire(time.monotonic_ns())
        if not mux.running:  # the loop died without finishing them (a bug)
            break
    take()
    for i, rec in enumerate(out):
        if rec is None:
            a = attempts[i][0]
            a.error = StreamError("client", "the stream multiplexer stopped")
            out[i] = a.record()
    return [r for r in out if r is not None]


class _SlotRun:
    """The state of one ``run_slots`` call, shared by the loop and the caller.

    An object rather than closures that call each other: those made a reference
    cycle that kept the whole run's attempts alive until a full collection
    (which the loop holds off while it measures, :mod:`gcpause`).
    """

    def __init__(
        self,
        mux: StreamMux,
        attempts: Sequence[tuple[Attempt, int | None]],
        before: Before | None,
        after: After | None,
        slack_s: float = DEADLINE_SLACK_S,
    ) -> None:
        self.mux, self.attempts = mux, attempts
        self.slack_s = slack_s
        self.deadlines: list[tuple[int, int]] = []  # (deadline_ns, index) of submitted ones
        self.over = bytearray(len(attempts))  # 1: its record is in (a second one is dropped)
        self.before, self.after = before, after
        self.n = len(attempts)
        self.finished: list[tuple[int, RequestRecord]] = []  # by the loop, for the caller
        self.all_done = threading.Event()
        self.lock = threading.Lock()
        self.cursor = iter(range(self.n))
        self.counted: dict[int, Any] = {}  # before() values of requests in flight
        self.ended = 0

    def take(self) -> list[tuple[int, RequestRecord]]:
        with self.lock:
            batch, self.finished = self.finished, []
        return batch

    def _put(self, i: int, rec: RequestRecord) -> bool:
        """Keep ``rec`` as request ``i``'s record (under the lock); False if it has one."""
        if self.over[i]:
            return False
        self.over[i] = 1
        self.finished.append((i, rec))
        self.ended += 1
        if self.ended == self.n:
            self.all_done.set()
        return True

    def start_next(self) -> None:
        while True:  # a loop, not recursion: refused requests are recorded here
            with self.lock:
                i = next(self.cursor, None)
            if i is None:
                return
            a, at = self.attempts[i]
            if at is not None:
                a.scheduled_ns = at
            on_done = _OnDone(self, i, a)
            now = time.monotonic_ns()
            bound_s = request_bound_s(a.t, a.spec.max_tokens) + self.slack_s
            with self.lock:
                heapq.heappush(self.deadlines, (max(now, at or now) + int(bound_s * 1e9), i))
            try:
                if self.mux.submit(a, on_done, at_ns=at, on_start=_OnStart(self, a, at)):
                    return
            except Exception as e:  # a client bug: a record, and the slot goes on
                a.error = StreamError("client", f"submit: {type(e).__name__}: {e}")
            rec = a.record()
            with self.lock:
                self._put(i, rec)

    def expire(self, now: int) -> None:
        """Record every request past its deadline as a ``client`` error and start the next
        in its slot (the caller's thread; only a request the loop lost gets here)."""
        late = []
        with self.lock:
            while self.deadlines and self.deadlines[0][0] <= now:
                _, i = heapq.heappop(self.deadlines)
                if not self.over[i]:
                    late.append(i)
        for i in late:
            a = self.attempts[i][0]
            bound_s = request_bound_s(a.t, a.spec.max_tokens)
            a.error = StreamError("client", deadline_message(bound_s, self.slack_s))
            rec = a.record()  # never raises; the loop may still hold the attempt
            self.counted.pop(id(a), None)
            with self.lock:
                fresh = self._put(i, rec)
            if fresh:
                self.start_next()

    def started(self, a: Attempt, at: int | None) -> None:
        if at is None:
            a.scheduled_ns = time.monotonic_ns()
        if self.before is not None:
            self.counted[id(a)] = self.before()

    def done(self, i: int, a: Attempt, rec: RequestRecord) -> None:
        if self.after is not None and id(a) in self.counted:
            try:
                rec = self.after(rec, self.counted.pop(id(a)))
            except Exception:
                pass
        with self.lock:
            fresh = self._put(i, rec)
        if fresh:  # not a late record of a request already given up on
            self.start_next()


class _OnStart:
    __slots__ = ("a", "at", "run")

    def __init__(self, run: _SlotRun, a: Attempt, at: int | None) -> None:
        self.run, self.a, self.at = run, a, at

    def __call__(self) -> None:
        self.run.started(self.a, self.at)


class _OnDone:
    __slots__ = ("a", "i", "run")

    def __init__(self, run: _SlotRun, i: int, a: Attempt) -> None:
        self.run, self.i, self.a = run, i, a

    def __call__(self, rec: RequestRecord) -> None:
        self.run.done(self.i, self.a, rec)

"""A closed loop driven by the mux itself: at most ``slots`` requests in flight.

When a request ends, its callback (in the loop thread) starts the next one at
once: no thread is woken to send it, so opening new streams never competes with
reading the open ones. A request with a scheduled time (an open loop) waits on
the loop's timer heap, not in a sleeping thread. Records reach the caller's
thread through a queue, where ``on_record`` runs (file writes, progress lines
stay out of the loop).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from strata_plugin.formats.records import RequestRecord
from strata_plugin.load.client.attempt import Attempt
from strata_plugin.load.client.errors import StreamError
from strata_plugin.load.client.mux import StreamMux

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
) -> list[RequestRecord]:
    """Run every ``(attempt, scheduled_ns)`` in order, ``slots`` at a time; records in order.

    ``scheduled_ns`` None: the request is sent as soon as a slot takes it (and
    that is its scheduled time); otherwise not before ``scheduled_ns``.
    ``on_record(index, record)`` and ``on_tick()`` run in the calling thread.
    """
    n = len(attempts)
    out: list[RequestRecord | None] = [None] * n
    finished: list[tuple[int, RequestRecord]] = []  # appended by the loop, taken by the caller
    all_done = threading.Event()
    lock = threading.Lock()
    cursor = iter(range(n))
    counted: dict[int, Any] = {}  # before() values of requests in flight
    ended = [0]

    def put(i: int, rec: RequestRecord) -> None:
        finished.append((i, rec))
        ended[0] += 1
        if ended[0] == n:
            all_done.set()

    def start_next() -> None:
        while True:  # a loop, not recursion: refused requests are recorded here
            with lock:
                i = next(cursor, None)
            if i is None:
                return
            a, at = attempts[i]
            if at is not None:
                a.scheduled_ns = at
            if mux.submit(a, _done(i, a, at), at_ns=at, on_start=_start(a, at)):
                return
            with lock:
                put(i, a.record())

    def _start(a: Attempt, at: int | None) -> Callable[[], None]:
        def on_start() -> None:
            if at is None:
                a.scheduled_ns = time.monotonic_ns()
            if before is not None:
                counted[id(a)] = before()

        return on_start

    def _done(i: int, a: Attempt, at: int | None) -> Callable[[RequestRecord], None]:
        def on_done(rec: RequestRecord) -> None:
            if after is not None and id(a) in counted:
                try:
                    rec = after(rec, counted.pop(id(a)))
                except Exception:
                    pass
            with lock:
                put(i, rec)
            start_next()

        return on_done

    for _ in range(min(max(1, slots), n)):
        start_next()

    def take() -> None:
        with lock:
            batch, finished[:] = finished[:], []
        for i, rec in batch:
            out[i] = rec
            if on_record is not None:
                on_record(i, rec)
        if on_tick is not None:
            on_tick()

    if n == 0:
        all_done.set()
    while not all_done.wait(tick_s):
        take()
        if not mux.running:  # the loop died without finishing them (a bug)
            break
    take()
    for i, rec in enumerate(out):
        if rec is None:
            a = attempts[i][0]
            a.error = StreamError("client", "the stream multiplexer stopped")
            out[i] = a.record()
    return [r for r in out if r is not None]

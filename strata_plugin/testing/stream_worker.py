"""A pool worker process: runs batches of streams on one StreamMux loop, sends records back.

Started by :class:`strata_plugin.testing.stream_pool.ShardedStreamRunner` as
``python -m strata_plugin.testing.stream_worker FD`` (a plain subprocess, so the
parent's ``__main__`` is never re-imported and no threaded parent is forked).
FD is its end of a socketpair carrying pickled messages: a batch in, lists of
``(index, RequestRecord)`` out as they finish, then ``("stats", LoopStats)`` and
``"done"``; ``None`` stops it.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import requests

from strata_plugin.formats.records import RequestRecord
from strata_plugin.load.client.attempt import Attempt
from strata_plugin.load.client.mux import StreamMux
from strata_plugin.load.client.send import send_streaming
from strata_plugin.load.client.slots import run_slots
from strata_plugin.load.client.spec import RequestSpec, Timeouts

#: How often a worker sends its finished records back.
FLUSH_S = 0.25

#: Records pickled per message. One ``pickle.dumps`` holds the GIL from start to end,
#: so a whole flush in one message (up to ~10k token events when hundreds of
#: streams end together) held the loop off for tens of ms.
_SEND_RECORDS = 4

Job = tuple[RequestSpec, int]


def serve(conn: Connection) -> None:
    """Run each batch the parent sends until it sends None or goes away."""
    # Keep the collector off the imports; records leave every FLUSH_S, so the
    # heap it scans stays small. Shorter GIL slices: while this thread pickles
    # and ships a batch, the loop gets the GIL back within 0.5 ms instead of 5.
    gc.freeze()
    sys.setswitchinterval(0.0005)
    with StreamMux() as mux:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return
            if msg is None:
                return
            run_batch(conn, mux, *msg)


def run_batch(
    conn: Connection,
    mux: StreamMux,
    jobs: list[Job],
    base_url: str,
    api: str,
    slots: int,
    timeouts: Timeouts,
    headers: dict[str, str],
) -> None:
    """``slots`` requests in flight, in order, each sent when its time has come.

    The mux's loop sends and reads them all (``run_slots``); this thread only
    ships the finished records back every FLUSH_S, then the loop's own lag and
    backlog samples, then ``"done"``.
    """
    lock = threading.Lock()
    finished: list[tuple[int, RequestRecord]] = []

    def on_record(i: int, rec: RequestRecord) -> None:
        with lock:
            finished.append((i, rec))

    with requests.Session() as session:
        if not mux.handles(base_url, session):
            for i, (spec, scheduled) in enumerate(jobs):  # HTTPS: one by one, in this thread
                at = scheduled if scheduled > 0 else time.monotonic_ns()
                on_record(i, send_streaming(session, base_url, api, spec, scheduled_ns=at,
                                            timeouts=timeouts, headers=headers))
                _flush(conn, lock, finished)
        else:
            work = [(Attempt(session, base_url, api, spec, 0, timeouts, headers),
                     scheduled if scheduled > 0 else None) for spec, scheduled in jobs]
            mux.take_stats()
            run_slots(mux, work, slots, on_record=on_record, tick_s=FLUSH_S,
                      on_tick=lambda: _flush(conn, lock, finished))
    _flush(conn, lock, finished)
    conn.send(("stats", mux.take_stats()))
    conn.send("done")


def _flush(conn: Connection, lock: threading.Lock, finished: list[tuple[int, Any]]) -> None:
    with lock:
        batch = finished[:]
        finished.clear()
    for i in range(0, len(batch), _SEND_RECORDS):
        conn.send(batch[i:i + _SEND_RECORDS])


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))

"""A pool worker process: runs batches of streams with a StreamMux, sends records back.

Started by :class:`strata_plugin.testing.stream_pool.ShardedStreamRunner` as
``python -m strata_plugin.testing.stream_worker FD`` (a plain subprocess, so the
parent's ``__main__`` is never re-imported and no threaded parent is forked).
FD is its end of a socketpair carrying pickled messages: a batch in, lists of
``(index, RequestRecord)`` out as they finish, then ``"done"``; ``None`` stops it.
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
from strata_plugin.load.client.mux import StreamMux
from strata_plugin.load.client.spec import RequestSpec, Timeouts

#: How often a worker sends its finished records back.
FLUSH_S = 0.25

Job = tuple[RequestSpec, int]


def serve(conn: Connection) -> None:
    """Run each batch the parent sends until it sends None or goes away."""
    # Keep the collector off the imports; records leave every FLUSH_S, so the
    # heap it scans stays small. Shorter GIL slices: when request threads are
    # busy (sending, building records), the reading loop gets the GIL back
    # within 0.5 ms instead of 5.
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
    """``slots`` threads take jobs in order; each sends when its job's time has come."""
    lock = threading.Lock()
    cursor = iter(enumerate(jobs))
    finished: list[tuple[int, RequestRecord]] = []

    def slot() -> None:
        with requests.Session() as session:
            while True:
                with lock:
                    item = next(cursor, None)
                if item is None:
                    return
                i, (spec, scheduled) = item
                if scheduled <= 0:
                    scheduled = time.monotonic_ns()
                else:
                    delay = (scheduled - time.monotonic_ns()) / 1e9
                    if delay > 0:
                        time.sleep(delay)
                rec = mux.send_streaming(
                    session,
                    base_url,
                    api,
                    spec,
                    scheduled_ns=scheduled,
                    timeouts=timeouts,
                    headers=headers,
                )
                with lock:
                    finished.append((i, rec))

    threads = [
        threading.Thread(target=slot, name=f"strata-slot-{k}", daemon=True)
        for k in range(max(1, slots))
    ]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(FLUSH_S)
            _flush(conn, lock, finished)
    _flush(conn, lock, finished)
    conn.send("done")


def _flush(conn: Connection, lock: threading.Lock, finished: list[tuple[int, Any]]) -> None:
    with lock:
        batch = finished[:]
        finished.clear()
    if batch:
        conn.send(batch)


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))

"""The pool's worker loop as a Ray actor: one per bundle of the placement group.

Ray imports this module in the actor's worker process by name, so the actor class
never travels by value: the nodes need ``strata_plugin`` installed (the same package
as the driver), or ``[load] ship_package = true`` for Ray's own runtime_env to carry
it. The actor runs :func:`strata_plugin.load.pool_worker.run_batch` in a thread; its
messages wait in a queue that the driver drains with :meth:`LoadActor.poll` (the
driver calls it again as soon as it answers: a long poll, so records, token marks and
the loop's samples come as they are made). ``clock`` answers the driver's round trips
for the offset of this host's CLOCK_MONOTONIC to the driver's.
"""

from __future__ import annotations

import gc
import os
import queue
import socket
import sys
import threading
import time
from typing import Any

from strata_plugin.load.client.mux import StreamMux
from strata_plugin.load.pool_worker import Batch, run_batch


class LoadActor:
    """One worker loop on one Ray node (wrapped by ``ray.remote`` in load/ray_engine.py)."""

    def __init__(self) -> None:
        gc.freeze()
        sys.setswitchinterval(0.0005)  # as the process worker: the loop gets the GIL back
        self.mux = StreamMux().__enter__()
        self.out: queue.Queue[Any] = queue.Queue()
        self.go_ns: int | None = None
        self.went = threading.Event()
        self.thread: threading.Thread | None = None

    def where(self) -> dict[str, Any]:
        try:
            import ray

            ip = ray.util.get_node_ip_address()
            node = ray.get_runtime_context().get_node_id()
        except Exception:  # (a figure for the report, never a failure)
            ip, node = "", ""
        return {"host": socket.gethostname(), "ip": ip, "node_id": node, "pid": os.getpid()}

    def clock(self) -> int:
        return time.monotonic_ns()

    def start(self, batch: Batch) -> None:
        """Prepare the batch's requests in a thread; it waits for :meth:`go`."""
        self.went.clear()
        self.thread = threading.Thread(target=self._run, args=(batch,), daemon=True,
                                       name="strata-ray-batch")
        self.thread.start()

    def _run(self, batch: Batch) -> None:
        try:
            run_batch(self.out.put, self.mux, batch, self._wait_go)
        except BaseException as e:  # (the driver must hear of it, not hang)
            self.out.put(("error", f"{type(e).__name__}: {e}"))
            self.out.put("done")

    def _wait_go(self) -> int:
        self.went.wait()
        assert self.go_ns is not None
        return self.go_ns

    def go(self, start_ns: int) -> None:
        """Start: open-loop offsets count from ``start_ns`` (this host's clock)."""
        self.go_ns = start_ns
        self.went.set()

    def poll(self, wait_s: float = 0.25) -> list[Any]:
        """Every message so far; waits up to ``wait_s`` for the first."""
        msgs: list[Any] = []
        try:
            msgs.append(self.out.get(timeout=wait_s))
        except queue.Empty:
            return msgs
        while True:
            try:
                msgs.append(self.out.get_nowait())
            except queue.Empty:
                return msgs

    def interrupt(self) -> None:
        """Stop the batch now (the driver's Ctrl-C): its requests in flight end with the
        error class ``interrupted`` and the events they had; the batch thread then sends
        what it has and "done" (requests never sent come as ``client`` errors with
        ``dispatched_ns`` 0, which the driver leaves out)."""
        self.mux.interrupt()

    def close(self) -> None:
        self.mux.close()

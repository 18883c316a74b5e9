"""Many streams, one reader thread: a selector loop over every response body.

With a thread per stream, every event wakes a thread and passes the GIL
around; at a few hundred streams that costs ~100 us of CPU per event and the
GIL queue shows up as client lateness. Here the caller's thread only sends
the request and waits for the headers (with requests, as in
:func:`send_streaming`), then hands the socket to one loop thread that
``recv``s whatever is available from every ready socket, stamps it, undoes
the chunked framing and feeds the same :class:`StreamCore`. The caller's
thread sleeps until its stream ends, so it wakes twice per request, not once
per event.

Plain-HTTP bodies that are chunked or close-delimited are multiplexed; TLS
and Content-Length bodies are read in the caller's thread as before.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import requests

from strata_plugin.formats.records import RequestRecord
from strata_plugin.load.client.attempt import Attempt
from strata_plugin.load.client.chunked import ChunkedDecoder, ChunkError
from strata_plugin.load.client.core import StreamCore
from strata_plugin.load.client.errors import StreamError
from strata_plugin.load.client.reader import DRAIN_BYTES, DRAIN_S, READ_SIZE, socket_of
from strata_plugin.load.client.send import read_here
from strata_plugin.load.client.spec import RequestSpec, Timeouts

_NS = 1_000_000_000


class _Body:
    """One response body while the loop owns its socket."""

    __slots__ = (
        "attempt",
        "core",
        "deadline_ns",
        "decoder",
        "drain_until",
        "drained",
        "error",
        "finished",
        "last_ns",
        "over",
        "pre",
        "read_ns",
        "record",
        "resp",
        "reusable",
        "sock",
        "timeout0",
    )

    def __init__(
        self,
        sock: socket.socket,
        core: StreamCore,
        decoder: ChunkedDecoder | None,
        read_s: float,
        deadline_ns: int | None,
        pre: tuple[bytes, int],
    ) -> None:
        self.sock = sock
        self.core = core
        self.decoder = decoder
        self.read_ns = int(read_s * _NS)
        self.deadline_ns = deadline_ns
        self.pre = pre
        self.last_ns = pre[1]
        self.drain_until: int | None = None
        self.drained = 0
        self.timeout0: float | None = None
        self.error: StreamError | None = None
        self.reusable = False
        self.over = False  # the loop is done with it (finished is set a little later)
        self.finished = threading.Event()
        self.attempt: Attempt | None = None
        self.resp: requests.Response | None = None
        self.record: RequestRecord | None = None  # made by the loop as the stream ends

    def due(self) -> int:
        due = self.last_ns + self.read_ns
        if self.deadline_ns is not None and self.drain_until is None:
            due = min(due, self.deadline_ns)
        if self.drain_until is not None:
            due = min(due, self.drain_until)
        return due


class StreamMux:
    """A reader thread for many concurrent streams; use as a context manager.

    ``send_streaming`` has the signature and the guarantees of the module-level
    :func:`strata_plugin.load.client.send_streaming` and may be called from any
    number of threads at once.
    """

    def __init__(self, on_first_token: Callable[[str, int], None] | None = None) -> None:
        #: Called with (request id, arrival ns) when a stream's first token arrives, from
        #: whichever thread reads it (this loop, or the caller's for a stream read in
        #: place): lets a caller act on the load's state (an injection placed in
        #: steady-state decode) while it runs. It must be quick and must not raise.
        self.on_first_token = on_first_token
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._incoming: collections.deque[_Body] = collections.deque()
        self._heap: list[tuple[int, int, _Body]] = []
        self._seq = itertools.count()
        self._closing = False
        self._lock = threading.Lock()  # orders "closing" against handing a body in
        self._ended: list[_Body] = []  # over, their callers not woken yet
        self._thread = threading.Thread(target=self._loop, name="strata-mux", daemon=True)

    def __enter__(self) -> StreamMux:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the loop; streams still open end with a ``client`` error."""
        with self._lock:
            self._closing = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._wake_r.close()
        self._wake_w.close()
        self._sel.close()

    def send_streaming(
        self,
        session: requests.Session,
        base_url: str,
        api: str,
        spec: RequestSpec,
        *,
        scheduled_ns: int,
        timeouts: Timeouts = Timeouts(),
        headers: Mapping[str, str] | None = None,
    ) -> RequestRecord:
        a = Attempt(session, base_url, api, spec, scheduled_ns, timeouts, headers)
        if self.on_first_token is not None:
            cb, rid = self.on_first_token, spec.request_id
            a.core.on_first_token = lambda t_ns: cb(rid, t_ns)
        resp = a.open()
        if resp is None:
            return a.record()
        if self._closing or not self._thread.is_alive():
            read_here(a, resp)
            return a.record()
        body = _attach(resp, a)
        if body is None:
            read_here(a, resp)
            return a.record()
        with self._lock:
            closed = self._closing
            if not closed:
                self._incoming.append(body)
        if closed:
            body.error = StreamError("client", "the stream multiplexer was closed")
        else:
            self._wake()
            # The loop always finishes a body, even when it dies of a bug
            # (_loop); the liveness check is a second guard against a hang.
            while not body.finished.wait(1.0):
                if not self._thread.is_alive():
                    body.error = StreamError("client", "the stream multiplexer stopped")
                    break
            if body.record is not None:
                return body.record
        if body.error is not None:
            a.error = body.error
        _hand_back(resp, body)
        return a.record()

    # --- the loop thread ---------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake is pending) or closed
            self._wake_w.send(b"w")

    def _loop(self) -> None:
        try:
            self._run()
        except BaseException as e:  # a bug here must not leave callers waiting
            with self._lock:
                self._closing = True
            self._shut(f"the stream multiplexer failed: {type(e).__name__}: {e}")
            raise

    def _run(self) -> None:
        sel = self._sel
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        heap = self._heap
        while True:
            timeout = None
            if heap:
                timeout = max(0.0, (heap[0][0] - time.monotonic_ns()) / _NS)
            # Read and stamp every ready socket first, then parse: a stamp is
            # not delayed by the parsing of the sockets read before it.
            reads, admit = [], False
            for key, _ in sel.select(timeout):
                body = key.data
                if body is None:
                    admit = True
                else:
                    data = self._recv(body)
                    if data is not None:
                        reads.append((body, data, time.monotonic_ns()))
            for body, data, t in reads:
                self._take(body, data, t)
            if admit:
                self._admit()
            if heap and heap[0][0] <= time.monotonic_ns():
                self._expire()
            self._wake_callers()
            if self._closing:
                self._shut("the stream multiplexer was closed")
                return

    def _admit(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        while self._incoming:
            body = self._incoming.popleft()
            data, t = body.pre
            if data:
                self._take(body, data, t)
            if body.over:
                continue
            try:
                self._sel.register(body.sock, selectors.EVENT_READ, body)
            except (OSError, ValueError) as e:
                self._finish(body, StreamError("client", f"cannot watch the socket: {e}"))
                continue
            heapq.heappush(self._heap, (body.due(), next(self._seq), body))

    def _recv(self, body: _Body) -> bytes | None:
        """What one ``recv`` got (b"" at EOF), or None if nothing or the stream ended."""
        try:
            return body.sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as e:
            if body.core.done:
                self._finish(body, None)
            else:
                msg = f"connection error mid-stream: {type(e).__name__}: {e}"
                self._finish(body, StreamError("reset", msg))
            return None

    def _take(self, body: _Body, data: bytes, now: int) -> None:
        """Bytes (or EOF, when empty) that arrived at ``now``."""
        if body.over:
            return
        core, dec = body.core, body.decoder
        try:
            if not data:
                if dec is not None and not dec.complete and not core.done:
                    raise StreamError("reset", "connection closed before the body's last chunk")
                if dec is None:
                    core.end_of_body(now)
                self._finish(body, None)
                return
            chunk = dec.feed(data) if dec is not None else data
            body.last_ns = now
            if core.done:
                body.drained += len(chunk)
            if chunk:
                core.feed(chunk, now)
            if dec is not None and dec.complete:
                core.end_of_body(now)
                body.reusable = dec.extra == 0
                self._finish(body, None)
            elif core.done:
                if dec is None or body.drained > DRAIN_BYTES:
                    self._finish(body, None)  # nothing to reuse, or a long tail: stop here
                elif body.drain_until is None:
                    body.drain_until = now + int(DRAIN_S * _NS)
        except ChunkError as e:
            self._finish(body, StreamError("reset", f"broken chunked framing: {e}"))
        except StreamError as e:
            self._finish(body, e)
        except Exception as e:  # a client bug must still come back as a record
            self._finish(body, StreamError("client", f"{type(e).__name__}: {e}"))

    def _expire(self) -> None:
        heap, now = self._heap, time.monotonic_ns()
        while heap and heap[0][0] <= now:
            _, _, body = heapq.heappop(heap)
            if body.over:
                continue
            due = body.due()
            if due > now:
                heapq.heappush(heap, (due, next(self._seq), body))
            elif body.core.done:
                self._finish(body, None)  # the tail after the terminal event never came
            elif body.deadline_ns is not None and now >= body.deadline_ns:
                self._finish(body, StreamError("timeout", "the request ran past total_s"))
            else:
                secs = body.read_ns / _NS
                self._finish(body, StreamError("timeout", f"no data for read_s={secs:g} s"))

    def _finish(self, body: _Body, error: StreamError | None) -> None:
        if body.over:
            return
        body.over = True
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(body.sock)
        body.error = error
        if error is not None:
            body.reusable = False
        # Close the request here, not in the caller's thread: when hundreds of
        # streams end together, their callers then only pick up a record
        # instead of contending for the GIL with this loop.
        a, resp = body.attempt, body.resp
        if a is not None and resp is not None:
            try:
                if error is not None:
                    a.error = error
                _hand_back(resp, body)
                body.record = a.record()
            except Exception:  # the caller retries both and gets the error
                body.record = None
        self._ended.append(body)
        # Finished bodies leave the heap lazily (when their deadline comes up);
        # compact it so thousands of short requests cannot pile up in it.
        heap = self._heap
        if len(heap) > 64 and len(heap) > 2 * len(self._sel.get_map() or ()):
            heap[:] = [e for e in heap if not e[2].over]
            heapq.heapify(heap)

    def _wake_callers(self) -> None:
        """Wake the callers of ended streams once this round of reads is parsed:
        woken earlier, they would contend for the GIL with the rest of the round."""
        ended, self._ended = self._ended, []
        for body in ended:
            body.finished.set()

    def _shut(self, why: str) -> None:
        with self._lock:
            pending = list(self._incoming)
            self._incoming.clear()
        for body in pending + [b for _, _, b in self._heap]:
            self._finish(body, StreamError("client", why))
        self._heap.clear()
        self._wake_callers()


def _attach(resp: requests.Response, a: Attempt) -> _Body | None:
    """Take over the socket of a response whose body the loop can read, else None."""
    raw = resp.raw
    hr: Any = getattr(raw, "_fp", None)  # the http.client response
    sock = socket_of(raw)
    if sock is None or isinstance(sock, ssl.SSLSocket) or hr is None or hr.fp is None:
        return None
    chunked = bool(getattr(hr, "chunked", False))
    if not chunked and getattr(hr, "length", None) is not None:
        return None
    if raw.headers.get("content-encoding", "identity").lower() != "identity":
        return None
    # Body bytes that came in with the headers sit in http.client's buffer:
    # take them (non-blocking, so an empty buffer returns b"").
    timeout0 = sock.gettimeout()
    sock.setblocking(False)
    try:
        pre = hr.fp.read1(READ_SIZE) or b""
    except OSError:
        pre = b""
    body = _Body(
        sock,
        a.core,
        ChunkedDecoder() if chunked else None,
        a.t.read_s,
        a.deadline_ns,
        (pre, time.monotonic_ns()),
    )
    body.timeout0 = timeout0
    body.attempt, body.resp = a, resp
    return body


def _hand_back(resp: requests.Response, body: _Body) -> None:
    """Return a cleanly ended connection to the pool; close any other."""
    if body.reusable:
        try:
            body.sock.settimeout(body.timeout0)  # blocking again, as urllib3 left it
            resp.raw._fp._close_conn()  # http.client: this response is finished
            resp.raw.release_conn()
            return
        except Exception:  # could not hand it back cleanly: close it instead
            pass
    resp.close()

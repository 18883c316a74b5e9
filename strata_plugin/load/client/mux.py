"""Many streams, one thread: a non-blocking loop that sends every request and reads every body.

A thread per request (even one that only sends and waits for headers) competes
for the GIL with the thread that reads: at a few hundred streams, opening new
streams while others stream made the reads late by tens of ms. Here one loop
does everything: each request is prepared by ``requests`` (the same headers,
body and auth as ``Session.send``), and the loop connects a non-blocking
socket, writes the request's bytes, reads the head and the body of every
stream as its socket becomes readable, stamps each read when it returns, undoes
the chunked framing and feeds the same :class:`StreamCore` (sseclient parses
the events). Every wait is a timer on one heap, so a stalled server is a
recorded timeout, never a hang.

Callers either ``submit`` (the callback runs in the loop thread; what the load
generator and the pool workers do: no thread per request) or call
``send_streaming`` from any thread, which submits and sleeps until its record
is made. HTTPS and proxied URLs are sent by ``requests`` in the caller's thread
instead (:func:`strata_plugin.load.client.send.send_streaming`).

The loop also watches itself (:mod:`strata_plugin.load.client.loopstats`): how
late a periodic timer fires, and how many bytes wait in a socket when it is
read; ``take_stats`` hands these to the client self-check.

Keep-alive: a connection whose response ended cleanly, with neither side
asking to close, goes back to an idle pool per host and port. A pooled
connection is checked before reuse (a server's idle close has usually arrived
as EOF), and a request whose reused connection closes before any response byte
is sent again once on a fresh connection, so an idle close never fails a request.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import heapq
import itertools
import os
import selectors
import socket
import termios
import threading
import time
from collections.abc import Callable, Mapping

import requests

from strata_plugin.formats.records import RequestRecord
from strata_plugin.limits import EXTRA_EVENTS
from strata_plugin.load.client import gcpause
from strata_plugin.load.client.attempt import Attempt
from strata_plugin.load.client.chunked import ChunkedDecoder, ChunkError
from strata_plugin.load.client.errors import StreamError
from strata_plugin.load.client.http1 import (
    Head,
    HeadError,
    Target,
    head_problem,
    parse_head,
    request_bytes,
    target_of,
)
from strata_plugin.load.client.loopstats import PROBE_S, LoopProbe, LoopStats
from strata_plugin.load.client.reader import DRAIN_BYTES, DRAIN_S, NO_BODY, READ_SIZE
from strata_plugin.load.client.send import send_streaming as send_in_thread
from strata_plugin.load.client.spec import RequestSpec, Timeouts

_NS = 1_000_000_000
_PROBE_NS = int(PROBE_S * _NS)
_ERROR_BODY_BYTES = 64 * 1024
ERROR_BODY_S = 5.0  # how long the start of a non-2xx body is read, at most
_ERROR_BODY_NS = int(ERROR_BODY_S * _NS)
#: Added to a request's bound before the caller gives up on the loop's record: the
#: loop's own rounds (it admits 16 requests a round), a slow ``on_record`` in the
#: caller, a host that preempts the client for a while. A backstop, far from any
#: timeout a working request meets first.
DEADLINE_SLACK_S = 5.0
#: Without ``total_s`` only ``read_s`` bounds a stream, between any two reads; a working
#: server's stream is then taken to need at most ``read_s`` per requested token plus
#: EXTRA_EVENTS more (the role chunk, usage, the terminal event, pings: limits.py).


def request_bound_s(t: Timeouts, max_tokens: int) -> float:
    """The longest one request can take in the loop while the client works.

    Two connects (a reused connection that closed is retried once on a fresh one), the
    wait for the head, then ``total_s`` (or, without it, ``read_s`` per token and
    :data:`EXTRA_EVENTS` more), then the longer of the drain after the terminal event
    and the read of a non-2xx body.
    """
    body = t.total_s if t.total_s is not None else t.read_s * (max_tokens + EXTRA_EVENTS)
    return 2 * t.connect_s + t.read_s + body + max(DRAIN_S, ERROR_BODY_S)


_FIONREAD = termios.FIONREAD  # == SIOCINQ on a TCP socket
_ZERO4 = bytes(4)
_BACKLOG_EVERY = 7  # bytes waiting are asked for at one read in 8
#: Requests started (connected and sent) per loop round at most; the rest wait for the
#: next round, after the sockets ready by then are read. A closed loop's ramp submits
#: every stream at once: started in one round, 512 connects and sends (~0.1 ms each)
#: held the reads of the streams already open for ~50 ms.
ADMIT_PER_ROUND = 16

_WAIT, _CONNECT, _SEND, _HEAD, _BODY, _ERRBODY = range(6)

Done = Callable[[RequestRecord], None]


class _Probe:
    """The heap entry of the loop's lag probe."""

    __slots__ = ()


_PROBE = _Probe()


class _Req:
    """One request while the loop owns it."""

    __slots__ = (
        "a",
        "addr",
        "at_ns",
        "decoder",
        "drain_until",
        "drained",
        "err_body",
        "err_until",
        "head",
        "head_ns",
        "heap_due",
        "inbuf",
        "keep_alive",
        "last_ns",
        "left",
        "on_done",
        "on_start",
        "out",
        "over",
        "phase",
        "read_ns",
        "retried",
        "reusable",
        "reused",
        "sock",
        "target",
        "wire",
    )

    def __init__(
        self,
        a: Attempt,
        target: Target,
        addr: tuple,
        on_done: Done,
        on_start: Callable[[], None] | None,
        at_ns: int | None,
        keep_alive: bool,
    ) -> None:
        self.a = a
        self.target = target
        self.addr = addr
        self.wire = request_bytes(a.prep, target)
        self.on_done = on_done
        self.on_start = on_start
        self.at_ns = at_ns
        self.keep_alive = keep_alive
        self.phase = _WAIT
        self.sock: socket.socket | None = None
        self.out = memoryview(b"")
        self.inbuf = b""
        self.head: Head | None = None
        self.decoder: ChunkedDecoder | None = None
        self.left: int | None = None  # Content-Length bytes still to come
        self.read_ns = int(a.t.read_s * _NS)
        t = a.t
        self.head_ns = int((t.read_s if t.total_s is None else min(t.read_s, t.total_s)) * _NS)
        self.last_ns = 0
        self.drain_until: int | None = None
        self.drained = 0
        self.err_body: list[bytes] = []
        self.err_until = 0
        self.reused = False
        self.retried = False
        self.reusable = False
        self.over = False
        self.heap_due = 0

    def due(self) -> int:
        """When this request's current wait runs out."""
        ph = self.phase
        if ph == _WAIT:
            return self.at_ns or 0
        if ph == _CONNECT:
            return self.a.dispatched_ns + int(self.a.t.connect_s * _NS)
        if ph == _ERRBODY:
            return self.err_until
        if ph in (_SEND, _HEAD):
            due = self.last_ns + self.head_ns
        else:
            due = self.last_ns + self.read_ns
            if self.drain_until is not None:
                return min(due, self.drain_until)
        dl = self.a.deadline_ns
        return due if dl is None else min(due, dl)


class StreamMux:
    """The loop thread for many concurrent streams; use as a context manager.

    ``send_streaming`` has the signature and the guarantees of the module-level
    :func:`strata_plugin.load.client.send_streaming` and may be called from any
    number of threads at once; ``submit`` is its callback form.
    """

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._incoming: collections.deque[_Req] = collections.deque()
        self._heap: list[tuple[int, int, _Req | _Probe]] = []
        self._seq = itertools.count()
        self._closing = False
        self._lock = threading.Lock()  # orders "closing" against handing a request in
        self._ended: list[tuple[_Req, RequestRecord]] = []  # their callbacks not run yet
        self._idle: dict[tuple[str, int], list[socket.socket]] = {}
        self._addrs: dict[tuple[str, int], tuple] = {}
        self._live = 0  # requests the loop owns
        self._t_enter = self._t_ret = 0  # the last select call and its return
        self._cpu_ret = 0  # the loop thread's CPU time when select returned
        self._cpu_busy = 0  # its CPU in the round before select, when the probe was overdue
        self._nread = 0
        self._probe_due = 0  # when the lag probe fires next; 0: not armed (nothing in flight)
        self._gc_held = False  # this loop holds the collector's full passes off (gcpause)
        self._shut_cls = "client"  # the error class of requests open when it stops
        self.probe = LoopProbe()
        self._thread = threading.Thread(target=self._loop, name="strata-mux", daemon=True)

    def __enter__(self) -> StreamMux:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def interrupt(self) -> None:
        """Stop now (Ctrl-C, SIGTERM): the requests still open end with the error class
        ``interrupted`` and the events they received so far (their records are made
        before this returns)."""
        self._shut_cls = "interrupted"
        self.close()

    def close(self) -> None:
        """Stop the loop; requests still open end with a ``client`` error."""
        with self._lock:
            self._closing = True
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        self._wake_r.close()
        self._wake_w.close()
        self._sel.close()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def thread_id(self) -> int | None:
        """The loop thread's kernel id (its cgroup may differ from the process's)."""
        return self._thread.native_id

    def take_stats(self) -> LoopStats:
        """The loop's lag and read-backlog samples since the last call (any thread)."""
        return self.probe.take()

    # --- callers ---------------------------------------------------------

    def handles(self, base_url: str, session: requests.Session | None = None) -> bool:
        """Can the loop send to this URL itself (plain HTTP, no proxy)?"""
        t = target_of(base_url)
        if t.scheme != "http" or not t.host:
            return False
        s = session or requests.Session()
        proxies = s.merge_environment_settings(base_url, {}, None, None, None)["proxies"]
        return not any(proxies.get(k) for k in ("http", "all", f"http://{t.host}"))

    def submit(
        self,
        a: Attempt,
        on_done: Done,
        *,
        at_ns: int | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> bool:
        """Send ``a`` from the loop (at ``at_ns``, or now) and call ``on_done(record)``
        in the loop thread when it ends; True. The URL must be one the loop ``handles``.

        False (``on_done`` is never called, ``a.error`` is set, ``a.record()`` is the
        record) when the loop is closed or the host does not resolve.
        """
        target = target_of(a.prep.url or "")
        keep = "close" not in str(a.prep.headers.get("Connection", "")).lower()
        try:
            addr = self._resolve(target)
        except OSError as e:
            a.error = StreamError("connect", f"could not connect: {e}")
            return False
        r = _Req(a, target, addr, on_done, on_start, at_ns, keep)
        with self._lock:
            closed = self._closing
            if not closed:
                self._incoming.append(r)
        if closed:
            a.error = StreamError("client", "the stream multiplexer was closed")
            return False
        if threading.current_thread() is not self._thread:
            self._wake()
        return True

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
        if not self.handles(base_url, session):
            return send_in_thread(session, base_url, api, spec, scheduled_ns=scheduled_ns,
                                  timeouts=timeouts, headers=headers)
        a = Attempt(session, base_url, api, spec, scheduled_ns, timeouts, headers)
        box: list[RequestRecord] = []
        done = threading.Event()

        def on_done(rec: RequestRecord) -> None:
            box.append(rec)
            done.set()

        bound_s = request_bound_s(timeouts, spec.max_tokens)
        deadline = time.monotonic() + bound_s + DEADLINE_SLACK_S
        if not self.submit(a, on_done):
            return a.record()
        # The loop always finishes a request, even when it dies of a bug (_loop);
        # the liveness check and the deadline are guards against a hang.
        while not done.wait(1.0):
            if not self._thread.is_alive():
                a.error = StreamError("client", "the stream multiplexer stopped")
                return a.record()
            if time.monotonic() > deadline:
                a.error = StreamError("client", deadline_message(bound_s, DEADLINE_SLACK_S))
                return a.record()
        return box[0]

    def _resolve(self, t: Target) -> tuple:
        """The address to connect to, resolved once per host in the caller's thread
        (getaddrinfo blocks, so the loop never calls it)."""
        key = (t.host, t.port)
        addr = self._addrs.get(key)
        if addr is None:
            fam, _, _, _, sa = socket.getaddrinfo(t.host, t.port, type=socket.SOCK_STREAM)[0]
            addr = self._addrs[key] = (fam, sa)
        return addr

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake is pending) or closed
            self._wake_w.send(b"w")

    # --- the loop thread ---------------------------------------------------

    def _loop(self) -> None:
        try:
            self._run()
        except BaseException as e:  # a bug here must not leave callers waiting
            with self._lock:
                self._closing = True
            self._shut(f"the stream multiplexer failed: {type(e).__name__}: {e}")
            raise
        finally:
            if self._gc_held:
                self._gc_held = False
                gcpause.release()
            for socks in self._idle.values():
                for s in socks:
                    s.close()
            self._idle.clear()

    def _run(self) -> None:
        sel = self._sel
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        heap = self._heap
        mono, cpu = time.monotonic_ns, time.thread_time_ns
        while True:
            timeout = max(0.0, (heap[0][0] - mono()) / _NS) if heap else None
            if self._incoming:  # admission left over from the last round: poll only
                timeout = 0.0
            # Read and stamp every ready socket first, then parse: a stamp is
            # not delayed by the parsing of the sockets read before it.
            reads, admit = [], False
            self._t_enter = mono()
            # The probe already overdue: the loop was busy since; its CPU in the last
            # round bounds how much of that was its own work, not a preemption.
            self._cpu_busy = (cpu() - self._cpu_ret
                              if 0 < self._probe_due <= self._t_enter else 0)
            ready = sel.select(timeout)
            self._t_ret = mono()
            self._cpu_ret = cpu()
            for key, mask in ready:
                r = key.data
                if r is None:
                    admit = True
                elif mask & selectors.EVENT_WRITE:
                    self._writable(r)
                else:
                    data = self._recv(r)
                    if data is not None:
                        reads.append((r, data, mono()))
            for r, data, t in reads:
                self._take(r, data, t)
            if heap and heap[0][0] <= mono():
                self._expire()
            self._wake_callers()
            if admit or self._incoming:
                self._admit(admit)
            if self._closing:
                self._shut("interrupted (Ctrl-C or SIGTERM) while in flight"
                           if self._shut_cls == "interrupted"
                           else "the stream multiplexer was closed", self._shut_cls)
                return

    def _admit(self, drain_wake: bool) -> None:
        if drain_wake:
            with contextlib.suppress(OSError):
                while self._wake_r.recv(4096):
                    pass
        if self._incoming and not self._probe_due:
            if not self._gc_held:
                self._gc_held = True
                gcpause.hold()
            self._arm_probe(time.monotonic_ns())
        for _ in range(ADMIT_PER_ROUND):
            if not self._incoming:
                break
            r = self._incoming.popleft()
            self._live += 1
            if r.at_ns is not None and r.at_ns > time.monotonic_ns():
                self._arm(r)
            else:
                self._dispatch(r)
        self._wake_callers()

    def _arm_probe(self, now: int) -> None:
        """The lag probe runs while requests are in flight (an idle loop costs nothing)."""
        self._probe_due = now + _PROBE_NS
        heapq.heappush(self._heap, (self._probe_due, next(self._seq), _PROBE))

    def _arm(self, r: _Req) -> None:
        """Make sure a heap entry fires no later than ``r``'s current due time."""
        due = r.due()
        if r.heap_due and r.heap_due <= due:
            return
        r.heap_due = due
        heapq.heappush(self._heap, (due, next(self._seq), r))

    def _dispatch(self, r: _Req) -> None:
        a = r.a
        if r.on_start is not None:
            try:
                r.on_start()
            except Exception as e:  # the caller's hook must not stop the loop
                self._finish(r, StreamError("client", f"on_start: {type(e).__name__}: {e}"))
                return
        now = time.monotonic_ns()
        a.dispatched_ns = now
        if a.t.total_s is not None:
            a.deadline_ns = now + int(a.t.total_s * _NS)
        self._connect(r, now)

    def _connect(self, r: _Req, now: int) -> None:
        """Take a pooled connection (checked) or start a non-blocking connect."""
        r.out = memoryview(r.wire)
        r.last_ns = now
        pool = self._idle.get((r.target.host, r.target.port))
        while r.keep_alive and pool:
            s = pool.pop()
            if _alive(s):
                r.sock, r.reused = s, True
                self._send(r, now)
                return
            s.close()
        fam, sa = r.addr
        try:
            s = socket.socket(fam, socket.SOCK_STREAM)
        except OSError as e:
            self._finish(r, StreamError("client", f"cannot open a socket: {e}"))
            return
        r.sock, r.reused = s, False
        s.setblocking(False)
        with contextlib.suppress(OSError):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rc = s.connect_ex(sa)
        if rc == 0:
            self._send(r, now)
        elif rc in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY):
            r.phase = _CONNECT
            self._watch(r, selectors.EVENT_WRITE)
            self._arm(r)
        else:
            self._finish(r, _connect_error(rc))

    def _watch(self, r: _Req, mask: int) -> None:
        sock = r.sock
        assert sock is not None
        try:
            self._sel.modify(sock, mask, r)
        except KeyError:
            self._sel.register(sock, mask, r)

    def _writable(self, r: _Req) -> None:
        if r.over:
            return
        if r.phase == _CONNECT:
            assert r.sock is not None
            rc = r.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if rc:
                self._finish(r, _connect_error(rc))
                return
        self._send(r, time.monotonic_ns())

    def _send(self, r: _Req, now: int) -> None:
        """Write what is left of the request; once all of it left, wait for the head."""
        sock = r.sock
        assert sock is not None
        r.phase = _SEND
        try:
            n = sock.send(r.out)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as e:
            self._lost_before_response(r, e)
            return
        r.out = r.out[n:]
        now = time.monotonic_ns()
        if len(r.out):
            if n:
                r.last_ns = now
            self._watch(r, selectors.EVENT_WRITE)
            self._arm(r)
            return
        r.a.sent_ns = now
        r.last_ns = now
        r.phase = _HEAD
        self._watch(r, selectors.EVENT_READ)
        self._arm(r)

    def _lost_before_response(self, r: _Req, e: BaseException | None) -> None:
        """The connection closed before any response byte: on a reused connection
        (a server's idle close racing our send) send once more on a fresh one."""
        why = "EOF" if e is None else f"{type(e).__name__}: {e}"
        if r.reused and not r.retried:
            r.retried = True
            self._drop_sock(r)
            self._connect(r, time.monotonic_ns())
            return
        self._finish(r, StreamError("reset", f"connection closed before a response: {why}"))

    def _recv(self, r: _Req) -> bytes | None:
        """What one ``recv`` got (b"" at EOF), or None if nothing or the request ended."""
        sock = r.sock
        if r.over or sock is None:
            return None
        try:
            self._nread += 1
            if not self._nread & _BACKLOG_EVERY:  # a syscall: costs 1-9 us, so a sample
                waiting = int.from_bytes(fcntl.ioctl(sock.fileno(), _FIONREAD, _ZERO4), "little")
                self.probe.backlog(waiting)
            return sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as e:
            if r.phase in (_SEND, _HEAD) and not r.inbuf:
                self._lost_before_response(r, e)
            elif r.phase == _BODY and r.a.core.done:
                self._finish(r, None)
            elif r.phase == _ERRBODY:
                self._finish(r, self._status_error(r))
            else:
                msg = f"connection error mid-stream: {type(e).__name__}: {e}"
                self._finish(r, StreamError("reset", msg))
            return None

    def _take(self, r: _Req, data: bytes, now: int) -> None:
        """Bytes (or EOF, when empty) that arrived at ``now``."""
        if r.over:
            return
        try:
            if r.phase == _HEAD:
                self._take_head(r, data, now)
            elif r.phase == _BODY:
                self._take_body(r, data, now)
            elif r.phase == _ERRBODY:
                self._take_error_body(r, data)
        except ChunkError as e:
            self._finish(r, StreamError("reset", f"broken chunked framing: {e}"))
        except StreamError as e:
            self._finish(r, e)
        except Exception as e:  # a client bug must still come back as a record
            self._finish(r, StreamError("client", f"{type(e).__name__}: {e}"))

    def _take_head(self, r: _Req, data: bytes, now: int) -> None:
        if not data:
            if not r.inbuf:
                self._lost_before_response(r, None)
            else:
                raise StreamError("reset", "connection closed inside the response head")
            return
        r.last_ns = now
        r.inbuf += data
        try:
            head, used = parse_head(r.inbuf)
        except HeadError as e:
            raise StreamError("malformed_response", f"malformed response: {e}") from None
        if head is None:
            return
        a = r.a
        rest, r.inbuf = r.inbuf[used:], b""
        r.head = head
        a.first_byte_ns = now
        a.http_status = head.status
        a.content_type = head.headers.get("content-type")
        a.id_header = head.headers.get("x-request-id")
        r.keep_alive = r.keep_alive and head.keep_alive
        if head.framing == "chunked":
            r.decoder = ChunkedDecoder()
        elif head.framing == "length":
            r.left = head.length
        if not 200 <= head.status < 300:
            r.phase = _ERRBODY
            r.err_until = now + _ERROR_BODY_NS
            self._arm(r)
            if rest or r.left == 0:  # b"" here is "nothing yet", not EOF
                self._take_error_body(r, rest, eof=False)
            return
        problem = head_problem(head.headers)
        if problem is not None:
            raise StreamError("malformed_response", problem)
        r.phase = _BODY
        self._arm(r)
        if rest or r.left == 0:
            self._take_body(r, rest, now, eof=False)

    def _take_body(self, r: _Req, data: bytes, now: int, eof: bool = True) -> None:
        core, dec = r.a.core, r.decoder
        if not data and eof:
            if dec is not None and not dec.complete and not core.done:
                raise StreamError("reset", "connection closed before the body's last chunk")
            if r.left is not None and r.left > 0 and not core.done:
                raise StreamError("reset", "connection closed before the end of the body")
            if dec is None and r.left is None and not core.n_bytes:
                raise StreamError("reset", NO_BODY)
            core.end_of_body(now)
            self._finish(r, None)
            return
        r.last_ns = now
        extra = 0
        if dec is not None:
            chunk = dec.feed(data)
            complete = dec.complete
            extra = dec.extra
        elif r.left is not None:
            chunk = data[: r.left]
            extra = len(data) - len(chunk)
            r.left -= len(chunk)
            complete = r.left == 0
        else:
            chunk, complete = data, False
        if core.done:
            r.drained += len(chunk)
        if chunk:
            core.feed(chunk, now)
        if complete:
            core.end_of_body(now)
            r.reusable = extra == 0
            self._finish(r, None)
        elif core.done:
            if (r.decoder is None and r.left is None) or r.drained > DRAIN_BYTES:
                self._finish(r, None)  # nothing to reuse, or a long tail: stop here
            elif r.drain_until is None:
                r.drain_until = now + int(DRAIN_S * _NS)
                self._arm(r)

    def _take_error_body(self, r: _Req, data: bytes, eof: bool = True) -> None:
        """Keep the start of a non-2xx body for the error message."""
        n = sum(len(b) for b in r.err_body)
        if not data and eof:
            self._finish(r, self._status_error(r))
            return
        dec = r.decoder
        try:
            body = dec.feed(data) if dec is not None else data
        except ChunkError:
            body, dec = data, None
        if r.left is not None:
            body = body[: r.left]
            r.left -= len(body)
        r.err_body.append(body[: _ERROR_BODY_BYTES - n])
        n += len(body)
        if n >= _ERROR_BODY_BYTES or (dec is not None and dec.complete) or r.left == 0:
            self._finish(r, self._status_error(r))

    def _status_error(self, r: _Req) -> StreamError:
        status = r.a.http_status or 0
        text = b"".join(r.err_body).decode("utf-8", "replace")[:500]
        return StreamError("http_status", f"HTTP {status}: {text}", http_status=status)

    def _expire(self) -> None:
        heap, now = self._heap, time.monotonic_ns()
        while heap and heap[0][0] <= now:
            due, _, r = heapq.heappop(heap)
            if isinstance(r, _Probe):
                # The part of the lateness the loop's own work caused: its CPU time
                # since select returned, plus the time it was already busy when the
                # probe fell due (at most that round's CPU time). Not the host's late
                # wake-up from select, nor the loop's preemption by other tenants (or
                # by the server it measures) while it worked: CPU time, not wall time
                # (on a host whose other tenants held the cores, wall time made a 0.3 ms
                # round 8-16 ms of "own" work).
                cpu_round = time.thread_time_ns() - self._cpu_ret
                busy = min(max(0, self._t_enter - due), self._cpu_busy)
                own = cpu_round + busy if due <= self._t_ret else cpu_round
                self.probe.sample(now - due, min(now - due, own))
                self._probe_due = 0
                if self._live:
                    gcpause.tick()
                    self._arm_probe(now)
                elif self._gc_held:
                    self._gc_held = False
                    gcpause.release()
                continue
            if r.over or due != r.heap_due:
                continue  # finished, or superseded by an earlier entry
            r.heap_due = 0
            new = r.due()
            if new > now:
                self._arm(r)
                continue
            self._timeout(r, now)

    def _timeout(self, r: _Req, now: int) -> None:
        ph, a = r.phase, r.a
        if ph == _WAIT:
            self._dispatch(r)
        elif ph == _CONNECT:
            self._finish(r, StreamError("timeout", f"connect timed out after {a.t.connect_s:g} s"))
        elif ph in (_SEND, _HEAD):
            if a.deadline_ns is not None and now >= a.deadline_ns:
                self._finish(r, StreamError("timeout", "the request ran past total_s"))
            else:
                self._finish(r, StreamError("timeout",
                                            "no response headers within the read timeout"))
        elif ph == _ERRBODY:
            self._finish(r, self._status_error(r))
        elif a.core.done:
            self._finish(r, None)  # the tail after the terminal event never came
        elif a.deadline_ns is not None and now >= a.deadline_ns:
            self._finish(r, StreamError("timeout", "the request ran past total_s"))
        else:
            self._finish(r, StreamError("timeout", f"no data for read_s={a.t.read_s:g} s"))

    def _drop_sock(self, r: _Req) -> None:
        sock, r.sock = r.sock, None
        if sock is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(sock)
            sock.close()

    def _finish(self, r: _Req, error: StreamError | None) -> None:
        """End ``r``: its record first (``Attempt.record`` never raises), then it counts
        as over, so that nothing raised on the way can end a request without a record."""
        if r.over:
            return
        a = r.a
        if error is not None:
            a.error = error
        # The record is made here, in the loop: when hundreds of streams end
        # together, their callers then only pick it up.
        self._ended.append((r, a.record()))
        r.over = True
        self._live -= 1
        sock = r.sock
        if sock is not None and error is None and r.reusable and r.keep_alive:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(sock)
            self._idle.setdefault((r.target.host, r.target.port), []).append(sock)
            r.sock = None
        else:
            self._drop_sock(r)
        # Finished requests leave the heap lazily (when their time comes up);
        # compact it so thousands of short requests cannot pile up in it.
        heap = self._heap
        if len(heap) > 64 and len(heap) > 2 * self._live + 2:
            heap[:] = [e for e in heap if isinstance(e[2], _Probe)
                       or (not e[2].over and e[0] == e[2].heap_due)]
            heapq.heapify(heap)

    def _wake_callers(self) -> None:
        """Run the callbacks of ended requests once this round of reads is parsed:
        a woken caller would otherwise contend for the GIL with the rest of the round."""
        while self._ended:
            ended, self._ended = self._ended, []
            for r, rec in ended:
                try:
                    r.on_done(rec)
                except Exception:
                    continue

    def _shut(self, why: str, cls: str = "client") -> None:
        with self._lock:
            pending = list(self._incoming)
            self._incoming.clear()
        for r in pending:
            self._live += 1
            self._finish(r, StreamError(cls, why))
        for _, _, item in self._heap:
            if isinstance(item, _Req):
                self._finish(item, StreamError(cls, why))
        for key in list(self._sel.get_map().values()):
            r = key.data
            if isinstance(r, _Req):
                self._finish(r, StreamError(cls, why))
        self._heap.clear()
        self._wake_callers()


def deadline_message(bound_s: float, slack_s: float) -> str:
    """The ``client`` error of a request whose record never came (run_slots, send_streaming)."""
    return (f"no record from the stream loop by the request's deadline: {bound_s:g} s "
            f"(from connect_s, read_s, total_s, max_tokens) + {slack_s:g} s slack after its start")


def _alive(sock: socket.socket) -> bool:
    """An idle pooled connection the server has not closed (nothing to read, no EOF)."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # EOF, or bytes nobody asked for
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False
    return False


def _connect_error(rc: int) -> StreamError:
    if rc == errno.ETIMEDOUT:
        return StreamError("timeout", f"connect timed out: [Errno {rc}] {os.strerror(rc)}")
    return StreamError("connect", f"could not connect: [Errno {rc}] {os.strerror(rc)}")

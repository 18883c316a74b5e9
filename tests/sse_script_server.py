"""A scripted SSE server on 127.0.0.1 for client tests: exact timing, chosen faults.

Each request is answered by a :class:`Reply`: a list of ``(delay_s, bytes)``
items sent at fixed offsets (delays accumulate from when the request was read,
so a slow send does not shift later items), framed as HTTP chunks or as a raw
``Connection: close`` body, then ended normally, cut, reset, or left hanging.
The send time of every item is kept so tests can compare client stamps to it.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

FRAMINGS = ("chunked", "close", "length")
ENDINGS = ("normal", "cut", "reset", "hang")


def sse(obj: Any) -> bytes:
    """One SSE event carrying ``obj`` as JSON (or a raw string such as ``[DONE]``)."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


@dataclass(frozen=True)
class Reply:
    items: Iterable[tuple[float, bytes]] = ()
    status: int = 200
    framing: str = "chunked"  # chunked | close (no length, Connection: close) | length
    end: str = "normal"  # normal | cut (close, no terminator) | reset (RST) | hang
    content_type: str = "text/event-stream"
    head_delay_s: float = 0.0  # silence before the status line (a server stuck in a queue)
    headers: tuple[tuple[str, str], ...] = ()  # more response header lines (name, value)

    def __post_init__(self) -> None:
        assert self.framing in FRAMINGS and self.end in ENDINGS


@dataclass
class Seen:
    """A request as the server read it, and when each reply item went out."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    received_ns: int
    sent_ns: list[int] = field(default_factory=list)
    sent_bytes: int = 0
    broken: bool = False  # the client went away while we were sending

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class ScriptServer:
    """``with ScriptServer(reply) as srv: ... srv.url ...``; ``reply`` may be a callable."""

    def __init__(self, reply: Reply | Callable[[Seen], Reply], idle_close_s: float = 10) -> None:
        self._reply = reply
        self._idle_close_s = idle_close_s  # a kept-alive connection idle this long is closed
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.seen: list[Seen] = []
        self.connections = 0
        self.in_flight = 0  # replies being sent now
        self.max_in_flight = 0
        self._count = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []

    def __enter__(self) -> ScriptServer:
        t = threading.Thread(target=self._accept_loop, name="sse-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):  # wakes accept() now, not at its 0.1 s timeout
            self._listener.shutdown(socket.SHUT_RDWR)
        for conn in list(self._conns):  # wake threads waiting for a next request
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for t in list(self._threads):
            t.join(timeout=5)
        self._listener.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(self._idle_close_s)
        buf = b""
        try:
            while not self._stop.is_set():
                seen, buf = _read_request(conn, buf)
                if seen is None:
                    return
                self.seen.append(seen)
                reply = self._reply(seen) if callable(self._reply) else self._reply
                with self._count:
                    self.in_flight += 1
                    self.max_in_flight = max(self.max_in_flight, self.in_flight)
                try:
                    keep = self._answer(conn, seen, reply)
                finally:
                    with self._count:
                        self.in_flight -= 1
                if not keep:
                    return
        except OSError:
            return
        finally:
            conn.close()

    def _answer(self, conn: socket.socket, seen: Seen, reply: Reply) -> bool:
        """Send one reply; True when the connection may serve another request."""
        items = list(reply.items)
        head = [f"HTTP/1.1 {reply.status} X", f"Content-Type: {reply.content_type}"]
        head += [f"{k}: {v}" for k, v in reply.headers]
        if reply.framing == "chunked":
            head.append("Transfer-Encoding: chunked")
        elif reply.framing == "length":
            head.append(f"Content-Length: {sum(len(b) for _, b in items)}")
            head.append("Connection: close")
        else:
            head.append("Connection: close")
        if reply.head_delay_s and self._stop.wait(reply.head_delay_s):
            return False
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        due = seen.received_ns / 1e9
        try:
            for delay, payload in items:
                due += delay
                wait = due - time.monotonic()
                if wait > 0 and self._stop.wait(wait):
                    return False
                if reply.framing == "chunked":
                    payload = b"%x\r\n%s\r\n" % (len(payload), payload)
                seen.sent_ns.append(time.monotonic_ns())
                conn.sendall(payload)
                seen.sent_bytes += len(payload)
        except OSError:
            seen.broken = True
            return False
        if reply.end == "hang":
            self._stop.wait(60)
            return False
        if reply.end == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        if reply.end == "cut" or reply.framing != "chunked":
            return False
        conn.sendall(b"0\r\n\r\n")
        return True


def _read_request(conn: socket.socket, buf: bytes) -> tuple[Seen | None, bytes]:
    while b"\r\n\r\n" not in buf:
        more = conn.recv(65536)
        if not more:
            return None, b""
        buf += more
    received = time.monotonic_ns()
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    while len(rest) < n:
        more = conn.recv(65536)
        if not more:
            return None, b""
        rest += more
    return Seen(method, path, headers, rest[:n], received), rest[n:]


def free_port() -> int:
    """A port nothing listens on (for connection-refused tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a thread and fail the test if it has not returned in ``seconds``.

    Our own guard against hangs (pytest-timeout is not installed).
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the test thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise AssertionError(f"call did not return within {seconds} s (hang)")
    if "error" in box:
        raise box["error"]
    return box["value"]

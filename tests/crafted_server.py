"""A server on 127.0.0.1 that answers every request with exact bytes: head, body and ending.

``tests/sse_script_server.py`` writes a well-formed head and framing itself; a hostile
server does not. Here a :class:`Crafted` reply is the response byte for byte (a bad
status line, a head cut short, a gzip body, a chunk size that is not hex), sent as
``(delay_s, bytes)`` items, then the connection is closed, reset (RST) or held open
without another byte. It is a real server on a real socket, not a fake: the client
under test meets it through the kernel's TCP stack.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass

ENDINGS = ("close", "reset", "hang")


@dataclass(frozen=True)
class Crafted:
    items: Sequence[tuple[float, bytes]] = ()
    end: str = "close"  # close (FIN) | reset (RST) | hang (keep the socket, send nothing)
    answer: bool = True  # False: accept, read the request, never send a byte

    def __post_init__(self) -> None:
        assert self.end in ENDINGS


def head(status: str = "200 OK", *lines: str) -> bytes:
    """A response head from its status and header lines, CRLF-terminated."""
    return ("\r\n".join((f"HTTP/1.1 {status}", *lines)) + "\r\n\r\n").encode("latin-1")


def chunk(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk carrying ``payload``."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class CraftedServer:
    """``with CraftedServer(reply) as srv: ... srv.url ...``; every connection gets ``reply``."""

    def __init__(self, reply: Crafted) -> None:
        self.reply = reply
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []

    def __enter__(self) -> CraftedServer:
        t = threading.Thread(target=self._accept, name="crafted-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):  # wakes accept() now, not at its 0.1 s timeout
            self._listener.shutdown(socket.SHUT_RDWR)
        for c in list(self._conns):
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        for t in list(self._threads):
            t.join(timeout=5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        r = self.reply
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(5)
            if not _read_request(conn):
                return
            if not r.answer:
                self._stop.wait(60)
                return
            for delay, payload in r.items:
                if delay and self._stop.wait(delay):
                    return
                conn.sendall(payload)
            if r.end == "hang":
                self._stop.wait(60)
            elif r.end == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            return
        finally:
            conn.close()


def _read_request(conn: socket.socket) -> bool:
    """Read one request (head and Content-Length body); False if the client went away."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        more = conn.recv(65536)
        if not more:
            return False
        buf += more
    head_bytes, _, rest = buf.partition(b"\r\n\r\n")
    n = 0
    for line in head_bytes.decode("latin-1").split("\r\n")[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "content-length":
            n = int(v.strip())
    while len(rest) < n:
        more = conn.recv(65536)
        if not more:
            return False
        rest += more
    return True

"""An SSE event storm on 127.0.0.1: valid token events as fast as asked, whatever the
request's ``max_tokens``.

``tests/sse_script_server.py`` sends a reply's items one by one from a list; a storm of
50,000 events a second for seconds would be millions of items. Here each stream writes
``rate / 50`` events every 20 ms, one ``sendall`` a batch, for ``duration_s`` (then the
finish event and ``[DONE]``) or until the client goes away. A real server on a real
socket: the client meets it through the kernel's TCP stack.

``python -m tests.sse_storm_server PORTFILE [rate] [duration_s]`` runs one in its own
process (so its memory is not the client's when a run is measured).
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time

TICK_S = 0.02


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


TOKEN = _event({"choices": [{"index": 0, "text": " x"}]})
FINISH = _event({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                 "usage": {"prompt_tokens": 8, "completion_tokens": 1}}) + b"data: [DONE]\n\n"


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class StormServer:
    """``with StormServer(rate=50_000, duration_s=10) as srv: ... srv.url ...``;
    ``srv.sent`` counts the token events written (all streams), ``srv.streams`` the
    streams started, ``srv.ended_early`` those the client closed before the end."""

    def __init__(self, rate: int = 50_000, duration_s: float = 10.0) -> None:
        self.rate, self.duration_s = rate, duration_s
        self.sent = 0
        self.streams = 0
        self.ended_early = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []

    def __enter__(self) -> StormServer:
        t = threading.Thread(target=self._accept, name="storm-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
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
        try:
            conn.settimeout(10)
            method = _read_request(conn)
            if method is None:
                return
            if method == "GET":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
                             b"Connection: close\r\n\r\nok")
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            with self._lock:
                self.streams += 1
            per_tick = max(1, int(self.rate * TICK_S))
            batch = _chunk(TOKEN * per_tick)
            t0 = time.monotonic()
            due = t0
            while time.monotonic() - t0 < self.duration_s and not self._stop.is_set():
                try:
                    conn.sendall(batch)
                except OSError:
                    with self._lock:
                        self.ended_early += 1
                    return
                with self._lock:
                    self.sent += per_tick
                due += TICK_S
                self._stop.wait(max(0.0, due - time.monotonic()))
            conn.sendall(_chunk(FINISH) + b"0\r\n\r\n")
        except OSError:
            return
        finally:
            conn.close()


def _read_request(conn: socket.socket) -> str | None:
    """Read one request (head and Content-Length body); its method, or None."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        more = conn.recv(65536)
        if not more:
            return None
        buf += more
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    n = 0
    for line in lines[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "content-length":
            n = int(v.strip())
    while len(rest) < n:
        more = conn.recv(65536)
        if not more:
            return None
        rest += more
    return lines[0].split(" ", 1)[0]


if __name__ == "__main__":
    port_file = sys.argv[1]
    rate = int(sys.argv[2]) if len(sys.argv) > 2 else 50_000
    duration = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
    with StormServer(rate, duration) as srv:
        with open(port_file, "w") as fh:
            fh.write(str(srv.port))
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()

"""A loopback SSE emitter that stamps each event with its send time.

It measures the client, not a server: every content chunk carries
``time.monotonic_ns()`` read just before the send (CLOCK_MONOTONIC is shared by
all processes of a host), so the client's ``handled_ns - sent`` is its own
lateness. It runs in its own process (``python -m strata_plugin.testing.emitter``)
so it never shares a GIL with the client it measures, and serves any number
of streams from one thread with a selector and a timer heap.

Protocol: POST an OpenAI chat body. The role chunk is sent at once; then
``max_tokens`` content events ``emit_interval_s`` apart (default 0.02 s = 50
events/s), from ``emit_start_ns`` (a CLOCK_MONOTONIC time, so that many
streams can be opened first and then all run together; default: now) plus a
random phase within one interval, each with content ``"<sent_ns>;"`` (``emit_burst``
events per write, default 1); then a
usage chunk and ``[DONE]``. Use :func:`sent_stamps`
to read the stamps back out of a record's ``output_text``.

A scripted split, for the time ledger's tests: ``emit_first_byte_delay_s`` holds the
response head that long (time before the server's clock starts); ``emit_prefill_s``
holds the first content event that long after the head (no random phase then);
``emit_pauses`` (``[[k, seconds], ...]``) adds a pause before content event ``k``; and
``emit_timings`` puts llama.cpp-style ``timings`` on the last chunk (``prompt_ms`` the
scripted prefill, ``predicted_ms`` first to last content event as sent).
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import random
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
)
_PRE = b'data: {"id":"cmpl-emit","object":"chat.completion.chunk","model":"emitter","choices":'


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


@dataclass(frozen=True)
class EmitterProcess:
    url: str
    pid: int

    def cpu_s(self) -> float:
        """CPU seconds the emitter has used (Linux /proc; 0 elsewhere)."""
        try:
            with open(f"/proc/{self.pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return 0.0


def sent_stamps(output_text: str) -> list[int]:
    """The send stamps an emitter stream carried, in order."""
    return [int(s) for s in output_text.split(";") if s]


class _Conn:
    __slots__ = ("burst", "close", "extra", "first_sent", "inbuf", "interval", "k", "last_sent",
                 "n", "out", "pauses", "prefill", "sock", "start", "start_s", "timings",
                 "writing")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbuf = b""
        self.out = bytearray()
        self.writing = False
        self.n = self.k = 0
        self.start = 0.0
        self.interval = 0.02
        self.close = False  # the request said Connection: close
        self.burst = 1  # content events per write
        self.prefill: float | None = None  # scripted delay head -> first content event
        self.pauses: dict[int, float] = {}  # content event -> extra pause before it
        self.extra = 0.0  # pauses so far
        self.timings = False
        self.start_s = 0.0
        self.first_sent = self.last_sent = 0


class Emitter:
    """The event loop; ``serve_forever`` until the process is killed."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.listener = socket.create_server((host, port), backlog=1024)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.heap: list[tuple[float, int, _Conn]] = []
        self.seq = 0
        self.rng = random.Random(0)

    def serve_forever(self) -> None:
        while True:
            timeout = None
            if self.heap:
                timeout = max(0.0, self.heap[0][0] - time.monotonic())
            for key, mask in self.sel.select(timeout):
                if key.data is None:
                    self._accept()
                else:
                    self._io(key.data, mask)
            now = time.monotonic()
            while self.heap and self.heap[0][0] <= now:
                _, _, c = heapq.heappop(self.heap)
                self._emit(c)

    def _accept(self) -> None:
        while True:
            try:
                s, _ = self.listener.accept()
            except BlockingIOError:
                return
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = _Conn(s)
            self.sel.register(s, selectors.EVENT_READ, c)

    def _io(self, c: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            self._flush(c)
        if not mask & selectors.EVENT_READ:
            return
        try:
            data = c.sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._close(c)
            return
        c.inbuf += data
        head, sep, rest = c.inbuf.partition(b"\r\n\r\n")
        if not sep or c.n:
            return
        length = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            key = k.strip().lower()
            if key == b"content-length":
                length = int(v)
            elif key == b"connection":
                c.close = v.strip().lower() == b"close"
        if len(rest) < length:
            return
        body = json.loads(rest[:length] or b"{}")
        c.inbuf = rest[length:]
        c.n = int(body.get("max_tokens", 16))
        c.k = -1  # the role chunk first
        c.interval = float(body.get("emit_interval_s", 0.02))
        c.burst = max(1, int(body.get("emit_burst", 1)))
        c.start_s = float(body.get("emit_start_ns", 0)) / 1e9
        prefill = body.get("emit_prefill_s")
        c.prefill = None if prefill is None else float(prefill)
        c.pauses = {int(k): float(v) for k, v in body.get("emit_pauses", ())}
        c.extra = 0.0
        c.timings = bool(body.get("emit_timings", False))
        delay = float(body.get("emit_first_byte_delay_s", 0.0))
        if delay > 0:
            c.k = -2  # the head waits
            self._push(c, time.monotonic() + delay)
            return
        self._head(c)

    def _head(self, c: _Conn) -> None:
        """The response head and the role chunk now; content from ``c.start``."""
        now = time.monotonic()
        if c.prefill is not None:
            c.start = now + c.prefill
        else:
            c.start = max(now, c.start_s) + self.rng.random() * c.interval
        c.k = -1
        self._send(c, _HEAD)
        self._push(c, now)

    def _push(self, c: _Conn, due: float) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (due, self.seq, c))

    def _emit(self, c: _Conn) -> None:
        if c.sock.fileno() < 0:
            return
        if c.k == -2:
            self._head(c)
            return
        if c.k < 0:
            payload = _PRE + b'[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
            self._send(c, _chunk(payload))
            c.k += 1
        else:
            # ``emit_burst`` events in one write: a flood a client cannot parse as fast
            # as this loop makes it (the self-check's client-bound test), at a fraction
            # of the emitter's cost per event.
            k = min(c.burst, c.n - c.k)
            sent = time.monotonic_ns()
            one = b'[{"index":0,"delta":{"content":"%d;"},"finish_reason":null}]}\n\n' % sent
            self._send(c, b"".join(_chunk(_PRE + one) for _ in range(k)))
            c.first_sent = c.first_sent if c.k else sent
            c.last_sent = sent
            c.k += k
        if c.k < c.n:
            c.extra += c.pauses.get(c.k, 0.0)
            self._push(c, c.start + c.k * c.interval + c.extra)
            return
        usage = b'{"prompt_tokens":8,"completion_tokens":%d,"total_tokens":%d}' % (c.n, c.n + 8)
        timings = b""
        if c.timings:
            timings = (b',"timings":{"prompt_n":8,"prompt_ms":%.3f,"predicted_n":%d,'
                       b'"predicted_ms":%.3f}' % ((c.prefill or 0.0) * 1e3, c.n,
                                                  (c.last_sent - c.first_sent) / 1e6))
        last = _PRE + b'[{"index":0,"delta":{},"finish_reason":"length"}]%s}\n\n' % timings
        tail = b'data: {"id":"cmpl-emit","choices":[],"usage":%s}\n\ndata: [DONE]\n\n' % usage
        self._send(c, _chunk(last) + _chunk(tail) + b"0\r\n\r\n")
        c.n = 0  # ready for the next request on this connection
        if c.close and not c.writing:
            # As an HTTP/1.1 server must after a response to "Connection: close"
            # (RFC 9112, section 9.6), and as real servers do; a client that closed
            # first would hold every connection in TIME_WAIT, and thousands of
            # those slow the kernel's search for a free port at each connect.
            self._close(c)

    def _send(self, c: _Conn, data: bytes) -> None:
        if c.writing:
            c.out += data
            return
        try:
            sent = c.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._close(c)
            return
        if sent < len(data):
            c.out += data[sent:]
            c.writing = True
            self.sel.modify(c.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, c)

    def _flush(self, c: _Conn) -> None:
        try:
            sent = c.sock.send(c.out)
        except BlockingIOError:
            return
        except OSError:
            self._close(c)
            return
        del c.out[:sent]
        if not c.out:
            c.writing = False
            if c.close and not c.n:
                self._close(c)
                return
            self.sel.modify(c.sock, selectors.EVENT_READ, c)

    def _close(self, c: _Conn) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(c.sock)
        c.sock.close()


@contextlib.contextmanager
def emitter_process(host: str = "127.0.0.1") -> Iterator[EmitterProcess]:
    """Start the emitter in a child process, listening on ``host``; yields its URL and pid."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "strata_plugin.testing.emitter", host],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],  # where strata_plugin is importable
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.strip().isdigit():
            raise RuntimeError(f"emitter did not start (said {line!r})")
        yield EmitterProcess(f"http://{host}:{int(line)}", proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    em = Emitter(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1")
    print(em.port, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        em.serve_forever()


if __name__ == "__main__":
    main()

"""A TCP relay on 127.0.0.1 that delays every byte by a set one-way time (``outside_server``).

Why: time spent between the client and the server (a network path, a proxy, a TLS
terminator) is time the server's own clocks never see. The rules were not tuned on it
(the fault suite's set-aside set); the per-request ledger should put it before the
server.

:class:`LatencyProxy` starts a helper process that listens on an ephemeral loopback
port and, for each connection it accepts, opens one to the server and relays both
directions, each chunk held until ``delay_ms`` after it was read (a one-way delay per
direction, so a request-response round trip gains twice that). The connection set-up
itself is not delayed. The case's client is pointed at :attr:`LatencyProxy.url`.
The helper exits on its own after ``max_s`` and with the harness. Facts: the delay,
bytes relayed each way, connections, and the delay measured on the relay's own clock
(how late each chunk left against its due time: the event loop's timer error).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any
from urllib.parse import urlsplit

from strata_plugin.testing.faults import (
    FaultUnavailable,
    Injector,
    _await_line,
    _close_pipes,
    _guard,
    _helper_argv,
    _kill,
    _last_json,
    _say,
    _spawn,
)

_MODULE = "strata_plugin.testing.relay"
#: Only loopback: the relay never listens on or connects to anything else.
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class LatencyProxy(Injector):
    """A loopback relay in front of ``upstream`` (``http://127.0.0.1:PORT``) adding
    ``delay_ms`` to each direction's bytes."""

    name = "latency_proxy"
    expected_class = "outside_server"

    def __init__(self, upstream: str, delay_ms: float = 50.0, max_s: float = 300.0) -> None:
        super().__init__()
        u = urlsplit(upstream if "//" in upstream else f"http://{upstream}")
        if u.hostname not in LOOPBACK or not u.port:
            raise ValueError(f"the relay fronts a loopback server only (host:port on "
                             f"127.0.0.1), not {upstream!r}")
        if not 0 <= delay_ms <= 10_000:
            raise ValueError("delay_ms is in [0, 10000]")
        self.upstream = (u.hostname, u.port)
        self.scheme = u.scheme or "http"
        self.delay_ms, self.max_s = delay_ms, max_s
        self.proc: Any = None
        self.port = 0

    @property
    def url(self) -> str:
        """Where the client connects instead of the server."""
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def _start(self) -> None:
        host, port = self.upstream
        self.proc = _spawn(_helper_argv(
            "relay", self.max_s, "--upstream-host", host, "--upstream-port", str(port),
            "--delay-ms", f"{self.delay_ms:g}", module=_MODULE))
        self.port = int(_await_line(self.proc, "ready", 15.0)["port"])

    def _stop(self) -> dict[str, Any]:
        done: dict[str, Any] = {}
        if self.proc is not None:
            _kill(self.proc)
            done = _last_json(self.proc, "done")
            _close_pipes(self.proc)
        return {"delay_ms": self.delay_ms, "port": self.port,
                "upstream": f"{self.upstream[0]}:{self.upstream[1]}", **done}


# --- the helper process -------------------------------------------------------------------


class _Stats:
    def __init__(self) -> None:
        self.up = self.down = self.connections = self.chunks = 0
        self.late_max_s = 0.0
        self.late_sum_s = 0.0


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float,
                stats: _Stats, up: bool) -> None:
    """Read chunks as they come; write each ``delay_s`` after it was read, in order."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def feed() -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await reader.read(65536)
                await queue.put((loop.time() + delay_s, data))
                if not data:
                    return
        await queue.put((loop.time() + delay_s, b""))

    async def drain() -> None:
        try:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    with contextlib.suppress(OSError):
                        if writer.can_write_eof():
                            writer.write_eof()
                    return
                late = loop.time() - due
                stats.chunks += 1
                stats.late_sum_s += late
                stats.late_max_s = max(stats.late_max_s, late)
                if up:
                    stats.up += len(data)
                else:
                    stats.down += len(data)
                writer.write(data)
                await writer.drain()
        except OSError:
            return

    feeder = asyncio.ensure_future(feed())
    try:
        await drain()
    finally:
        feeder.cancel()


async def _serve(a: argparse.Namespace, deadline_s: float, stats: _Stats) -> None:
    delay_s = a.delay_ms / 1e3

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        stats.connections += 1
        try:
            sr, sw = await asyncio.open_connection(a.upstream_host, a.upstream_port)
        except OSError:
            cw.close()
            return
        try:
            await asyncio.gather(_pump(cr, sw, delay_s, stats, True),
                                 _pump(sr, cw, delay_s, stats, False))
        finally:
            for w in (sw, cw):
                with contextlib.suppress(OSError):
                    w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _say("ready", {"port": port})
    async with server:
        loop = asyncio.get_running_loop()
        while loop.time() < deadline_s and _parent_alive(a.parent):
            await asyncio.sleep(0.25)


def _parent_alive(parent: int) -> bool:
    import os

    return os.getppid() == parent


def _main_relay(a: argparse.Namespace, deadline: float) -> None:
    stats = _Stats()
    try:
        asyncio.run(_serve(a, deadline, stats))  # loop.time() is time.monotonic()
    finally:
        _say("done", {"bytes_up": stats.up, "bytes_down": stats.down,
                      "connections": stats.connections, "chunks": stats.chunks,
                      "late_mean_ms": round(stats.late_sum_s / stats.chunks * 1e3, 3)
                      if stats.chunks else 0.0,
                      "late_max_ms": round(stats.late_max_s * 1e3, 3)})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {_MODULE}")
    p.add_argument("mode", choices=("relay",))
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--max-s", type=float, default=60.0)
    p.add_argument("--upstream-host", required=True)
    p.add_argument("--upstream-port", type=int, required=True)
    p.add_argument("--delay-ms", type=float, default=50.0)
    a = p.parse_args(argv)
    if a.upstream_host not in LOOPBACK:
        sys.stderr.write(f"the relay connects to loopback only, not {a.upstream_host}\n")
        return 2
    deadline = _guard(a.parent, a.max_s)
    try:
        _main_relay(a, deadline)
    except FaultUnavailable as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

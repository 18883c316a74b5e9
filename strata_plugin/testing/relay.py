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

``buffer_flush_ms`` (``--buffer-flush-ms N``) is a reverse proxy's response buffering:
the server's bytes are held and written to the client every N ms (on a grid from the
connection's start), everything held in one write. The server makes its tokens at its
pace; the client gets them late and clumped: delivery, not the server's pace
(analysis/delivery.py). Facts add the flushes and the bytes per flush.

Two more shapes of a path, for the request's path (issue 31): :class:`PacedUpload`
dribbles the request's bytes upstream at a set rate (a slow uplink: the request reaches
the server late, every byte of it, while the answer comes back at once), and
:class:`RelayChain` puts relays one behind the other (client -> relay -> relay ->
server: a gateway in front of a router). Every relay is its own process, so the path's
discovery (``run/listener.py``) finds each hop by its sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
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
#: The upload pace a relay takes, bytes/s: from a very slow uplink to one that barely
#: slows a request of a few kilobytes.
MIN_PACE_BPS, MAX_PACE_BPS = 100.0, 100e6


class LatencyProxy(Injector):
    """A loopback relay in front of ``upstream`` (``http://127.0.0.1:PORT``) adding
    ``delay_ms`` to each direction's bytes."""

    name = "latency_proxy"
    expected_class = "outside_server"

    def __init__(self, upstream: str, delay_ms: float = 50.0, max_s: float = 300.0,
                 buffer_flush_ms: float = 0.0, *, pace_up_bps: float = 0.0) -> None:
        super().__init__()
        u = urlsplit(upstream if "//" in upstream else f"http://{upstream}")
        if u.hostname not in LOOPBACK or not u.port:
            raise ValueError(f"the relay fronts a loopback server only (host:port on "
                             f"127.0.0.1), not {upstream!r}")
        if not 0 <= delay_ms <= 10_000:
            raise ValueError("delay_ms is in [0, 10000]")
        if pace_up_bps and not MIN_PACE_BPS <= pace_up_bps <= MAX_PACE_BPS:
            raise ValueError(f"pace_up_bps is 0 (not paced) or in [{MIN_PACE_BPS:g}, "
                             f"{MAX_PACE_BPS:g}] bytes/s")
        if not 0 <= buffer_flush_ms <= 10_000:
            raise ValueError("buffer_flush_ms is in [0, 10000] (0: no buffering)")
        self.buffer_flush_ms = buffer_flush_ms
        self.upstream = (u.hostname, u.port)
        self.scheme = u.scheme or "http"
        self.delay_ms, self.max_s = delay_ms, max_s
        self.pace_up_bps = float(pace_up_bps)
        self.proc: Any = None
        self.port = 0

    @property
    def pid(self) -> int | None:
        """The relay's own process (the path's discovery finds it by its sockets)."""
        return self.proc.pid if self.proc is not None else None

    @property
    def url(self) -> str:
        """Where the client connects instead of the server."""
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def _start(self) -> None:
        host, port = self.upstream
        pace = ["--pace-up-bps", f"{self.pace_up_bps:g}"] if self.pace_up_bps else []
        self.proc = _spawn(_helper_argv(
            "relay", self.max_s, "--upstream-host", host, "--upstream-port", str(port),
            "--delay-ms", f"{self.delay_ms:g}", "--buffer-flush-ms",
            f"{self.buffer_flush_ms:g}", *pace, module=_MODULE))
        self.port = int(_await_line(self.proc, "ready", 15.0)["port"])

    def _stop(self) -> dict[str, Any]:
        done: dict[str, Any] = {}
        if self.proc is not None:
            _kill(self.proc)
            done = _last_json(self.proc, "done")
            _close_pipes(self.proc)
        return {"delay_ms": self.delay_ms, "buffer_flush_ms": self.buffer_flush_ms,
                "port": self.port, "pid": self.pid, "pace_up_bps": self.pace_up_bps,
                "upstream": f"{self.upstream[0]}:{self.upstream[1]}", **done}


class PacedUpload(LatencyProxy):
    """A relay that sends the request's bytes upstream at ``pace_up_bps`` bytes/s (a slow
    uplink) and the response back as it comes (plus ``delay_ms``, 0 by default).

    Every request byte is paced, head and body alike (the relay reads no HTTP): a request
    of B bytes reaches the server B / rate seconds after the client sent it, which the
    server's clocks never see. The facts add the seconds the relay spent pacing
    (``pace_wait_s``) beside the bytes it paced (``bytes_up``).
    """

    name = "upload_pacing"

    def __init__(self, upstream: str, pace_up_bps: float, delay_ms: float = 0.0,
                 max_s: float = 300.0) -> None:
        super().__init__(upstream, delay_ms=delay_ms, max_s=max_s, pace_up_bps=pace_up_bps)


class RelayChain(Injector):
    """Relays one behind the other in front of ``upstream``: the client connects to the
    first (:attr:`url`), each relays to the next, the last to the server. ``hops`` are the
    relays' keyword arguments (``delay_ms``, ``pace_up_bps``), first hop first."""

    name = "relay_chain"
    expected_class = "outside_server"

    def __init__(self, upstream: str, hops: list[dict[str, float]],
                 max_s: float = 300.0) -> None:
        super().__init__()
        if not hops:
            raise ValueError("a chain has one relay at least")
        self.upstream, self.hops, self.max_s = upstream, [dict(h) for h in hops], max_s
        self.relays: list[LatencyProxy] = []

    @property
    def url(self) -> str:
        return self.relays[0].url

    @property
    def pids(self) -> list[int]:
        """The relays' processes, first hop first."""
        return [r.pid for r in self.relays if r.pid is not None]

    def _start(self) -> None:
        target = self.upstream
        for hop in reversed(self.hops):  # the server's side first: each needs its next
            relay = LatencyProxy(target, max_s=self.max_s, **hop)
            self.relays.insert(0, relay)  # stopped with the others if its start fails
            relay.start()
            target = relay.url

    def _stop(self) -> dict[str, Any]:
        facts = [r.stop().as_dict() for r in self.relays]
        return {"hops": facts, "url": self.relays[0].url if self.relays else "",
                "upstream": self.upstream}


# --- the helper process -------------------------------------------------------------------


class _Stats:
    def __init__(self) -> None:
        self.up = self.down = self.connections = self.chunks = 0
        self.late_max_s = 0.0
        self.late_sum_s = 0.0
        self.pace_wait_s = 0.0
        self.flushes = 0  # writes of held response bytes (buffering)
        self.flushed_bytes = 0


async def _paced_write(writer: asyncio.StreamWriter, data: bytes, bps: float,
                       stats: _Stats) -> None:
    """``data`` written in pieces of a fiftieth of a second's bytes, each at its due time
    on the relay's clock (due times add up from the first piece: no drift)."""
    loop = asyncio.get_running_loop()
    piece = max(1, int(bps / 50))
    t0 = due = loop.time()
    for i in range(0, len(data), piece):
        part = data[i:i + piece]
        wait = due - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        writer.write(part)
        await writer.drain()
        due += len(part) / bps
    stats.pace_wait_s += max(0.0, due - t0)


def _tick(due: float, t0: float, period_s: float) -> float:
    """The first flush at or after ``due`` on the grid ``t0 + k * period_s``."""
    return t0 + -(-(due - t0) // period_s) * period_s


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float,
                stats: _Stats, up: bool, pace_bps: float = 0.0, flush_s: float = 0.0) -> None:
    """Read chunks as they come; write each ``delay_s`` after it was read, in order
    (``pace_bps``: dribbled at that many bytes per second). With ``flush_s``, each is
    held to the next flush of a grid from now, and a flush writes every chunk due by
    then in one write."""
    loop = asyncio.get_running_loop()
    pending: collections.deque[tuple[float, bytes]] = collections.deque()
    arrived = asyncio.Event()
    t0 = loop.time()

    def due_of(read_at: float) -> float:
        return _tick(read_at, t0, flush_s) if flush_s > 0 else read_at

    async def feed() -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await reader.read(65536)
                pending.append((loop.time() + delay_s, data))
                arrived.set()
                if not data:
                    return
        pending.append((loop.time() + delay_s, b""))
        arrived.set()

    async def drain() -> None:
        try:
            while True:
                while not pending:
                    arrived.clear()
                    await arrived.wait()
                due = due_of(pending[0][0])
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                held = []  # one chunk; with buffering every chunk due by this flush
                while pending and pending[0][1] and due_of(pending[0][0]) <= due:
                    held.append(pending.popleft()[1])
                    if flush_s <= 0:
                        break
                if not held:  # EOF (after everything before it was written)
                    with contextlib.suppress(OSError):
                        if writer.can_write_eof():
                            writer.write_eof()
                    return
                data = b"".join(held)
                if flush_s > 0:
                    stats.flushes += 1
                    stats.flushed_bytes += len(data)
                late = loop.time() - due
                stats.chunks += 1
                stats.late_sum_s += late
                stats.late_max_s = max(stats.late_max_s, late)
                if up:
                    stats.up += len(data)
                else:
                    stats.down += len(data)
                if pace_bps:
                    await _paced_write(writer, data, pace_bps, stats)
                    continue
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
    flush_s = a.buffer_flush_ms / 1e3

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        stats.connections += 1
        try:
            sr, sw = await asyncio.open_connection(a.upstream_host, a.upstream_port)
        except OSError:
            cw.close()
            return
        try:
            await asyncio.gather(_pump(cr, sw, delay_s, stats, True, a.pace_up_bps),
                                 _pump(sr, cw, delay_s, stats, False, flush_s=flush_s))
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
                      "late_max_ms": round(stats.late_max_s * 1e3, 3),
                      "pace_wait_s": round(stats.pace_wait_s, 3),
                      "flushes": stats.flushes,
                      "bytes_per_flush": round(stats.flushed_bytes / stats.flushes, 1)
                      if stats.flushes else 0.0})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {_MODULE}")
    p.add_argument("mode", choices=("relay",))
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--max-s", type=float, default=60.0)
    p.add_argument("--upstream-host", required=True)
    p.add_argument("--upstream-port", type=int, required=True)
    p.add_argument("--delay-ms", type=float, default=50.0)
    p.add_argument("--pace-up-bps", type=float, default=0.0,
                   help="send the request's bytes upstream at this many bytes/s (0: as read)")
    p.add_argument("--buffer-flush-ms", type=float, default=0.0,
                   help="hold the response bytes, flush them every N ms (0: off)")
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

"""A round-robin TCP router on 127.0.0.1 in front of several engines (replicas).

Why: data-parallel replicas behind a router (vLLM's and SGLang's routers, llm-d, any L4
balancer) are how engines are served in practice, and the request's path then fans out:
one listener, several engines. :class:`RoundRobinRouter` starts a helper process that
listens on an ephemeral loopback port and, for each connection it accepts, opens one
connection to the next upstream in turn and relays both directions as they come (no
delay, no buffering). One upstream connection per client connection, opened when the
client's connection is accepted and closed with it: which engine served a request is
knowable from the router's sockets while the connection is open (HAProxy in TCP mode,
nginx ``stream`` without ``keepalive`` do the same). The helper is its own process, so
the path's discovery (``run/listener.py``) finds it and every upstream by their sockets.

Facts: the upstreams and the connections each one was handed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any
from urllib.parse import urlsplit

from strata_plugin.testing.faults import (
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
from strata_plugin.testing.relay import LOOPBACK, _parent_alive, _pump, _Stats

_MODULE = "strata_plugin.testing.router"
#: A router spreads over two upstreams at least (one is a relay), and no more than a
#: test's replicas.
MIN_UPSTREAMS, MAX_UPSTREAMS = 2, 16


def _upstream(text: str) -> tuple[str, int]:
    u = urlsplit(text if "//" in text else f"http://{text}")
    try:
        port = u.port
    except ValueError:
        port = None
    if u.hostname not in LOOPBACK or not port:
        raise ValueError(f"the router fronts loopback engines only (http://127.0.0.1:PORT), "
                         f"not {text!r}")
    return u.hostname, port


class RoundRobinRouter(Injector):
    """A loopback router handing each new client connection to the next of ``upstreams``
    (``http://127.0.0.1:PORT`` each), in turn."""

    name = "round_robin_router"
    expected_class = ""  # a deployment's shape, not a fault

    def __init__(self, upstreams: list[str], max_s: float = 300.0) -> None:
        super().__init__()
        if not MIN_UPSTREAMS <= len(upstreams) <= MAX_UPSTREAMS:
            raise ValueError(f"a router has {MIN_UPSTREAMS} to {MAX_UPSTREAMS} upstreams, "
                             f"not {len(upstreams)}")
        self.upstreams = [_upstream(u) for u in upstreams]
        self.max_s = max_s
        self.proc: Any = None
        self.port = 0

    @property
    def pid(self) -> int | None:
        """The router's own process."""
        return self.proc.pid if self.proc is not None else None

    @property
    def url(self) -> str:
        """Where the client connects."""
        return f"http://127.0.0.1:{self.port}"

    def _start(self) -> None:
        ups = [a for host, port in self.upstreams for a in ("--upstream", f"{host}:{port}")]
        self.proc = _spawn(_helper_argv("route", self.max_s, *ups, module=_MODULE))
        self.port = int(_await_line(self.proc, "ready", 15.0)["port"])

    def _stop(self) -> dict[str, Any]:
        done: dict[str, Any] = {}
        if self.proc is not None:
            _kill(self.proc)
            done = _last_json(self.proc, "done")
            _close_pipes(self.proc)
        return {"port": self.port, "pid": self.pid,
                "upstreams": [f"{h}:{p}" for h, p in self.upstreams], **done}


# --- the helper process -------------------------------------------------------------------


async def _serve(upstreams: list[tuple[str, int]], parent: int, deadline_s: float,
                 handed: list[int], stats: _Stats) -> None:
    turn = [0]

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        i = turn[0] % len(upstreams)
        turn[0] += 1
        handed[i] += 1
        stats.connections += 1
        try:
            sr, sw = await asyncio.open_connection(*upstreams[i])
        except OSError:
            cw.close()
            return
        try:
            await asyncio.gather(_pump(cr, sw, 0.0, stats, True),
                                 _pump(sr, cw, 0.0, stats, False))
        finally:
            for w in (sw, cw):
                with contextlib.suppress(OSError):
                    w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    _say("ready", {"port": server.sockets[0].getsockname()[1]})
    async with server:
        loop = asyncio.get_running_loop()
        while loop.time() < deadline_s and _parent_alive(parent):
            await asyncio.sleep(0.25)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {_MODULE}")
    p.add_argument("mode", choices=("route",))
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--max-s", type=float, default=60.0)
    p.add_argument("--upstream", action="append", required=True, help="HOST:PORT, in turn")
    a = p.parse_args(argv)
    try:
        upstreams = [_upstream(u) for u in a.upstream]
    except ValueError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    deadline = _guard(a.parent, a.max_s)
    handed = [0] * len(upstreams)
    stats = _Stats()
    try:
        asyncio.run(_serve(upstreams, a.parent, deadline, handed, stats))
    finally:
        _say("done", {"handed": {f"{h}:{port}": n for (h, port), n in zip(upstreams, handed)},
                      "connections": stats.connections})
    return 0


if __name__ == "__main__":
    sys.exit(main())

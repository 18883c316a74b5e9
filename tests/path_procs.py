"""Small real servers and proxies for the request-path tests (tests/test_request_path.py),
each its own process, so the path's discovery finds it by its sockets as it would find
nginx or a router: ``python tests/path_procs.py MODE [options]``; prints the port it
listens on, then serves until killed (or ``--max-s``).

* ``http``: an HTTP/1.1 server answering every request ``200`` (``--hold HOST:PORT``, as
  often as wanted: it also keeps one connection open to each address from its start, as
  an engine keeps one to a database or a Ray head).
* ``forward``: a proxy that opens a new connection upstream for each client connection
  (``--to HOST:PORT``) and relays both ways; at most ``--max-conns`` relayed at once (a
  loop of two forwarders would otherwise open them without end): past them a client's
  connection is held open, unanswered. A count of those open, as a proxy's connection
  limit is, not of all ever made: one short connection into a loop (Strata's NAT check
  connects and closes before its probe) runs round it to the limit and back down, and a
  lifetime count would then leave the probe's connections held, the proxy opening none.
* ``pool``: a proxy holding one connection to its upstream (``--to``) from its start and
  opening none per request (a keep-alive pool); it answers clients itself.
* ``raw``: a TCP listener that accepts and never speaks HTTP (a database).

``--port N`` listens on that port (default: an ephemeral one), ``--bind ADDR`` on that
address (default 127.0.0.1), ``--reuseport`` with SO_REUSEPORT (several processes on one
port).
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _pipe(src: socket.socket, dst: socket.socket,
          slot: threading.Semaphore | None = None) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if slot is not None:  # the relay is over (both ways are shut): its slot is free
            slot.release()


def _answer(c: socket.socket) -> None:
    with c:
        c.settimeout(5)
        try:
            got = b""
            while b"\r\n\r\n" not in got:
                data = c.recv(4096)
                if not data:
                    return
                got += data
            c.sendall(OK)
        except OSError:
            pass


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("http", "forward", "pool", "raw"))
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--to", type=_addr)
    p.add_argument("--hold", type=_addr, action="append", default=[])
    p.add_argument("--reuseport", action="store_true")
    p.add_argument("--max-conns", type=int, default=50)
    p.add_argument("--max-s", type=float, default=120.0)
    a = p.parse_args()
    srv = socket.create_server((a.bind, a.port), reuse_port=a.reuseport)
    held = [socket.create_connection(h) for h in a.hold]
    if a.mode == "pool":
        held.append(socket.create_connection(a.to))
    print(srv.getsockname()[1], flush=True)
    slots = threading.Semaphore(a.max_conns)
    deadline = time.monotonic() + a.max_s
    srv.settimeout(0.5)
    while time.monotonic() < deadline:
        try:
            c, _ = srv.accept()
        except TimeoutError:
            continue
        if a.mode == "raw":
            held.append(c)
        elif a.mode == "forward":
            if not slots.acquire(blocking=False):  # held, not closed: a close would
                held.append(c)  # run back the loop
                continue
            try:
                up = socket.create_connection(a.to, timeout=5)
            except OSError:
                c.close()
                slots.release()
                continue
            threading.Thread(target=_pipe, args=(c, up, slots), daemon=True).start()
            threading.Thread(target=_pipe, args=(up, c), daemon=True).start()
        else:
            threading.Thread(target=_answer, args=(c,), daemon=True).start()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Each engine's connections on a fine grid: the evidence of which engine served a request.

Where the server is several engines behind a router (replicas), the client's connection
ends at the router and the request's way on from it is the router's business: the router's
pairing of its client socket with its upstream socket is inside the router and shows in no
file. What does show is each engine's own side: a router that opens one upstream connection
per client connection (HAProxy in TCP mode, nginx ``stream`` without ``keepalive``,
``testing/router.py``) opens a connection to one engine when a request comes and that
connection closes when the request ends. So the engine that served a request is the one
whose connection opened and closed with it (``analysis/engine_requests.py``).

Silent while the server is one engine (its connections tell nothing the request does not).
With several, a thread of its own reads, every ``interval_s`` (20 ms, the run-state
grid: a request's way through a loopback router takes well under 1 ms, and its
attribution needs its opening and closing told apart from other requests', tens of ms
apart at least), the established TCP connections of each engine's network namespace (one read per
namespace: the kernel's sock_diag for the agent's own namespace, filtered by state in
the kernel; ``/proc/<root>/net/tcp`` and ``tcp6`` for another, which also list every
TIME_WAIT socket) and keeps the connections whose local end is one of that engine's listening
sockets, in state ESTABLISHED: a connection ends when either side closes it (the engine
after its answer; the router when its client hung up, however long the engine takes to
notice), as the request ends for the client. The listening sockets are those of the engine's root
process's descriptors (``/proc/<root>/fd`` -> ``socket:[inode]``), looked up again every
``LISTEN_RESCAN_S``. When a connection is no longer seen, one row:

* wall = when it was first seen, device ``pid<N>`` (the engine's root process), gauges
  ``conn_open_s`` (from first to last seen), ``conn_opened_within_s`` (from the step
  before, which did not see it, to the first that did: it opened in that span) and
  ``conn_closed_within_s`` (from the last step that saw it to the first that did not).
  The two spans are the grid step as it was kept: a thread kept from its CPU (a loaded
  host, the agent's own main tick) widens them, and they say by how much.

The three rows of a connection are written together, so the k-th row of each of an
engine's three series is the same connection (rows of one series at the same time keep
the order they were written in, ``analysis/timeline.py``).

Cost: one sock_diag dump (or one read of the tcp tables) per namespace a step. Measured
here (two engines, four connections, 150 sockets on the host): 1.23 ms of CPU a step,
about 6% of a core at 20 ms, nearly all of it the kernel walking its TCP hash table, which
it does whatever the sockets; /proc/net/tcp took 10.7 ms a read with 600 sockets, most of
them TIME_WAIT. Only while the server is several engines.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING

from .base import Collector, Emit, Unavailable

if TYPE_CHECKING:
    import argparse

    from ..targets import ProcessTargets

#: The grid, in seconds (module docstring).
INTERVAL_S = 0.02
#: How often each engine's listening sockets are looked up again, in seconds.
LISTEN_RESCAN_S = 1.0
#: /proc/net/tcp states: LISTEN, and ESTABLISHED (neither side has closed it).
_LISTEN = "0A"
_ESTABLISHED = "01"
_TABLES = ("tcp", "tcp6")


def _socket_inodes(pid: int) -> set[int]:
    """The socket inodes among ``pid``'s descriptors (empty once it is gone or unreadable)."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return set()
    out = set()
    for n in names:
        try:
            link = os.readlink(f"{fd_dir}/{n}")
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def _rows(pid: int) -> list[list[str]]:
    """The split lines of the tcp tables of ``pid``'s network namespace."""
    out: list[list[str]] = []
    for table in _TABLES:
        try:
            with open(f"/proc/{pid}/net/{table}", "rb") as f:
                text = f.read().decode("ascii", "replace")
        except OSError:
            continue
        out.extend(line.split() for line in text.splitlines()[1:])
    return [r for r in out if len(r) > 9]


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_DUMP_REQUEST = 0x301  # NLM_F_REQUEST | NLM_F_DUMP
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_ESTABLISHED = 1


def _hex_end(family: int, addr: bytes, port: int) -> str:
    """An end (address, port) as /proc/net/tcp writes it: each 32-bit word of the address
    in host order, in hex, then the port."""
    words = struct.unpack(f"={len(addr) // 4}I", addr)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def _established_by_netlink(families: set[int]) -> list[list[str]] | None:
    """The established TCP connections of the agent's own network namespace, as the
    split /proc/net/tcp lines this module reads (local end, remote end, state), from the
    kernel's sock_diag: filtered by state in the kernel, so a host's thousands of
    TIME_WAIT sockets cost nothing (/proc/net/tcp lists them all: about 10 ms of CPU for
    600 here, longer than the grid). None where sock_diag cannot be used."""
    out: list[list[str]] = []
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
        sock.settimeout(1.0)  # a dump answers at once; never hang the sampler on one
    except (OSError, AttributeError):
        return None
    try:
        for family, size in ((socket.AF_INET, 4), (socket.AF_INET6, 16)):
            if family not in families:
                continue  # each family's dump walks the kernel's whole table
            req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0,
                              1 << _TCP_ESTABLISHED) + bytes(48)
            sock.send(struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY,
                                  _NLM_F_DUMP_REQUEST, 1, 0) + req)
            done = False
            while not done:
                data = sock.recv(1 << 16)
                at = 0
                while at + 16 <= len(data):
                    length, kind = struct.unpack_from("=IH", data, at)
                    if kind == _NLMSG_DONE or length < 16:
                        done = True
                        break
                    if kind == _NLMSG_ERROR:
                        return None
                    msg = at + 16  # inet_diag_msg: family, state, timer, retrans, sockid
                    sport, dport = struct.unpack_from(">HH", data, msg + 4)
                    src = data[msg + 8: msg + 8 + size]
                    dst = data[msg + 24: msg + 24 + size]
                    out.append(["", _hex_end(family, src, sport), _hex_end(family, dst, dport),
                                "01"])
                    at += (length + 3) & ~3
    except OSError:
        return None
    finally:
        sock.close()
    return out


class _Engine:
    """One engine: its namespace (by a member process) and its listening ends."""

    __slots__ = ("listening", "netns", "pid")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.netns = ""
        self.listening: set[str] = set()  # "ADDR:PORT" as /proc/net/tcp writes it

    def families(self) -> set[int]:
        """The address families it listens in (an IPv6 end takes v4-mapped peers too)."""
        return {socket.AF_INET6 if len(x.partition(":")[0]) == 32 else socket.AF_INET
                for x in self.listening}

    def rescan(self) -> None:
        try:
            self.netns = os.readlink(f"/proc/{self.pid}/ns/net")
        except OSError:
            self.netns, self.listening = "", set()
            return
        mine = _socket_inodes(self.pid)
        self.listening = {r[1] for r in _rows(self.pid) if r[3] == _LISTEN and
                          r[9].isdigit() and int(r[9]) in mine}


def _serves(local: str, listening: set[str]) -> bool:
    """A connection's local end is one of the listening ends: the same address and port,
    or the same port where the engine listens on every address."""
    if local in listening:
        return True
    port = local.rpartition(":")[2]
    return any(x.rpartition(":")[2] == port and set(x.rpartition(":")[0]) <= {"0"}
               for x in listening)


class ConnsCollector(Collector):
    source = "conns"
    follows_targets = True

    def __init__(self, targets: ProcessTargets, interval_s: float = INTERVAL_S) -> None:
        super().__init__()
        self.targets = targets
        self.interval_s = interval_s
        self._engines: dict[int, _Engine] = {}
        self._next_rescan = 0.0
        #: (root, "local-remote") -> [step before first seen, first seen, last seen], wall ns
        self._open: dict[tuple[int, str], list[int]] = {}
        self._prev_wall: int | None = None  # the last step's
        try:
            self._own_netns = os.readlink("/proc/self/ns/net")
        except OSError:
            self._own_netns = "?"
        self._done: list[Emit] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def probe(self) -> None:
        try:
            self.targets.probe()
        except ValueError as e:
            raise Unavailable(str(e)) from None
        self.targets.commands.clear()  # the proc collector records them

    def set_pids(self, pids: list[int]) -> None:
        self.targets.set_pids(pids)
        self._next_rescan = 0.0

    def sample(self, wall_ns: int) -> list[Emit]:
        self.targets.refresh()
        if self._thread is None and len(self.targets.roots) > 1:
            self._thread = threading.Thread(target=self._run, name="strata-conns", daemon=True)
            self._thread.start()
        return self.take()

    def take(self) -> list[Emit]:
        """The rows of the connections gone since the last call."""
        with self._lock:
            out, self._done = self._done, []
        return out

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)

    # -- the fine grid -------------------------------------------------------------------
    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.step(time.time_ns())
            except Exception as e:  # the agent and its other collectors run on
                self.mark_unavailable("", f"the connection sampler stopped: "
                                          f"{type(e).__name__}: {e}")
                return
            next_t += self.interval_s
            now = time.monotonic()
            if next_t < now:  # late (a loaded host): the next step now, not a burst
                next_t = now
            self._stop.wait(next_t - now)

    def step(self, wall_ns: int) -> None:
        """One read of every engine's connections at ``wall_ns``."""
        now = time.monotonic()
        roots = tuple(self.targets.roots)
        if now >= self._next_rescan or set(roots) != set(self._engines):
            self._engines = {p: self._engines.get(p) or _Engine(p) for p in roots}
            for e in self._engines.values():
                e.rescan()
            self._next_rescan = now + LISTEN_RESCAN_S
        seen: set[tuple[int, str]] = set()
        tables: dict[str, list[list[str]]] = {}
        for e in self._engines.values():
            if not e.listening:
                continue
            if e.netns not in tables:
                diag = None
                if e.netns == self._own_netns:
                    diag = _established_by_netlink(
                        {f for x in self._engines.values() if x.netns == e.netns
                         for f in x.families()})
                tables[e.netns] = diag if diag is not None else _rows(e.pid)
            for r in tables[e.netns]:
                if r[3] == _ESTABLISHED and _serves(r[1], e.listening):
                    # its two ends name it: its inode is 0 until the engine accepts it
                    key = (e.pid, f"{r[1]}-{r[2]}")
                    seen.add(key)
                    span = self._open.get(key)
                    if span is None:
                        before = wall_ns if self._prev_wall is None else self._prev_wall
                        self._open[key] = [before, wall_ns, wall_ns]
                    else:
                        span[2] = wall_ns
        gone = [k for k in self._open if k not in seen]
        if gone:
            rows: list[Emit] = []
            for k in gone:
                before, first, last = self._open.pop(k)
                dev = f"pid{k[0]}"
                rows += [(first, dev, "conn_open_s", (last - first) / 1e9, "gauge"),
                         (first, dev, "conn_opened_within_s", (first - before) / 1e9, "gauge"),
                         (first, dev, "conn_closed_within_s", (wall_ns - last) / 1e9, "gauge")]
            with self._lock:
                self._done.extend(rows)
        self._prev_wall = wall_ns


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory: the server's engines (its roots), on the fine grid."""
    return ConnsCollector(targets)

"""The processes behind an attached server's URL: the listener, the proxies, the engine.

``--strata-server-url http://127.0.0.1:8000`` names a server Strata did not start, so it
has no PID for it; without one the agent cannot follow the server's CPU, faults,
threads, run state and cgroup, and the CPU rules cannot decide. And the process that
listens on the URL's port is often not the engine: a router, an API gateway, a TLS
terminator or a container runtime's port forwarder (``docker-proxy``) listens there and
connects on to the engine. Followed as the server, that proxy's fraction of a core is
"the server" and the engine's cores are "other processes": the verdict then names
``cpu_contention`` for the engine's own work (issue 31, measured on a relay in front of
llama-server). :func:`discover` follows the path instead:

1. The socket listening on the URL's port (``/proc/net/tcp``, ``/proc/net/tcp6``: state
   0A = LISTEN, proc(5)) belongs to the processes that hold its inode among their file
   descriptors (``/proc/<pid>/fd/* -> socket:[inode]``). Processes holding sockets of
   their own on one port (SO_REUSEPORT) are several engines; processes sharing one
   socket (a forking server's workers) are one.
2. A URL address that is no listener here is looked for in the other network namespaces
   of this machine (``run/netns.py``: one process's ``/proc/<pid>/net`` per namespace,
   matched by the namespace's own addresses): a container on a bridge network reached at
   its address. Where nothing listens at all, the probe connection's NAT translation
   (the connection-tracking table) says where a published port really goes.
3. A process that holds its own connections to another listener is a proxy: its
   sockets in state ESTABLISHED (01) or SYN_SENT (02) whose local port is none of its
   listening ports are connections it opened, in any namespace (a forwarder that made
   its upstream socket inside the engine's namespace holds it in that namespace's
   table). The listener at their far end (in this namespace, another one, or where a NAT
   rule sends the connection) is the next hop, followed the same way: two hops and more,
   a cycle stopped at a listener already on the path, at most ``max_depth`` hops (a hop
   still connecting on there is a proxy, not the engine, and the path says so).
4. The hop that opens no connection on is an engine; the agent follows it as the
   server and the proxies as the path (``--path-pid``), so their CPU is neither the
   server's nor "other processes'". Each engine is recorded with its host PID, network
   namespace, cgroup and container (``RequestPath.engines``). A far end that no network
   namespace of this machine holds is another host: the path says so, and that engine
   cannot be observed.

**Why a probe.** Many proxies keep a pool of upstream connections (nginx ``keepalive``,
Envoy, Go's ``httputil.ReverseProxy``, Python HTTP clients): those are there at any
moment. Others open one per request (a TCP relay, HAProxy in TCP mode, nginx without
``keepalive``): between requests the proxy holds no connection on, and a look at an
idle proxy finds the proxy alone. So the sockets are read over a short window
(``window_s``, 1 s) while probe requests are in flight: held open, ``DISCOVERY_HELD_EACH``
POSTs whose head stops short (a TCP relay forwards them at once, and every server waits
for the head's end), then as many whose head is whole and whose body stops after its
first byte (an HTTP proxy connects on once it has the head; the engine waits for a body
that never comes: no token is generated), so that a round-robin router over several
replicas hands one to each of them (every replica then holds one while the sockets are
read; one of each kind found one replica of two), and a GET of the health path every
50 ms for proxies that buffer the whole request before they connect. A connection that
appeared during the probe carried it: those are the hop's upstreams. A hop that opened
none is followed along the connections it already held only to a listener that answers
the health path with a 2xx status (an engine's own connections to a database, a Ray
head or a ZeroMQ peer do not), and without any it is the engine.

Bounded whatever the topology (``limits.py``, the DISCOVERY_* rows): the idle peers are
asked at once within one total time, the hops followed and the paths listed are capped,
and each cap reached is said in the path's notes.

What this cannot see, stated where it matters: a proxy that forwards over a Unix socket
(no TCP peer to follow); another user's processes, without privileges (their file
descriptors and namespaces are not readable: the hop says whose socket it is, and how
many namespaces could not be read); a NAT rule whose translation the connection-tracking
table does not show and that neither ``iptables -t nat -S`` nor ``nft -j list ruleset``
lists (another namespace's rules, or a user not allowed to list them).
``telemetry.pid_pattern`` names the engine in all of these, and wins wherever it is
given. Process facts are read from /proc only; the commands run are a container
runtime's ``ps``, to name a container, and the NAT rules' listing where connection
tracking has no entry (``run/netns.py``).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import selectors
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from strata_plugin.formats.request_path import Container, Engine, Hop, RequestPath
from strata_plugin.limits import (
    DISCOVERY_HELD_EACH,
    DISCOVERY_LISTENERS_MAX,
    DISCOVERY_PATHS_MAX,
    DISCOVERY_PEER_CHECK_S,
    DISCOVERY_PEERS_MAX,
)
from strata_plugin.run.netns import (
    DnatRule,
    container_of,
    namespaces,
    nat_destination,
    nat_rules,
    ns_inode,
    ns_key,
    rule_read,
    rule_translation,
    translation,
)

_LISTEN, _ESTABLISHED, _SYN_SENT = "0A", "01", "02"
#: The most hops followed from the URL's listener (a chain longer than this is a loop
#: the listener-address guard did not catch, or a deployment no one would build).
MAX_DEPTH = 8
#: How long the sockets are read while the probe is in flight (seconds); each new hop
#: seen extends it to WINDOW_GROW_S after that hop, up to WINDOW_MAX_S in all.
WINDOW_S = 1.0
WINDOW_GROW_S, WINDOW_MAX_S = 0.5, 3.0
#: Between two reads of the sockets, and between two GET probes (seconds).
SCAN_EVERY_S, GET_EVERY_S = 0.01, 0.05
INTERPRETERS = ("python", "python3", "node", "java", "ruby", "perl", "bun", "deno", "php")


# --- /proc/net/tcp -------------------------------------------------------------------------


@dataclass(frozen=True)
class Sock:
    """One line of /proc/net/tcp or tcp6."""

    laddr: str
    lport: int
    raddr: str
    rport: int
    state: str
    uid: int
    inode: str


def _addr(hexaddr: str) -> str:
    """/proc/net/tcp's address (host byte order per 32-bit word) as text; an IPv4-mapped
    IPv6 address as its IPv4 form."""
    words = [int(hexaddr[i:i + 8], 16) for i in range(0, len(hexaddr), 8)]
    raw = b"".join(struct.pack("=I", w) for w in words)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw)
    ip = ipaddress.IPv6Address(raw)
    return str(ip.ipv4_mapped) if ip.ipv4_mapped else str(ip)


def read_sockets(net: Path) -> list[Sock]:
    """Every TCP socket of one network namespace (``/proc/net`` or ``/proc/<pid>/net``)."""
    out = []
    for name in ("tcp", "tcp6"):
        try:
            lines = (net / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10:
                continue
            try:
                la, lp = f[1].rsplit(":", 1)
                ra, rp = f[2].rsplit(":", 1)
                out.append(Sock(_addr(la), int(lp, 16), _addr(ra), int(rp, 16), f[3],
                                int(f[7]), f[9]))
            except (ValueError, OSError):
                continue
    return out


def _wildcard(addr: str) -> bool:
    return addr in ("0.0.0.0", "::")


def _matches(listener: Sock, addr: str, port: int) -> bool:
    """``listener`` accepts connections to ``addr:port`` (its own address or any)."""
    return listener.lport == port and (listener.laddr == addr or _wildcard(listener.laddr))


def _hostport(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def local_addresses(net: Path) -> set[str]:
    """The addresses of one network namespace: every ``/32 host LOCAL`` of its fib_trie
    (IPv4) and every address of ``if_inet6``; loopback always."""
    out = {"127.0.0.1", "::1"}
    with contextlib.suppress(OSError):
        last = ""
        for line in (net / "fib_trie").read_text().splitlines():
            s = line.strip()
            if s.startswith("|--"):
                last = s[3:].strip()
            elif "/32 host LOCAL" in s and last:
                out.add(last)
    with contextlib.suppress(OSError):
        for line in (net / "if_inet6").read_text().splitlines():
            f = line.split()
            if f and len(f[0]) == 32:
                out.add(str(ipaddress.IPv6Address(bytes.fromhex(f[0]))))
    return out


def _is_local(addr: str, local: set[str]) -> bool:
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    return ip.is_loopback or addr in local


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[str]:
    """Inodes of the TCP sockets listening on ``port`` (any address, IPv4 or IPv6)."""
    return {s.inode for s in read_sockets(proc / "net")
            if s.state == _LISTEN and s.lport == port and s.inode != "0"}


# --- /proc/<pid>/fd -------------------------------------------------------------------------


def _socket_inodes(pid: int, proc: Path) -> set[str] | None:
    """The socket inodes ``pid`` holds, or None when its fds cannot be read."""
    base = proc / str(pid) / "fd"
    try:
        fds = os.listdir(base)
    except OSError:
        return None
    out = set()
    for fd in fds:
        try:
            link = os.readlink(base / fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[8:-1])
    return out


def _pids(proc: Path) -> list[int]:
    try:
        return sorted(int(e) for e in os.listdir(proc) if e.isdigit())
    except OSError:
        return []


def owners(inodes: Iterable[str], proc: Path = Path("/proc")) -> tuple[dict[str, set[int]], int]:
    """Which PIDs hold each of these socket inodes, and how many processes could not be
    read (another user's, without privileges)."""
    wanted = set(inodes)
    out: dict[str, set[int]] = {}
    denied = 0
    if not wanted:
        return out, 0
    for pid in _pids(proc):
        held = _socket_inodes(pid, proc)
        if held is None:
            denied += (proc / str(pid)).exists()
            continue
        for i in held & wanted:
            out.setdefault(i, set()).add(pid)
    return out, denied


def socket_owner(inodes: set[str], proc: Path = Path("/proc")) -> int | None:
    """The lowest PID holding one of these socket inodes (a forking server's parent)."""
    found, _ = owners(inodes, proc)
    pids = set().union(*found.values()) if found else set()
    return min(pids) if pids else None


def attached_server_pid(base_url: str, proc: Path = Path("/proc")) -> int | None:
    """The PID of the process listening on a loopback URL's port, or None (another host,
    no such listener, or not allowed to see it). The first hop of :func:`discover`,
    without the probe: what attach mode followed before the path was looked at."""
    try:
        parts = urlsplit(base_url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return None
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    if not _is_loopback(host):
        return None
    return socket_owner(listening_inodes(port, proc), proc)


def _name(pid: int, proc: Path) -> str:
    """A short name of a process's command: ``nginx``, ``vllm serve``, ``python -m x``."""
    try:
        argv = [a.decode(errors="replace") for a in
                (proc / str(pid) / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")]
    except OSError:
        argv = []
    if not argv or not argv[0]:
        try:
            return (proc / str(pid) / "comm").read_text().strip()
        except OSError:
            return "?"
    words = [os.path.basename(argv[0])]
    rest = argv[1:]
    if words[0].rstrip("0123456789.") in INTERPRETERS:
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            rest = rest[1:]
        if rest[:1] == ["-m"] and len(rest) > 1:
            words += ["-m", rest[1]]
            rest = rest[2:]
        elif rest:
            words.append(os.path.basename(rest[0]))
            rest = rest[1:]
    if rest and rest[0][:1].isalpha() and "/" not in rest[0] and len(rest[0]) <= 24:
        words.append(rest[0])  # a subcommand: `vllm serve`, `relay`
    return " ".join(words)[:80]


def _tree(roots: Iterable[int], proc: Path) -> set[int]:
    """The roots and their descendants (a proxy that forks per connection)."""
    from strata_plugin.agent import procfs

    out: set[int] = set()
    if proc == Path(procfs.PROC):
        for r in roots:
            out.update(procfs.process_tree(r))
    return out or set(roots)


# --- the path -------------------------------------------------------------------------------

#: One far end, keyed by where its connection is: (namespace key, local address, port).
_Where = tuple[str, str, int]
#: How long one idle peer has to answer the health path (seconds); all of them together
#: have DISCOVERY_PEER_CHECK_S.
ANSWER_TIMEOUT_S = 0.5
#: The URL's addresses whose NAT translation is probed (each waits up to
#: ``netns.NAT_WAIT_S`` for its entry): a name resolves to one or two (IPv4, IPv6).
NAT_ADDRESSES_MAX = 4


@dataclass
class _Net:
    """One network namespace: where its tables are read, its addresses, the baseline."""

    key: str  # its /proc/<pid>/ns/net link, "net:[<inode>]"
    net: Path
    local: set[str]
    socks: list[Sock] = field(default_factory=list)

    def read(self) -> list[Sock]:
        self.socks = read_sockets(self.net)
        return self.socks

    def listeners(self, addr: str, port: int) -> list[Sock]:
        """Every socket listening for ``addr:port``: those bound to that address, else
        those bound to any (the kernel prefers the bound one); several where processes
        share the port with SO_REUSEPORT."""
        on_port = [s for s in self.socks
                   if s.state == _LISTEN and s.lport == port and s.inode != "0"]
        return [s for s in on_port if s.laddr == addr] or [s for s in on_port
                                                           if _wildcard(s.laddr)]

    def listener(self, addr: str, port: int) -> Sock | None:
        found = self.listeners(addr, port)
        return found[0] if found else None


@dataclass
class _Node:
    """One listener on the path (the processes holding one listening socket, or several
    sockets they share) and what was seen of it during the window."""

    net: _Net
    listen: Sock
    pids: set[int]  # every PID holding the listening socket(s)
    #: far end -> where the connection to it is (namespace key, local address, port)
    upstream_new: dict[tuple[str, int], _Where] = field(default_factory=dict)
    upstream_old: dict[tuple[str, int], _Where] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.net.key, self.listen.laddr, self.listen.lport, min(self.pids))

    @property
    def address(self) -> tuple[str, str, int]:
        return (self.net.key, self.listen.laddr, self.listen.lport)


def _groups(inodes: Iterable[str], found: dict[str, set[int]]) -> list[set[int]]:
    """The PIDs behind a port's listening sockets, one set per engine: sockets held by
    the same processes (a forking server's workers inherit the parent's) are one
    engine; sockets held by processes that share none (SO_REUSEPORT) are several."""
    out: list[set[int]] = []
    for inode in sorted(inodes):
        pids = set(found.get(inode, ()))
        if not pids:
            continue
        merged = [g for g in out if g & pids]
        out = [g for g in out if not g & pids] + [pids.union(*merged)]
    return sorted(out, key=min)


class _Walker:
    """The path's listeners, read over the probe's window."""

    def __init__(self, proc: Path, own: _Net) -> None:
        self.proc = proc
        self.nets = {own.key: own}
        self.own = own
        self.others: list[_Net] | None = None
        #: processes whose network namespace could not be read (another user's)
        self.unreadable_ns = 0
        self.nodes: dict[tuple[str, str, int, int], _Node] = {}
        #: each listening address reached -> its engines (several with SO_REUSEPORT)
        self.groups: dict[tuple[str, str, int], list[_Node]] = {}
        self.denied_uid: dict[tuple[str, str, int], int] = {}
        self.pending: dict[tuple[str, str, int], tuple[_Net, Sock]] = {}
        self.baseline: set[str] = set()
        self.skip: set[tuple[str, int, str, int]] = set()  # the harness's own probe sockets
        #: (namespace key, far address, far port) -> where its listener is (None: nowhere)
        self.located: dict[tuple[str, str, int], tuple[_Net, Sock] | None] = {}
        #: far ends asked for the health path, and whether they answered 2xx
        self.answers: dict[tuple[str, int], bool] = {}
        self.unchecked: set[tuple[str, int]] = set()  # past the count or the time bound
        self.not_followed = 0  # listeners past DISCOVERY_LISTENERS_MAX
        self.nat: list[str] = []  # the translations followed, said in the notes
        self._rules: tuple[DnatRule, ...] | None = None  # this namespace's, listed once
        self._by_inode: dict[str, tuple[_Net, Sock]] = {}  # other namespaces' sockets
        self._rest_seen: set[str] = set()

    def start(self) -> None:
        """Every namespace's sockets before the probe: a connection among them was there
        before it (a pool, or the engine's own), one not among them carried it."""
        self.own.read()
        for n in (self.own, *self.other_nets()):
            self.baseline |= {s.inode for s in n.socks if s.state in (_ESTABLISHED, _SYN_SENT)}

    def rules(self) -> tuple[DnatRule, ...]:
        """This namespace's DNAT rules, listed the first time a translation is not in the
        connection-tracking table (netns.nat_rules: a command, so at most once a path)."""
        if self._rules is None:
            self._rules = nat_rules()
        return self._rules

    def other_nets(self) -> list[_Net]:
        """Every other network namespace on this machine, one process to read it through."""
        if self.others is None:
            found = namespaces(self.proc)
            self.unreadable_ns = found.unreadable
            self.others = []
            for key, pid in found.through.items():
                if key == self.own.key:
                    continue
                net = self.proc / str(pid) / "net"
                self.others.append(_Net(key, net, local_addresses(net)))
            self._read_others()
        return self.others

    def _read_others(self) -> None:
        self._by_inode = {}
        for n in self.others or ():
            n.read()
            self.nets[n.key] = n
            self._by_inode.update((s.inode, (n, s)) for s in n.socks if s.inode != "0")

    def group(self, net: _Net, listen: Sock) -> list[_Node] | None:
        """The engines (or proxies) listening on ``listen``'s address: one, or several
        sharing the port; None when their processes cannot be read."""
        key = (net.key, listen.laddr, listen.lport)
        if key not in self.groups and key not in self.denied_uid:
            self.pending[key] = (net, listen)
            self.resolve()
        return self.groups.get(key)

    def resolve(self) -> None:
        """The processes of every listener met since the last call, in one pass over
        /proc (one pass a scan, not one a listener)."""
        todo = {k: v for k, v in self.pending.items()
                if k not in self.groups and k not in self.denied_uid}
        self.pending.clear()
        if not todo:
            return
        inodes = {k: {s.inode for s in net.socks if s.state == _LISTEN and s.lport == k[2]
                      and s.laddr == k[1] and s.inode != "0"} for k, (net, _) in todo.items()}
        found, denied = owners(set().union(*inodes.values()), self.proc)
        for k, (net, listen) in todo.items():
            sets = _groups(inodes[k], found)
            if not sets:
                self.denied_uid[k] = listen.uid if denied else -1
                continue
            room = DISCOVERY_LISTENERS_MAX - len(self.nodes)
            if room < len(sets):
                self.not_followed += len(sets) - max(room, 0)
                sets = sets[:max(room, 0)]
                if not sets:
                    continue
            self.groups[k] = [_Node(net, listen, pids) for pids in sets]
            for node in self.groups[k]:
                self.nodes[node.key] = node

    def locate(self, net: _Net, raddr: str, rport: int, laddr: str, lport: int
               ) -> tuple[_Net, Sock] | None:
        """The listener at a connection's far end: in the same namespace (its address is
        one of the namespace's), else in the namespace holding the connection's other end
        or that address, else where a NAT rule sent the connection; None when no
        namespace of this machine has it."""
        if _is_local(raddr, net.local):
            lst = net.listener(raddr, rport)
            if lst is not None:
                return net, lst
        else:
            for other in self.other_nets():
                mirror = any(s.laddr == raddr and s.lport == rport and s.raddr == laddr
                             and s.rport == lport for s in other.socks)
                if mirror or raddr in other.local:
                    lst = other.listener(raddr, rport)
                    if lst is not None:
                        return other, lst
        far = translation(net.net, laddr, lport, raddr, rport)
        how = "connection tracking"
        if far is None and net is self.own:  # no entry: the rules say where it goes
            hit = rule_translation(self.rules(), raddr, rport)
            if hit is not None:
                far, how = hit[0], rule_read(hit[1])
        if far is not None and far != (raddr, rport):
            where = self.find(*far, first=net)
            if where is not None:
                self.nat.append(f"{_hostport(raddr, rport)} is forwarded by a NAT rule to "
                                f"{_hostport(*far)} ({how})")
            return where
        return None

    def find(self, addr: str, port: int, first: _Net | None = None
             ) -> tuple[_Net, Sock] | None:
        """The listener for ``addr:port`` in whichever namespace has that address:
        ``first`` (the own namespace by default) first; a loopback address only there,
        since no other namespace's loopback is reachable from it."""
        start = first or self.own
        seen: set[str] = set()
        for n in (start, self.own, *self.other_nets()):
            if n.key in seen:
                continue
            seen.add(n.key)
            ok = _is_local(addr, n.local) if n is start else (
                addr in n.local and not _is_loopback(addr))
            lst = n.listener(addr, port) if ok else None
            if lst is not None:
                return n, lst
        return None

    def _conns(self, node: _Node, held: set[str]) -> list[tuple[_Net, Sock]]:
        """The sockets the node's processes hold, in any namespace: a forwarder whose
        upstream socket was made inside the engine's namespace (pasta, rootlessport's
        child, a setns'd helper) holds it in that namespace's table, not its own."""
        out = [(node.net, s) for s in node.net.socks if s.inode in held]
        rest = held - {s.inode for _, s in out}
        if rest and self.others is not None:
            if rest - self._rest_seen:
                self._rest_seen |= rest
                self._read_others()
            out += [self._by_inode[i] for i in rest if i in self._by_inode]
        return out

    def scan(self) -> None:
        """One read of the sockets of every namespace on the path and of every known hop's
        fds: each hop's connections on, and the listeners at the far ends of the new ones
        (new hops), whose own connections are read in the same pass: a chain of relays is
        followed to its end in one scan, however few scans a loaded host allows."""
        fresh: set[str] = set()
        fds: dict[int, set[str]] = {}
        todo = list(self.nodes.values())
        for _ in range(MAX_DEPTH + 1):
            for n in {node.net.key: node.net for node in todo}.values():
                if n.key not in fresh:
                    fresh.add(n.key)
                    n.read()
            before = set(self.nodes)
            for node in todo:
                self._scan_node(node, fds)
            self.resolve()
            todo = [n for k, n in self.nodes.items() if k not in before]
            if not todo:
                return

    def _scan_node(self, node: _Node, fds: dict[int, set[str]]) -> None:
        held: set[str] = set()
        for pid in _tree(node.pids, self.proc):
            if pid not in fds:
                fds[pid] = _socket_inodes(pid, self.proc) or set()
            held |= fds[pid]
        conns = self._conns(node, held)
        own_ports = {(n.key, s.lport) for n, s in conns if s.state == _LISTEN}
        for net, s in conns:
            if s.state not in (_ESTABLISHED, _SYN_SENT) or (net.key, s.lport) in own_ports:
                continue
            if (s.laddr, s.lport, s.raddr, s.rport) in self.skip:
                continue
            far, where = (s.raddr, s.rport), (net.key, s.laddr, s.lport)
            if s.inode in self.baseline:
                node.upstream_old.setdefault(far, where)
                continue
            node.upstream_new.setdefault(far, where)
            self._queue(where, far)

    def _queue(self, where: _Where, far: tuple[str, int]) -> None:
        key = (where[0], *far)
        if key not in self.located:
            self.located[key] = self.locate(self.nets[where[0]], far[0], far[1], where[1],
                                            where[2])
        found = self.located[key]
        if found is not None:
            net, lst = found
            k = (net.key, lst.laddr, lst.lport)
            if k not in self.groups and k not in self.denied_uid:
                self.pending[k] = found

    def follow_idle(self, health_path: str, check: bool, deadline: float) -> None:
        """The connections a hop held before the probe, followed only to listeners that
        answer the health path (an engine's own connections to a database or a Ray head
        do not): every such peer asked at once, all of them within ``deadline``, at most
        DISCOVERY_PEERS_MAX; then the new hops' own connections, level by level.
        ``check=False`` (no probe): every held connection is followed."""
        for _ in range(MAX_DEPTH):
            cands: dict[tuple[str, int], _Where] = {}
            for node in list(self.nodes.values()):
                if node.upstream_new:
                    continue
                for far, where in node.upstream_old.items():
                    if far not in self.answers and far not in self.unchecked:
                        cands.setdefault(far, where)
            if not cands:
                return
            fars = sorted(cands)
            if check:
                room = max(DISCOVERY_PEERS_MAX - len(self.answers), 0)
                left = deadline - time.monotonic()
                take = fars[:room] if left > 0 else []
                self.unchecked.update(fars[len(take):])
                got = answers_health_many(take, health_path, min(ANSWER_TIMEOUT_S, left))
            else:
                got = dict.fromkeys(fars, True)
            self.answers.update(got)
            before = len(self.nodes)
            for far, ok in got.items():
                if ok:
                    self._queue(cands[far], far)
            self.resolve()
            if len(self.nodes) == before:
                return
            self.scan()


def _probe(url: str, host: str, port: int, health_path: str, stop: threading.Event,
           held: list[tuple[str, int]], auth: str = "") -> None:
    """The probe requests: one held open (its body never completes), GETs of the health
    path until ``stop``. Every error is ignored: the probe only makes traffic to watch.
    ``auth``: the URL's ``Authorization`` value (configure/credentials.py), sent as the
    client sends it, so a server behind Basic auth sees a request it accepts."""
    auth_line = f"Authorization: {auth}\r\n" if auth else ""
    parts = urlsplit(url)
    prefix = parts.path.rstrip("/")
    tls = parts.scheme == "https"

    def connect() -> socket.socket:
        s = socket.create_connection((host, port), timeout=2.0)
        held.append(s.getsockname()[:2])
        if tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            s = ctx.wrap_socket(s, server_hostname=host)
        return s

    holds = []
    head = (f"POST {prefix}/v1/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: 4096\r\n{auth_line}")
    # A head cut short (a relay forwards it at once; every server waits for its end), and
    # a whole head with a body cut short (an HTTP proxy connects on once it has the head).
    # Several of each, one kind after the other: a round-robin router hands each to its
    # next replica, so every replica holds one while the sockets are read.
    for text in ((head,) * DISCOVERY_HELD_EACH
                 + (head + "Connection: close\r\n\r\n{",) * DISCOVERY_HELD_EACH):
        with contextlib.suppress(OSError, ValueError):
            s = connect()
            holds.append(s)
            s.sendall(text.encode())
    try:
        while not stop.wait(GET_EVERY_S):
            with contextlib.suppress(OSError, ValueError):
                s = connect()
                try:
                    s.sendall((f"GET {prefix}{health_path} HTTP/1.1\r\nHost: {parts.netloc}"
                               f"\r\n{auth_line}Connection: close\r\n\r\n").encode())
                    s.settimeout(1.0)
                    s.recv(256)
                finally:
                    s.close()
    finally:
        for s in holds:
            with contextlib.suppress(OSError):
                s.close()


def _health_ok(head: bytes) -> bool:
    words = head.split(b"\r\n", 1)[0].split()
    return len(words) >= 2 and words[0].startswith(b"HTTP/1") and words[1][:1] == b"2"


def answers_health(addr: str, port: int, health_path: str,
                   timeout_s: float = ANSWER_TIMEOUT_S) -> bool:
    """A listener that answers ``GET <health_path>`` with a 2xx status line: an HTTP server
    of the kind the client talks to, not a database or a ZeroMQ peer."""
    return answers_health_many([(addr, port)], health_path, timeout_s).get((addr, port),
                                                                          False)


def answers_health_many(fars: Iterable[tuple[str, int]], health_path: str,
                        timeout_s: float) -> dict[tuple[str, int], bool]:
    """:func:`answers_health` for many listeners at once, all within ``timeout_s`` in
    total: one non-blocking connection each, watched together, so a peer that accepts
    and never answers costs the timeout once, not once per peer."""
    out: dict[tuple[str, int], bool] = {}
    sel = selectors.DefaultSelector()
    end = time.monotonic() + max(timeout_s, 0.0)
    try:
        for far in fars:
            out[far] = False
            addr, port = far
            try:
                s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET,
                                  socket.SOCK_STREAM)
            except OSError:
                continue
            s.setblocking(False)
            if s.connect_ex((addr, port)) not in (0, errno.EINPROGRESS, errno.EAGAIN):
                s.close()
                continue
            req = (f"GET {health_path} HTTP/1.1\r\nHost: {_hostport(addr, port)}\r\n"
                   "Connection: close\r\n\r\n").encode()
            sel.register(s, selectors.EVENT_WRITE, [far, req, b""])
        while sel.get_map() and (left := end - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                conn, data = key.fileobj, key.data
                assert isinstance(conn, socket.socket)
                try:
                    if data[1]:  # connected (or failed): send the request
                        if conn.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                            raise OSError("refused")
                        data[1] = data[1][conn.send(data[1]):]
                        if not data[1]:
                            sel.modify(conn, selectors.EVENT_READ, data)
                        continue
                    got = conn.recv(64)
                    data[2] += got
                    if got and b"\r\n" not in data[2] and len(data[2]) < 64:
                        continue
                    out[data[0]] = _health_ok(data[2])
                except OSError:
                    pass
                sel.unregister(conn)
                conn.close()
    finally:
        for key in list(sel.get_map().values()):
            sock = key.fileobj
            if isinstance(sock, socket.socket):  # every registered object is one
                sock.close()
        sel.close()
    return out


def _unreadable(address: str, uid: int) -> Hop:
    if uid < 0:
        note = ("its process was not found (it may have exited, or hold the socket in a way "
                "/proc does not show)")
    else:
        try:
            import pwd

            who = f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
        except (KeyError, ImportError):
            who = f"uid {uid}"
        note = (f"its socket belongs to {who}, whose processes this user (uid {os.geteuid()}) "
                "may not read: run Strata as that user or root, or name the engine with "
                "telemetry.pid_pattern")
    return Hop(address, "unreadable", note=note)


REMOTE_NOTE = "another host: its processes cannot be observed from here"
REMOTE_REASON = ("The engine is on another host: its CPU, run state, faults and log cannot "
                 "be observed from here; the verdict reads the client's clocks and the "
                 "engine's /metrics only")



def discover(url: str, *, pid_pattern: str = "", health_path: str = "/health",
             window_s: float = WINDOW_S, probe: bool = True, max_depth: int = MAX_DEPTH,
             proc: Path = Path("/proc"), auth: str = "") -> RequestPath:
    """The path from ``url`` to the engine, with the PIDs the agent follows.

    ``pid_pattern`` (the profile's ``telemetry.pid_pattern``) names the engine and wins:
    the path is still looked at, for the record and the proxies. ``probe=False`` reads
    the sockets once and sends nothing (the dry run): the connections on that are open
    at that moment only.
    """
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError as exc:
        return RequestPath(url, engine_from="none", reason=f"not a URL: {exc}", how="none")
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    own_net = proc / "net"
    own = _Net(ns_key("self", proc), own_net, local_addresses(own_net))
    own.read()
    path = _walk(url, _resolve(host), port, own, proc, health_path=health_path, auth=auth,
                 window_s=window_s if probe else 0.0, max_depth=max_depth, probe=probe)
    if not pid_pattern:
        return path
    from strata_plugin.agent import procfs

    engine = tuple(procfs.match_pids(pid_pattern)) if proc == Path(procfs.PROC) else ()
    hit = _tree(engine, proc) if engine else set()
    return RequestPath(url, path.chains, "pid_pattern", engine,
                       tuple(p for p in (*path.proxy_pids, *path.engine_pids) if p not in hit),
                       "" if engine else f"No process matches telemetry.pid_pattern "
                       f"{pid_pattern!r} yet (the agent keeps looking)", path.how, path.notes)


def _resolve(host: str) -> list[str]:
    """The host's addresses (an IP as itself, localhost as loopback); [] when it does not
    resolve."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return []
    return list(dict.fromkeys(str(i[4][0]) for i in infos))




def _root(w: _Walker, addrs: list[str], port: int, probe: bool
          ) -> tuple[str, tuple[str, int], _Net, Sock] | None:
    """Where the URL's connections are accepted: a listener on one of its addresses in
    this namespace, else in the namespace of this machine that has that address (a
    container on a bridge network), else where a NAT rule sends a connection to it (a
    published port: nothing listens on the host's port). (the URL's address the probe
    connects to, where its connection arrives, namespace, socket)."""
    for a in addrs:  # ``localhost``: the address something listens on
        if _is_local(a, w.own.local) and w.own.listener(a, port) is not None:
            # a published port's reservation (podman's conmon listens on it and never
            # accepts) is passed by: the NAT rule sends the connection on
            moved = _nat(w, a, port) if probe else None
            return moved or (a, (a, port), w.own, w.own.listeners(a, port)[0])
    for a in addrs:
        found = w.find(a, port)
        if found is not None:
            return a, (a, port), *found
    if not probe:
        return None
    for a in addrs[:NAT_ADDRESSES_MAX]:
        moved = _nat(w, a, port)
        if moved is not None:
            return moved
    return None


def _nat(w: _Walker, addr: str, port: int
         ) -> tuple[str, tuple[str, int], _Net, Sock] | None:
    """Where a NAT rule sends a connection to ``addr:port``, when it sends it to a
    listener of this machine; the note says so."""
    seen = nat_destination(addr, port, w.own.net, w.rules)
    if seen is None:
        return None
    far, how = seen
    found = w.find(far[0], far[1])
    if found is None:
        return None
    w.nat.append(f"{_hostport(addr, port)} is forwarded by a NAT rule to "
                 f"{_hostport(*far)} ({how})")
    return addr, far, *found


def _blind(w: _Walker) -> str:
    """What an address no namespace here holds may still be: a namespace not read."""
    if not w.unreadable_ns:
        return ""
    return (f"; the network namespaces of {w.unreadable_ns} processes could not be read by "
            f"this user (uid {os.geteuid()}): if the engine runs on this machine, run "
            "Strata as root or that user, or name it with telemetry.pid_pattern")


def _nowhere(url: str, addrs: list[str], host: str, port: int, w: _Walker) -> RequestPath:
    """No namespace here has a listener for the URL: another host, or (an address of this
    namespace) a port nothing forwards; with what could not be read."""
    blind = _blind(w)
    local = [a for a in addrs if _is_local(a, w.own.local)]
    if local:
        hop = Hop(_hostport(local[0], port), "unreadable",
                  note="nothing listens on it in any network namespace of this machine, "
                  "and no NAT translation of a connection to it was seen" + blind)
        return RequestPath(url, ((hop,),), "none", reason="No process on this machine "
                           "listens on the URL's port: name the engine with "
                           "telemetry.pid_pattern", how="static")
    where = _hostport(addrs[0], port) if addrs else f"{host}:{port}"
    return RequestPath(url, ((Hop(where, "remote", note=REMOTE_NOTE + blind),),), "none",
                       reason=REMOTE_REASON, how="none")


def _walk(url: str, addrs: list[str], port: int, own: _Net, proc: Path, *, health_path: str,
          window_s: float, max_depth: int, auth: str = "", probe: bool = True) -> RequestPath:
    """Find the URL's listener, read the sockets before the probe, then over its window;
    follow what was seen."""
    w = _Walker(proc, own)
    w.start()
    found = _root(w, addrs, port, probe)
    if found is None:
        return _nowhere(url, addrs, urlsplit(url).hostname or "", port, w)
    addr, (there, there_port), net, lst = found
    address = _hostport(there if _wildcard(lst.laddr) else lst.laddr, there_port)
    roots = w.group(net, lst)
    if roots is None:
        hop = _unreadable(address, w.denied_uid.get((net.key, lst.laddr, lst.lport), -1))
        return RequestPath(url, ((hop,),), "none", reason=f"The URL's listener: {hop.note}",
                           how="static", notes=tuple(w.nat))
    w.scan()
    stop = threading.Event()
    t = None
    if window_s > 0:
        held: list[tuple[str, int]] = []
        t = threading.Thread(target=_probe, args=(url, addr, port, health_path, stop, held, auth),
                             name="strata-path-probe", daemon=True)
        t.start()
    try:
        if t is not None:
            # a hop found extends the window: on a loaded host the probe's connection
            # takes its time through a chain of relays, each waiting for a CPU
            start = time.monotonic()
            end = start + window_s
            while (now := time.monotonic()) < end:
                time.sleep(SCAN_EVERY_S)
                w.skip = {(a, p, addr, port) for a, p in list(held)}
                hops = len(w.nodes)
                w.scan()
                if len(w.nodes) > hops:
                    end = min(max(end, now + WINDOW_GROW_S), start + WINDOW_MAX_S)
        # the probe still held open: a hop behind a pool carries it now
        w.follow_idle(health_path, check=window_s > 0,
                      deadline=time.monotonic() + DISCOVERY_PEER_CHECK_S)
    finally:
        stop.set()
        if t is not None:
            t.join(5.0)
    return _chains(url, w, roots, address, checked=window_s > 0, max_depth=max_depth,
                   how="probe" if window_s > 0 else "static")


def _chains(url: str, w: _Walker, roots: list[_Node], address: str, *, checked: bool,
            max_depth: int, how: str) -> RequestPath:
    """Every chain from the root listener, proxies to engines, as the window saw them;
    at most DISCOVERY_PATHS_MAX of them listed."""
    chains: list[tuple[Hop, ...]] = []
    engines: dict[tuple[str, str, int, int], tuple[_Node, str]] = {}
    proxies: list[int] = []
    notes: list[str] = list(dict.fromkeys(w.nat))
    deep: list[str] = []
    full = [False]
    names: dict[str, str] = {}
    places: dict[int, tuple[str, Container | None]] = {}

    def ups(node: _Node) -> list[tuple[str, int]]:
        if node.upstream_new:  # what carried the probe
            return sorted(node.upstream_new)
        # held before it: only an HTTP server (every one, without the probe)
        return [far for far in sorted(node.upstream_old)
                if not checked or w.answers.get(far, False)]

    def place(pid: int) -> tuple[str, Container | None]:
        if pid not in places:
            places[pid] = container_of(pid, w.proc, names)
        return places[pid]

    def hop(node: _Node, kind: str, where: str) -> Hop:
        pid = min(node.pids)
        box = place(pid)[1] if kind == "engine" else None
        return Hop(where, kind, pid, _name(pid, w.proc), tuple(sorted(node.pids)),
                   node.net.key if node.net.key != w.own.key else "",
                   container=box.text() if box else "")

    def add(chain: tuple[Hop, ...]) -> None:
        if len(chains) >= DISCOVERY_PATHS_MAX:
            full[0] = True
        else:
            chains.append(chain)

    def walk(node: _Node, where: str, so_far: tuple[Hop, ...], seen: frozenset) -> None:
        if full[0]:
            return
        far_ends = ups(node)
        if not far_ends:
            add((*so_far, hop(node, "engine", where)))
            engines.setdefault(node.key, (node, where))
            return
        h = hop(node, "proxy", where)
        proxies.append(h.pid or 0)
        if len(so_far) + 1 >= max_depth:
            add((*so_far, h))
            deep.append(f"{where} (PID {h.pid} `{h.name}`)")
            return
        for far in far_ends:
            if full[0]:
                return
            key = node.upstream_new.get(far) or node.upstream_old[far]
            located = w.located.get((key[0], *far))
            address = _hostport(*far)
            if located is None:
                add((*so_far, h, Hop(address, "remote", note=REMOTE_NOTE + _blind(w))))
                continue
            gkey = (located[0].key, located[1].laddr, located[1].lport)
            nxt = w.groups.get(gkey)
            if nxt is None:
                if gkey in w.denied_uid:
                    add((*so_far, h, _unreadable(address, w.denied_uid[gkey])))
                else:  # past DISCOVERY_LISTENERS_MAX: said in the notes
                    add((*so_far, h))
                continue
            for n in nxt:
                if n.key in seen:
                    notes.append(f"a cycle at {address} (already on the path): not followed")
                    add((*so_far, h))
                    continue
                walk(n, address, (*so_far, h), seen | {n.key})

    for root in roots:
        walk(root, address, (), frozenset({root.key}))
    if full[0]:  # every listener reached, not every path: none is left out of the lists
        notes.append(f"more than {DISCOVERY_PATHS_MAX} paths: the first "
                     f"{DISCOVERY_PATHS_MAX} are listed (DISCOVERY_PATHS_MAX); the engines "
                     "and proxies are every listener reached")
        for node in w.nodes.values():
            if ups(node):
                proxies.append(min(node.pids))
            else:
                engines.setdefault(node.key, (node, _hostport(node.listen.laddr,
                                                              node.listen.lport)))
    if deep:
        deep = list(dict.fromkeys(deep))
        more = f" and {len(deep) - 3} more" if len(deep) > 3 else ""
        one = len(deep) == 1
        notes.append(f"the path goes on past {max_depth} hops: {', '.join(deep[:3])}{more} "
                     f"still {'connects' if one else 'connect'} on, and "
                     f"{'is' if one else 'are'} not called the engine")
    if w.not_followed:
        notes.append(f"{w.not_followed} listeners past the first {DISCOVERY_LISTENERS_MAX} "
                     "were not followed (DISCOVERY_LISTENERS_MAX)")
    if w.unchecked:
        notes.append(f"{len(w.unchecked)} idle connections were not asked for the health "
                     f"path (past DISCOVERY_PEERS_MAX = {DISCOVERY_PEERS_MAX} peers or "
                     f"DISCOVERY_PEER_CHECK_S = {DISCOVERY_PEER_CHECK_S:g} s): not followed")
    ends = [c[-1] for c in chains]
    reason = ""
    if any(e.kind == "remote" for e in ends):
        reason = REMOTE_REASON
    elif any(e.kind == "unreadable" for e in ends):
        reason = "The engine's process cannot be read: " + next(
            e.note for e in ends if e.kind == "unreadable")
    elif not engines and deep:
        reason = (f"The path is longer than {max_depth} hops: no engine was reached; name "
                  "it with telemetry.pid_pattern")
    found = []
    for node, where in engines.values():
        pid = min(node.pids)
        cgroup, box = place(pid)
        found.append(Engine(pid, tuple(sorted(node.pids)), where, ns_inode(node.net.key),
                            cgroup, box, _name(pid, w.proc)))
    engine_pids = tuple(dict.fromkeys(e.pid for e in found))
    return RequestPath(url, tuple(chains), "path" if engine_pids else "none", engine_pids,
                       tuple(p for p in dict.fromkeys(proxies) if p not in engine_pids),
                       reason, how, tuple(dict.fromkeys(notes)), tuple(found))

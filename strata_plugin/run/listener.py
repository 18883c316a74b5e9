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
   descriptors (``/proc/<pid>/fd/* -> socket:[inode]``).
2. A process that holds its own connections to another listener is a proxy: its
   sockets in state ESTABLISHED (01) or SYN_SENT (02) whose local port is none of its
   listening ports are connections it opened. The listener at their far end (found in
   this machine's network namespace, or another one: a container on a bridge network)
   is the next hop, followed the same way: two hops and more, a cycle stopped at a
   listener already on the path, at most ``max_depth`` hops.
3. The hop that opens no connection on is the engine; the agent follows it as the
   server and the proxies as the path (``--path-pid``), so their CPU is neither the
   server's nor "other processes'". A far end that no network namespace of this machine
   holds is another host: the path says so, and that engine cannot be observed.

**Why a probe.** Many proxies keep a pool of upstream connections (nginx ``keepalive``,
Envoy, Go's ``httputil.ReverseProxy``, Python HTTP clients): those are there at any
moment. Others open one per request (a TCP relay, HAProxy in TCP mode, nginx without
``keepalive``): between requests the proxy holds no connection on, and a look at an
idle proxy finds the proxy alone. So the sockets are read over a short window
(``window_s``, 1 s) while probe requests are in flight: two held open, a POST whose
head stops short (a TCP relay forwards it at once, and every server waits for the
head's end) and one whose head is whole and whose body stops after its first byte (an
HTTP proxy connects on once it has the head; the engine waits for a body that never
comes: no token is generated), and a GET of the health path every 50 ms for proxies
that buffer the whole request before they connect. A connection that appeared during
the probe carried it: those are the hop's upstreams. A hop that opened none is followed
along the connections it already held only to a listener that answers the health path
with a 2xx status (an engine's own connections to a database, a Ray head or a ZeroMQ
peer do not), and without any it is the engine.

What this cannot see, stated where it matters: a proxy that forwards over a Unix
socket (no TCP peer to follow); another user's processes, without privileges (their
file descriptors are not readable: the hop says whose socket it is); a port forwarded
by a NAT rule (nothing listens on it here). ``telemetry.pid_pattern`` names the engine
in all of these, and wins wherever it is given. Process facts are read from /proc only;
nothing is run.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from strata_plugin.formats.request_path import Hop, RequestPath

_LISTEN, _ESTABLISHED, _SYN_SENT = "0A", "01", "02"
#: The most hops followed from the URL's listener (a chain longer than this is a loop
#: the listener-address guard did not catch, or a deployment no one would build).
MAX_DEPTH = 8
#: How long the sockets are read while the probe is in flight (seconds).
WINDOW_S = 1.0
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


def _netns(pid: int | str, proc: Path) -> str:
    try:
        return os.readlink(proc / str(pid) / "ns" / "net")
    except OSError:
        return ""


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

    def listener(self, addr: str, port: int) -> Sock | None:
        return next((s for s in self.socks if s.state == _LISTEN and _matches(s, addr, port)),
                    None)


@dataclass
class _Node:
    """A listener on the path and what was seen of it during the window."""

    net: _Net
    listen: Sock
    pids: set[int]  # every PID holding the listening socket
    upstream_new: dict[tuple[str, int], str] = field(default_factory=dict)  # far end -> net key
    upstream_old: dict[tuple[str, int], str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.net.key, self.listen.laddr, self.listen.lport)


class _Walker:
    """The path's listeners, read over the probe's window."""

    def __init__(self, proc: Path, own: _Net) -> None:
        self.proc = proc
        self.nets = {own.key: own}
        self.own = own
        self.others: list[_Net] | None = None
        self.nodes: dict[tuple[str, str, int], _Node] = {}
        self.denied_uid: dict[tuple[str, str, int], int] = {}
        self.baseline: set[str] = set()
        self.skip: set[tuple[str, int, str, int]] = set()  # the harness's own probe sockets
        #: (namespace key, far address, far port) -> where its listener is (None: nowhere)
        self.located: dict[tuple[str, str, int], tuple[_Net, Sock] | None] = {}

    def start(self) -> None:
        """Every namespace's sockets before the probe: a connection among them was there
        before it (a pool, or the engine's own), one not among them carried it."""
        self.own.read()
        for n in (self.own, *self.other_nets()):
            self.baseline |= {s.inode for s in n.socks if s.state in (_ESTABLISHED, _SYN_SENT)}

    def other_nets(self) -> list[_Net]:
        """Every other network namespace on this machine, one process to read it through."""
        if self.others is None:
            seen: dict[str, int] = {}
            for pid in _pids(self.proc):
                key = _netns(pid, self.proc)
                if key and key != self.own.key and key not in seen:
                    seen[key] = pid
            self.others = []
            for key, pid in seen.items():
                net = self.proc / str(pid) / "net"
                self.others.append(_Net(key, net, local_addresses(net)))
            for n in self.others:
                n.read()
                self.nets[n.key] = n
        return self.others

    def node(self, net: _Net, listen: Sock) -> _Node | None:
        key = (net.key, listen.laddr, listen.lport)
        if key in self.nodes:
            return self.nodes[key]
        if key in self.denied_uid:
            return None
        inodes = {s.inode for s in net.socks if s.state == _LISTEN and s.lport == listen.lport
                  and s.laddr == listen.laddr and s.inode != "0"}
        found, denied = owners(inodes, self.proc)
        pids = set().union(*found.values()) if found else set()
        if not pids:
            self.denied_uid[key] = listen.uid if denied else -1
            return None
        n = self.nodes[key] = _Node(net, listen, pids)
        return n

    def locate(self, net: _Net, raddr: str, rport: int, laddr: str, lport: int
               ) -> tuple[_Net, Sock] | None:
        """The listener at a connection's far end: in the same namespace (its address is
        one of the namespace's), else in the namespace holding the connection's other end
        or that address; None when no namespace of this machine has it."""
        if _is_local(raddr, net.local):
            lst = net.listener(raddr, rport)
            return (net, lst) if lst is not None else None
        for other in self.other_nets():
            mirror = any(s.laddr == raddr and s.lport == rport and s.raddr == laddr
                         and s.rport == lport for s in other.socks)
            if mirror or raddr in other.local:
                lst = other.listener(raddr, rport)
                if lst is not None:
                    return other, lst
        return None

    def scan(self) -> None:
        """One read of the sockets of every namespace on the path and of every known hop's
        fds: each hop's connections on, and the listeners at their far ends (new hops)."""
        for n in {node.net.key: node.net for node in self.nodes.values()}.values():
            n.read()
        for node in list(self.nodes.values()):
            held: set[str] = set()
            for pid in _tree(node.pids, self.proc):
                held |= _socket_inodes(pid, self.proc) or set()
            own_ports = {s.lport for s in node.net.socks if s.state == _LISTEN and s.inode in held}
            for s in node.net.socks:
                if s.inode not in held or s.state not in (_ESTABLISHED, _SYN_SENT):
                    continue
                if s.lport in own_ports or (s.laddr, s.lport, s.raddr, s.rport) in self.skip:
                    continue
                far = (s.raddr, s.rport)
                (node.upstream_old if s.inode in self.baseline else node.upstream_new
                 ).setdefault(far, node.net.key)
                key = (node.net.key, s.raddr, s.rport)
                if key not in self.located:
                    self.located[key] = self.locate(node.net, s.raddr, s.rport, s.laddr,
                                                    s.lport)
                where = self.located[key]
                if where is not None:
                    self.node(*where)


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
    for text in (head, head + "Connection: close\r\n\r\n{"):
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


def answers_health(addr: str, port: int, health_path: str, timeout_s: float = 0.5) -> bool:
    """A listener that answers ``GET <health_path>`` with a 2xx status line: an HTTP server
    of the kind the client talks to, not a database or a ZeroMQ peer."""
    try:
        with socket.create_connection((addr, port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            s.sendall(f"GET {health_path} HTTP/1.1\r\nHost: {_hostport(addr, port)}\r\n"
                      "Connection: close\r\n\r\n".encode())
            head = s.recv(64).split(b"\r\n", 1)[0].split()
    except OSError:
        return False
    return len(head) >= 2 and head[0].startswith(b"HTTP/1") and head[1][:1] == b"2"


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
    own = _Net(_netns("self", proc), own_net, local_addresses(own_net))
    addrs = _resolve(host)
    local = [a for a in addrs if _is_local(a, own.local)]
    # ``localhost`` may resolve to ::1 and 127.0.0.1: the one something listens on
    own.read()
    addr = next((a for a in local if own.listener(a, port) is not None),
                local[0] if local else None)
    if addr is None:
        where = _hostport(addrs[0], port) if addrs else f"{host}:{port}"
        path = RequestPath(url, ((Hop(where, "remote", note=REMOTE_NOTE),),), "none",
                           reason=REMOTE_REASON, how="none")
    else:
        path = _walk(url, addr, port, own, proc, health_path=health_path, auth=auth,
                     window_s=window_s if probe else 0.0, max_depth=max_depth)
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


def _walk(url: str, addr: str, port: int, own: _Net, proc: Path, *, health_path: str,
          window_s: float, max_depth: int, auth: str = "") -> RequestPath:
    """Read the sockets before the probe, then over its window; follow what was seen."""
    w = _Walker(proc, own)
    w.start()
    address = _hostport(addr, port)
    lst = own.listener(addr, port)
    if lst is None:
        hop = Hop(address, "unreadable", note="nothing listens on it in this network "
                  "namespace (a NAT rule may forward the port)")
        return RequestPath(url, ((hop,),), "none", reason="No process on this machine "
                           "listens on the URL's port: name the engine with "
                           "telemetry.pid_pattern", how="static")
    root = w.node(own, lst)
    if root is None:
        hop = _unreadable(address, w.denied_uid.get((own.key, lst.laddr, lst.lport), -1))
        return RequestPath(url, ((hop,),), "none", reason=f"The URL's listener: {hop.note}",
                           how="static")
    w.scan()
    if window_s > 0:
        stop = threading.Event()
        held: list[tuple[str, int]] = []
        t = threading.Thread(target=_probe, args=(url, addr, port, health_path, stop, held, auth),
                             name="strata-path-probe", daemon=True)
        t.start()
        try:
            end = time.monotonic() + window_s
            while time.monotonic() < end:
                time.sleep(SCAN_EVERY_S)
                w.skip = {(a, p, addr, port) for a, p in list(held)}
                w.scan()
        finally:
            stop.set()
            t.join(5.0)
    return _chains(url, w, root, address, health_path=health_path, checked=window_s > 0,
                   max_depth=max_depth, how="probe" if window_s > 0 else "static")


def _chains(url: str, w: _Walker, root: _Node, address: str, *, health_path: str,
            checked: bool, max_depth: int, how: str) -> RequestPath:
    """Every chain from the root listener, proxies to engines, as the window saw them."""
    chains: list[tuple[Hop, ...]] = []
    engines: list[int] = []
    proxies: list[int] = []
    notes: list[str] = []
    answers: dict[tuple[str, int], bool] = {}

    def ups(node: _Node) -> list[tuple[str, int]]:
        if node.upstream_new:  # what carried the probe
            return sorted(node.upstream_new)
        out = []
        for far in sorted(node.upstream_old):  # held before it: only an HTTP server
            if checked and far not in answers:
                answers[far] = answers_health(far[0], far[1], health_path)
            if not checked or answers[far]:
                out.append(far)
        return out

    def hop(node: _Node, kind: str, where: str) -> Hop:
        pid = min(node.pids)
        return Hop(where, kind, pid, _name(pid, w.proc), tuple(sorted(node.pids)),
                   node.net.key if node.net.key != w.own.key else "")

    def walk(node: _Node, where: str, so_far: tuple[Hop, ...], seen: frozenset) -> None:
        far_ends = ups(node)
        if not far_ends or len(so_far) + 1 >= max_depth:
            if far_ends:
                notes.append(f"stopped after {max_depth} hops")
            h = hop(node, "engine", where)
            chains.append((*so_far, h))
            engines.append(h.pid)
            return
        h = hop(node, "proxy", where)
        proxies.append(h.pid)
        for far in far_ends:
            key = node.upstream_new.get(far) or node.upstream_old.get(far, w.own.key)
            located = w.located.get((key, *far))
            address = _hostport(*far)
            if located is None:
                chains.append((*so_far, h, Hop(address, "remote", note=REMOTE_NOTE)))
                continue
            nxt = w.node(*located)
            if nxt is None:
                ukey = (located[0].key, located[1].laddr, located[1].lport)
                chains.append((*so_far, h, _unreadable(address, w.denied_uid.get(ukey, -1))))
                continue
            if nxt.key in seen:
                notes.append(f"a cycle at {address} (already on the path): not followed")
                chains.append((*so_far, h))
                continue
            walk(nxt, address, (*so_far, h), seen | {nxt.key})

    walk(root, address, (), frozenset({root.key}))
    ends = [c[-1] for c in chains]
    reason = ""
    if any(e.kind == "remote" for e in ends):
        reason = REMOTE_REASON
    elif any(e.kind == "unreadable" for e in ends):
        reason = "The engine's process cannot be read: " + next(
            e.note for e in ends if e.kind == "unreadable")
    engine_pids = tuple(dict.fromkeys(engines))
    return RequestPath(url, tuple(chains), "path" if engine_pids else "none", engine_pids,
                       tuple(p for p in dict.fromkeys(proxies) if p not in engine_pids),
                       reason, how, tuple(dict.fromkeys(notes)))

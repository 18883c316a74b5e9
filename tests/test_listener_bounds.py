"""The path's discovery bounded whatever the topology (run/listener.py, limits.py's
DISCOVERY_* rows): an engine's many idle peers asked at once, not in turn; the peers
asked at most DISCOVERY_PEERS_MAX; the paths of a proxy mesh listed at most
DISCOVERY_PATHS_MAX; a path longer than the depth bound never names its last proxy the
engine; every engine sharing a port with SO_REUSEPORT followed. Real processes and
sockets throughout (tests/path_procs.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_request_path import Procs, _chain_kinds

from strata_plugin.limits import DISCOVERY_PATHS_MAX, DISCOVERY_PEERS_MAX
from strata_plugin.run.listener import MAX_DEPTH, answers_health_many, discover
from strata_plugin.run.netns import ns_inode, ns_key
from strata_plugin.run.server import free_port

#: The probe's window where no relay has to carry it (every hop's connection is held
#: before it, or there is no hop on): the window only costs the fast lane's time.
SHORT = 0.3


@pytest.fixture
def procs():
    made = Procs()
    yield made
    made.close()


@pytest.fixture
def silent_peers():
    """Listeners that accept (the kernel's backlog does) and never answer: a database, a
    ZeroMQ peer, as an engine's idle connections see them."""
    made: list[socket.socket] = []

    def make(n: int) -> list[str]:
        for _ in range(n):
            made.append(socket.create_server(("127.0.0.1", 0), backlog=8))
        return [f"127.0.0.1:{s.getsockname()[1]}" for s in made[-n:]]

    yield make
    for s in made:
        s.close()


def _engine_with_peers(procs: Procs, peers: list[str]) -> tuple[subprocess.Popen, int]:
    args = ["http"]
    for p in peers:
        args += ["--hold", p]
    return procs.start(*args)


@pytest.mark.parametrize("extra, unasked", [(0, 0), (1, 1)])
def test_silent_peers_are_asked_at_once_and_bounded(procs, silent_peers, extra, unasked):
    """An engine holding hundreds of idle connections to listeners that never answer (a
    database, ZeroMQ peers): each was asked for the health path in turn, 0.5 s each (200
    of them took 107 s before the run started). Asked at once, discovery takes its window
    and one timeout; the engine is still the engine and no peer is on the path.
    DISCOVERY_PEERS_MAX peers are all asked; one more is not, and the path's notes say
    how many were not (nothing is cut silently)."""
    peers = silent_peers(DISCOVERY_PEERS_MAX + extra)
    engine, port = _engine_with_peers(procs, peers)
    t0 = time.monotonic()
    path = discover(f"http://127.0.0.1:{port}", health_path="/", window_s=SHORT)
    took = time.monotonic() - t0
    assert _chain_kinds(path) == [[("engine", engine.pid)]] and path.observable
    # in turn: 128 s; at once: the window and one 0.5 s timeout, plus scans
    assert took < 20.0, took
    said = [n for n in path.notes if "were not asked for the health path" in n]
    if unasked:
        assert said == [f"{unasked} idle connections were not asked for the health path (past"
                        f" DISCOVERY_PEERS_MAX = {DISCOVERY_PEERS_MAX} peers or "
                        "DISCOVERY_PEER_CHECK_S = 2 s): not followed"]
    else:
        assert said == []


def test_many_listeners_are_asked_at_once_and_answer_in_one_timeout(silent_peers):
    """The check itself: 50 silent listeners and one that answers 2xx, asked together
    with a 0.5 s timeout, take one timeout (not 50) and tell the answering one apart."""
    silent = [tuple(p.rsplit(":", 1)) for p in silent_peers(50)]
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    code = ("import socket,sys\ns=socket.socket(fileno=int(sys.argv[1]))\nwhile True:\n"
            " c,_=s.accept(); c.recv(4096)\n"
            " c.sendall(b'HTTP/1.1 204 No Content\\r\\n\\r\\n'); c.close()\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(srv.fileno())],
                         pass_fds=(srv.fileno(),))
    try:
        fars = [(a, int(b)) for a, b in silent] + [("127.0.0.1", port)]
        t0 = time.monotonic()
        got = answers_health_many(fars, "/health", 0.5)
        took = time.monotonic() - t0
        assert got == {**{f: False for f in fars[:-1]}, ("127.0.0.1", port): True}
        assert took < 0.5 * 10, took  # in turn: 25 s
    finally:
        p.kill()
        p.wait()
        srv.close()


def _mesh_proc(port: int, others: list[int]) -> list[str]:
    """A proxy holding a connection to each other proxy of the mesh (a pool) and answering
    clients itself."""
    code = ("import socket,sys,threading,time\n"
            "srv=socket.create_server(('127.0.0.1',int(sys.argv[1])))\n"
            "held=[]\n"
            "def dial(p):\n"
            " while True:\n"
            "  try: held.append(socket.create_connection(('127.0.0.1',p))); return\n"
            "  except OSError: time.sleep(0.05)\n"
            "def answer(c):\n"
            " got=b''\n"
            " while b'\\r\\n\\r\\n' not in got:\n"
            "  d=c.recv(4096)\n"
            "  if not d: return c.close()\n"
            "  got+=d\n"
            " c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Length: 0\\r\\n\\r\\n'); c.close()\n"
            "def serve():\n"
            " while True:\n"
            "  c,_=srv.accept(); threading.Thread(target=answer,args=(c,),daemon=True).start()\n"
            "threading.Thread(target=serve,daemon=True).start()\n"
            "ts=[threading.Thread(target=dial,args=(int(p),)) for p in sys.argv[2:]]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
            "print(len(held),flush=True)\n"
            "time.sleep(120)\n")
    return [sys.executable, "-c", code, str(port), *map(str, others)]


@pytest.mark.integration  # nine processes and ~2 s: the integration lane
def test_a_full_mesh_of_nine_proxies_lists_a_bounded_number_of_paths(procs):
    """Nine proxies, each holding a connection to every other: 146,743 paths were listed.
    At most DISCOVERY_PATHS_MAX are, the notes say so, every proxy is still a proxy, and
    none is called the engine."""
    ports = [free_port("127.0.0.1") for _ in range(9)]
    made = []
    for port in ports:
        p = subprocess.Popen(_mesh_proc(port, [q for q in ports if q != port]),
                             stdout=subprocess.PIPE, text=True)
        procs.made.append(p)
        made.append(p)
    for p in made:  # each says once it holds its 8 connections
        assert p.stdout is not None and int(p.stdout.readline()) == 8
    t0 = time.monotonic()
    path = discover(f"http://127.0.0.1:{ports[0]}", health_path="/", window_s=SHORT)
    took = time.monotonic() - t0
    assert len(path.chains) == DISCOVERY_PATHS_MAX
    assert (f"more than {DISCOVERY_PATHS_MAX} paths: the first {DISCOVERY_PATHS_MAX} are "
            "listed (DISCOVERY_PATHS_MAX); the engines and proxies are every listener "
            "reached") in path.notes
    assert sorted(path.proxy_pids) == sorted(p.pid for p in made)
    assert path.engine_pids == () and not path.observable
    assert took < 30.0, took


@pytest.mark.integration  # ten processes and ~3 s each: the integration lane
@pytest.mark.parametrize("forwarders", [MAX_DEPTH - 1, MAX_DEPTH + 1])
def test_past_the_depth_bound_the_last_proxy_is_not_called_the_engine(procs, forwarders):
    """A chain of forwarders in front of an HTTP server. Within MAX_DEPTH hops the server
    is the engine; past them the walk stops at the 8th hop, which still connects on: it is
    a proxy, the notes say where the path went on, and the reason says no engine was
    reached (it was silently named the engine)."""
    engine, port = procs.start("http")
    to = port
    fwd = []
    for _ in range(forwarders):
        p, to = procs.start("forward", "--to", f"127.0.0.1:{to}")
        fwd.append((p, to))
    fwd.reverse()  # the front first
    path = discover(f"http://127.0.0.1:{fwd[0][1]}", health_path="/")
    kinds = _chain_kinds(path)
    if forwarders < MAX_DEPTH:
        assert kinds == [[*(("proxy", p.pid) for p, _ in fwd), ("engine", engine.pid)]]
        assert path.observable and not path.notes
        return
    last, last_port = fwd[MAX_DEPTH - 1]
    assert kinds == [[("proxy", p.pid) for p, _ in fwd[:MAX_DEPTH]]]
    assert path.engine_pids == () and not path.observable
    assert path.notes == (f"the path goes on past {MAX_DEPTH} hops: 127.0.0.1:{last_port} "
                          f"(PID {last.pid} `python path_procs.py forward`) still connects "
                          "on, and is not called the engine",)
    assert path.reason == (f"The path is longer than {MAX_DEPTH} hops: no engine was "
                           "reached; name it with telemetry.pid_pattern")


def test_two_engines_sharing_a_port_with_so_reuseport_are_both_followed(procs):
    """Two servers listening on one port with SO_REUSEPORT: two engines, each its own
    chain and its own entry (PID, namespace, cgroup), both followed by the agent."""
    port = free_port("127.0.0.1")
    a, _ = procs.start("http", "--port", str(port), "--reuseport")
    b, _ = procs.start("http", "--port", str(port), "--reuseport")
    path = discover(f"http://127.0.0.1:{port}", health_path="/", window_s=SHORT)
    assert sorted(_chain_kinds(path)) == sorted([[("engine", a.pid)], [("engine", b.pid)]])
    assert sorted(path.engine_pids) == sorted((a.pid, b.pid)) and path.observable
    own = ns_inode(ns_key("self", Path("/proc")))
    assert sorted(e.pid for e in path.engines) == sorted((a.pid, b.pid))
    for e in path.engines:
        assert e.netns_inode == own and e.address == f"127.0.0.1:{port}"
        assert e.cgroup and e.cgroup in open(f"/proc/{e.pid}/cgroup").read()
        assert e.container is None


def test_a_forking_server_sharing_one_socket_is_one_engine(procs):
    """The other side of SO_REUSEPORT: a server whose worker inherited the listening socket
    (gunicorn, a pre-forking server) is one engine, its parent followed."""
    code = ("import os,socket,sys,time\n"
            "s=socket.create_server(('127.0.0.1',0))\n"
            "print(s.getsockname()[1],flush=True)\n"
            "if os.fork()==0:\n"
            " while True:\n"
            "  c,_=s.accept(); c.recv(4096)\n"
            "  c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Length: 0\\r\\n\\r\\n'); c.close()\n"
            "time.sleep(120)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        port = int(p.stdout.readline())
        path = discover(f"http://127.0.0.1:{port}", health_path="/", window_s=SHORT)
        assert [[h.kind for h in c] for c in path.chains] == [["engine"]]
        (engine,) = path.engines
        assert engine.pid == p.pid and len(engine.pids) == 2 and path.engine_pids == (p.pid,)
    finally:
        os.killpg(p.pid, 9)
        p.wait()


def test_the_engines_are_recorded_and_read_back():
    """The per-engine list survives the manifest: what the replica and lifetime work reads."""
    import json

    from strata_plugin.formats.request_path import Container, Engine, Hop, RequestPath

    box = Container("podman", "a" * 64, "strata-engine")
    e = Engine(5678, (5678, 5679), "10.88.0.5:8000", 4026532000, "/machine.slice/x", box,
               "vllm serve")
    hop = Hop("10.88.0.5:8000", "engine", 5678, "vllm serve", (5678,), "net:[4026532000]",
              container=box.text())
    path = RequestPath("http://127.0.0.1:8000", ((hop,),), "path", (5678,), (),
                       engines=(e,))
    back = RequestPath.from_json(json.loads(json.dumps(path.to_json())))
    assert back == path
    assert hop.text() == ("10.88.0.5:8000 (network namespace net:[4026532000]) -> PID 5678 "
                          "`vllm serve` in container podman strata-engine (aaaaaaaaaaaa)")


"""The engine found across network namespaces (run/listener.py, run/netns.py): reached at
its own namespace's address (a container on a bridge network), behind a forwarder whose
upstream socket is made inside the engine's namespace (rootlessport, pasta), behind a NAT
rule (a port published with DNAT: nothing listens on it), named by its container's cgroup,
and said to be unreadable, not on another host, where this user cannot read the
namespaces. Real namespaces, veth pairs, NAT rules and cgroups (tests/netlab.py), each
removed at the end."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_request_path import PROCS, Procs, _chain_kinds

from strata_plugin.formats.request_path import RequestPath
from strata_plugin.run.listener import REMOTE_NOTE, discover
from strata_plugin.run.netns import ns_inode, ns_key
from strata_plugin.run.server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.netlab, pytest.mark.root]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def procs():
    made = Procs()
    yield made
    made.close()


@pytest.fixture
def lab(tmp_path_factory):
    from netlab import lab_fixture

    yield from lab_fixture(tmp_path_factory, sshd=False)


@pytest.fixture
def pair():
    from netlab import LabUnavailable, NsPair
    from system_packages import require

    require("iproute2")
    try:
        p = NsPair()
    except LabUnavailable as e:
        pytest.skip(f"network namespaces unavailable: {e}")
    try:
        yield p
    finally:
        p.close()


def _engine_in(lab, bind: str) -> tuple[subprocess.Popen, int]:
    port = free_port("127.0.0.1")
    engine = lab.ns_popen([sys.executable, str(PROCS), "http", "--bind", bind,
                           "--port", str(port)], stdout=subprocess.PIPE, text=True)
    assert int(engine.stdout.readline()) == port
    return engine, port


def test_an_engine_at_its_namespaces_address_is_followed_by_its_host_pid(lab):
    """The URL is the namespace's own address (a container's, on a bridge network): the
    engine is a process of this machine, found by its host PID in that namespace, not
    "another host". An address no namespace here holds still is another host."""
    engine, port = _engine_in(lab, lab.worker_addr)
    path = discover(f"http://{lab.worker_addr}:{port}", health_path="/")
    assert _chain_kinds(path) == [[("engine", engine.pid)]]
    (hop,) = path.chains[0]
    assert hop.netns == os.readlink(f"/proc/{engine.pid}/ns/net") != ns_key("self",
                                                                          Path("/proc"))
    assert path.observable and path.engine_pids == (engine.pid,) and not path.reason
    (e,) = path.engines
    assert e.pid == engine.pid and e.address == f"{lab.worker_addr}:{port}"
    assert e.netns_inode == ns_inode(hop.netns)
    assert "another host" not in path.line()

    t0 = time.monotonic()
    away = discover(f"http://10.231.{lab.n}.200:{port}", health_path="/")
    assert time.monotonic() - t0 < 10
    assert _chain_kinds(away) == [[("remote", None)]]
    assert away.chains[0][0].note == REMOTE_NOTE and not away.observable


def test_a_forwarder_whose_upstream_is_made_inside_the_namespace_is_followed(lab):
    """rootlessport's and pasta's shape: the process holding the host's port lives in the
    engine's namespace (or enters it), so its connection on is in that namespace's table,
    to an engine listening on that namespace's loopback only. The forwarder is a proxy and
    the engine behind it is found; it was taken for the engine."""
    import socket

    engine, port = _engine_in(lab, "127.0.0.1")
    srv = socket.create_server(("127.0.0.1", 0))
    front = srv.getsockname()[1]
    code = ("import socket,sys,threading\n"
            "srv=socket.socket(fileno=int(sys.argv[1])); port=int(sys.argv[2])\n"
            "def pipe(a,b):\n"
            " try:\n"
            "  while (d:=a.recv(65536)): b.sendall(d)\n"
            " except OSError: pass\n"
            " for s in (a,b):\n"
            "  try: s.shutdown(socket.SHUT_RDWR)\n"
            "  except OSError: pass\n"
            "while True:\n"
            " c,_=srv.accept(); u=socket.create_connection(('127.0.0.1',port))\n"
            " for x,y in ((c,u),(u,c)): threading.Thread(target=pipe,args=(x,y),"
            "daemon=True).start()\n")
    fwd = lab.ns_popen([sys.executable, "-c", code, str(srv.fileno()), str(port)],
                       pass_fds=(srv.fileno(),))
    srv.close()  # only the forwarder holds the host's port now
    path = discover(f"http://127.0.0.1:{front}", health_path="/")
    assert _chain_kinds(path) == [[("proxy", fwd.pid), ("engine", engine.pid)]]
    assert path.chains[0][1].address == f"127.0.0.1:{port}"
    assert path.chains[0][1].netns == os.readlink(f"/proc/{engine.pid}/ns/net")
    assert path.engine_pids == (engine.pid,) and path.proxy_pids == (fwd.pid,)


def _engine_in_b(pair) -> tuple[subprocess.Popen, int]:
    """An HTTP engine listening at namespace b's own address, and its port."""
    port = free_port("127.0.0.1")
    engine = pair.popen(pair.b, [sys.executable, str(PROCS), "http", "--bind", pair.b_addr,
                                 "--port", str(port)], stdout=subprocess.PIPE, text=True)
    assert int(engine.stdout.readline()) == port
    return engine, port


def _discover_in(pair, ns: str, url: str, prelude: str = "") -> RequestPath:
    code = (prelude + "import json,sys\nfrom strata_plugin.run.listener import discover\n"
            "print(json.dumps(discover(sys.argv[1], health_path='/').to_json()))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(pair.argv(ns, [sys.executable, "-c", code, url]), env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return RequestPath.from_json(json.loads(out.stdout))


def test_a_port_published_with_dnat_is_followed_to_the_engine(pair, procs):
    """docker's and podman's default on a bridge network: a NAT rule sends the published
    port to the container's address, and nothing listens on the port. Strata (in its own
    namespace, so that the rule is not the host's) follows the probe connection's
    translation to the engine in the other namespace, and a proxy's connection to the
    published port the same way. Without the rule the port is said to have no listener
    and no translation."""
    from system_packages import require

    require("iptables")
    engine, port = _engine_in_b(pair)
    published = 8080
    url = f"http://{pair.a_addr}:{published}"
    bare = _discover_in(pair, pair.a, url)
    assert [[h.kind for h in c] for c in bare.chains] == [["unreadable"]]
    assert "no NAT translation of a connection to it was seen" in bare.chains[0][0].note
    pair.run(pair.a, ["iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d",
                      pair.a_addr, "--dport", str(published), "-j", "DNAT",
                      "--to-destination", f"{pair.b_addr}:{port}"])
    path = _discover_in(pair, pair.a, url)
    assert _chain_kinds(path) == [[("engine", engine.pid)]]
    nat = (f"{pair.a_addr}:{published} is forwarded by a NAT rule to {pair.b_addr}:{port} "
           "(connection tracking)")
    assert path.notes == (nat,) and path.observable
    assert path.engines[0].netns_inode == ns_inode(os.readlink(f"/proc/{engine.pid}/ns/net"))
    # a proxy in front of the published port: its connection's translation, followed
    fwd = pair.popen(pair.a, [sys.executable, str(PROCS), "forward", "--to",
                              f"{pair.a_addr}:{published}"], stdout=subprocess.PIPE,
                     text=True)
    fwd_port = int(fwd.stdout.readline())
    via = _discover_in(pair, pair.a, f"http://127.0.0.1:{fwd_port}")
    assert _chain_kinds(via) == [[("proxy", fwd.pid), ("engine", engine.pid)]]
    assert nat in via.notes


def _cgroup2_root() -> Path | None:
    for line in Path("/proc/mounts").read_text().splitlines():
        f = line.split()
        if len(f) > 2 and f[2] == "cgroup2":
            return Path(f[1])
    return None


def test_the_engines_container_is_named_by_its_cgroup(lab):
    """An engine in a cgroup named as podman names a container's (``libpod-<id>.scope``):
    the path's engine carries that cgroup and the container (runtime and id; its name
    where podman here knows it, none here), and the report's line says it."""
    root = _cgroup2_root()
    if root is None:
        pytest.skip("no cgroup2 hierarchy mounted")
    cid = secrets.token_hex(32)
    group = root / f"strata-test-{os.getpid()}" / f"libpod-{cid}.scope"
    group.mkdir(parents=True)
    engine, port = _engine_in(lab, lab.worker_addr)
    try:
        (group / "cgroup.procs").write_text(str(engine.pid))
        path = discover(f"http://{lab.worker_addr}:{port}", health_path="/")
        (e,) = path.engines
        assert e.cgroup == f"/strata-test-{os.getpid()}/libpod-{cid}.scope"
        assert e.container is not None
        assert (e.container.runtime, e.container.id) == ("podman", cid)
        assert path.chains[0][0].container == f"podman (name unknown) ({cid[:12]})"
        assert path.line().endswith(f"in container podman (name unknown) ({cid[:12]})")
    finally:
        engine.kill()
        engine.wait()
        for _ in range(50):
            try:
                group.rmdir()
                group.parent.rmdir()
                break
            except OSError:
                time.sleep(0.05)


def test_namespaces_this_user_cannot_read_are_said_within_seconds(lab):
    """Looked at as an unprivileged user, root's processes' namespaces cannot be read:
    the engine at its namespace's address is not found, and the path says so and what to
    do, in seconds, beside "another host". (A forked child drops to uid 65534.)"""
    import pwd  # noqa: F401  (the child needs it and cannot read the stdlib any more)

    from strata_plugin.run import netns  # noqa: F401  (likewise)

    _, port = _engine_in(lab, lab.worker_addr)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            t0 = time.monotonic()
            path = discover(f"http://{lab.worker_addr}:{port}", window_s=0.2)
            os.write(w, json.dumps([time.monotonic() - t0, path.to_json()]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as fh:
        text = fh.read()
    _, status = os.waitpid(child, 0)
    assert status == 0 and text
    took, raw = json.loads(text)
    path = RequestPath.from_json(raw)
    (hop,) = path.chains[0]
    assert not path.observable and path.engine_pids == ()
    assert "could not be read by this user (uid 65534)" in hop.note
    assert "run Strata as root or that user, or name it with telemetry.pid_pattern" in hop.note
    assert took < 10, took





def test_the_nat_rules_are_parsed_as_iptables_and_nft_list_them(pair):
    """Where connection tracking has no entry, the rules themselves say where a port goes:
    real rules added in a private namespace, listed by the real commands, parsed. Each
    rule is matched on its port and, where it names one, its destination address (a
    negated one too); a rule without a port in its destination keeps the port."""
    from system_packages import require

    from strata_plugin.run.netns import (
        parse_iptables_nat,
        parse_nft_ruleset,
        rule_translation,
    )

    require("iptables")
    a, b = pair.a_addr, pair.b_addr
    other = a.rsplit(".", 1)[0] + ".77"
    for rule in (["-A", "OUTPUT", "-p", "tcp", "-d", a, "--dport", "8080", "-j", "DNAT",
                  "--to-destination", f"{b}:9000"],
                 ["-A", "OUTPUT", "-p", "tcp", "!", "-d", a, "--dport", "8081", "-j",
                  "DNAT", "--to-destination", f"{b}:9001"],
                 ["-A", "PREROUTING", "!", "-i", "docker0", "-p", "tcp", "-m", "tcp",
                  "--dport", "8100:8102", "-j", "DNAT", "--to-destination", b],
                 ["-A", "OUTPUT", "-p", "udp", "--dport", "8082", "-j", "DNAT",
                  "--to-destination", f"{b}:9002"]):
        pair.run(pair.a, ["iptables", "-t", "nat", *rule])
    listed = pair.run(pair.a, ["iptables", "-t", "nat", "-S"]).stdout
    rules = parse_iptables_nat(listed)
    assert len(rules) == 3  # the UDP rule is no TCP listener's
    assert rule_translation(rules, a, 8080)[0] == (b, 9000)
    assert rule_translation(rules, other, 8080) is None  # the rule names another address
    assert rule_translation(rules, a, 8079) is None and rule_translation(rules, a, 8083) is None
    assert rule_translation(rules, other, 8081)[0] == (b, 9001)  # "! -d a": any but a
    assert rule_translation(rules, a, 8081) is None
    assert rule_translation(rules, a, 8102)[0] == (b, 8102)  # a range, the port kept
    assert rule_translation(rules, a, 8103) is None
    assert rule_translation(rules, a, 8082) is None
    assert rule_translation(rules, a, 8080)[1].source == "iptables -t nat -S"

    require("nftables")
    pair.run(pair.a, ["nft", "add", "table", "ip", "strata_t"])
    pair.run(pair.a, ["nft", "add", "chain", "ip", "strata_t", "out",
                      "{ type nat hook output priority -100; }"])
    pair.run(pair.a, ["nft", "add", "rule", "ip", "strata_t", "out", "ip", "daddr", a,
                      "tcp", "dport", "7070", "dnat", "to", f"{b}:7071"])
    pair.run(pair.a, ["nft", "add", "rule", "ip", "strata_t", "out", "tcp", "dport",
                      "7072-7074", "dnat", "to", b])
    native = parse_nft_ruleset(json.loads(
        pair.run(pair.a, ["nft", "-j", "list", "ruleset"]).stdout))
    # iptables' own rules show there as "xt" targets without a destination: not these
    assert len(native) == 2
    assert rule_translation(native, a, 7070)[0] == (b, 7071)
    assert rule_translation(native, other, 7070) is None
    assert rule_translation(native, other, 7073)[0] == (b, 7073)
    assert rule_translation(native, a, 7075) is None and rule_translation(native, a, 7069) is None


def test_a_dnat_port_without_a_conntrack_entry_is_followed_by_the_rule(pair, procs):
    """A published port whose probe connection leaves no connection-tracking entry to read
    (no nf_conntrack here, or the entry not shown: made so here by reading none): the NAT
    rule listed by ``iptables -t nat -S`` is followed to the engine, and the note says the
    rule was read. Without the rule the port still has no listener and no translation."""
    from system_packages import require

    require("iptables")
    engine, port = _engine_in_b(pair)
    published = 8080
    url = f"http://{pair.a_addr}:{published}"
    blind = ("import strata_plugin.run.netns as n, strata_plugin.run.listener as li\n"
             "n.translation = li.translation = lambda *a, **k: None\n")
    bare = _discover_in(pair, pair.a, url, prelude=blind)
    assert [[h.kind for h in c] for c in bare.chains] == [["unreadable"]]
    pair.run(pair.a, ["iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d",
                      pair.a_addr, "--dport", str(published), "-j", "DNAT",
                      "--to-destination", f"{pair.b_addr}:{port}"])
    path = _discover_in(pair, pair.a, url, prelude=blind)
    assert _chain_kinds(path) == [[("engine", engine.pid)]]
    assert path.notes == (
        f"{pair.a_addr}:{published} is forwarded by a NAT rule to {pair.b_addr}:{port} "
        "(the rule read from `iptables -t nat -S`: connection tracking had no entry)",)
    # a proxy's connection to the published port, its entry unread as well
    fwd = pair.popen(pair.a, [sys.executable, str(PROCS), "forward", "--to",
                              f"{pair.a_addr}:{published}"], stdout=subprocess.PIPE,
                     text=True)
    fwd_port = int(fwd.stdout.readline())
    via = _discover_in(pair, pair.a, f"http://127.0.0.1:{fwd_port}", prelude=blind)
    assert _chain_kinds(via) == [[("proxy", fwd.pid), ("engine", engine.pid)]]
    assert path.notes[0] in via.notes

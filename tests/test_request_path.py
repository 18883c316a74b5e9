"""The request's path to an attached server, found on real processes (run/listener.py):
proxies followed hop by hop to the engine, the engine itself left alone, a pool of
connections told from an engine's own connections, a cycle stopped, a chain that leaves
the machine said to be unobservable, another user's processes said to be unreadable,
and ``telemetry.pid_pattern`` winning over all of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from strata_plugin.configure.profile import NodeSpec, TelemetrySpec
from strata_plugin.formats.request_path import Hop, RequestPath, paths_in
from strata_plugin.report.markdown import path_rows
from strata_plugin.run.agents import AgentFleet
from strata_plugin.run.listener import attached_server_pid, discover
from strata_plugin.run.server import free_port
from strata_plugin.testing.relay import LatencyProxy, RelayChain

pytest_plugins = ["pytester"]
HERE = Path(__file__).resolve().parent
PROCS = HERE / "path_procs.py"


class Procs:
    """Processes of tests/path_procs.py, each killed at the end."""

    def __init__(self) -> None:
        self.made: list[subprocess.Popen] = []

    def start(self, *args: str) -> tuple[subprocess.Popen, int]:
        p = subprocess.Popen([sys.executable, str(PROCS), *args], stdout=subprocess.PIPE,
                             text=True)
        self.made.append(p)
        assert p.stdout is not None
        return p, int(p.stdout.readline())

    def close(self) -> None:
        for p in self.made:
            p.kill()
            p.wait()


@pytest.fixture
def procs():
    made = Procs()
    yield made
    made.close()


def _chain_kinds(path: RequestPath) -> list[list[tuple[str, int | None]]]:
    return [[(h.kind, h.pid) for h in c] for c in path.chains]


def test_two_relays_are_followed_to_the_http_server_behind_them(procs):
    """relay -> relay -> an HTTP server: the relays open their connection on per request
    (none while idle), so only the probe shows them; the path names all three, the agent
    follows the server, and what attach mode followed before (the listener) is the first
    relay."""
    engine, port = procs.start("http")
    chain = RelayChain(f"http://127.0.0.1:{port}", [{"delay_ms": 0.0}, {"delay_ms": 0.0}],
                       max_s=60)
    with chain:
        front, back = chain.relays
        path = discover(chain.url, health_path="/")
        assert _chain_kinds(path) == [[("proxy", front.pid), ("proxy", back.pid),
                                       ("engine", engine.pid)]]
        assert [h.address for h in path.chains[0]] == [
            f"127.0.0.1:{front.port}", f"127.0.0.1:{back.port}", f"127.0.0.1:{port}"]
        assert path.engine_pids == (engine.pid,) and path.proxy_pids == (front.pid, back.pid)
        assert path.observable and path.engine_from == "path" and path.how == "probe"
        assert path.line() == (
            f"127.0.0.1:{front.port} -> PID {front.pid} `python -m strata_plugin.testing.relay"
            f" relay` -> 127.0.0.1:{back.port} -> PID {back.pid} `python -m strata_plugin."
            f"testing.relay relay` -> 127.0.0.1:{port} -> PID {engine.pid} `python "
            "path_procs.py http`")
        # Without the probe an idle relay holds no connection on: the listener alone.
        static = discover(chain.url, probe=False)
        assert _chain_kinds(static) == [[("engine", front.pid)]]
        assert attached_server_pid(chain.url) == front.pid


@pytest.mark.integration  # 3.3 s of real waiting on the quiet VM
def test_a_pool_is_followed_and_an_engines_own_connections_are_not(procs):
    """A proxy that holds one connection to its upstream and opens none per request (a
    keep-alive pool) is followed along it: its far end answers the health path. The
    engine's own connection to a database (a listener that speaks no HTTP) is not a hop:
    the engine stays the engine."""
    db, db_port = procs.start("raw")
    engine, port = procs.start("http", "--hold", f"127.0.0.1:{db_port}")
    pool, pool_port = procs.start("pool", "--to", f"127.0.0.1:{port}")
    path = discover(f"http://127.0.0.1:{pool_port}", health_path="/health")
    assert _chain_kinds(path) == [[("proxy", pool.pid), ("engine", engine.pid)]]
    direct = discover(f"http://localhost:{port}", health_path="/health")  # ::1 or 127.0.0.1
    assert _chain_kinds(direct) == [[("engine", engine.pid)]] and not direct.proxy_pids
    assert direct.chains[0][0].address == f"127.0.0.1:{port}"
    assert db.pid not in (*path.engine_pids, *path.proxy_pids)


def test_a_cycle_of_proxies_is_stopped_where_it_closes(procs):
    """Two forwarders pointed at each other: the path stops at the listener already on it,
    says so, and names no engine (nothing there serves)."""
    a_port, b_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    a, _ = procs.start("forward", "--port", str(a_port), "--to", f"127.0.0.1:{b_port}")
    b, _ = procs.start("forward", "--port", str(b_port), "--to", f"127.0.0.1:{a_port}")
    path = discover(f"http://127.0.0.1:{a_port}", window_s=0.5)
    assert _chain_kinds(path) == [[("proxy", a.pid), ("proxy", b.pid)]]
    assert path.notes == (f"a cycle at 127.0.0.1:{a_port} (already on the path): not followed",)
    assert path.engine_pids == () and not path.observable


@pytest.mark.integration  # waits out real seconds (>= 2 s on a quiet host)
def test_the_path_pattern_wins_and_the_fleet_gives_the_agent_no_pid(procs, tmp_path):
    """telemetry.pid_pattern names the engine: the head agent gets the pattern and no PID
    (a PID beside it won in the agent, which is how a proxy's PID beat the pattern), and
    the relay is still followed as the path."""
    engine, port = procs.start("http", "--port", str(free_port("127.0.0.1")))
    pattern = rf"path_procs\.py http --port {port}$"
    with LatencyProxy(f"http://127.0.0.1:{port}", delay_ms=0, max_s=60) as relay:
        path = discover(relay.url, pid_pattern=pattern, health_path="/")
        assert path.engine_from == "pid_pattern" and engine.pid in path.engine_pids
        assert path.proxy_pids == (relay.pid,)
        assert "the engine by telemetry.pid_pattern: PID" in path.line()
        t = TelemetrySpec(collectors=("proc", "cpu"), pid_pattern=pattern)
        fleet = AgentFleet((NodeSpec("local"),), t, tmp_path, None, attached=True)
        fleet.paths["attached"] = path
        server = SimpleNamespace(base_url=relay.url, log_path=None, block_key="attached")
        argv = fleet.commands(None, server)["local"]
        assert "--pid" not in argv and argv[argv.index("--pid-pattern") + 1] == pattern
        assert argv[argv.index("--path-pid") + 1] == str(relay.pid)
        # the same fleet without the pattern follows the engine the path found
        plain = AgentFleet((NodeSpec("local"),), TelemetrySpec(collectors=("proc",)),
                           tmp_path, None, attached=True)
        plain.paths["attached"] = discover(relay.url, health_path="/")
        argv = plain.commands(None, server)["local"]
        assert argv[argv.index("--pid") + 1] == str(engine.pid)
        assert argv[argv.index("--path-pid") + 1] == str(relay.pid)
        assert "--pid-pattern" not in argv


def test_another_users_listener_is_named_unreadable_with_its_owner(procs):
    """Looked at as an unprivileged user, root's processes cannot be read: the hop says
    whose socket it is and what to do, and no PID is followed. (A forked child drops to
    uid 65534: the stdlib and the checkout are already loaded, so nothing under a 0700
    home has to be read again.)"""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    import pwd  # noqa: F401  (the child needs it and cannot read the stdlib any more)

    from strata_plugin.agent import procfs  # noqa: F401  (likewise)

    _, port = procs.start("http")
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            path = discover(f"http://127.0.0.1:{port}", window_s=0.2)
            os.write(w, json.dumps(path.to_json()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as fh:
        text = fh.read()
    _, status = os.waitpid(child, 0)
    assert status == 0 and text
    path = RequestPath.from_json(json.loads(text))
    (hop,) = path.chains[0]
    assert hop.kind == "unreadable" and hop.pid is None
    assert "uid 0 (root)" in hop.note and "telemetry.pid_pattern" in hop.note
    assert not path.observable and path.engine_pids == ()


def test_the_path_is_recorded_and_read_back_for_the_report():
    hops = (Hop("127.0.0.1:8000", "proxy", 1234, "nginx", (1234, 1235)),
            Hop("127.0.0.1:9000", "engine", 5678, "vllm serve", (5678,)))
    path = RequestPath("http://127.0.0.1:8000", (hops,), "path", (5678,), (1234,))
    assert path.line() == ("127.0.0.1:8000 -> PID 1234 `nginx` -> 127.0.0.1:9000 -> "
                           "PID 5678 `vllm serve`")
    manifest = json.loads(json.dumps({"request_path": {"attached": path.to_json()}}))
    assert paths_in(manifest) == {"attached": path}
    assert path_rows(manifest) == [("request path", path.line())]
    away = RequestPath("http://127.0.0.1:8000", ((hops[0], Hop("10.0.0.5:9000", "remote",
                                                                   note="another host")),),
                       "none", (), (1234,), reason="The engine is on another host")
    assert away.line().endswith("10.0.0.5:9000 (another host). The engine is on another host")
    assert not away.observable and path_rows({}) == []


# --- across network namespaces: a container on this machine, and another host ----------


@pytest.fixture
def lab(tmp_path_factory):
    from netlab import lab_fixture

    yield from lab_fixture(tmp_path_factory, sshd=False)


@pytest.mark.integration
@pytest.mark.netlab
@pytest.mark.root
def test_a_chain_into_a_namespace_is_followed_and_one_leaving_the_host_is_not(lab, procs):
    """A relay to a server in another network namespace of this machine (a container on
    a bridge network) is followed into it: the engine is a process here, observable. A
    relay to an address no namespace here holds (the lab's subnet, nobody at .200: its
    connection stays in SYN_SENT) leaves the machine: the path ends there, says so, and
    follows no engine."""
    port = free_port("127.0.0.1")
    engine = lab.ns_popen([sys.executable, str(PROCS), "http", "--bind", lab.worker_addr,
                           "--port", str(port)], stdout=subprocess.PIPE, text=True)
    assert int(engine.stdout.readline()) == port
    fwd, fwd_port = procs.start("forward", "--to", f"{lab.worker_addr}:{port}")
    path = discover(f"http://127.0.0.1:{fwd_port}", health_path="/")
    assert _chain_kinds(path) == [[("proxy", fwd.pid), ("engine", engine.pid)]]
    hop = path.chains[0][-1]
    assert hop.address == f"{lab.worker_addr}:{port}" and hop.netns.startswith("net:[")
    assert path.observable and f"(network namespace {hop.netns})" in path.line()

    away, away_port = procs.start("forward", "--to", f"10.231.{lab.n}.200:9")
    path = discover(f"http://127.0.0.1:{away_port}", health_path="/")
    assert _chain_kinds(path) == [[("proxy", away.pid), ("remote", None)]]
    assert path.chains[0][-1].address == f"10.231.{lab.n}.200:9"
    assert not path.observable and path.engine_pids == () and path.proxy_pids == (away.pid,)
    assert path.line().endswith("another host: its processes cannot be observed from here)"
                                ". The engine is on another host: its CPU, run state, faults "
                                "and log cannot be observed from here; the verdict reads the "
                                "client's clocks and the engine's /metrics only")


# --- on the real engine -----------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_server():
    from tests.test_robustness_support import llama_paths

    p = llama_paths()
    port = free_port("127.0.0.1")
    proc = subprocess.Popen([p["llama_server"], "-m", p["model"], "--host", "127.0.0.1",
                             "--port", str(port), "-t", "1", "-c", "512", "-np", "1",
                             "--no-webui"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "llama-server did not start"
        time.sleep(0.2)
    yield proc, url
    proc.terminate()
    proc.wait(10)


@pytest.mark.integration
def test_relay_relay_llama_server_names_llama_server_the_engine(llama_server):
    """The two-hop chain in front of the real engine: both relays are proxies, llama-server
    is the engine, and the probe generated nothing there (its body never completes)."""
    server, url = llama_server
    with RelayChain(url, [{"delay_ms": 5.0}, {"delay_ms": 5.0}], max_s=60) as chain:
        path = discover(chain.url)
        assert _chain_kinds(path) == [[("proxy", chain.pids[0]), ("proxy", chain.pids[1]),
                                       ("engine", server.pid)]]
        assert path.chains[0][-1].name == "llama-server" and path.observable
        assert path.line().endswith(f"-> {url.split('//')[1]} -> PID {server.pid} "
                                    "`llama-server`")


@pytest.mark.integration
def test_llama_server_alone_is_its_own_path(llama_server):
    """A listener that is not a proxy: the path is the engine alone, as attach mode
    followed it before; nothing is sampled as a proxy."""
    server, url = llama_server
    path = discover(url)
    assert _chain_kinds(path) == [[("engine", server.pid)]]
    assert path.proxy_pids == () and path.engine_pids == (server.pid,)
    assert attached_server_pid(url) == server.pid


@pytest.mark.integration
def test_an_attached_run_through_a_relay_follows_the_engine_and_reports_the_path(
        llama_server, pytester, monkeypatch):
    """``--strata-server-url`` pointed at a relay in front of llama-server: the manifest
    and report.md name the relay and llama-server, and the head agent's command follows
    llama-server as the server and the relay as the path (its samples under ``path``)."""
    server, url = llama_server
    monkeypatch.setenv("PYTHONPATH", str(HERE.parent))
    profile = pytester.path / "profile.toml"  # attached: no command of its own
    profile.write_text('name = "attached"\n[server]\nengine = "llamacpp"\napi = "llamacpp"\n'
                       'argv = []\ntoken_id_range = [300, 1000]\n[telemetry]\n'
                       'interval_s = 0.25\nbaseline_s = 1\ncooldown_s = 0\n'
                       'collectors = ["proc", "cpu", "mem", "prom", "log"]\n')
    pytester.makeini(f"[pytest]\nstrata_reports_dir = {pytester.path / 'reports'}\n")
    with LatencyProxy(url, delay_ms=20.0, max_s=120) as relay:
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", f"--strata-server-url={relay.url}",
            f"--strata-profile={profile}", "--strata-workload=isl=16,osl=8,requests=4",
            "--strata-run-id=p1")
        relay_pid = relay.pid
    result.assert_outcomes(passed=1)
    run = pytester.path / "reports" / "p1"
    manifest = json.loads((run / "manifest.json").read_text())
    (path,) = paths_in(manifest).values()
    assert _chain_kinds(path) == [[("proxy", relay_pid), ("engine", server.pid)]]
    assert f"| request path | {path.line()} |" in (run / "report.md").read_text()
    argv = json.loads((run / "nodes" / "local" / "collector_commands" / "agent.json")
                      .read_text())
    assert argv[argv.index("--pid") + 1] == str(server.pid)
    assert argv[argv.index("--path-pid") + 1] == str(relay_pid)
    samples = (run / "nodes" / "local" / "samples" / "path.csv").read_text()
    assert f",path,pid{relay_pid},cpu_user_s," in samples


def test_a_head_reached_over_ssh_is_not_looked_at_from_here(tmp_path):
    """The server's node is another machine: its sockets are not this one's. Nothing is
    probed; the pattern, where given, is what that node's agent follows."""
    server = SimpleNamespace(base_url="http://10.0.0.5:8000", log_path=None, block_key="b")
    nodes = (NodeSpec("gpu", ssh_host="gpu-a"),)
    fleet = AgentFleet(nodes, TelemetrySpec(pid_pattern="vllm serve"), tmp_path, None,
                       attached=True)
    path = fleet.look_at_path(server)
    assert path.engine_from == "pid_pattern" and path.how == "none" and not path.reason
    blind = AgentFleet(nodes, TelemetrySpec(), tmp_path, None, attached=True)
    assert "node gpu is reached over ssh" in blind.look_at_path(server).reason

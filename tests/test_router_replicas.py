"""Two replicas behind a round-robin router (testing/router.py), on real processes: the
router hands connections to its upstreams in turn, the request's path records both
engines and the router between, the head agent is given both engines and the router,
and each engine's own cgroup (its CFS quota and its throttling) is sampled under its
own name, so a quota on one replica is neither missed nor taken for the other's."""

from __future__ import annotations

import http.client
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from strata_plugin.agent.collectors.allowance import AllowanceCollector
from strata_plugin.agent.targets import ProcessTargets
from strata_plugin.configure.profile import NodeSpec, TelemetrySpec
from strata_plugin.run.agents import AgentFleet
from strata_plugin.run.listener import discover
from strata_plugin.testing import faults
from strata_plugin.testing.router import RoundRobinRouter
from tests.test_request_path import Procs

pytest_plugins = ["pytester"]

SPIN = "import sys\nprint('up', flush=True)\nwhile True: pass\n"
SLEEP = "import sys, time\nprint('up', flush=True)\ntime.sleep(120)\n"


@pytest.fixture
def procs():
    made = Procs()
    yield made
    made.close()


def _get(url: str) -> int:
    host, port = url.rsplit("/", 1)[-1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", "/", headers={"Connection": "close"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_the_router_hands_connections_in_turn_and_refuses_what_it_cannot_route(procs):
    """Five requests over two upstreams: 3 and 2, in turn (the facts count them). A router
    of one upstream (a relay) and one in front of another host are refused at once, in
    the caller's terms."""
    _, a = procs.start("http")
    _, b = procs.start("http")
    ups = [f"http://127.0.0.1:{a}", f"http://127.0.0.1:{b}"]
    with RoundRobinRouter(ups, max_s=60) as router:
        assert [_get(router.url) for _ in range(5)] == [200] * 5
    facts = router.stop().as_dict()
    assert facts["handed"] == {f"127.0.0.1:{a}": 3, f"127.0.0.1:{b}": 2}, facts
    with pytest.raises(ValueError, match="2 to 16 upstreams, not 1"):
        RoundRobinRouter(ups[:1])
    with pytest.raises(ValueError, match=r"loopback engines only .*'http://10\.0\.0\.1:80'"):
        RoundRobinRouter([ups[0], "http://10.0.0.1:80"])


def test_every_engine_behind_the_router_is_recorded_and_given_to_the_agent(procs, tmp_path):
    """Three replicas: the path fans out at the router, one chain per engine, every engine
    recorded (PID, address), the router a proxy; the head agent follows all three as the
    server (``--pid`` each) and the router as the path. The replicas answer a request as
    soon as its head ends, so only the probes held open show them (a GET's connection
    lasts a millisecond): with one held probe of each kind, one replica of two was found."""
    engines = [procs.start("http") for _ in range(3)]
    with RoundRobinRouter([f"http://127.0.0.1:{port}" for _, port in engines],
                          max_s=60) as router:
        path = discover(router.url, health_path="/")
        assert sorted([(h.kind, h.pid) for h in c] for c in path.chains) == sorted(
            [("proxy", router.pid), ("engine", p.pid)] for p, _ in engines)
        assert sorted((e.pid, e.address) for e in path.engines) == sorted(
            (p.pid, f"127.0.0.1:{port}") for p, port in engines)
        assert sorted(path.engine_pids) == sorted(p.pid for p, _ in engines)
        assert path.proxy_pids == (router.pid,) and path.observable
        fleet = AgentFleet((NodeSpec("local"),), TelemetrySpec(collectors=("proc",)),
                           tmp_path, None, attached=True)
        fleet.paths["attached"] = path
        server = SimpleNamespace(base_url=router.url, log_path=None, block_key="attached")
        argv = fleet.commands(None, server)["local"]
        given = [int(argv[i + 1]) for i, w in enumerate(argv) if w == "--pid"]
        assert sorted(given) == sorted(p.pid for p, _ in engines)
        assert [argv[i + 1] for i, w in enumerate(argv) if w == "--path-pid"] == [
            str(router.pid)]


def _by_engine(emits: list, metric: str) -> dict[str, float]:
    return {dev: v for _w, dev, m, v, _k in emits if m == metric}


@pytest.mark.root
def test_each_engines_own_quota_and_throttling_are_sampled_under_its_pid(tmp_path):
    """Two engines, the second held to a quarter of a core by a cgroup v1 CFS quota of its
    own (testing/faults.ServerCpuQuota) and spinning into it: the collector names that
    quota under ``pid<N>`` of that engine alone, and its throttled periods grow while the
    other engine's cgroup, without a quota, shows none. One engine alone gets no
    per-engine rows (the server's own rows are its)."""
    idle = Procs()
    try:
        quiet, _ = _start(idle, SLEEP)
        busy, _ = _start(idle, SPIN)
        quota = faults.ServerCpuQuota(busy.pid, quota_cores=0.25)
        try:
            quota.start()
        except faults.FaultUnavailable as e:
            pytest.skip(f"no CPU quota cgroup of its own here: {e}")
        c = AllowanceCollector(ProcessTargets(pids=[quiet.pid, busy.pid]))
        c.probe()
        try:
            first = c.sample(time.time_ns())
            time.sleep(1.0)  # ten CFS periods: a spinner at 0.25 core is throttled in each
            last = c.sample(time.time_ns())
        finally:
            c.close()
            quota.stop()
        assert _by_engine(last, "engine_quota_cores") == {f"pid{busy.pid}": 0.25}
        grew = {dev: v - _by_engine(first, "engine_nr_throttled")[dev]
                for dev, v in _by_engine(last, "engine_nr_throttled").items()}
        assert grew[f"pid{busy.pid}"] >= 3, grew
        assert grew.get(f"pid{quiet.pid}", 0) == 0, grew
        assert _by_engine(last, "engine_throttled_s")[f"pid{busy.pid}"] > 0
        one = AllowanceCollector(ProcessTargets(pids=[quiet.pid]))
        one.probe()
        try:
            assert not [e for e in one.sample(time.time_ns()) if e[2].startswith("engine_")]
        finally:
            one.close()
    finally:
        idle.close()


def _start(made: Procs, code: str):
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    made.made.append(p)
    assert p.stdout is not None and p.stdout.readline() == "up\n"
    return p, Path(f"/proc/{p.pid}")


# --- each engine's line over a window (analysis/engine_lines.py) --------------------------


def _window(quota_pid: int, other_pid: int, throttled: float) -> list:
    """A window's rows as the agent's samples summarize: the second engine's cgroup has a
    quota of a quarter core and ``throttled`` of its 10 periods throttled."""
    from strata_plugin.analysis.timeline import HwStat

    def row(source: str, pid: int, metric: str, **v: float) -> HwStat:
        return HwStat("w", "local", source, f"pid{pid}", metric, "counter", 5, 1.0, **v)

    out = []
    for pid in (quota_pid, other_pid):
        out += [row("proc", pid, "cpu_user_s", rate=0.2), row("proc", pid, "cpu_system_s",
                                                               rate=0.05),
                row("proc", pid, "runqueue_delay_ns", rate=5e8 if pid == quota_pid else 1e7),
                row("allowance", pid, "engine_nr_periods", delta=10.0)]
    out += [row("allowance", quota_pid, "engine_nr_throttled", delta=throttled),
            row("allowance", other_pid, "engine_nr_throttled", delta=0.0),
            row("allowance", quota_pid, "engine_quota_cores", min=0.25)]
    return out


def _engines(a: int, b: int) -> tuple:
    from strata_plugin.formats.request_path import Engine

    return (Engine(a, (a,), "127.0.0.1:8081", name="llama-server"),
            Engine(b, (b,), "127.0.0.1:8082", name="llama-server"))


HELD = ("Held by its own CPU quota (throttled in over 5% of its periods): PID 2 "
        "`llama-server` at 127.0.0.1:8082: CFS quota 0.25 core, throttled in 6% of its "
        "periods, 0.25 core of CPU, 0.50 s/s waiting for a CPU. The other 1 engine is not.")


@pytest.mark.parametrize(("share", "held", "finding"), [(0.04, False, ""), (0.06, True, HELD)])
def test_an_engine_is_held_by_its_quota_just_above_cgroup_throttled_frac(share, held, finding):
    """cgroup_throttled_frac (5% of its periods), applied to one engine's own cgroup: at
    4% it is not named, at 6% it is, with its quota; the other engine never is."""
    from strata_plugin.analysis import thresholds
    from strata_plugin.analysis.engine_lines import engine_lines, held_by_quota

    assert thresholds.value("cgroup_throttled_frac") == 0.05
    lines = engine_lines(_window(2, 1, share * 10), _engines(1, 2))
    assert [(x.key, x.held_by_quota) for x in lines] == [("local/pid1", False),
                                                         ("local/pid2", held)]
    slow = lines[1]
    assert (slow.quota_cores, slow.cpu_cores, slow.run_wait) == (0.25, 0.25, 0.5)
    assert slow.throttled_share == pytest.approx(share)
    assert held_by_quota(lines) == finding


def test_one_engine_has_no_lines_and_an_engine_without_samples_is_left_out():
    """One engine's evidence is the server's own rows: no per-engine lines. An engine the
    agent has no rows of in the window (it had not started) is not given a line of
    made-up figures."""
    from strata_plugin.analysis.engine_lines import engine_lines

    rows = _window(2, 1, 5.0)
    assert engine_lines(rows, _engines(1, 2)[:1]) == ()
    lines = engine_lines(rows, (*_engines(1, 2), _engines(3, 4)[0]))
    assert [x.pid for x in lines] == [1, 2]


# --- live: two llama-server replicas behind the router, one held to a quarter core -------


@pytest.fixture(scope="module")
def llama():
    """The built llama-server and model (read before pytester moves HOME)."""
    from tests.test_robustness_support import llama_paths

    return llama_paths()


def _llama(p: dict, port: int):
    import subprocess
    import urllib.request

    proc = subprocess.Popen([p["llama_server"], "-m", p["model"], "--host", "127.0.0.1",
                             "--port", str(port), "-t", "1", "-c", "512", "-np", "1",
                             "--no-webui"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "llama-server did not start"
        time.sleep(0.2)


@pytest.mark.integration
@pytest.mark.root
def test_two_replicas_behind_a_router_one_throttled_are_both_reported(llama, pytester,
                                                                     monkeypatch):
    """An attached run through the router over two llama-server replicas, the second held to
    a quarter of a core by a cgroup v1 CFS quota of its own for the whole run: the head
    agent follows both, and report.md's Engines section gives each its own line, the
    throttled one with its quota and named as held by it, the other not."""
    import json

    from strata_plugin.run.server import free_port

    pa, pb = free_port("127.0.0.1"), free_port("127.0.0.1")
    fast = _llama(llama, pa)
    slow = _llama(llama, pb)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    profile = pytester.path / "profile.toml"
    profile.write_text('name = "attached"\n[server]\nengine = "llamacpp"\napi = "llamacpp"\n'
                       'argv = []\ntoken_id_range = [300, 1000]\n[telemetry]\n'
                       'interval_s = 0.25\nbaseline_s = 1\ncooldown_s = 0\n'
                       'collectors = ["proc", "cpu", "mem"]\n')
    pytester.makeini(f"[pytest]\nstrata_reports_dir = {pytester.path / 'reports'}\n")
    try:
        with faults.ServerCpuQuota(slow.pid, quota_cores=0.25), RoundRobinRouter(
                [f"http://127.0.0.1:{pa}", f"http://127.0.0.1:{pb}"], max_s=300) as router:
            result = pytester.runpytest_subprocess(
                "-p", "no:cacheprovider", f"--strata-server-url={router.url}",
                f"--strata-profile={profile}",
                "--strata-workload=isl=16,osl=48,requests=8,concurrency=2",
                "--strata-run-id=r1")
            router_pid = router.pid
    finally:
        for p in (fast, slow):
            p.terminate()
            p.wait(10)
    result.assert_outcomes(passed=1)
    run = pytester.path / "reports" / "r1"
    argv = json.loads((run / "nodes" / "local" / "collector_commands" / "agent.json")
                      .read_text())
    assert sorted(int(argv[i + 1]) for i, w in enumerate(argv) if w == "--pid") == sorted(
        (fast.pid, slow.pid))
    assert [argv[i + 1] for i, w in enumerate(argv) if w == "--path-pid"] == [str(router_pid)]
    report = (run / "report.md").read_text()
    section = report[report.index("\n## Engines\n"):]
    section = section[:section.index("\n## ", 5)]
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in section.splitlines() if line.startswith("| ") and "PID" in line}
    held = rows[f"PID {slow.pid} `llama-server`"]
    free = rows[f"PID {fast.pid} `llama-server`"]
    assert held[2:4] == [f"127.0.0.1:{pb}", "0.25"] and held[-1] == "yes", section
    assert free[2:4] == [f"127.0.0.1:{pa}", "-"] and free[-1] == "no", section
    # each one's own CPU and run-queue wait were sampled (its root process, proc pid<N>)
    assert "-" not in (held[5], held[6], free[5], free[6]), section
    assert (f"Held by its own CPU quota (throttled in over 5% of its periods): PID "
            f"{slow.pid} `llama-server` at 127.0.0.1:{pb}: CFS quota 0.25 core") in section
    assert "The other 1 engine is not." in section

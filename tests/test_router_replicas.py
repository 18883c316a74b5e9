"""Two replicas behind a round-robin router (testing/router.py), on real processes: the
router hands connections to its upstreams in turn, the request's path records both
engines and the router between, the head agent is given both engines and the router,
and each engine's own cgroup (its CFS quota and its throttling) is sampled under its
own name, so a quota on one replica is neither missed nor taken for the other's. Which
engine served each request (each engine's connections on the agent's fine grid, matched to
the requests' spans), each engine's share and pace, and the slow one named with its cause."""

from __future__ import annotations

import http.client
import re
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


# --- which engine served each request (agent/collectors/conns.py, analysis/engine_requests.py)


def _connect(port: int):
    import socket

    return socket.create_connection(("127.0.0.1", port), timeout=5)


def test_each_engines_connections_are_recorded_with_when_they_were_first_and_last_seen(procs):
    """Two real engines (listening processes): a connection to the first held over three
    steps, one to the second over one, then both closed; the step after each is gone it
    is one row under its own engine's PID, at the step it was first seen, its value to
    the last step that saw it. The test's own client ends (local port ephemeral) are never
    taken for an engine's, and the engine's listening socket is not a connection."""
    from strata_plugin.agent.collectors.conns import ConnsCollector

    (a, pa), (b, pb) = procs.start("http"), procs.start("http")
    c = ConnsCollector(ProcessTargets(pids=[a.pid, b.pid]))
    c.probe()
    try:
        c.step(1_000_000_000)  # no connection yet: nothing open (the steps by hand: no thread)
        assert c.take() == []
        to_a = _connect(pa)
        c.step(2_000_000_000)
        to_b = _connect(pb)
        c.step(2_010_000_000)
        to_b.close()
        c.step(2_020_000_000)
        c.step(2_030_000_000)
        to_a.close()
        rows = []
        for t in range(2_040_000_000, 2_540_000_000, 10_000_000):  # until the close is seen
            c.step(t)
            rows += c.take()
            if len(rows) == 6:
                break
    finally:
        c.close()
        for s in (to_a, to_b):
            s.close()
    # each connection's three rows at the step it was first seen: seen from first to last
    # step, opened since the step before (1 s before for the first: the grid as it was
    # kept), closed before the step that no longer saw it
    got = {(w, dev, m): round(v, 6) for w, dev, m, v, _k in rows}
    assert got == {(2_000_000_000, f"pid{a.pid}", "conn_open_s"): 0.03,
                   (2_000_000_000, f"pid{a.pid}", "conn_opened_within_s"): 1.0,
                   (2_000_000_000, f"pid{a.pid}", "conn_closed_within_s"): 0.01,
                   (2_010_000_000, f"pid{b.pid}", "conn_open_s"): 0.0,
                   (2_010_000_000, f"pid{b.pid}", "conn_opened_within_s"): 0.01,
                   (2_010_000_000, f"pid{b.pid}", "conn_closed_within_s"): 0.01}, rows
    assert {k for *_, k in rows} == {"gauge"}


def test_sock_diag_lists_the_established_connections_proc_net_tcp_does(procs):
    """The kernel's sock_diag (the agent's own namespace) and /proc/net/tcp (another
    namespace's) give the same ends for the same connections: three held to a real
    engine, each seen from both sides, in the same text; none that is not established."""
    from strata_plugin.agent.collectors import conns

    _, port = procs.start("http")
    held = [_connect(port) for _ in range(3)]
    try:
        end = f":{port:04X}"

        def ours(rows: list) -> list:
            return sorted((r[1], r[2]) for r in rows if r[3] == "01"
                          and (r[1].endswith(end) or r[2].endswith(end)))

        diag = conns._established_by_netlink({__import__("socket").AF_INET})
        proc = conns._rows(__import__("os").getpid())
    finally:
        for s in held:
            s.close()
    assert diag is not None and ours(diag) == ours(proc) and len(ours(diag)) == 6
    assert {r[3] for r in diag} == {"01"}


def test_one_engine_starts_no_fine_grid():
    """One engine's connections say nothing its requests do not: no thread, no rows."""
    from strata_plugin.agent.collectors.conns import ConnsCollector

    c = ConnsCollector(ProcessTargets(pids=[__import__("os").getpid()]))
    c.probe()
    try:
        assert c.sample(time.time_ns()) == [] and c._thread is None
    finally:
        c.close()


S = 1_000_000_000
MS = 1_000_000


def _conn(first: int, last: int, opened: int = 0, closed: int = 0):
    from strata_plugin.analysis.engine_requests import Conn

    return Conn(first - opened, first, last, last + closed)


def _att(start_off: int, end_off: int):
    """A request from 10 s to 20 s, and engine 1's connection seen offset from its ends."""
    from strata_plugin.analysis.engine_requests import Span, attribute

    return attribute([Span("r", 10 * S, 20 * S)],
                     {1: [_conn(10 * S + start_off, 20 * S + end_off)],
                      2: [_conn(30 * S, 40 * S)]})


@pytest.mark.parametrize(("start_off", "end_off", "engine"), [
    (49 * MS, 0, 1), (51 * MS, 0, None), (-49 * MS, 0, 1), (-51 * MS, 0, None),
    (0, 49 * MS, 1), (0, 51 * MS, None), (0, -49 * MS, 1), (0, -51 * MS, None)])
def test_a_request_is_its_engines_when_the_connection_opened_and_closed_with_it(
        start_off, end_off, engine):
    """engine_conn_match_s (50 ms) at either end of the request, either side: a
    connection seen on a kept grid (no span between steps) first or last seen 49 ms off
    is the request's, 51 ms off it is not (and no other engine's is: not known, no
    connection)."""
    from strata_plugin.analysis import thresholds

    assert thresholds.value("engine_conn_match_s") == 0.05
    att = _att(start_off, end_off)
    assert dict(att.engine_of) == ({"r": engine} if engine else {})
    assert dict(att.not_known) == ({} if engine else {"r": "no_connection"})


@pytest.mark.parametrize(("closed_within_ms", "engine"), [(49, None), (51, 1)])
def test_a_late_sampler_widens_the_span_a_connection_closed_in_by_its_own_gap(
        closed_within_ms, engine):
    """The sampler kept from its CPU: a connection last seen 100 ms before the request
    ended, and not seen again until the next step. The request is its engine's when that
    step came at least 100 - 50 ms after: 51 ms, yes; 49 ms, no."""
    from strata_plugin.analysis.engine_requests import Span, attribute

    conn = _conn(10 * S, 20 * S - 100 * MS, closed=closed_within_ms * MS)
    att = attribute([Span("r", 10 * S, 20 * S)], {1: [conn], 2: [_conn(30 * S, 40 * S)]})
    assert dict(att.engine_of) == ({"r": engine} if engine else {})


def test_a_request_two_engines_could_have_served_or_with_no_span_is_not_known():
    """Two engines' connections both opened and closed with it: not known (several),
    never the first one's. A request that never ended, one without a clock, and a run
    whose agent recorded no connection at all each say why."""
    from strata_plugin.analysis.engine_requests import REASONS, Span, attribute

    spans = [Span("both", 10 * S, 20 * S), Span("cut", 10 * S, None),
             Span("clockless", None, None), Span("one", 30 * S, 31 * S)]
    conns = {1: [_conn(10 * S, 20 * S)], 2: [_conn(10 * S + 20 * MS, 20 * S - 20 * MS),
                                             _conn(30 * S, 31 * S)]}
    att = attribute(spans, conns)
    assert dict(att.engine_of) == {"one": 2}
    assert dict(att.not_known) == {"both": "several", "cut": "unfinished",
                                   "clockless": "no_clock"}
    assert att.reasons().startswith(f"1 {REASONS['several']}")
    none = attribute([Span("r", 10 * S, 20 * S)], {1: [], 2: []})
    assert dict(none.not_known) == {"r": "no_samples"}


def test_each_engines_share_and_pace_are_of_the_requests_it_served():
    """Three requests on engine 1 (TPOT 10, 20, 30 ms), one on engine 2 (90 ms), one not
    known: shares 3 of 5 and 1 of 5, medians 20 and 90; the request not known is in
    neither engine's median, and one without a TPOT (a failed one) is left out of it."""
    from strata_plugin.analysis.engine_requests import Attribution, paces

    att = Attribution({"a": 1, "b": 1, "c": 1, "d": 2, "f": 1},
                      {"x": "several"})
    tpot = {"a": 10.0, "b": 20.0, "c": 30.0, "d": 90.0, "x": 1.0, "f": None}
    e2e = {"a": 100.0, "b": 200.0, "c": 300.0, "d": 900.0, "x": 1.0, "f": None}
    one, two = paces(att, [1, 2], tpot, e2e)
    assert (one.served, one.of, one.tpot_ms, one.e2e_ms) == (4, 6, 20.0, 200.0)
    assert (two.served, two.of, two.tpot_ms, two.e2e_ms) == (1, 6, 90.0, 900.0)
    assert two.share == pytest.approx(1 / 6)


def _pace(pid: int, tpot: float, paced: int = 4):
    from strata_plugin.analysis.engine_requests import EnginePace

    return EnginePace(pid, paced, 8, tpot, tpot * 48, paced)


NAMED = ("Slower than the others: PID 2, median TPOT 4.02 ms over 4 requests against 2 ms "
         "on PID 1 `llama-server` (2.01x, over 2x). Cause, from its own evidence: its own "
         "CPU quota. PID 2 `llama-server` at 127.0.0.1:8082: CFS quota 0.25 core, throttled "
         "in 60% of its periods, 0.25 core of CPU, 0.50 s/s waiting for a CPU.")


@pytest.mark.parametrize(("ratio", "slow_fast", "finding"),
                         [(1.99, None, ""), (2.01, (2, 1), NAMED)])
def test_an_engine_is_named_slower_just_above_engine_pace_ratio(ratio, slow_fast, finding):
    """engine_pace_ratio (2x the fastest engine's median TPOT): 1.99x is not named,
    2.01x is, the slowest against the fastest (a middle engine is neither), with its
    cause from its own evidence: its quota, where its own cgroup throttles it."""
    from strata_plugin.analysis import thresholds
    from strata_plugin.analysis.engine_lines import engine_lines
    from strata_plugin.analysis.engine_requests import imbalance, imbalance_finding

    assert thresholds.value("engine_pace_ratio") == 2.0
    found = imbalance([_pace(1, 2.0), _pace(2, 2.0 * ratio), _pace(3, 2.5)])
    assert (found and (found.slow.pid, found.fastest.pid)) == slow_fast
    lines = engine_lines(_window(2, 1, 6.0), _engines(1, 2))
    assert imbalance_finding(found, lines) == finding


def test_a_slow_engine_not_held_by_its_quota_is_named_without_a_cause():
    """Slower, but its own cgroup did not throttle it (no periods throttled): named, its
    evidence given, no cause claimed."""
    from strata_plugin.analysis.engine_lines import engine_lines
    from strata_plugin.analysis.engine_requests import imbalance, imbalance_finding

    lines = engine_lines(_window(2, 1, 0.0), _engines(1, 2))
    text = imbalance_finding(imbalance([_pace(1, 2.0), _pace(2, 5.0)]), lines)
    assert text.endswith("(2.50x, over 2x). Its own evidence names no cause: PID 2 "
                         "`llama-server` at 127.0.0.1:8082: CFS quota 0.25 core, throttled "
                         "in 0% of its periods, 0.25 core of CPU, 0.50 s/s waiting for a "
                         "CPU."), text


@pytest.mark.parametrize(("paced", "named"), [(2, False), (3, True)])
def test_an_engine_is_compared_from_engine_pace_min_requests(paced, named):
    """engine_pace_min_requests (3): an engine whose median is of two requests is not
    compared (3x slower, not named); of three, it is."""
    from strata_plugin.analysis import thresholds
    from strata_plugin.analysis.engine_requests import imbalance

    assert thresholds.value("engine_pace_min_requests") == 3
    found = imbalance([_pace(1, 2.0), _pace(2, 6.0, paced=paced)])
    assert (found is not None) is named


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
    throttled one with its quota and named as held by it, the other not; each one's share
    of the 12 requests (those not attributed counted with their reason) and their median
    TPOT and end-to-end latency; and the throttled one named slower, its quota the cause.
    The case's verdict names that engine first (``cpu_limited``), each engine's own cgroup
    a row of its evidence; the time ledger gives each engine's requests side by side."""
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
                "--strata-workload=isl=16,osl=48,requests=12,concurrency=2",
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
    assert held[2] == f"127.0.0.1:{pb}" and held[6] == "0.25" and held[-1] == "yes", section
    assert free[2] == f"127.0.0.1:{pa}" and free[6] == "-" and free[-1] == "no", section
    # each one's own CPU and run-queue wait were sampled (its root process, proc pid<N>)
    assert "-" not in (held[8], held[9], free[8], free[9]), section
    # which engine served each request: the router hands connections in turn, 6 each;
    # each engine is given enough of them for its pace (engine_pace_min_requests), and
    # every one of the 12 is attributed or counted with its reason
    served = {k: int(r[3].split(" of ")[0]) for k, r in (("held", held), ("free", free))}
    unknown = sum(int(n) for n in re.findall(r"`adhoc`: (\d+) of 12 requests:", section))
    assert 3 <= served["held"] <= 6 and 3 <= served["free"] <= 6, section
    assert served["held"] + served["free"] + unknown == 12, section
    # the throttled engine's requests are slower, per token and end to end, and it is
    # named the slow one, its quota the cause
    assert float(held[4]) > float(free[4]) and float(held[5]) > float(free[5]), section
    assert f"Slower than the others: PID {slow.pid}, median TPOT " in section, section
    assert (f"on PID {fast.pid} `llama-server`" in section
            and f"Cause, from its own evidence: its own CPU quota. PID {slow.pid} "
                f"`llama-server` at 127.0.0.1:{pb}: CFS quota 0.25 core" in section), section
    assert (f"Held by its own CPU quota (throttled in over 5% of its periods): PID "
            f"{slow.pid} `llama-server` at 127.0.0.1:{pb}: CFS quota 0.25 core") in section
    assert "The other 1 engine is not." in section
    # the verdict: the held, slow engine first, named with its own evidence and its share
    # of the requests, not the whole server's compute; each engine's own cgroup a row
    case = report[report.index("#### Verdict"):report.index("#### Timeline")]
    assert case.split("**")[1].startswith("cpu_limited"), case
    assert (f"Where the time went: PID {slow.pid} on local held by its own CPU quota and "
            in case), case
    assert (f"PID {slow.pid} `llama-server` at 127.0.0.1:{pb}: CFS quota 0.25 core, "
            f"throttled in" in case and f"served {served['held']} of 12 requests" in case), case
    evidence = {line.split("|")[2].strip(): line.split("|")[7].strip()
                for line in case.splitlines() if "| engine_throttled_frac" in line}
    assert evidence == {f"engine_throttled_frac local/pid{slow.pid}": "yes",
                        f"engine_throttled_frac local/pid{fast.pid}": "no"}, case
    # the ledger, engine by engine: the requests each one served side by side, the
    # held one's slower, and those not attributed counted
    ledger = report[report.index("\n## Time ledger\n"):]
    ledger = ledger[:ledger.index("\n## ", 5)]
    head = next(line for line in ledger.splitlines() if line.startswith("| part |"))
    cols = [c.strip() for c in head.split("|")[2:-1]]  # in the path's order of engines
    assert sorted(cols) == sorted(
        (f"PID {fast.pid} `llama-server` ({served['free']} requests)",
         f"PID {slow.pid} `llama-server` ({served['held']} requests)")), ledger
    mean = next(line for line in ledger.splitlines()
                if "(mean ms) |" in line or "(ms/token) |" in line)
    ms = dict(zip(cols, (float(c) for c in mean.split("|")[2:-1])))
    assert ms[f"PID {slow.pid} `llama-server` ({served['held']} requests)"] > ms[
        f"PID {fast.pid} `llama-server` ({served['free']} requests)"], ledger
    assert f"Not attributed to an engine: {unknown} of 12 requests" in ledger, ledger

"""The Ray engine against a real cluster: a head and two worker nodes, each its own host.

tests/raylab.py builds the cluster (``ray start`` in three network namespaces at their
own addresses, Ray Client on the head); the test emitter and a real llama-server listen
on the lab's address in the root namespace, where this process is the Ray driver.
Needs root (namespaces) and Ray (``pip install "strata[ray]"``, what
``scripts/setup.sh --ray`` does; CI's ``scripts/test.sh --vllm`` installs it and sets
STRATA_REQUIRE_RAY=1, so there these tests fail rather than skip). About 2-3 minutes on
a shared 2-core host, most of it ``ray start``.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from strata_plugin.configure.load_spec import LoadSpec
from strata_plugin.load.client import RequestSpec, Timeouts
from strata_plugin.load.generator import Job, LoadResult
from strata_plugin.testing.emitter import EmitterProcess, emitter_process, sent_stamps

pytestmark = [pytest.mark.ray, pytest.mark.integration, pytest.mark.netlab, pytest.mark.root]
T = Timeouts(connect_s=20, read_s=60)


def _need(what: str) -> None:
    msg = f"{what}; Ray tests need root and Ray: `bash scripts/setup.sh --ray`"
    if os.environ.get("STRATA_REQUIRE_RAY") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[object]:
    try:
        import ray  # noqa: F401
    except ImportError:
        _need('Ray is not installed (pip install "strata[ray]")')
    if os.geteuid() != 0:
        _need("not root (network namespaces)")
    from netlab import LabUnavailable
    from raylab import RayLab

    try:
        lab = RayLab.create(tmp_path_factory.mktemp("raylab"), nodes=3)
    except LabUnavailable as e:
        _need(f"network namespaces unavailable: {e}")
    try:
        lab.start_ray()
        yield lab
    finally:
        lab.close()
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert all(n.ns not in left for n in lab.nodes)  # namespaces removed
    assert not _ours_left(lab)  # no Ray process of the lab's, anywhere


def _ours_left(lab) -> list[int]:
    """Processes whose command line names one of the lab's node temp dirs."""
    marks = [str(n.temp).encode() for n in lab.nodes]
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as fh:
                    cmd = fh.read()
            except OSError:
                continue
            if any(m in cmd for m in marks):
                pids.append(int(d))
    return pids


def _streaming(lab, k: int, url: str) -> int:
    """Connections from node ``k`` to ``url``'s port (its actor's open streams)."""
    port = url.rsplit(":", 1)[1]
    out = lab.ns_run(k, ["ss", "-Htn", "state", "established", "dst",
                         f"{lab.head_addr}:{port}"], check=False)
    return len(out.stdout.splitlines())


@pytest.fixture(scope="module")
def emitter(lab) -> Iterator[EmitterProcess]:
    with emitter_process(lab.head_addr) as em:
        yield em


def _spec(lab, **kw) -> LoadSpec:
    return LoadSpec(engine="ray", address=lab.address, num_cpus=1.0, **kw)


def _jobs(n: int, events: int, offsets: list[float] | None = None) -> list[Job]:
    extra = (("emit_interval_s", 0.02),)
    return [Job(RequestSpec(f"r{i}", "ray", "measured", events, prompt="x", extra_body=extra),
                None if offsets is None else offsets[i]) for i in range(n)]


def _run(lab, jobs: list[Job], url: str, api: str, concurrency: int, **kw) -> LoadResult:
    from strata_plugin.load.ray_engine import run_load_on_ray

    return run_load_on_ray(jobs, spec=_spec(lab, **kw), base_url=url, api=api,
                           concurrency=concurrency, timeouts=T)


def _cluster_free(lab) -> dict[str, float]:
    """The cluster's free CPUs, asked by a driver of its own: all of them when no
    actor or placement group of ours is left."""
    import ray

    ray.init(address=lab.address, logging_level="WARNING")
    try:
        deadline = time.monotonic() + 30
        while True:
            free, total = ray.available_resources(), ray.cluster_resources()
            if free.get("CPU") == total.get("CPU") or time.monotonic() > deadline:
                return {"free": free.get("CPU", 0.0), "total": total.get("CPU", 0.0)}
            time.sleep(0.5)
    finally:
        ray.shutdown()


def test_the_load_runs_on_three_nodes_on_one_timeline(lab, emitter) -> None:
    t0 = time.monotonic_ns()
    res = _run(lab, _jobs(30, 20), emitter.url, "chat", 30)
    sc = res.self_check
    assert sc.engine == "ray" and sc.processes == 3 and sc.hosts == 3, sc.placement
    assert all(r.ok for r in res.records), [r.error for r in res.records if not r.ok][:3]
    assert sum(len(sent_stamps(r.output_text)) for r in res.records) == 30 * 20  # 0 lost
    hosts = {p["host"] for p in sc.per_process}
    assert hosts == {n.addr for n in lab.nodes}  # one actor on each node's own address
    # Every stamp moved onto this process's clock: inside the load's window, and the
    # emitter's own send stamps (this host's clock) before each event's arrival stamp.
    assert t0 < res.start_ns and all(res.start_ns <= r.dispatched_ns <= r.done_ns <= res.end_ns
                                     for r in res.records)
    err_ns = int(sc.clock_alignment_error_ms * 1e6)
    for r in res.records:
        for sent, e in zip(sent_stamps(r.output_text), r.events, strict=False):
            assert e.t_ns >= sent - err_ns
    assert 0 < sc.clock_alignment_error_ms < 50
    # each actor's own check is there; whether it fell behind is the host's load (this lab's
    # three nodes share the test machine's cores: a clean `.ci/run` here had one flagged),
    # and a flag always comes with its reasons
    assert all(p["clock_error_ms"] is not None and p["loop_lag_p99_ms"] is not None
               and p["client_bound"] is bool(p["reasons"]) for p in sc.per_process)
    assert sc.incomplete is None
    assert _cluster_free(lab)["free"] == 3.0  # actors and placement group gone


def test_an_open_loop_rate_is_the_sum_across_actors(lab, emitter) -> None:
    rng = random.Random(7)
    offsets, t = [], 0.0
    for _ in range(60):
        offsets.append(t)
        t += rng.expovariate(30.0)  # Poisson, 30 requests/s asked
    res = _run(lab, _jobs(60, 5, offsets), emitter.url, "chat", 60)
    sc = res.self_check
    assert sc.processes == 3
    for off, r in zip(offsets, res.records, strict=True):
        assert r.ok and r.scheduled_ns == res.start_ns + int(off * 1e9)
    assert sc.rate_asked is not None and sc.rate_achieved is not None
    assert abs(sc.rate_achieved / sc.rate_asked - 1) < 0.05, (sc.rate_asked, sc.rate_achieved)
    late = sorted(r.dispatched_ns - r.scheduled_ns for r in res.records)
    assert late[0] >= -int(sc.clock_alignment_error_ms * 1e6) and late[-1] < 50_000_000


@pytest.fixture(scope="module")
def llama(lab) -> Iterator[str]:
    """The embedded llama-server, listening on the lab's address (the nodes reach it)."""
    import requests
    from test_robustness_support import llama_paths

    from strata_plugin.run.server import free_port

    p = llama_paths()
    port = free_port(lab.head_addr)
    proc = subprocess.Popen([p["llama_server"], "-m", p["model"], "--host", lab.head_addr,
                             "--port", str(port), "-t", "1", "-c", "2048", "-np", "4",
                             "--no-webui"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://{lab.head_addr}:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_load_on_ray_against_the_embedded_llama_server(lab, llama) -> None:
    jobs = [Job(RequestSpec(f"l{i}", "ray", "measured", 8, prompt_token_ids=tuple(
        range(300 + i, 316 + i)), ignore_eos=True, isl=16)) for i in range(8)]
    res = _run(lab, jobs, llama, "llamacpp", 8)
    assert all(r.ok for r in res.records), [r.error for r in res.records if not r.ok]
    assert all(r.usage.completion_tokens == 8 and len(r.events) >= 1 for r in res.records)
    assert res.self_check.hosts == 3


def test_a_case_runs_on_ray_from_the_profile(lab, llama) -> None:
    """The case runner (what the ``strata`` fixture hands a test) with ``[load] engine =
    "ray"``: warm-ups and measured requests on the actors, records written as they come,
    the case line's self-check saying where it ran."""
    from strata_plugin.load.case_runner import CaseRunner, CaseSetup
    from strata_plugin.load.workload import TokenSpace, Workload

    records, cases = [], []
    setup = CaseSetup(base_url=llama, api="llamacpp", config_id="default",
                      token_space=TokenSpace(300, 1000), timeouts=T, salt="ray-case",
                      load=_spec(lab))
    runner = CaseRunner(setup, record=records.append, mark=lambda *a: None,
                        add_case=cases.append)
    res = runner.run(Workload("ray_case", isl=16, osl=4, concurrency=6, requests=12,
                              warmups=1), scale=False)
    assert not res.problems, res.problems
    assert len(records) == 13 and all(r.ok for r in records)
    sc = cases[0].self_check
    assert sc["engine"] == "ray" and sc["processes"] == 3 and sc["hosts"] == 3
    assert sc["clock_alignment_error_ms"] is not None and len(sc["per_process"]) == 3


#: events per stream of the Ctrl-C test, 20 ms apart: 30 s, which the press cuts short
EVENTS = 1500


def test_ctrl_c_keeps_the_actors_in_flight_requests(lab, emitter,
                                                    sigint_as_at_a_terminal) -> None:
    """Ctrl-C in the driver: every request in flight on the actors is recorded with the
    error class ``interrupted`` and the events it had; the cluster is left as found."""
    import _thread

    from strata_plugin.load.ray_engine import INTERRUPT_GRACE_S, run_load_on_ray

    got: list = []
    streams: dict[int, int] = {}  # node -> its open streams, when last looked
    load_done = threading.Event()
    pressed: list[float] = []  # when Ctrl-C was pressed (monotonic)

    def press() -> None:
        # Ctrl-C once every node streams (bounded): on a busy host the three `ss` calls
        # a look takes can outlast short streams, so the streams are long (30 s: the
        # press ends them) and a load that ends first is never interrupted after it.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not load_done.is_set():
            streams.update({k: _streaming(lab, k, emitter.url) for k in range(3)})
            if all(streams.values()):
                time.sleep(1.0)
                if not load_done.is_set():
                    pressed.append(time.monotonic())
                    _thread.interrupt_main()
                return
            time.sleep(0.2)

    threading.Thread(target=press, daemon=True).start()
    try:
        run_load_on_ray(_jobs(6, EVENTS), spec=_spec(lab), base_url=emitter.url, api="chat",
                        concurrency=6, timeouts=T, on_record=got.append)
    except KeyboardInterrupt:
        raised = time.monotonic()
    else:
        ended = time.monotonic()
        pytest.fail(f"Ctrl-C was pressed with every node streaming ({streams}), "
                    f"{ended - pressed[0]:.1f} s before the load returned normally: the "
                    "interrupt was lost" if pressed else
                    f"the load ended before every node streamed (open streams per node when "
                    f"last looked: {streams}): no Ctrl-C was pressed")
    finally:
        load_done.set()
    # all six were in flight: say which came, and what each node streamed at the press
    assert len(got) == 6, (f"records of {sorted(r.request_id for r in got)}, "
                           f"{raised - pressed[0]:.1f} s from the press to the interrupt's "
                           f"end (grace {INTERRUPT_GRACE_S:g} s); open streams per node at "
                           f"the press: {streams}")
    assert {r.error.cls for r in got if r.error} == {"interrupted"}
    assert all(r.dispatched_ns and 1 <= len(r.events) < EVENTS for r in got)
    assert _cluster_free(lab)["free"] == 3.0


def test_a_worker_node_lost_mid_case_gives_an_incomplete_case(lab, emitter) -> None:
    """Last in the module: it takes node 2 away."""
    out: list[LoadResult] = []
    th = threading.Thread(target=lambda: out.append(
        _run(lab, _jobs(12, 400), emitter.url, "chat", 12)))  # 8 s streams
    th.start()
    victim = lab.nodes[2]
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not _streaming(lab, 2, emitter.url):
        time.sleep(0.2)  # until its actor streams
    assert _streaming(lab, 2, emitter.url), "node 2's actor never streamed"
    time.sleep(1.0)
    killed = lab.kill_node(2)
    assert killed
    t_kill = time.monotonic()
    th.join(120)
    assert not th.is_alive(), "the load hung after a node was lost"
    res = out[0]
    sc = res.self_check
    print(f"node lost: the load returned {time.monotonic() - t_kill:.1f} s after the kill; "
          f"incomplete: {sc.incomplete}")
    assert sc.incomplete and f"on {victim.addr}" in sc.incomplete, sc.incomplete
    lost = [p for p in sc.per_process if p["host"] == victim.addr]
    assert len(lost) == 1 and lost[0]["lost"]
    on_victim = [r for r in res.records if not r.ok]
    assert on_victim and all(r.error.cls == "client" and victim.addr in r.error.message
                             for r in on_victim if r.error)
    assert sum(r.ok for r in res.records) == len(res.records) - len(on_victim) > 0
    assert lab.processes()[victim.ns] == []  # nothing left on the lost host

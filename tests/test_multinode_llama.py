"""A real two-node inference across the lab's veth: ggml-rpc-server on the worker holds
part of the model's layers for llama-server on the head, so every decoded token crosses
the link. Uncapped vs capped (tbf 8 Mbit/s) decode speed, the veth bytes in each window
as the two agents sampled them, and what the attribution says about the capped window.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from netlab import lab_fixture

from strata_plugin.agent.handle import AgentHandle, agent_argv
from strata_plugin.analysis import clocks as clock
from strata_plugin.analysis import rails
from strata_plugin.analysis.clocks import node_clocks
from strata_plugin.analysis.rules import WindowSignals, classify
from strata_plugin.analysis.signals import build_signals
from strata_plugin.analysis.timeline import Window, load_samples, summarize_window
from strata_plugin.run import remote
from strata_plugin.run.server import LaunchSpec, Server, free_port

ROOT = Path(__file__).resolve().parents[1]
SYS_PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"
CAP_BYTES_S = 1e6  # tbf rate 8mbit
N_PREDICT = 96
REQUESTS = 4
#: A/B blocks tried until one is link-bound: a shared machine's load can starve the CPU.
ATTEMPTS = 3
#: The two engine processes run at a raised priority so that a shared development
#: machine's background load (other test runs) does not set their speed: the test is
#: about the link. Root may raise priority; anyone else runs them as they are.
NICE = ("nice", "-n", "-10") if os.geteuid() == 0 else ()
pytestmark = [pytest.mark.integration, pytest.mark.netlab, pytest.mark.root]


def _paths() -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "strata_plugin", "setup", "--print-paths"],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        pytest.fail("llama-server is not built: run `bash scripts/setup.sh` first\n" + out.stderr)
    paths = json.loads(out.stdout.strip().splitlines()[-1])
    if not paths.get("rpc_server") or not os.path.exists(paths["rpc_server"]):
        pytest.fail("ggml-rpc-server missing: rebuild with python -m strata_plugin setup --rebuild")
    return paths


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from lab_fixture(tmp_path_factory)


def _wait_port(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def _decode(base_url: str, n: int) -> list[dict]:
    """``n`` decode-heavy requests, one after another; llama.cpp's timings of each."""
    out = []
    for i in range(n):
        t = time.monotonic()
        r = requests.post(
            f"{base_url}/completion",
            timeout=120,
            json={
                "prompt": f"request {i}: the quick brown fox",
                "n_predict": N_PREDICT,
                "ignore_eos": True,
                "cache_prompt": False,
                "temperature": 0.0,
            },
        )
        r.raise_for_status()
        body = r.json()
        body["wall_s"] = time.monotonic() - t
        assert body["timings"]["predicted_n"] == N_PREDICT
        out.append(body)
    return out


def _tok_s(results: list[dict]) -> float:
    """Decode rate over the group: generated tokens / decode time (llama.cpp timings)."""
    n = sum(r["timings"]["predicted_n"] for r in results)
    ms = sum(r["timings"]["predicted_ms"] for r in results)
    return n / (ms / 1e3)


def _best_tok_s(results: list[dict]) -> float:
    """The fastest request's decode rate: a shared machine's bursts of load only slow
    requests down, so the best of a few is the least disturbed."""
    return max(r["timings"]["predicted_per_second"] for r in results)


@dataclass
class Block:
    """One uncapped-then-capped measurement: windows (harness wall ns) and requests."""

    t0: int
    t1: int
    t2: int
    t3: int
    free: list[dict]
    capped: list[dict]
    capped_busier: float  # bytes/s of the busier direction in the capped window

    @property
    def link_bound(self) -> bool:
        """The capped window ran against the link, not against a starved CPU."""
        return self.capped_busier >= 0.62 * CAP_BYTES_S and _best_tok_s(
            self.capped
        ) < 0.7 * _best_tok_s(self.free)


def _ab_block(lab, base: str) -> Block:
    gap = 0.6  # two sampling intervals between windows: counters interpolate at edges
    time.sleep(gap)
    t0 = time.time_ns()
    free = _decode(base, REQUESTS)
    t1 = time.time_ns()
    lab.cap(rate="8mbit", burst="32kbit", latency="50ms")
    time.sleep(gap)
    b2, t2 = lab.veth_bytes()[lab.head_if], time.time_ns()
    capped = _decode(base, REQUESTS)
    b3, t3 = lab.veth_bytes()[lab.head_if], time.time_ns()
    time.sleep(gap)
    lab.uncap()
    busier = max(b3[0] - b2[0], b3[1] - b2[1]) / ((t3 - t2) / 1e9)
    return Block(t0, t1, t2, t3, free, capped, busier)


def test_two_node_decode_crosses_the_veth_and_the_capped_link_is_named(lab, tmp_path):
    paths = _paths()
    run = tmp_path / "run"
    opts = ("-F", str(lab.sshd.config))
    rpc_port = 50052
    # the worker's half of the engine, launched over ssh under the guard
    rpc = remote.RemoteProcess.start(
        "worker",
        lab.sshd.alias,
        [*NICE, paths["rpc_server"], "-H", lab.worker_addr, "-p", str(rpc_port), "-t", "1"],
        run / "service" / "worker" / "rpc-server.log",
        grace_s=3.0,
        ssh_options=opts,
        remote_python=SYS_PY,
    )
    server = head = worker = None
    attempts: list[Block] = []
    try:
        assert _wait_port(lab.worker_addr, rpc_port, 20), (
            run / "service" / "worker" / "rpc-server.log"
        ).read_text()
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        argv = (
            *NICE,
            paths["llama_server"],
            "-m",
            paths["model"],
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-t",
            "1",
            "-c",
            "2048",
            "-np",
            "1",
            "--rpc",
            f"{lab.worker_addr}:{rpc_port}",
            "-ngl",
            "4",
            "--no-webui",
        )
        server = Server(
            LaunchSpec(
                "rpc", argv, (), base, "/health", 120, 5, run / "service" / "head" / "server.log"
            ),
            base,
        )
        server.start()
        head = AgentHandle.start(
            "head",
            run / "nodes" / "head",
            agent_argv("head", 0.25, pids=[server.pid], collectors=["net", "cpu", "proc", "mem"]),
        )
        worker_out = run / "nodes" / "worker"
        worker = AgentHandle.start(
            "worker",
            worker_out,
            remote.remote_agent_argv(
                lab.sshd.alias,
                agent_argv(
                    "worker", 0.25, pid_pattern="ggml-rpc-server", collectors=["net", "cpu", "proc"]
                ),
                ssh_options=opts,
                remote_python=SYS_PY,
            ),
            on_exit=remote.on_agent_exit(worker_out),
        )
        starts = {h.node: h.measure_clock_offset() for h in (head, worker)}
        _decode(base, 1)  # warm-up: the first graph is built and sent once
        time.sleep(0.5)
        w_idle = (time.time_ns(), None)
        time.sleep(1.5)
        w_idle = (w_idle[0], time.time_ns())
        for _ in range(ATTEMPTS):
            attempts.append(_ab_block(lab, base))
            if attempts[-1].link_bound:
                break
        ends = {h.node: h.measure_clock_offset() for h in (head, worker)}
    finally:
        lab.uncap()
        for h in (head, worker):
            if h is not None:
                h.stop()
        if server is not None:
            server.stop()
        rpc.stop()
    # nothing left on the worker, and the agent stopped cleanly over ssh
    assert lab.wait_worker_clean(10) == {}
    assert worker.exit_info.expected, worker.exit_info

    for i, a in enumerate(attempts):
        print(
            f"\nattempt {i + 1}: best request uncapped {_best_tok_s(a.free):.1f}, capped "
            f"{_best_tok_s(a.capped):.1f} tok/s; capped link (kernel counters) "
            f"{a.capped_busier / 1e6:.3f} MB/s busier direction"
        )
    block = attempts[-1]
    assert block.link_bound, (
        f"no A/B block in {len(attempts)} was link-bound (a busy machine?): "
        + "; ".join(
            f"{_best_tok_s(a.free):.0f} vs {_best_tok_s(a.capped):.0f} tok/s, "
            f"{a.capped_busier / 1e6:.2f} MB/s"
            for a in attempts
        )
    )
    free, capped = block.free, block.capped
    t0, t1, t2, t3 = block.t0, block.t1, block.t2, block.t3
    manifest = {"nodes": {n: clock.fit(n, starts[n], ends[n]).manifest() for n in starts}}
    store = load_samples(run, node_clocks(manifest))
    windows = {
        "idle": Window("baseline", "idle", "", *w_idle),
        "uncapped": Window("case", "uncapped", "uncapped", t0, t1),
        "capped": Window("case", "capped", "capped", t2, t3),
    }
    rows = {k: summarize_window(store, w) for k, w in windows.items()}
    (run / "windows.json").write_text(
        json.dumps({k: [w.start_ns, w.end_ns] for k, w in windows.items()})
    )

    def veth(window: str, node: str, iface: str) -> tuple[float, float]:
        got = {
            r.metric: r
            for r in rows[window]
            if (r.node, r.source, r.device) == (node, "net", iface)
        }
        return got["rx_bytes"].rate, got["tx_bytes"].rate

    tok_free, tok_cap = _tok_s(free), _tok_s(capped)
    table = {
        w: {"head": veth(w, "head", lab.head_if), "worker": veth(w, "worker", lab.worker_if)}
        for w in windows
    }
    tokens_s = {
        "uncapped": REQUESTS * N_PREDICT / ((t1 - t0) / 1e9),
        "capped": REQUESTS * N_PREDICT / ((t3 - t2) / 1e9),
    }
    print(f"\ndecode tok/s (llama.cpp timings): uncapped {tok_free:.1f}, capped {tok_cap:.1f}")
    for w, per in table.items():
        (hrx, htx), (wrx, wtx) = per["head"], per["worker"]
        extra = f", {(hrx + htx) / tokens_s[w] / 1e3:.1f} kB/token" if w in tokens_s else ""
        print(
            f"  {w:9s} {windows[w].duration_s:5.2f} s  head {lab.head_if} rx {hrx / 1e6:.3f} "
            f"tx {htx / 1e6:.3f} MB/s | worker {lab.worker_if} rx {wrx / 1e6:.3f} "
            f"tx {wtx / 1e6:.3f} MB/s{extra}"
        )

    # the cap bites: the fastest capped request is far slower than the fastest free one
    assert _best_tok_s(capped) < 0.7 * _best_tok_s(free)
    idle_rx, idle_tx = table["idle"]["head"]
    free_rx, free_tx = table["uncapped"]["head"]
    cap_rx, cap_tx = table["capped"]["head"]
    # the link carries the decode: far above the idle baseline (the worker agent's own
    # samples cross it too, a few kB/s)
    idle = idle_rx + idle_tx
    assert free_rx + free_tx > 20 * idle and cap_rx + cap_tx > 20 * idle
    # and what it carries is per token: the same bytes per token in both windows, though
    # the cap changed the rate (a floor in bytes/s would be a floor on the CPU's speed:
    # CI's loaded host decoded at 1.59 MB/s uncapped where a quiet one reaches 2.6)
    per_token = {w: (sum(table[w]["head"]) - idle) / tokens_s[w] for w in tokens_s}
    assert per_token["capped"] == pytest.approx(per_token["uncapped"], rel=0.25), per_token
    # capped: each direction at the tbf rate or under it, and the busier one near it
    assert max(cap_rx, cap_tx) < 1.15 * CAP_BYTES_S
    assert max(cap_rx, cap_tx) > 0.6 * CAP_BYTES_S
    # the worker's agent (over ssh) saw the same bytes the head's did, mirrored
    w_rx, w_tx = table["capped"]["worker"]
    assert w_rx == pytest.approx(cap_tx, rel=0.15) and w_tx == pytest.approx(cap_rx, rel=0.15)

    # --- attribution ----------------------------------------------------------------
    def signals(window: str) -> WindowSignals:
        w = windows[window]
        return build_signals(
            window=window,
            duration_s=w.duration_s,
            start_ns=w.start_ns,
            end_ns=w.end_ns,
            hw=rows[window],
            requests=None,
            gpu_present=False,
            gpu_expected=False,
            multi_node=True,
            unavailable=(),
        )

    # 1. from the agents' samples alone the classifier cannot see the shaped link: the
    #    veth reports its own speed (10 Gbit/s, the net collector's link_speed_mbps), so
    #    1 MB/s looks like nothing. The limit is the qdisc's rate, which no counter shows.
    plain = signals("capped")
    assert plain.net_util is not None and plain.net_util < 0.01
    v = classify(plain)
    assert "network" not in v.classes
    # 2. with the link's real capacity (the tbf rate) rails finds the link bound. The
    #    RPC alternates directions (send the graph, wait for the result), so neither
    #    direction fills its 1 MB/s: the busier one runs at 0.6-0.8, both together past
    #    1.0. Where that busier direction crosses net_link_frac (0.7) the classifier
    #    names the network, and so it does when both directions together fill the
    #    link (net_wire_busy >= 1.0), the signal for alternating request/response traffic.
    caps = {("head", lab.head_if): CAP_BYTES_S, ("worker", lab.worker_if): CAP_BYTES_S}
    rep = rails.analyze(rows["capped"], window="capped", link_caps=caps)
    sig = rep.signals()
    # both link signals from the declared capacity (merge_signals never overrides one
    # already computed against the veth's own speed)
    no_link = {"net_util": None, "net_wire_busy": None}
    v_cap = classify(WindowSignals(**rails.merge_signals({**vars(plain), **no_link}, rep)))
    print(
        f"  capped verdict: {v_cap.summary()} (confidence {v_cap.confidence}); "
        f"net_util {sig['net_util']:.2f} (busier direction / tbf rate), "
        f"net_wire_busy {sig['net_wire_busy']:.2f} ((tx + rx) / tbf rate)"
    )
    # the busier direction ran at >= 0.62 of the cap (the block was link-bound), so both
    # together carry about 1.6x that: the link is a finding
    # The capped link must cross a network threshold: if it does not, the thresholds
    # (not this test) are wrong for alternating RPC traffic, and that is the news.
    assert sig["net_wire_busy"] >= 1.0 or sig["net_util"] >= 0.7, sig
    kinds = {f.kind for f in rep.by_class("network")}
    assert kinds & {"net_saturated", "net_round_trip_bound"}, rep.findings
    # past threshold with its evidence in the verdict (a shared VM may rank
    # cpu_contention, from its steal time, above it: every class past threshold is kept)
    assert "network" in v_cap.past_threshold, v_cap
    assert any(e.cls == "network" and e.metric in ("net_util", "net_wire_busy") and e.met
               for e in v_cap.evidence), v_cap.evidence
    # 3. the uncapped window against the veth's own speed (sysfs: 10000 Mbit/s): no
    #    network verdict
    speed = int(Path(f"/sys/class/net/{lab.head_if}/speed").read_text()) * 1e6 / 8
    rep_free = rails.analyze(
        rows["uncapped"], link_caps={("head", lab.head_if): speed, ("worker", lab.worker_if): speed}
    )
    v_free = classify(
        WindowSignals(
            **rails.merge_signals({**vars(signals("uncapped")), **no_link}, rep_free)
        )
    )
    print(f"  uncapped verdict: {v_free.summary()}")
    assert "network" not in v_free.classes and not rep_free.by_class("network")

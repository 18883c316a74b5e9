"""Prometheus as a source: mapping onto the agents' names, scrape-time stamps, and a real
Prometheus + node_exporter whose numbers agree with the agent's own samples."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from strata_plugin.agent.handle import AgentHandle, agent_argv
from strata_plugin.analysis.timeline import Window, load_samples, summarize_window
from strata_plugin.run import prometheus as ps

# --- a scripted client: what Prometheus would answer -------------------------------------

STEP = 0.5
T0 = 1_800_000_000.0  # seconds


class ScriptedClient:
    """Answers the queries fetch_job makes, from a scrape every 1 s at T0 + k + 0.3.

    CPU: 2 cores, 'user' grows 0.5 s/s and 'system' 0.25 s/s on each; 'idle' the rest.
    A range query at step t answers with the latest scrape at or before t.
    """

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.base_url = "scripted"

    def scrape_at(self, t: float) -> float | None:
        k = int((t - T0 - 0.3) // 1)
        return T0 + 0.3 + k if k >= 0 else None

    def steps(self, start: float, end: float):
        n = round((end - start) / STEP)
        return [start + i * STEP for i in range(n + 1)]

    def query_range(self, query, start, end, step):
        assert step == STEP
        self.queries.append(query)
        inst = {"instance": "10.0.0.7:9100", "job": "node"}
        out = []
        if query.startswith("timestamp(up"):
            pts = [(t, s) for t in self.steps(start, end) if (s := self.scrape_at(t))]
            return [(dict(inst), pts)]
        if query.startswith("node_cpu_seconds_total"):
            modes = {"user": 0.5, "system": 0.25, "idle": 0.25, "iowait": 0.0}
            for cpu in ("0", "1"):
                for mode, r in modes.items():
                    if mode not in query and "=~" not in query:
                        continue
                    if "=~" in query and mode not in query.split("=~")[1]:
                        continue
                    if "=~" not in query and f'"{mode}"' not in query:
                        continue
                    pts = [
                        (t, 1000.0 + r * (s - T0))
                        for t in self.steps(start, end)
                        if (s := self.scrape_at(t))
                    ]
                    out.append(
                        (
                            {
                                **inst,
                                "cpu": cpu,
                                "mode": mode,
                                "__name__": "node_cpu_seconds_total",
                            },
                            pts,
                        )
                    )
            return out
        if query.startswith("node_network_speed_bytes"):
            pts = [(t, 1.25e9) for t in self.steps(start, end) if self.scrape_at(t)]
            return [({**inst, "device": "eth0"}, pts)]
        if query.startswith("{job="):  # the engine job
            einst = {"instance": "10.0.0.7:30000", "job": "sglang"}
            pts = [(t, 3.0) for t in self.steps(start, end) if self.scrape_at(t)]
            return [
                ({**einst, "__name__": "sglang:num_queue_reqs", "model_name": "m"}, pts),
                ({**einst, "__name__": "sglang:prompt_tokens_total", "tp_rank": "0"}, pts),
            ]
        return []

    def metadata(self):
        return {"sglang:num_queue_reqs": "gauge", "sglang:prompt_tokens_total": "counter"}

    def clock_offset(self, n=5):
        return ps.ServerClock(0, 1000, 1_000_500, 0)


def test_node_exporter_onto_agent_names_at_scrape_times():
    c = ScriptedClient()
    start, end = int((T0 + 2) * 1e9), int((T0 + 6) * 1e9)
    samples = ps.fetch_job(c, ps.Job("node", "node"), start, end, STEP, pad_s=1.0)
    assert {s.node for s in samples} == {"10.0.0.7"}
    busy = [s for s in samples if s.metric == "busy_s" and s.device == ""]
    # one row per scrape (two steps saw each scrape), stamped at the scrape, not the step
    assert [s.wall_ns % 1_000_000_000 for s in busy] == [300_000_000] * len(busy)
    assert len({s.wall_ns for s in busy}) == len(busy) == 7  # T0+0.3 .. T0+6.3 (padded)
    # host-wide busy = (user + system) of both cores: 1.5 core-seconds per second
    rate = (busy[-1].value - busy[0].value) / ((busy[-1].wall_ns - busy[0].wall_ns) / 1e9)
    assert rate == pytest.approx(1.5)
    per_core = {s.device for s in samples if s.metric == "busy_s"}
    assert per_core == {"", "cpu0", "cpu1"}
    idle = [s for s in samples if s.metric == "idle_s"]
    assert idle and all(s.kind == "counter" and s.device == "" for s in idle)
    (speed,) = {s.value for s in samples if s.metric == "link_speed_mbps"}
    assert speed == pytest.approx(10_000.0)  # 1.25e9 B/s = 10 Gbit/s
    assert all('job="node"' in q for q in c.queries)


def test_engine_metrics_get_the_agents_common_names():
    c = ScriptedClient()
    samples = ps.fetch_job(
        c,
        ps.Job("sglang", "engine"),
        int((T0 + 2) * 1e9),
        int((T0 + 4) * 1e9),
        STEP,
        node_of=lambda labels: "head",
    )
    names = {(s.metric, s.kind, s.device) for s in samples}
    assert names == {
        ("waiting_requests", "gauge", ""),
        ("prompt_tokens_total", "counter", "tp_rank=0"),
    }
    assert {s.source for s in samples} == {"prom"}


def test_write_layouts_and_the_timeline_reads_them(tmp_path):
    c = ScriptedClient()
    res = ps.pull(
        tmp_path,
        c,
        [ps.Job("node", "node")],
        [(int((T0 + 2) * 1e9), int((T0 + 6) * 1e9))],
        STEP,
        node_of=lambda labels: "gpu-a",
    )
    assert res.nodes == ("gpu-a",) and res.samples > 0 and res.clock is not None
    cpu = tmp_path / "nodes" / "gpu-a" / "samples" / "cpu.csv"
    assert cpu in res.files
    assert cpu.read_text().splitlines()[0] == "wall_ns,node,source,device,metric,value,kind"
    rec = json.loads((tmp_path / "nodes/gpu-a/collector_commands/prom_node.json").read_text())
    assert (rec["job"] == "node" and rec["queries"] == []) or isinstance(rec["queries"], list)
    store = load_samples(tmp_path)
    rows = summarize_window(
        store, Window("case", "w", "w", int((T0 + 2.5) * 1e9), int((T0 + 5.5) * 1e9))
    )
    (busy,) = [r for r in rows if (r.source, r.metric, r.device) == ("cpu", "busy_s", "")]
    assert busy.rate == pytest.approx(1.5)
    # the job layout keeps them apart from an agent's files
    files = ps.write_samples(
        tmp_path / "b",
        [ps.Sample(1, "n", "cpu", "", "busy_s", 1.0, "counter")],
        layout="job",
        job="node",
    )
    assert files[0].name == "prom_node.csv"
    assert files[0].read_text().splitlines()[1] == "1,n,prom_node,,busy_s,1,counter"
    with pytest.raises(ValueError):
        ps.write_samples(tmp_path, [], layout="nope")


def test_a_sum_missing_one_series_is_dropped_not_written_as_a_reset():
    class Gappy(ScriptedClient):
        def query_range(self, query, start, end, step):
            out = super().query_range(query, start, end, step)
            if query.startswith("node_cpu_seconds_total") and out:
                labels, pts = out[0]
                out[0] = (labels, pts[:-2])  # cpu0/user lost its last scrape
            return out

    samples = ps.fetch_job(
        Gappy(), ps.Job("node", "node"), int((T0 + 2) * 1e9), int((T0 + 6) * 1e9), STEP, pad_s=1.0
    )
    busy = [s.value for s in samples if s.metric == "busy_s" and s.device == ""]
    assert busy == sorted(busy)  # monotonic: the partial sum was dropped


class _Api(BaseHTTPRequestHandler):
    def do_GET(self):
        q = parse_qs(urlparse(self.path).query)
        if self.path.startswith("/api/v1/query_range"):
            self.server.calls.append(q)
            if "bad" in q["query"][0]:
                body, code = {"status": "error", "errorType": "bad_data", "error": "parse"}, 400
            else:
                s, e = float(q["start"][0]), float(q["end"][0])
                body = {
                    "status": "success",
                    "data": {
                        "resultType": "matrix",
                        "result": [
                            {"metric": {"instance": "x:1"}, "values": [[s, "1"], [e, "NaN"]]}
                        ],
                    },
                }
                code = 200
        elif self.path.startswith("/api/v1/query"):
            body, code = (
                {
                    "status": "success",
                    "data": {"resultType": "scalar", "result": [time.time(), "0"]},
                },
                200,
            )
        else:
            body, code = {"status": "error"}, 404
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


def test_http_client_splits_long_ranges_and_reports_errors():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    srv.calls = []
    threading.Thread(target=srv.serve_forever, args=(0.01,), daemon=True).start()  # quick shutdown
    try:
        c = ps.PromClient(f"http://127.0.0.1:{srv.server_port}", headers={"Authorization": "x"})
        series = c.query_range("up", 0.0, 0.5 * 25_000, 0.5)
        assert len(srv.calls) == 3  # 25001 points in chunks of at most MAX_POINTS
        ((labels, pts),) = series
        assert labels == {"instance": "x:1"} and all(v == 1.0 for _, v in pts)  # NaN dropped
        with pytest.raises(ps.PromError, match=r"bad_data|parse"):
            c.query_range("bad{", 0, 1, 0.5)
        off = c.clock_offset(3)
        assert abs(off.offset_ns) < 50_000_000 and off.uncertainty_ns >= 1_000_000
        assert "Authorization" not in json.dumps(c.queries)
    finally:
        srv.shutdown()
        srv.server_close()


class _Hop(_Api):
    """The test API behind ``/old/``: that prefix answers a 302 to ``server.target`` plus
    the rest of the path. Records each request's path and headers."""

    def do_GET(self):
        self.server.seen.append((self.path, dict(self.headers)))
        if self.path.startswith("/old/"):
            self.send_response(302)
            self.send_header("Location", self.server.target(self.path[len("/old"):]))
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            super().do_GET()


@pytest.mark.parametrize("where, keeps", [("same", True), ("port", False), ("host", False)])
def test_the_bearer_token_is_not_sent_on_to_another_origin(where, keeps):
    """A redirect to another port or host name is another origin: it is followed without
    the Authorization header. To the same scheme, host and port it keeps it."""
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Hop) for _ in range(2)]
    hop, api = servers
    to = {"same": f"http://127.0.0.1:{hop.server_port}",
          "port": f"http://127.0.0.1:{api.server_port}",
          "host": f"http://localhost:{hop.server_port}"}[where]
    for srv in servers:
        srv.calls, srv.seen = [], []
        srv.target = lambda rest, to=to: to + rest
        # polled every 10 ms: shutdown() does not wait out the default 0.5 s
        threading.Thread(target=srv.serve_forever, args=(0.01,), daemon=True).start()
    try:
        c = ps.PromClient(f"http://127.0.0.1:{hop.server_port}/old",
                          headers={"Authorization": "Bearer s3cret"})
        ((labels, _),) = c.query_range("up", 0.0, 1.0, 0.5)  # followed to the answer
        assert labels == {"instance": "x:1"}
        first, *after = hop.seen + api.seen
        assert first[0].startswith("/old/") and first[1]["Authorization"] == "Bearer s3cret"
        assert [p.split("?")[0] for p, _ in after] == ["/api/v1/query_range"]
        assert ("Authorization" in after[0][1]) == keeps, after
    finally:
        for srv in servers:
            srv.shutdown()
            srv.server_close()


# --- a real Prometheus and node_exporter -------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout_s: float) -> bool:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(0.2)
    return False


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """node_exporter and Prometheus started by hand on 127.0.0.1 (never their services)."""
    from system_packages import require

    require("prometheus", "prometheus-node-exporter")
    exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    prom = shutil.which("prometheus")
    assert exporter and prom, "installed, yet not on PATH"
    tmp = tmp_path_factory.mktemp("prom")
    ne_port, p_port = _free_port(), _free_port()
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: node\n    static_configs:\n"
        f'      - targets: ["127.0.0.1:{ne_port}"]\n'
    )
    procs = []
    log = open(tmp / "log.txt", "ab")
    try:
        procs.append(
            subprocess.Popen(
                [
                    exporter,
                    f"--web.listen-address=127.0.0.1:{ne_port}",
                    "--collector.disable-defaults",
                    "--collector.cpu",
                    "--collector.netdev",
                    "--collector.netdev.device-exclude=^$",  # Debian's default leaves out lo
                    "--collector.stat",
                    "--collector.meminfo",
                    "--collector.loadavg",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        procs.append(
            subprocess.Popen(
                [
                    prom,
                    f"--config.file={tmp / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'data'}",
                    f"--web.listen-address=127.0.0.1:{p_port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        url = f"http://127.0.0.1:{p_port}"
        if not _wait_http(f"{url}/-/ready", 30):
            pytest.fail(f"prometheus not ready: {(tmp / 'log.txt').read_text()[-2000:]}")
        # targets reach the scrape manager up to 5 s after start: wait for the first scrape
        client = ps.PromClient(url)
        deadline = time.monotonic() + 30
        while not client.query_range('up{job="node"}', time.time() - 2, time.time(), 1.0):
            if time.monotonic() > deadline:
                pytest.fail("prometheus never scraped node_exporter")
            time.sleep(0.5)
        yield url
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        log.close()


def _loopback_traffic(seconds: float, rate_bps: float) -> None:
    """A paced TCP stream over lo at ``rate_bps`` bytes/s."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def drain():
        c, _ = srv.accept()
        with c:
            while c.recv(1 << 16):
                pass

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    chunk = b"x" * 65536
    with socket.create_connection(("127.0.0.1", port)) as s:
        start = time.monotonic()
        sent = 0
        while (now := time.monotonic()) - start < seconds:
            if sent < (now - start) * rate_bps:
                s.sendall(chunk)
                sent += len(chunk)
            else:
                time.sleep(0.002)
    t.join(5)
    srv.close()


@pytest.mark.integration
def test_prometheus_agrees_with_the_agent(prometheus, tmp_path):
    """node_cpu_seconds_total (busy modes) vs the agent's cpu busy_s, and lo bytes, over
    the same 6 s window: within 5% (CPU) and 2% (bytes)."""
    run = tmp_path / "run"
    agent = AgentHandle.start(
        "local", run / "nodes" / "local", agent_argv("local", 0.5, collectors=["cpu", "net"])
    )
    try:
        time.sleep(2.0)  # a few scrapes before the window
        spin = "import time\nend = time.monotonic() + 10\nwhile time.monotonic() < end:\n    pass\n"
        load = subprocess.Popen([sys.executable, "-c", spin])  # one core busy for 10 s
        t_load = time.time_ns()
        traffic = threading.Thread(target=_loopback_traffic, args=(10.0, 40e6), daemon=True)
        traffic.start()
        time.sleep(2.0)
        w0 = time.time_ns()
        time.sleep(6.0)
        w1 = time.time_ns()
        traffic.join(10)
        load.wait(10)
        time.sleep(2.5)  # the scrapes after the window
    finally:
        agent.stop()
    assert w0 - t_load >= 1.9e9
    client = ps.PromClient(prometheus)
    res = ps.pull(
        run, client, [ps.Job("node", "node")], [(w0, w1)], 0.5, node_of=lambda labels: "local-prom"
    )
    assert res.nodes == ("local-prom",) and res.clock is not None
    assert abs(res.clock.offset_ns) <= res.clock.uncertainty_ns + 2_000_000  # one host
    store = load_samples(run)
    rows = summarize_window(store, Window("case", "w", "w", w0, w1))

    def rate(node, source, device, metric):
        (r,) = [
            r
            for r in rows
            if (r.node, r.source, r.device, r.metric) == (node, source, device, metric)
        ]
        assert r.coverage > 0.99, r
        return r.rate

    cpu_a, cpu_p = rate("local", "cpu", "", "busy_s"), rate("local-prom", "cpu", "", "busy_s")
    lo_a, lo_p = rate("local", "net", "lo", "rx_bytes"), rate("local-prom", "net", "lo", "rx_bytes")
    print(
        f"\nbusy cores: agent {cpu_a:.3f}, prometheus {cpu_p:.3f}; "
        f"lo rx: agent {lo_a / 1e6:.2f} MB/s, prometheus {lo_p / 1e6:.2f} MB/s"
    )
    assert cpu_a > 0.9  # the spinner alone holds one core
    assert cpu_p == pytest.approx(cpu_a, rel=0.05)
    assert lo_a == pytest.approx(40e6, rel=0.15)
    assert lo_p == pytest.approx(lo_a, rel=0.02)

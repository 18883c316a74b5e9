"""Prometheus /metrics: parsing, per-engine name mapping, scraping a live HTTP endpoint."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_plugin.agent.collectors.base import Unavailable
from strata_plugin.agent.collectors.prom import (
    PROM_BODY_BYTES_MAX,
    BodyRefused,
    NameMapper,
    PromCollector,
    detect_engine,
    kind_of,
    parse_exposition,
    read_bounded,
    scrape,
)

DATA = Path(__file__).parent / "data" / "prom"


def mapped(text: str) -> dict[tuple[str, str], tuple[float, str]]:
    samples = parse_exposition(text)
    m = NameMapper()
    mapping = m.update({s.family for s in samples})
    out = {}
    for s in samples:
        if s.name.endswith("_created"):
            continue
        dev = ";".join(f"{k}={v}" for k, v in sorted(s.labels) if k != "model_name")
        out[(dev, m.name(s, mapping))] = (s.value, kind_of(s))
    return out


def test_llamacpp_names_map_to_common_names() -> None:
    text = (DATA / "llamacpp.txt").read_text()
    assert detect_engine(parse_exposition(text)) == "llamacpp"
    v = mapped(text)
    assert v[("", "prompt_tokens_total")] == (1024, "counter")
    assert v[("", "generation_tokens_total")] == (512, "counter")
    assert v[("", "running_requests")] == (2, "gauge")
    assert v[("", "waiting_requests")] == (1, "gauge")
    assert v[("", "kv_cache_usage")] == (0.125, "gauge")
    assert v[("", "generation_seconds_total")] == (10.25, "counter")


def test_vllm_names_labels_histograms_and_first_candidate_wins() -> None:
    text = (DATA / "vllm.txt").read_text()
    assert detect_engine(parse_exposition(text)) == "vllm"
    v = mapped(text)
    assert v[("engine=0", "running_requests")] == (4.0, "gauge")
    assert v[("engine=0", "waiting_requests")] == (7.0, "gauge")
    assert v[("engine=0", "kv_cache_usage")] == (0.42, "gauge")
    # the deprecated alias stays under its raw name instead of doubling kv_cache_usage
    assert ("engine=0", "vllm:gpu_cache_usage_perc") in v
    assert v[("engine=0", "prompt_tokens_total")] == (123456.0, "counter")
    assert v[("engine=0", "preemptions_total")] == (3.0, "counter")
    assert v[("engine=0;le=0.1", "ttft_seconds_bucket")] == (40.0, "counter")
    assert v[("engine=0;le=+Inf", "ttft_seconds_bucket")] == (100.0, "counter")
    assert v[("engine=0", "ttft_seconds_sum")] == (12.5, "counter")
    assert v[("engine=0", "itl_seconds_count")] == (6500.0, "counter")
    # unknown metrics are kept raw, labels and all
    key = (
        "block_size=16;cache_dtype=auto;engine=0;gpu_memory_utilization=0.9",
        "vllm:cache_config_info",
    )
    assert v[key] == (1.0, "gauge")
    assert v[("generation=0", "python_gc_objects_collected_total")][1] == "counter"


def test_sglang_names() -> None:
    text = (DATA / "sglang.txt").read_text()
    assert detect_engine(parse_exposition(text)) == "sglang"
    v = mapped(text)
    assert v[("tp_rank=0", "running_requests")] == (12.0, "gauge")
    assert v[("tp_rank=0", "waiting_requests")] == (3.0, "gauge")
    assert v[("tp_rank=0", "kv_cache_usage")] == (0.61, "gauge")
    assert v[("", "cached_prompt_tokens_total")] == (120000.0, "counter")
    assert v[("mode=prefill_compute", "sglang:realtime_tokens_total")][0] == 130000.0
    assert v[("le=0.1", "ttft_seconds_bucket")] == (500.0, "counter")


def test_renamed_metrics_still_land() -> None:
    # underscore instead of colon, and OpenMetrics-style counter family without _total
    text = (
        "# TYPE vllm_num_requests_running gauge\n"
        "vllm_num_requests_running 5\n"
        "# TYPE vllm:generation_tokens counter\n"
        "vllm:generation_tokens_total 77\n"
    )
    v = mapped(text)
    assert v[("", "running_requests")] == (5.0, "gauge")
    assert v[("", "generation_tokens_total")] == (77.0, "counter")


def test_parser_handles_escapes_timestamps_and_garbage() -> None:
    text = (
        "# TYPE m gauge\n"
        'm{path="/a,b",q="say \\"hi\\"",x="}"} 1.5 1700000000000\n'
        "m_no_labels +Inf\n"
        "not a metric line\n"
        "m_nan NaN\n"
    )
    s = parse_exposition(text)
    assert s[0].labels == (("path", "/a,b"), ("q", 'say "hi"'), ("x", "}"))
    assert s[0].value == 1.5
    assert s[1].value == float("inf")
    assert len(s) == 3  # the garbage line is skipped


class _Server:
    def __init__(self, body: bytes, status: int = 200) -> None:
        outer = self
        self.body, self.status, self.hits = body, status, 0

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.hits += 1
                self.send_response(outer.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        # polled every 10 ms, so that close() (shutdown) does not wait out the default 0.5 s
        threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    made = []

    def make(body: bytes, status: int = 200) -> _Server:
        s = _Server(body, status)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def test_scrape_of_a_live_endpoint(server) -> None:
    s = server((DATA / "llamacpp.txt").read_bytes())
    c = PromCollector(s.url, interval_s=0.1)
    t0 = time.time_ns()
    c.scrape_once()
    emits = c.sample(time.time_ns())
    v = {(d, m): val for _, d, m, val, _ in emits}
    assert v[("", "running_requests")] == 2 and v[("", "scrape_ok")] == 1
    assert all(t0 <= w <= time.time_ns() for w, *_ in emits)
    _, info, _, _ = c.drain()
    assert info[0]["engine"] == "llamacpp"
    assert info[0]["mapping"]["llamacpp:requests_deferred"] == "waiting_requests"


def test_scraper_thread_runs_each_interval(server) -> None:
    s = server((DATA / "sglang.txt").read_bytes())
    c = PromCollector(s.url, interval_s=0.1)
    t0 = time.monotonic()
    c.probe()
    while s.hits < 3 and time.monotonic() < t0 + 10:
        time.sleep(0.01)
    c.close()
    elapsed = time.monotonic() - t0  # a late wake only lengthens it
    assert s.hits >= 3, s.hits  # one scrape and no thread never gets here
    # it waits its interval between scrapes: no more than one per 0.1 s (plus the
    # probe's and one in flight at the close)
    assert s.hits <= elapsed / 0.1 + 2, (s.hits, elapsed)
    assert sum(1 for e in c.sample(time.time_ns()) if e[2] == "scrape_ok") == s.hits


def test_404_and_refused_are_reported_and_retried(server) -> None:
    s = server(b"not found", status=404)
    c = PromCollector(s.url, interval_s=0.1)
    c.scrape_once()
    c.scrape_once()
    unavailable, _, _, events = c.drain()
    assert "HTTP 404" in unavailable["scrape"] and "--metrics" in unavailable["scrape"]
    assert len(events) == 1  # the same error is reported once
    oks = [val for _, _, m, val, _ in c.sample(time.time_ns()) if m == "scrape_ok"]
    assert oks == [0, 0]
    s.close()
    c2 = PromCollector(s.url, interval_s=0.1, timeout_s=0.5)
    c2.scrape_once()
    unavailable, _, _, _ = c2.drain()
    assert "scrape" in unavailable


def test_bad_url_is_unavailable() -> None:
    with pytest.raises(Unavailable, match="http"):
        PromCollector("localhost:8080/metrics").probe()


# --- the body is bounded: PROM_BODY_BYTES_MAX, within the scrape's timeout --------------
# On 449ac52 the scrape read the whole body: an endless /metrics grew the agent from 0.66
# to 2.68 GB in 9 s, and the report said "no samples" with no reason.

LINE = b'vllm:num_requests_running{engine="0"} 1\n'


class _Endless:
    """A /metrics that never ends: ``framing`` chunked, close (no length) or a huge
    Content-Length; ``rate`` bytes a second (None: as fast as the socket takes), until
    the client goes away. Counts the bytes it got out."""

    def __init__(self, framing: str = "chunked", rate: float | None = None) -> None:
        self.framing, self.rate, self.sent = framing, rate, 0
        self._stop = threading.Event()
        self._ls = socket.create_server(("127.0.0.1", 0))
        self._ls.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._ls.getsockname()[1]}/metrics"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._ls.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                head = {"chunked": "Transfer-Encoding: chunked",
                        "close": "Connection: close",
                        "length": f"Content-Length: {1 << 40}"}[self.framing]
                conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{head}\r\n\r\n"
                             .encode())
                block = LINE * (1 if self.rate else 1600)
                piece = b"%x\r\n%s\r\n" % (len(block), block) if self.framing == "chunked" \
                    else block
                while not self._stop.is_set():
                    conn.sendall(piece)
                    self.sent += len(block)
                    if self.rate:
                        self._stop.wait(len(block) / self.rate)
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self._ls.close()


@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
def test_an_endless_body_fails_the_scrape_with_its_reason(framing) -> None:
    import tracemalloc

    srv = _Endless(framing)
    try:
        c = PromCollector(srv.url, interval_s=0.5)
        tracemalloc.start()
        t0 = time.monotonic()
        c.scrape_once()
        took = time.monotonic() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    finally:
        srv.close()
    unavailable, _, _, events = c.drain()
    n = PROM_BODY_BYTES_MAX
    assert unavailable["scrape"].startswith(f"no samples: /metrics body exceeded {n} bytes"), \
        unavailable
    assert events[0]["kind"] == "scrape_error"
    assert [v for _, _, m, v, _ in c.sample(time.time_ns()) if m == "scrape_ok"] == [0]
    assert took < c.timeout_s + 0.5, took
    assert peak < 3 * n, peak  # the bound and its copy, no more
    if framing == "length":  # refused from the head, unread
        assert "Content-Length 1099511627776" in unavailable["scrape"]


def test_a_body_that_trickles_past_the_timeout_is_refused() -> None:
    srv = _Endless("chunked", rate=2000.0)  # a line every 20 ms, never ending
    try:
        c = PromCollector(srv.url, interval_s=0.1, timeout_s=0.5)
        t0 = time.monotonic()
        c.scrape_once()
        took = time.monotonic() - t0
    finally:
        srv.close()
    unavailable, _, _, _ = c.drain()
    assert "still arriving after the scrape's timeout" in unavailable["scrape"], unavailable
    assert 0.5 <= took < 3.0, took  # the body never ends: a scrape with no bound hangs


@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
@pytest.mark.parametrize("extra, ok", [(0, True), (1, False)])
def test_a_body_of_exactly_the_bound_is_read_and_a_byte_more_is_refused(framing, extra, ok):
    """The bound itself, at a small value: ``max_bytes`` bytes are read whole, one byte
    more is refused, in each framing."""
    body = (LINE * 30)[: 1000 + extra]
    srv = _Fixed(body, framing)
    try:
        if ok:
            assert scrape(srv.url, 2.0, max_bytes=1000) == body.decode()
        else:
            with pytest.raises(BodyRefused, match="/metrics body exceeded 1000 bytes"):
                scrape(srv.url, 2.0, max_bytes=1000)
    finally:
        srv.close()


class _Fixed(_Endless):
    """One body of exactly these bytes, in the framing asked for."""

    def __init__(self, body: bytes, framing: str) -> None:
        self.body = body
        super().__init__(framing)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            head = {"chunked": "Transfer-Encoding: chunked", "close": "Connection: close",
                    "length": f"Content-Length: {len(self.body)}"}[self.framing]
            data = self.body
            if self.framing == "chunked":  # in uneven chunks, the last one crossing the bound
                data = b"".join(b"%x\r\n%s\r\n" % (len(p), p)
                                for p in (self.body[:333], self.body[333:]) if p) + b"0\r\n\r\n"
            conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{head}\r\n\r\n"
                         .encode() + data)


@settings(derandomize=True, database=None, deadline=None, max_examples=100)
@given(size=st.integers(0, 5000), cuts=st.lists(st.integers(1, 700), min_size=1,
                                                  max_size=12),
       limit=st.integers(1, 5000))
def test_read_bounded_reads_whole_bodies_within_the_bound_and_refuses_others(size, cuts,
                                                                               limit):
    """Whatever pieces a body comes in, read_bounded returns it whole when it fits and
    refuses it once it does not, having kept no more than the bound."""
    body = bytes(i % 251 for i in range(size))

    class Pieces:
        headers: dict = {}

        def __init__(self) -> None:
            self.at, self.i, self.read = 0, 0, 0

        def read1(self, n: int) -> bytes:
            step = min(n, cuts[self.i % len(cuts)])
            self.i += 1
            out = body[self.at:self.at + step]
            self.at += len(out)
            return out

    src = Pieces()
    if size <= limit:
        assert read_bounded(src, limit) == body
    else:
        with pytest.raises(BodyRefused):
            read_bounded(src, limit)
        assert src.at <= limit + 700  # stopped at the first piece past the bound


@pytest.mark.integration  # waits out real seconds (>= 2 s on a quiet host)
def test_the_agent_process_stays_small_and_reports_why(tmp_path) -> None:
    """The agent itself against an endless /metrics: its peak RSS stays near its size at
    start, and unavailable.json carries the reason the report prints."""
    import json

    from strata_plugin.agent.handle import AgentHandle, agent_argv

    srv = _Endless("chunked")
    try:
        h = AgentHandle.start("n1", tmp_path, agent_argv("n1", 0.1, prom_url=srv.url,
                                                         collectors=["prom", "cpu"]))
        try:
            time.sleep(2.0)
            status = Path(f"/proc/{h.proc.pid}/status").read_text()
            hwm_kb = int(next(x for x in status.splitlines() if x.startswith("VmHWM"))
                         .split()[1])
        finally:
            h.stop()
    finally:
        srv.close()
    assert hwm_kb < 80_000, hwm_kb  # ~30 MB at start, plus one bounded body
    unavailable = json.loads((tmp_path / "unavailable.json").read_text())
    assert unavailable["prom/scrape"].startswith(
        f"no samples: /metrics body exceeded {PROM_BODY_BYTES_MAX} bytes"), unavailable


class _ServerWithEndlessMetrics(_Endless):
    """An attached server: /health answers, /v1/completions streams two tokens, and
    /metrics never ends (chunked, as fast as the socket takes)."""

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                head = b""
                while b"\r\n\r\n" not in head:
                    more = conn.recv(65536)
                    if not more:
                        return
                    head += more
                line = head.split(b"\r\n", 1)[0].decode()
                if line.startswith("GET /metrics"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n")
                    block = LINE * 1600
                    piece = b"%x\r\n%s\r\n" % (len(block), block)
                    while not self._stop.is_set():
                        conn.sendall(piece)
                elif line.startswith("GET"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
                                 b"Connection: close\r\n\r\nok")
                else:
                    ev = [b'data: {"choices":[{"index":0,"text":" x"}]}\n\n'] * 2 + [
                        b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}],'
                        b'"usage":{"prompt_tokens":8,"completion_tokens":2}}\n\n',
                        b"data: [DONE]\n\n"]
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Connection: close\r\n\r\n" + b"".join(ev))
            except OSError:
                return


@pytest.mark.integration
def test_a_run_against_an_endless_metrics_says_why_prom_has_no_samples(tmp_path) -> None:
    """The whole run: the report's unavailable collectors name the bound (449ac52 grew
    the agent without limit and the report said no samples, with no reason)."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "profile.toml").write_text(
        'name = "endless"\n[server]\nengine = "other"\napi = "completions"\n'
        "health_timeout_s = 30\n"
        "token_id_range = [300, 1000]\n[telemetry]\ninterval_s = 0.2\nbaseline_s = 1\n"
        'cooldown_s = 0\ncollectors = ["prom", "proc"]\n')
    srv = _ServerWithEndlessMetrics()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
             "no:hypothesispytest", f"--strata-profile={tmp_path / 'profile.toml'}",
             f"--strata-reports-dir={tmp_path / 'reports'}",
             f"--strata-server-url={srv.url.removesuffix('/metrics')}",
             "--strata-workload=isl=8,osl=2,requests=4", "--strata-run-id=m"],
            cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False,
            env=dict(os.environ, PYTHONPATH=str(root), CI_NO_PROGRESS="1"))
    finally:
        srv.close()
    run = tmp_path / "reports" / "m"
    assert out.returncode == 0, out.stdout[-3000:]
    says = f"no samples: /metrics body exceeded {PROM_BODY_BYTES_MAX} bytes"
    unavailable = json.loads((run / "nodes" / "local" / "unavailable.json").read_text())
    assert unavailable["prom/scrape"].startswith(says), unavailable
    report = (run / "report.md").read_text()
    assert says in report[report.index("## Unavailable collectors"):]

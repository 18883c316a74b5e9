"""Prometheus /metrics: parsing, per-engine name mapping, scraping a live HTTP endpoint."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from strata_plugin.agent.collectors.base import Unavailable
from strata_plugin.agent.collectors.prom import (
    NameMapper,
    PromCollector,
    detect_engine,
    kind_of,
    parse_exposition,
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
    c.probe()
    time.sleep(0.55)
    c.close()
    assert 3 <= s.hits <= 8
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

"""Latency added between client and server is attributed outside the server.

The server is llama-server behind a small TCP relay that holds every chunk, in both
directions, for a fixed delay (a slow network path or proxy), started by a shim as the
profile's server command. The same case runs against the relay with no delay and with
1.5 s each way: the delayed one must name ``outside_server`` with the per-request
share of TTFT the time ledger puts before the server as evidence, not
``queueing`` (the server's own waiting count stays 0), and the direct one must not.
"""

from __future__ import annotations

import json
import sys

import pytest

from strata_plugin.report import summarize_case
from tests.test_robustness_support import PytestRun, llama_paths, make_project

pytestmark = pytest.mark.integration

DELAY_S = 1.5  # large beside a request even when other work slows the server 10x

#: argv: <listen port> <server argv ...>, with @INNER@ where the server's port goes.
#: The relay keeps each chunk's arrival time and writes it DELAY later, in order, so the
#: path adds a fixed latency and no throughput limit. Only POSTs (the API) take the slow
#: path: the health poll and the agent's /metrics scrape go straight through.
RELAY = r"""
import asyncio, os, socket, subprocess, sys, time
delay = float(os.environ.get("RELAY_DELAY_S", "0"))
s = socket.socket(); s.bind(("127.0.0.1", 0)); inner = s.getsockname()[1]; s.close()
argv = [a.replace("@INNER@", str(inner)) for a in sys.argv[2:]]
child = subprocess.Popen(argv)

async def pump(reader, writer, delay, first=b""):
    q = asyncio.Queue()
    if first:
        await q.put((time.monotonic(), first))
    async def out():
        while True:
            t, data = await q.get()
            if data is None:
                break
            wait = t + delay - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()
    task = asyncio.ensure_future(out())
    try:
        while True:
            data = await reader.read(65536)
            await q.put((time.monotonic(), data or None))
            if not data:
                break
    except OSError:
        await q.put((time.monotonic(), None))
    await task

async def handle(cr, cw):
    first = await cr.read(65536)
    # the API's traffic goes the slow way; health checks and /metrics scrapes do not
    d = 0.0 if first.startswith(b"GET ") else delay
    try:
        sr, sw = await asyncio.open_connection("127.0.0.1", inner)
    except OSError:
        cw.close()
        return
    await asyncio.gather(pump(cr, sw, d, first), pump(sr, cw, d), return_exceptions=True)

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    while child.poll() is None:
        await asyncio.sleep(0.2)
    server.close()

try:
    asyncio.run(main())
finally:
    child.kill()
"""

CASES = """
import pytest
from strata_plugin.load.workload import Workload

@pytest.mark.strata_configs("direct", "delayed")
def test_decode(strata):
    r = strata.run(Workload("decode", isl=16, osl=8, concurrency=2, requests=6), scale=False)
    assert not r.problems, r.problems
"""


def test_latency_added_on_the_path_is_named_outside_the_server(tmp_path):
    p = llama_paths()
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    argv = [sys.executable, str(relay), "{port}", p["llama_server"], "-m", p["model"],
            "--host", "127.0.0.1", "--port", "@INNER@", "-t", "2", "-c", "4096", "-np", "4",
            "--metrics", "--no-webui"]
    profile = tmp_path / "profile.toml"
    profile.write_text(f"""
name = "relay"
[server]
engine = "llamacpp"
api = "llamacpp"
argv = {json.dumps(argv)}
health_timeout_s = 60
stop_timeout_s = 5
request_timeout_s = 60
token_id_range = [300, 1000]
[server.configs.direct]
env = {{ RELAY_DELAY_S = "0" }}
[server.configs.delayed]
env = {{ RELAY_DELAY_S = "{DELAY_S}" }}
[telemetry]
interval_s = 0.25
baseline_s = 0.5
cooldown_s = 0
collectors = ["proc", "cpu", "mem", "prom", "log"]
""")
    (tmp_path / "proj").mkdir()
    proj = make_project(tmp_path / "proj", CASES)
    reports = tmp_path / "reports"
    run = PytestRun.start(["-rA", f"--strata-profile={profile}", f"--strata-reports-dir={reports}",
                           "--strata-run-id=run"], tmp_path / "out.txt", reports / "run",
                          cwd=proj)
    rc = run.wait(400)
    assert rc == 0, run.text()[-4000:]
    direct = summarize_case(run.run_dir, "test_cases.py::test_decode[direct]").verdict
    delayed = summarize_case(run.run_dir, "test_cases.py::test_decode[delayed]").verdict
    print(f"direct: {direct.summary()}; delayed: {delayed.summary()}")
    assert "outside_server" not in direct.past_threshold, direct
    assert "outside_server" in delayed.past_threshold, delayed
    assert "queueing" not in delayed.past_threshold, delayed
    ev = {e.metric: e for e in delayed.evidence if e.cls == "outside_server"}
    # the ledger's time on the way there is the path's two delays (the way there told from
    # the queue by the case's floor) plus the front end's few ms; its share of TTFT is most
    # of it, less what the host's load adds to a 16-token prefill
    path_ms = 2 * DELAY_S * 1e3
    assert ev["before_server_ms"].met, ev
    assert path_ms <= ev["before_server_ms"].value < path_ms + 100, ev
    assert ev["outside_server_frac"].met and ev["outside_server_frac"].value > 0.5, ev
    # the decomposition: what no server clock accounts for is the path's two delays
    from strata_plugin.analysis.case_summary import load_run
    from strata_plugin.analysis.metrics import request_metrics

    delayed_id = "test_cases.py::test_decode[delayed]"
    bundle, _ = load_run(run.run_dir, delayed_id)
    outside = sorted(request_metrics(r).outside_server_ms
                     for r in bundle.records[delayed_id] if r.phase == "measured")
    assert outside[len(outside) // 2] >= 2 * DELAY_S * 1e3 * 0.9, outside

"""Broken streams through a whole plugin run: recorded and classified, memory bounded,
no hang, and the run completes.

The client has unit tests for each fault (tests/test_client_faults.py); here one case of
a real ``pytest`` run meets all of them in turn from a scripted server
(tests/sse_script_server.py): a stream that stalls, one that sends garbage, one that
sends binary noise, one cut mid-event, one reset, one event of 64 MB, an HTTP 500,
and good streams between them. Every request must land in requests.jsonl with the
right error class, the run must finish well inside its bounds, the harness's peak
memory must stay far under the 64 MB it was sent, and the manifest must say complete.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.sse_script_server import Reply, ScriptServer, Seen, sse
from tests.test_robustness_support import PytestRun, make_project

PROFILE = """
name = "streams"
[server]
engine = "llamacpp"
api = "llamacpp"
health_timeout_s = 5
request_timeout_s = 1
token_id_range = [300, 1000]
[telemetry]
interval_s = 0.25
baseline_s = 0
cooldown_s = 0
collectors = ["cpu", "mem"]
"""

#: Request index -> (what the server does, the error class the record must carry).
SCRIPT = (
    ("good", None),
    ("stall", "timeout"),
    ("good", None),
    ("garbage", "malformed_event"),
    ("noise", "truncated_stream"),
    ("cut", "truncated_stream"),
    ("reset", "reset"),
    ("huge", "event_too_large"),
    ("http500", "http_status"),
    ("good", None),
)
HUGE_BYTES = 64 * 2**20

CASES = f"""
import resource
from strata_plugin.load.workload import Workload

def test_broken_streams(strata, record_property):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = strata.run(Workload("streams", isl=8, osl=3, requests={len(SCRIPT)}), scale=False,
                   allow_errors=True)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"RSS_PEAK_KB before={{before}} after={{after}}")
    assert len(r.records) == {len(SCRIPT)}
"""

TOKEN = sse({"content": "ab", "tokens": [400], "stop": False})
END = sse({"content": "", "stop": True, "stop_type": "limit", "tokens_evaluated": 8,
           "tokens_predicted": 3, "timings": {"prompt_n": 8, "prompt_ms": 1.0,
                                              "predicted_n": 3, "predicted_ms": 2.0}})


def _reply(kind: str) -> Reply:
    good = [(0.001, TOKEN), (0.001, TOKEN), (0.001, TOKEN), (0.001, END)]
    return {
        "good": Reply(good),
        "stall": Reply([(0.001, TOKEN)], end="hang"),
        "garbage": Reply([(0.001, TOKEN), (0.001, b"data: {not json at all\n\n"),
                          (0.001, END)]),
        "noise": Reply([(0.001, TOKEN), (0.001, bytes(range(256)) * 64)], framing="close"),
        "cut": Reply([(0.001, TOKEN), (0.01, b'data: {"content": "a", "tok')],
                     framing="close", end="cut"),
        "reset": Reply([(0.001, TOKEN), (0.01, TOKEN)], end="reset"),
        "huge": Reply([(0.001, TOKEN), (0.001, b"data: {\"content\": \"" + b"x" * HUGE_BYTES)],
                      framing="close"),
        "http500": Reply([(0.0, b'{"error": "boom"}')], status=500, framing="length",
                         content_type="application/json"),
    }[kind]


@pytest.mark.integration
def test_broken_streams_are_recorded_and_the_run_completes(tmp_path):
    lock = threading.Lock()
    posts: list[int] = []

    def reply(seen: Seen) -> Reply:
        if seen.method == "GET":
            return Reply([(0.0, b"ok")], framing="length", content_type="text/plain")
        with lock:
            i = len(posts)
            posts.append(i)
        return _reply(SCRIPT[i % len(SCRIPT)][0])

    (tmp_path / "proj").mkdir()
    proj = make_project(tmp_path / "proj", CASES)
    (proj / "profile.toml").write_text(PROFILE)
    reports = tmp_path / "reports"
    with ScriptServer(reply) as srv:
        t0 = time.monotonic()
        run = PytestRun.start(["-s", f"--strata-profile={proj / 'profile.toml'}",
                               f"--strata-server-url={srv.url}",
                               f"--strata-reports-dir={reports}", "--strata-run-id=run"],
                              tmp_path / "out.txt", reports / "run", cwd=proj)
        rc = run.wait(90)
        took = time.monotonic() - t0
    out = run.text()
    assert rc == 0, out[-4000:]
    assert took < 60, took  # one 1 s stall, the rest fail fast
    records = [json.loads(x) for x in (run.run_dir / "requests.jsonl").read_text().splitlines()]
    by_index = {int(r["request_id"].rsplit("/", 1)[1]): r for r in records}
    assert sorted(by_index) == list(range(len(SCRIPT)))
    got = {i: (by_index[i]["error"] or {}).get("cls") for i in by_index}
    want = {i: cls for i, (_, cls) in enumerate(SCRIPT)}
    assert got == want, (got, want)
    assert all(r["events"] for r in records if SCRIPT[int(r["request_id"].rsplit("/", 1)[1])][0]
               in ("stall", "garbage", "reset", "huge")), "events before the fault are kept"
    line = next(x for x in out.splitlines() if "RSS_PEAK_KB" in x)
    before, after = (int(x.split("=")[1]) for x in line.split("RSS_PEAK_KB", 1)[1].split())
    assert (after - before) * 1024 < HUGE_BYTES / 4, line  # bounded: no 64 MB buffer
    m = run.manifest()
    assert m["complete"] is True, m
    cases = [json.loads(x) for x in (run.run_dir / "cases.jsonl").read_text().splitlines()]
    assert cases[-1]["headline"]["n_errors"] == sum(1 for _, c in SCRIPT if c)

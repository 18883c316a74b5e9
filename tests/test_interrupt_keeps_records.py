"""Ctrl-C keeps what it saw: a real pytest run in a subprocess against a slow scripted
server gets SIGINT while four streams are in flight; requests.jsonl then holds those four,
each with the events it had received and the error class ``interrupted``, and nothing for
the requests never sent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import default_signals
import pytest
from sse_script_server import Reply, ScriptServer, Seen, sse

pytestmark = pytest.mark.integration  # a whole pytest run of the plugin, in a subprocess

ROOT = Path(__file__).resolve().parents[1]

PROFILE = """
name = "interrupt-test"
[server]
engine = "other"
api = "completions"
health_timeout_s = 30
token_id_range = [300, 1000]
[telemetry]
interval_s = 0.1
baseline_s = 0
cooldown_s = 0
collectors = ["proc"]
"""
N_TOKENS, GAP_S = 40, 0.25  # a 10 s stream


def _slow(seen: Seen) -> Reply:
    if seen.method == "GET":
        return Reply([(0.0, b"ok")], framing="length", content_type="text/plain")
    items = [(GAP_S, sse({"choices": [{"index": 0, "text": " x"}]})) for _ in range(N_TOKENS)]
    items.append((0.0, sse({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                            "usage": {"prompt_tokens": 8, "completion_tokens": N_TOKENS}})))
    items.append((0.0, sse("[DONE]")))
    return Reply(items)


def test_sigint_mid_case_writes_the_in_flight_requests(tmp_path):
    (tmp_path / "profile.toml").write_text(PROFILE)
    (tmp_path / "pytest.ini").write_text(
        f"[pytest]\nstrata_profile = {tmp_path / 'profile.toml'}\n"
        f"strata_reports_dir = {tmp_path / 'reports'}\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), CI_NO_PROGRESS="1")
    with ScriptServer(_slow) as srv:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
             "no:hypothesispytest", f"--strata-server-url={srv.url}",
             f"--strata-workload=isl=8,osl={N_TOKENS},concurrency=4,requests=8",
             "--strata-run-id=int"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=default_signals.restore)
        try:
            deadline = time.monotonic() + 60
            posts = []
            while time.monotonic() < deadline:  # four streams, each 3 tokens in
                posts = [s for s in srv.seen if s.method == "POST"]
                if len(posts) >= 4 and all(len(s.sent_ns) >= 3 for s in posts[:4]):
                    break
                time.sleep(0.05)
            assert len(posts) == 4, f"{len(posts)} requests reached the server"
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        sent = sorted(len(s.sent_ns) for s in posts)
    assert proc.returncode == 2, out  # pytest's "interrupted"
    run = tmp_path / "reports" / "int"
    recs = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    assert len(recs) == 4, out  # the four in flight; the four never sent are not requests
    assert {r["error"]["cls"] for r in recs} == {"interrupted"}
    got = sorted(len(r["events"]) for r in recs)
    assert all(n >= 3 for n in got), got  # what had arrived before the signal is kept
    assert all(g <= s for g, s in zip(got, sent, strict=True)), (got, sent)
    assert all(n < N_TOKENS for n in got)
    assert all(r["phase"] == "measured" and r["first_byte_ns"] for r in recs)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["complete"] is False and "interrupted" in manifest["incomplete_reason"]
    line = json.loads((run / "cases.jsonl").read_text().splitlines()[-1])
    assert line["case_id"] == "adhoc" and line["interrupted"] is True

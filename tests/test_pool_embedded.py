"""A case at 512 streams on the embedded llama-server runs through the pool without any option.

A real pytest run of the generated case (``--strata-workload``) against the local
profile's llama-server: the profile as packaged except 64 slots and a 600 s request
timeout, so that 512 requests in flight do not wait past the read timeout in the
server's queue on a shared 2-core host (its 5 slots serve about one request a second
there). The report has the same sections as one loop's, plus where the load ran; the
self-check is per process. About 2-3 minutes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from strata_plugin.load import pool

ROOT = Path(__file__).resolve().parents[1]
LOCAL = ROOT / "strata_plugin" / "profiles" / "local.toml"

pytestmark = pytest.mark.integration


def _profile(tmp: Path, extra: str = "") -> Path:
    text = LOCAL.read_text()
    assert '"-np", "5"' in text and "request_timeout_s = 120" in text
    p = tmp / "local512.toml"
    p.write_text(text.replace('"-np", "5"', '"-np", "64"')
                 .replace("request_timeout_s = 120", "request_timeout_s = 600") + extra)
    return p


def test_512_streams_on_the_embedded_target_run_through_the_pool(tmp_path) -> None:
    if pool.usable_cpus() < 2:
        pytest.skip("one usable CPU: the pool cannot help, auto keeps one loop")
    reports = tmp_path / "reports"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--strata-profile", str(_profile(tmp_path)),
         "--strata-workload", "isl=16,osl=4,concurrency=512,requests=512,warmups=0",
         "--strata-reports-dir", str(reports)],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    run = next(reports.iterdir())
    case = json.loads((run / "cases.jsonl").read_text().splitlines()[-1])
    sc = case["self_check"]
    assert sc["engine"] == "pool" and sc["processes"] == 2, sc
    assert sc["placement"].startswith("auto: 512 streams > 256 streams a loop"), sc["placement"]
    assert [p["streams"] for p in sc["per_process"]] == [256, 256]
    assert sum(p["requests"] for p in sc["per_process"]) == 512
    recs = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    measured = [r for r in recs if r["phase"] == "measured"]
    assert len(measured) == 512 and all(r["error"] is None for r in measured)
    assert all(r["proc"] is not None for r in measured)  # the server's /proc, per request
    report = (run / "report.md").read_text()
    assert "| load carried by | 2 processes on 1 host (the worker pool)" in report
    assert report.count("| self-check, process ") == 2
    for section in ("#### Workload as run", "#### Request metrics", "#### Verdict"):
        assert section in report

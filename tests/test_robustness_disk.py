"""A results disk that fills up mid-run: a clear error, and nothing half-written
presented as complete.

The reports folder is a 2 MB tmpfs (``mount -t tmpfs -o size=2m``, root only) and the
case sends thousands of short requests at a scripted server, so requests.jsonl and the
samples fill it. The run must fail naming the full disk, keep ``complete: false`` in a
manifest that still parses, leave no report that claims anything, and leave no agent
running. The mount is removed on every path.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sse_script_server import ScriptServer
from tests.test_plugin import llama_reply
from tests.test_robustness_support import PytestRun, make_project, processes_mentioning

PROFILE = """
name = "disk"
[server]
engine = "llamacpp"
api = "llamacpp"
health_timeout_s = 5
token_id_range = [300, 1000]
[telemetry]
interval_s = 0.1
baseline_s = 0.5
cooldown_s = 0
collectors = ["proc", "cpu", "mem", "disk", "net"]
"""

CASES = """
from strata_plugin.load.workload import Workload

def test_fill(strata):
    strata.run(Workload("fill", isl=8, osl=6, concurrency=4, requests=4000), scale=False)
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "reports"
    mnt.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.root
@pytest.mark.integration
def test_full_results_disk_fails_clearly_and_nothing_claims_completion(tmp_path, small_disk):
    (tmp_path / "proj").mkdir()
    proj = make_project(tmp_path / "proj", CASES)
    (proj / "profile.toml").write_text(PROFILE)
    with ScriptServer(llama_reply) as srv:
        run = PytestRun.start([f"--strata-profile={proj / 'profile.toml'}",
                               f"--strata-server-url={srv.url}",
                               f"--strata-reports-dir={small_disk}", "--strata-run-id=run"],
                              tmp_path / "out.txt", small_disk / "run", cwd=proj)
        rc = run.wait(240)
    out = run.text()
    assert rc != 0, out[-3000:]
    assert "No space left on device" in out, out[-3000:]
    assert "run incomplete: could not write the run folder" in out, out[-3000:]
    m = json.loads((run.run_dir / "manifest.json").read_text())  # still whole JSON
    assert m["complete"] is False  # with its reason (the run kept room aside for it)
    assert "could not write the run folder" in m["incomplete_reason"], m
    report = run.run_dir / "report.md"
    assert not report.exists() or "incomplete" in report.read_text()
    assert not processes_mentioning(str(run.run_dir))

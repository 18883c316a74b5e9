"""A report that cannot be written is a failed run (issue 32, item 3).

The reports folder is a small tmpfs (``mount -t tmpfs``, root only; removed on every
path). The case measures a scripted server, then the disk is filled to a few hundred
bytes short of full: just before the report (every raw file whole), or as the case
ends (its case line with the verdict, the last markers and the end of the manifest no
longer fit). The run must then
fail (pytest exits non-zero although the test's own checks passed) and say why in one
line, with no traceback pile before it; its manifest must say ``complete: false`` with
the reason (a full disk too: the run keeps room aside for it); no raw file may hold half
a line; and the folder, copied to a roomy disk and
reported offline, must say the run is incomplete and why in report.md's first lines,
summary.json and the exit status.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
interval_s = 0.25
baseline_s = 0.3
cooldown_s = 0
collectors = ["proc", "cpu", "mem"]
"""

def _fill_code(free: int) -> str:
    # The run folder may grow between the statvfs and the write: the filler writes in
    # chunks, and where the disk fills first it gives back the room it meant to leave.
    return f"""
def fill(folder):
    st = os.statvfs(folder)
    want = max(0, st.f_bavail * st.f_frsize - {free})
    path = os.path.join(folder, "filler")
    with open(path, "wb", buffering=0) as fh:
        try:
            while want > 0:
                want -= fh.write(b"x" * min(want, 1 << 16))
        except OSError:
            pass
    if want > 0:
        os.truncate(path, max(0, os.path.getsize(path) - {free}))
"""


# When the disk fills: at the case's end (its case line and the run's last manifest and
# markers no longer fit) or just before the report (every raw file is whole). The
# project's conftest times the second: the disk fills at the worst moment for the report.
CASES = """
import os
from strata_plugin.load.workload import Workload
""" + _fill_code(300) + """
def test_then_the_disk_fills(strata):
    r = strata.run(Workload("fill", isl=8, osl=6, concurrency=2, requests=12), scale=False)
    assert r.metrics.n_ok == 12
    if os.environ["FILL_AT"] == "case_end":
        fill(os.environ["FILL_DIR"])
"""
CONFTEST = """
import os
import strata_plugin.report as report
""" + _fill_code(300) + """
if os.environ.get("FILL_AT") == "report":
    from strata_plugin.report.writer import write_report

    def filled_first(run_dir, **kw):
        fill(os.environ["FILL_DIR"])
        return write_report(run_dir, **kw)

    report.write_report = filled_first
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "reports"
    mnt.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


def _whole_lines(path: Path) -> list[dict]:
    """Every line of a JSON-lines file parses and the file ends with a newline."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"{path.name} ends mid-line: {data[-80:]!r}"
    return [json.loads(x) for x in data.splitlines() if x.strip()]


@pytest.mark.root
@pytest.mark.integration
@pytest.mark.parametrize(("fill_at", "why"), [
    # every raw file whole, no room for the report
    ("report", "report failed: OSError: [Errno 28] No space left on device"),
    # no room for the case line with its verdict (it is cut back to the last whole
    # line), the last markers or the end of the manifest (it keeps its last version)
    ("case_end", "could not write the run folder"),
])
def test_a_report_that_cannot_be_written_fails_the_run_in_one_line(tmp_path, small_disk,
                                                                   fill_at, why):
    (tmp_path / "proj").mkdir()
    proj = make_project(tmp_path / "proj", CASES)
    (proj / "conftest.py").write_text(CONFTEST)
    (proj / "profile.toml").write_text(PROFILE)
    with ScriptServer(llama_reply) as srv:
        run = PytestRun.start([f"--strata-profile={proj / 'profile.toml'}",
                               f"--strata-server-url={srv.url}",
                               f"--strata-reports-dir={small_disk}", "--strata-run-id=run"],
                              tmp_path / "out.txt", small_disk / "run", cwd=proj,
                              env={"FILL_DIR": str(small_disk), "FILL_AT": fill_at})
        rc = run.wait(180)
    out = run.text()
    assert rc != 0, out[-3000:]  # a failed report is a failed run
    lines = [x for x in out.splitlines() if "run incomplete:" in x]
    assert len(lines) == 1 and why in lines[0], out[-3000:]
    assert "No space left on device" in lines[0], lines
    assert "Traceback" not in out and "ExceptionGroup" not in out, out[-6000:]
    assert len(out.splitlines()) < 40, out  # no traceback pile before the one line
    # the manifest says why, though the disk is full (the room kept aside for it)
    m = json.loads((run.run_dir / "manifest.json").read_text())
    assert m["complete"] is False and why in m["incomplete_reason"], m
    kind = "report_failed" if fill_at == "report" else "run_folder_failed"
    assert any(r["kind"] == kind for r in m["incomplete_reasons"]), m
    assert not (run.run_dir / ".strata-reserve").exists()
    # no raw file holds half a line: a write that did not fit was cut back whole
    assert len(_whole_lines(run.run_dir / "requests.jsonl")) == 12
    cases = _whole_lines(run.run_dir / "cases.jsonl")
    assert cases and all(c["case_id"] for c in cases)
    assert not (run.run_dir / "report.md").exists()
    assert not processes_mentioning(str(run.run_dir))

    # Copied to a roomy disk, the report is written and says the run is incomplete.
    copy = tmp_path / "copy"
    shutil.copytree(run.run_dir, copy)
    off = subprocess.run([sys.executable, "-m", "strata_plugin", "report", str(copy)],
                         capture_output=True, text=True, check=False, timeout=120)
    assert off.returncode == 1, off.stdout + off.stderr
    assert "run incomplete: " in off.stderr and why in off.stderr, off.stderr
    head = "\n".join((copy / "report.md").read_text().splitlines()[:4])
    assert "**Run incomplete:**" in head and why in head, head
    summary = json.loads((copy / "summary.json").read_text())
    assert summary["outcome"]["complete"] is False
    assert why in summary["outcome"]["incomplete_reason"]

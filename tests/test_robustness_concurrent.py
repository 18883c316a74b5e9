"""Two runs at once: separate run folders, no clobbering.

Two ``pytest`` runs start together against one scripted server and the same reports
folder. With generated run ids each gets its own folder holding exactly its own
requests and a complete manifest. Given the same ``--strata-run-id``, one run wins the
folder and the other stops with a clear error, leaving the winner's files untouched.
"""

from __future__ import annotations

import json

import pytest

from tests.sse_script_server import ScriptServer
from tests.test_plugin import llama_reply
from tests.test_robustness_support import PytestRun, count_lines, make_project

PROFILE = """
name = "twice"
[server]
engine = "llamacpp"
api = "llamacpp"
health_timeout_s = 5
token_id_range = [300, 1000]
[telemetry]
interval_s = 0.1
baseline_s = 0.5
cooldown_s = 0
collectors = ["cpu", "mem"]
"""
N = 40
CASES = f"""
from strata_plugin.load.workload import Workload

def test_load(strata):
    r = strata.run(Workload("load", isl=8, osl=6, concurrency=2, requests={N}), scale=False)
    assert not r.problems, r.problems
"""


def _project(tmp_path):
    (tmp_path / "proj").mkdir()
    proj = make_project(tmp_path / "proj", CASES)
    (proj / "profile.toml").write_text(PROFILE)
    return proj


def _start(proj, tmp_path, reports, url, name, run_id=None):
    args = [f"--strata-profile={proj / 'profile.toml'}", f"--strata-server-url={url}",
            f"--strata-reports-dir={reports}"]
    if run_id:
        args.append(f"--strata-run-id={run_id}")
    return PytestRun.start(args, tmp_path / f"{name}.txt", reports / (run_id or "?"), cwd=proj)


@pytest.mark.integration
def test_two_runs_at_once_get_their_own_folders(tmp_path):
    proj = _project(tmp_path)
    reports = tmp_path / "reports"
    with ScriptServer(llama_reply) as srv:
        runs = [_start(proj, tmp_path, reports, srv.url, name) for name in ("a", "b")]
        codes = [r.wait(120) for r in runs]
    assert codes == [0, 0], [r.text()[-2000:] for r in runs]
    folders = sorted(p for p in reports.iterdir() if p.is_dir())
    assert len(folders) == 2, folders
    for f in folders:
        assert json.loads((f / "manifest.json").read_text())["complete"] is True
        assert count_lines(f / "requests.jsonl") == N
        assert (f / "report.md").exists()
    announced = sorted(next(x.split(": ", 1)[1] for x in r.text().splitlines()
                            if x.startswith("run folder: ")) for r in runs)
    assert announced == [str(f) for f in folders]


@pytest.mark.integration
def test_the_same_run_id_twice_never_shares_a_folder(tmp_path):
    proj = _project(tmp_path)
    reports = tmp_path / "reports"
    with ScriptServer(llama_reply) as srv:
        runs = [_start(proj, tmp_path, reports, srv.url, name, run_id="same")
                for name in ("c", "d")]
        codes = [r.wait(120) for r in runs]
    assert sorted(codes)[0] == 0 and sorted(codes)[1] != 0, codes
    loser = runs[codes.index(max(codes))]
    assert "run folder already exists" in loser.text(), loser.text()[-2000:]
    folder = reports / "same"
    assert json.loads((folder / "manifest.json").read_text())["complete"] is True
    assert count_lines(folder / "requests.jsonl") == N  # the winner's requests only
    assert [p.name for p in reports.iterdir()] == ["same"]

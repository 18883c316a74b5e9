"""API keys: read from the environment variable the profile names, sent to the server,
and written nowhere.

A real llama-server is started by the plugin with ``LLAMA_API_KEY`` in its environment
(llama.cpp then refuses requests without the key); the profile says
``api_key_env = "STRATA_TEST_KEY"``, which holds the same key. The requests must
succeed, which proves the key was sent, and the key's value must appear in no file of
the run folder (manifest, command files, server log, agent files, samples, report), in
the JUnit XML, or in pytest's output. A second run with only the server's variable set
must fail its requests with HTTP 401, so the first run's success is not an accident of
a server that ignores keys.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from tests.test_robustness_support import PytestRun, local_profile, make_project

pytestmark = pytest.mark.integration

CASES = """
from strata_plugin.load.workload import Workload

def test_with_key(strata):
    r = strata.run(Workload("k", isl=16, osl=4, concurrency=2, requests=4), scale=False)
    assert not r.problems, r.problems
"""


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _run(tmp_path: Path, name: str, env: dict[str, str]) -> tuple[PytestRun, Path]:
    proj = tmp_path / "proj"
    if not proj.exists():
        proj.mkdir()
        make_project(proj, CASES)
        local_profile(proj / "profile.toml", baseline_s=0.5, scaled=False,
                      extra_server='api_key_env = "STRATA_TEST_KEY"')
    xml = tmp_path / f"{name}.xml"
    run = PytestRun.start(["-v", "-s", "-rA", f"--strata-profile={proj / 'profile.toml'}",
                           f"--strata-reports-dir={tmp_path / 'reports'}",
                           f"--strata-run-id={name}", f"--junitxml={xml}"],
                          tmp_path / f"{name}.txt", tmp_path / "reports" / name, env=env,
                          cwd=proj)
    return run, xml


def test_api_key_is_used_and_never_written(tmp_path, monkeypatch):
    key = "sk-strata-" + secrets.token_hex(16)
    monkeypatch.delenv("LLAMA_API_KEY", raising=False)
    monkeypatch.delenv("STRATA_TEST_KEY", raising=False)
    run, xml = _run(tmp_path, "with_key", {"LLAMA_API_KEY": key, "STRATA_TEST_KEY": key})
    rc = run.wait(120)
    out = run.text()
    assert rc == 0, out[-3000:]
    records = [json.loads(x) for x in (run.run_dir / "requests.jsonl").read_text().splitlines()]
    assert records and all(r["error"] is None for r in records)
    profile = json.loads((run.run_dir / "manifest.json").read_text())["profile"]
    assert profile["server"]["api_key_env"] == "STRATA_TEST_KEY"  # the name is recorded
    files = _files(run.run_dir)
    assert any(p.name == "server.log" for p in files) and any(
        p.parent.name == "commands" for p in files)
    leaks = [str(p) for p in [*files, xml, run.out] if key.encode() in p.read_bytes()]
    assert not leaks, f"the API key was written to {leaks}"
    assert key not in out

    # Without the client's key the same server refuses: the first run really used it.
    bare, _ = _run(tmp_path, "no_key", {"LLAMA_API_KEY": key})
    bare.proc.wait(120)
    records = [json.loads(x) for x in (bare.run_dir / "requests.jsonl").read_text().splitlines()]
    assert records and {(r["error"] or {}).get("http_status") for r in records} == {401}

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


# --- literal values in the profile's env tables (issue 24) --------------------------------

CANARY = "hf_canary" + "0123456789abcdef" * 2


def _env_profile(proj: Path) -> Path:
    """The local profile with literal values in [server.env] and in a configuration's env.

    The first is llama-server's API key (``LLAMA_API_KEY``): the client sends the same key
    (``api_key_env``), so requests that succeed prove the literal reached the server."""
    local_profile(proj / "profile.toml", baseline_s=0.5, scaled=False, extra_server=(
        'api_key_env = "STRATA_T_KEY"\n'
        f'[server.env]\nLLAMA_API_KEY = "{CANARY}"\n'
        f'[server.configs.default]\nenv = {{ STRATA_T_LITERAL = "{CANARY[::-1]}" }}\n'))
    return proj / "profile.toml"


def _private(run_dir: Path) -> list[str]:
    """Paths under the run folder that someone other than the owner could read or enter."""
    paths = [run_dir, *run_dir.rglob("*")]
    return [f"{p} {oct(p.stat().st_mode & 0o777)}" for p in paths
            if p.stat().st_mode & 0o077 or (p.is_file() and p.stat().st_mode & 0o777 != 0o600)
            or (p.is_dir() and p.stat().st_mode & 0o777 != 0o700)]


def _leaks(run_dir: Path, *extra: Path) -> list[str]:
    files = [*_files(run_dir), *extra]
    return [str(p) for p in files
            if CANARY.encode() in p.read_bytes() or CANARY[::-1].encode() in p.read_bytes()]


def test_public_profile_keeps_env_names_and_drops_their_values(tmp_path):
    from strata_plugin.configure.profile import StrataConfig, load_profile
    from strata_plugin.run.session import public_profile

    p = tmp_path / "p.toml"
    p.write_text(f"""
name = "t"
[server]
engine = "vllm"
api = "chat"
argv = ["vllm", "serve", "{{host}}"]
api_key_env = "STRATA_API_KEY"
[server.env]
HF_TOKEN = "{CANARY}"
[server.container]
runtime = "docker"
image = "vllm/vllm-openai"
env = {{ VLLM_X = "{CANARY}" }}
env_pass = ["HF_HOME"]
[server.configs.a]
env = {{ OMP_NUM_THREADS = "{CANARY}" }}
[server.configs.b]
args = ["-x"]
""")
    prof = load_profile(p)
    cfg = StrataConfig(prof, tmp_path, "r", "", False, None, 10.0, tmp_path)
    rec = public_profile(cfg)
    assert CANARY not in repr(rec)
    s = rec["server"]
    assert s["env"] == ["HF_TOKEN"] and s["configs"]["a"]["env"] == ["OMP_NUM_THREADS"]
    assert s["container"]["env"] == ["VLLM_X"] and s["container"]["env_pass"] == ["HF_HOME"]
    assert s["configs"]["b"] == {"args": ["-x"]} and s["api_key_env"] == "STRATA_API_KEY"
    assert s["argv"] == ["vllm", "serve", "{host}"] and rec["_path"] == str(p)
    assert prof.raw["server"]["env"] == {"HF_TOKEN": CANARY}  # the profile itself is intact
    assert prof.has_env_values
    p.write_text(p.read_text().replace(f'"{CANARY}"', '""'))
    assert not load_profile(p).has_env_values  # names with empty values carry nothing


def test_a_dry_run_with_literal_env_values_writes_none_and_keeps_the_folder_private(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    make_project(proj, CASES)
    profile = _env_profile(proj)
    run = PytestRun.start(["-q", f"--strata-profile={profile}", "--strata-dry-run",
                           f"--strata-reports-dir={tmp_path / 'reports'}",
                           "--strata-run-id=dry"], tmp_path / "dry.txt",
                          tmp_path / "reports" / "dry", cwd=proj)
    assert run.wait(60) == 0, run.text()[-3000:]
    files = _files(run.run_dir)
    assert {"manifest.json", "dry_run.json", "dry_run.md"} <= {p.name for p in files}
    assert any(p.parent.name == "commands" for p in files)
    manifest = json.loads((run.run_dir / "manifest.json").read_text())
    assert manifest["profile"]["server"]["env"] == ["LLAMA_API_KEY"]  # the name stays
    assert not _leaks(run.run_dir, run.out)
    assert not _private(run.run_dir), _private(run.run_dir)


def test_a_dry_run_without_env_values_keeps_the_usual_modes(tmp_path):
    """The boundary: no value in any env table, no reason to change the folder's mode."""
    import os

    proj = tmp_path / "proj"
    proj.mkdir()
    make_project(proj, CASES)
    local_profile(proj / "profile.toml", baseline_s=0.5, scaled=False,
                  extra_server='[server.env]\nEMPTY_ONE = ""\n')
    run = PytestRun.start(["-q", f"--strata-profile={proj / 'profile.toml'}",
                           "--strata-dry-run", f"--strata-reports-dir={tmp_path / 'reports'}",
                           "--strata-run-id=dry"], tmp_path / "dry.txt",
                          tmp_path / "reports" / "dry", cwd=proj)
    assert run.wait(60) == 0, run.text()[-3000:]
    mask = os.umask(0)
    os.umask(mask)
    assert run.run_dir.stat().st_mode & 0o777 == 0o777 & ~mask
    assert (run.run_dir / "manifest.json").stat().st_mode & 0o777 == 0o666 & ~mask


def test_a_real_run_with_literal_env_values_writes_none_and_keeps_the_folder_private(tmp_path):
    """Against the real llama-server: the literal API key reaches the server's environment
    (requests sent with it succeed; without it llama-server answers 401, as
    test_api_key_is_used_and_never_written shows), and no value appears in any file of the
    run folder, binary ones included, nor in pytest's output."""
    proj = tmp_path / "proj"
    proj.mkdir()
    make_project(proj, CASES)
    profile = _env_profile(proj)
    run = PytestRun.start(["-q", "-rA", f"--strata-profile={profile}",
                           f"--strata-reports-dir={tmp_path / 'reports'}",
                           "--strata-run-id=real"], tmp_path / "real.txt",
                          tmp_path / "reports" / "real", cwd=proj,
                          env={"STRATA_T_KEY": CANARY})
    assert run.wait(120) == 0, run.text()[-3000:]
    files = _files(run.run_dir)
    names = {p.name for p in files}
    assert {"manifest.json", "summary.json", "requests.jsonl", "server.log"} <= names, names
    assert any(p.parent.name == "commands" for p in files)
    records = [json.loads(x) for x in (run.run_dir / "requests.jsonl").read_text().splitlines()]
    assert records and all(r["error"] is None for r in records)
    server = json.loads((run.run_dir / "commands" / "server-default.json").read_text())
    assert server["env_names"] == ["LLAMA_API_KEY", "STRATA_T_LITERAL"]
    assert not _leaks(run.run_dir, run.out)
    assert not _private(run.run_dir), _private(run.run_dir)

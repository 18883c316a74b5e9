"""docs/extending.md's plugin package, as a team would ship it: written from the page,
pip-installed with Strata (this checkout) into a fresh virtualenv, and a run that uses
all four of its kinds.

The virtualenv has no system site-packages and nothing of this checkout on its path;
``pip install`` builds Strata and the plugin from their pyproject files and installs
their declared dependencies (from pip's cache when it holds them). The run is a user's
``pytest`` in a repository of theirs against their server (``tests/sse_script_server.py``
in a process of its own, holding most of its file descriptors: 236 of a soft limit of
256), attached with ``--strata-server-url``; in it

* the engine: the profile names ``scripted`` and is accepted; the cold case empties the
  server's prefix cache the engine's way (``POST /flush``);
* the collector: the head node's agent samples the server's descriptors into
  ``nodes/local/samples/fds.csv``;
* the rule: fires on them and its comparison is in the verdict's evidence, with the
  plugin's threshold and source;
* the section: is in report.md, before the thresholds table.

Slow (a virtualenv, two builds, an install: the figures are printed and kept as the
test's properties), so marked ``integration`` and run under the heavy lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest
from plugin_package import doc_block, write_package

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
LIMIT = 256
HELD = 236

SERVER = f"""
import os, resource, sys
sys.path.insert(0, {str(TESTS)!r})
from sse_script_server import Reply, ScriptServer, sse

resource.setrlimit(resource.RLIMIT_NOFILE, ({LIMIT}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
seen = open(sys.argv[1], "a", buffering=1)


def reply(s):
    seen.write(f"{{s.method}} {{s.path}}\\n")
    if s.method == "GET" or s.path == "/flush":
        return Reply([(0.0, b"ok")], framing="length", content_type="text/plain")
    body = s.json
    n_prompt, n_out = len(body["prompt"]), body["max_tokens"]
    items = [(0.02, sse({{"id": "c", "object": "text_completion", "model": "m",
                         "choices": [{{"index": 0, "text": f" t{{i}}", "logprobs": None,
                                      "finish_reason": "length" if i == n_out - 1 else None}}],
                         "usage": None}})) for i in range(n_out)]
    items.append((0.0, sse({{"id": "c", "object": "text_completion", "choices": [],
                            "usage": {{"prompt_tokens": n_prompt, "completion_tokens": n_out,
                                      "total_tokens": n_prompt + n_out}}}})))
    items.append((0.0, sse("[DONE]")))
    return Reply(items)


held = []
while len(os.listdir("/proc/self/fd")) < {HELD} + 1:
    held.append(open(os.devnull))
with ScriptServer(reply) as srv:
    print(srv.url, flush=True)
    sys.stdin.read()
"""

CASES = """
from strata_plugin import Workload


def test_their_case(strata):
    result = strata.run(Workload("fds", isl=16, osl=10, concurrency=2, requests=16),
                        scale=False)
    assert not result.problems, result.problems
"""

PYTEST_INI = """
[pytest]
addopts = -p no:cacheprovider
strata_profile = profiles/scripted.toml
"""


def _profile() -> str:
    """The page's profile, and its telemetry with the plugin's collector, for a server
    that is attached (its argv unused) and a short case."""
    text = doc_block("# profiles/scripted.toml", "toml").replace(
        "[server]\n", "[server]\nmodel_name = \"m\"\nhealth_path = \"/health\"\n"
        "health_timeout_s = 5\ntoken_id_range = [10, 500]\n")
    return text + doc_block("# in the profile", "toml") + (
        "interval_s = 0.1\nbaseline_s = 0\ncooldown_s = 0\n")


@pytest.fixture(scope="module")
def installed(tmp_path_factory, record_testsuite_property) -> Path:
    """A fresh virtualenv with Strata (this checkout) and the page's package installed."""
    tmp = tmp_path_factory.mktemp("plugin-venv")
    pkg = write_package(tmp / "strata-example")
    t0 = time.monotonic()
    venv.create(tmp / "venv", with_pip=True, system_site_packages=False)
    t1 = time.monotonic()
    py = tmp / "venv" / "bin" / "python"
    out = subprocess.run([str(py), "-m", "pip", "install", "--quiet",
                          "--disable-pip-version-check", str(ROOT), str(pkg)],
                         capture_output=True, text=True, timeout=900)
    t2 = time.monotonic()
    assert out.returncode == 0, out.stderr[-3000:]
    figures = {"venv_s": round(t1 - t0, 1), "pip_install_s": round(t2 - t1, 1)}
    for k, v in figures.items():
        record_testsuite_property(f"plugin_package_{k}", v)
    print(f"\nplugin package: fresh virtualenv {figures['venv_s']} s, pip install of Strata "
          f"and the plugin {figures['pip_install_s']} s", file=sys.stderr)
    return py


@pytest.fixture
def their_server(tmp_path):
    log = tmp_path / "seen.log"
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    p = subprocess.Popen([sys.executable, str(script), str(log)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        url = p.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield url, p.pid, log
    finally:
        p.stdin.close()
        p.wait(10)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "MPLCONFIGDIR")}


@pytest.mark.integration
def test_the_package_lists_its_four_plugins(installed, tmp_path):
    out = subprocess.run([str(installed), "-m", "strata_plugin", "plugins"], cwd=tmp_path,
                         capture_output=True, text=True, env=_clean_env(), check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout == doc_block("$ python -m strata_plugin plugins", "text")


@pytest.mark.integration
def test_a_run_uses_all_four(installed, their_server, tmp_path, record_property):
    url, server_pid, seen = their_server
    repo = tmp_path / "their-repo"
    (repo / "profiles").mkdir(parents=True)
    (repo / "benchmarks").mkdir()
    (repo / "pytest.ini").write_text(PYTEST_INI)
    (repo / "profiles" / "scripted.toml").write_text(_profile())
    (repo / "benchmarks" / "test_serving.py").write_text(CASES)
    t0 = time.monotonic()
    run = subprocess.run([str(installed), "-m", "pytest", "benchmarks",
                          f"--strata-server-url={url}", "--strata-run-id=theirs"],
                         cwd=repo, env=_clean_env(), capture_output=True, text=True,
                         timeout=300)
    record_property("plugin_run_s", round(time.monotonic() - t0, 1))
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    run_dir = repo / "reports" / "theirs"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["complete"] is True

    # the engine: accepted, and its flush used for the cold case
    assert manifest["profile"]["server"]["engine"] == "scripted"
    paths = seen.read_text().splitlines()
    assert "POST /flush" in paths and paths.count("POST /v1/completions") == 16

    # the collector: the head node's agent sampled the server's descriptors
    rows = (run_dir / "nodes" / "local" / "samples" / "fds.csv").read_text().splitlines()
    mine = [r.split(",") for r in rows[1:] if f",fds,pid{server_pid}," in r]
    assert len(mine) >= 10
    opened = [float(r[5]) for r in mine if r[4] == "fds_open"]
    assert {float(r[5]) for r in mine if r[4] == "fds_max"} == {LIMIT}
    assert HELD <= max(opened) < LIMIT

    # the rule: fired, its comparison in the verdict's evidence
    (case,) = json.loads((run_dir / "summary.json").read_text())["cases"]
    verdict = case["verdict"]
    assert case["signals"]["fd_used_frac"] >= HELD / LIMIT
    assert "fd_exhaustion" in (*verdict["classes"], *verdict["also_flagged"]), verdict
    (ev,) = [e for e in verdict["evidence"] if e["cls"] == "fd_exhaustion"]
    assert (ev["metric"], ev["op"], ev["threshold"], ev["threshold_value"], ev["met"]) == (
        "fd_used_frac", ">=", "fd_used_frac", 0.9, True)
    assert ev["source"].startswith("[inferred] getrlimit(2), RLIMIT_NOFILE")

    # the section: in report.md, before the thresholds table
    report = (run_dir / "report.md").read_text()
    at = report.index("\n## File descriptors\n")
    assert at < report.index("\n## Thresholds\n")
    assert f"| pid{server_pid} | " in report[at:]
    assert "fd_exhaustion" in report[:at]  # the verdict, in the cases above it

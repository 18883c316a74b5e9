"""Strata as a user gets it: a wheel, installed into a fresh virtualenv, in a repository
that is not this one.

(a) An unrelated test suite passes and the plugin leaves no trace (no run folder, no
    profile read); (b) a case file written against the public API, with its own profile,
    runs against a scripted OpenAI-compatible server through ``--strata-server-url``, is
    selected with ``-k`` and ``-m``, and writes JUnit properties and a report.

The fresh virtualenv has no system site-packages and nothing from this checkout on its
path: a dependency the wheel forgets to declare fails here. Slow (a wheel build and an
install, about a minute with a warm pip cache), so it runs once per session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.sse_script_server import Reply, ScriptServer, Seen, sse

ROOT = Path(__file__).resolve().parents[1]

PROFILE = """
name = "their-vllm"
[server]
engine = "vllm"
api = "completions"
model_name = "their-model"
health_path = "/health"
health_timeout_s = 5
token_id_range = [10, 500]
[telemetry]
interval_s = 0.1
baseline_s = 0
cooldown_s = 0
collectors = ["cpu", "mem"]
"""

PYTEST_INI = """
[pytest]
addopts = -p no:cacheprovider
markers =
    latency: their own marker for latency cases
strata_profile = profiles/their-vllm.toml
"""

CASES = """
import pytest
from strata_plugin import Workload

@pytest.mark.latency
def test_short_prompt(strata):
    result = strata.run(Workload("short", isl=16, osl=4, concurrency=2, requests=4),
                        scale=False)
    assert not result.problems, result.problems
    assert result.metrics.ttft.p50 > 0
    assert len(result.records) == 4

def test_other_case(strata):
    strata.run(Workload("other", isl=8, osl=4, requests=1), scale=False)
"""

UNRELATED = """
import signal

def test_arithmetic():
    assert 1 + 1 == 2

def test_no_signal_handler_was_installed():
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
"""


def completions_reply(seen: Seen) -> Reply:
    """/v1/completions as vLLM streams it: one token per event, then usage, then [DONE]."""
    if seen.method == "GET" or seen.path == "/reset_prefix_cache":  # health, cache flush
        return Reply([(0.0, b"ok")], framing="length", content_type="text/plain")
    body = seen.json
    n_prompt, n_out = len(body["prompt"]), body["max_tokens"]
    items = [(0.01 if i == 0 else 0.004, sse({
        "id": "c", "object": "text_completion", "model": body.get("model", ""),
        "choices": [{"index": 0, "text": f" t{i}", "logprobs": None,
                     "finish_reason": "length" if i == n_out - 1 else None}],
        "usage": None})) for i in range(n_out)]
    items.append((0.001, sse({"id": "c", "object": "text_completion", "choices": [],
                              "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                                        "total_tokens": n_prompt + n_out}})))
    items.append((0.0, sse("[DONE]")))
    return Reply(items)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtualenv with Strata installed from a wheel built from this checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--wheel-dir", str(tmp / "dist"), str(ROOT)],
                   check=True, timeout=300)
    wheels = list((tmp / "dist").glob("strata-*.whl"))
    assert len(wheels) == 1, wheels
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    py = env_dir / "bin" / "python"
    out = subprocess.run([str(py), "-m", "pip", "install", "--quiet",
                          "--disable-pip-version-check", str(wheels[0])],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return py


def _repo(tmp: Path) -> Path:
    repo = tmp / "their-repo"
    (repo / "profiles").mkdir(parents=True)
    (repo / "benchmarks").mkdir()
    (repo / "pytest.ini").write_text(PYTEST_INI)
    (repo / "profiles" / "their-vllm.toml").write_text(PROFILE)
    (repo / "benchmarks" / "test_serving.py").write_text(CASES)
    (repo / "test_unrelated.py").write_text(UNRELATED)
    return repo


def _pytest(py: Path, repo: Path, *args: str, home: Path | None = None
            ) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "MPLCONFIGDIR", "STRATA_CACHE")}
    if home is not None:
        env["HOME"] = str(home)
    return subprocess.run([str(py), "-m", "pytest", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.integration
def test_the_wheel_holds_the_plugin_alone(installed):
    site = subprocess.run([str(installed), "-c", "import strata_plugin, sys; "
                           "print(strata_plugin.__file__)"], capture_output=True, text=True,
                          check=True, cwd="/").stdout.strip()
    assert "site-packages" in site and str(ROOT) not in site
    listing = subprocess.run([str(installed), "-m", "pip", "show", "-f", "strata"],
                             capture_output=True, text=True, check=True).stdout
    assert "strata_plugin/profiles/local.toml" in listing
    for stray in ("cases/", "fixtures/", "tests/", "reports/"):
        assert f"  {stray}" not in listing, f"{stray} shipped in the wheel"


@pytest.mark.integration
def test_an_unrelated_suite_is_untouched(installed, tmp_path):
    repo = _repo(tmp_path)
    run = _pytest(installed, repo, "test_unrelated.py", "-v")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "plugins:" in run.stdout and "strata-" in run.stdout  # loaded, through the entry point
    assert "2 passed" in run.stdout
    assert not (repo / "reports").exists()
    # a broken profile is not even read when no Strata fixture is used
    (repo / "profiles" / "their-vllm.toml").write_text("this is not toml = = =")
    run = _pytest(installed, repo, "test_unrelated.py")
    assert run.returncode == 0, run.stdout + run.stderr
    assert _pytest(installed, repo, "--help").returncode == 0
    assert not (repo / "reports").exists()


@pytest.mark.integration
def test_their_case_runs_against_their_server(installed, tmp_path):
    repo = _repo(tmp_path)
    xml = repo / "junit.xml"
    home = tmp_path / "home"
    home.mkdir()
    with ScriptServer(completions_reply) as srv:
        run = _pytest(installed, repo, "benchmarks", "-k", "short", "-m", "latency",
                      f"--strata-server-url={srv.url}", f"--junitxml={xml}",
                      "--strata-run-id=theirs", home=home)
        prompts = [s.json["prompt"] for s in srv.seen if s.path == "/v1/completions"]
        flushes = [s.path for s in srv.seen if s.path == "/reset_prefix_cache"]
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed, 1 deselected" in run.stdout
    assert len(prompts) == 4 and all(len(p) == 16 for p in prompts)  # exact token-ID prompts
    assert flushes == ["/reset_prefix_cache"]  # vLLM's prefix cache emptied for the cold case
    assert all(10 <= t < 500 for p in prompts for t in p)
    props = {p.get("name"): p.get("value") for p in ET.parse(xml).getroot().iter("property")}
    assert props["strata_run_id"] == "theirs" and props["strata_profile"] == "their-vllm"
    assert props["n_ok"] == "4" and props["n_errors"] == "0"
    run_dir = repo / "reports" / "theirs"
    assert (run_dir / "report.md").read_text().startswith("#")
    assert json.loads((run_dir / "manifest.json").read_text())["complete"] is True
    # Outside their repository, only Strata's cache was written (matplotlib's font cache).
    written = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())
    assert written and all(w.startswith(".cache/strata/") for w in written), written

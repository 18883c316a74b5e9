"""An ad-hoc workload from the command line: --strata-workload and `python -m strata_plugin
bench`, against a scripted OpenAI-compatible server and against the real llama-server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from strata_plugin.load.workload_spec import WorkloadSpecError, parse_workload
from strata_plugin.plugin.bench_cli import pytest_args
from tests.sse_script_server import ScriptServer
from tests.test_packaging import completions_reply

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
SPEC = "isl=256,osl=64,concurrency=4,requests=40"
OTHER = "def test_the_repository_matrix():\n    raise AssertionError('must not run')\n"


def test_parse_the_issue_example():
    w = parse_workload(SPEC)
    assert (w.name, w.isl, w.osl, w.concurrency, w.requests) == ("adhoc", 256, 64, 4, 40)
    w = parse_workload("isl=8, osl=2, arrival=poisson, rate=2.5, expect_stop=true, name=x")
    assert (w.arrival, w.rate, w.expect_stop, w.name) == ("poisson", 2.5, True, "x")


@pytest.mark.parametrize("text, message", [
    ("isl=8,osl=2,isll=3", "unknown key 'isll'; the keys are"),
    ("isl=8,osl=two", "osl=two: expected an integer"),
    ("isl=8,osl=2,rate=fast,arrival=poisson", "rate=fast: expected a number"),
    ("isl=8", "missing osl"),
    ("isl=8,osl=2,concurrency=0", "concurrency/requests must be >= 1"),
    ("isl=8,osl=2,arrival=poisson", "an open-loop arrival needs rate > 0"),
    ("isl=8,osl", "'osl': expected key=value"),
    ("isl=8,osl=2,expect_stop=maybe", "expected true or false"),
])
def test_bad_specs_say_what_is_wrong(text, message):
    with pytest.raises(WorkloadSpecError, match=re.escape(message)):
        parse_workload(text)


def test_bench_arguments_are_the_pytest_options():
    assert pytest_args(["http://h:1", "--workload", SPEC, "--api", "completions",
                        "--run-id", "b", "--", "-x"]) == [
        "-p", "no:cacheprovider", "--strata-server-url=http://h:1",
        f"--strata-workload={SPEC}", "--strata-api=completions", "--strata-run-id=b", "-x"]


@pytest.fixture
def project(pytester, monkeypatch):
    """A repository with a test of its own and no Strata profile (the packaged default)."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeini(f"[pytest]\nstrata_reports_dir = {pytester.path / 'reports'}\n")
    pytester.makepyfile(test_theirs=OTHER)
    return pytester


def _peak_in_flight(seen) -> int:
    """Most completions streams open at once (the agent's GET /metrics not counted)."""
    edges = sorted(e for s in seen if s.method == "POST"
                   for e in ((s.received_ns, 1), (s.sent_ns[-1], -1)))
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def _last_case(run: Path) -> dict:
    """cases.jsonl's last line (a case is written when run, again with its outcome)."""
    lines = [json.loads(x) for x in (run / "cases.jsonl").read_text().splitlines()]
    assert {c["case_id"] for c in lines} == {"adhoc"}
    return lines[-1]


def _check_run(run: Path, seen) -> None:
    posts = [s for s in seen if s.method == "POST"]
    assert len(posts) == 40
    assert {s.path for s in posts} == {"/v1/completions"}
    assert all(len(s.json["prompt"]) == 256 and s.json["max_tokens"] == 64 for s in posts)
    case = _last_case(run)
    assert case["case_id"] == "adhoc" and case["api"] == "completions"
    assert (case["params"]["isl"], case["params"]["osl"], case["params"]["concurrency"]) == (
        256, 64, 4)
    assert case["scaled_from"] is None  # the workload as stated: the profile's [scale] not applied
    assert case["headline"]["n_ok"] == 40 and case["headline"]["n_errors"] == 0
    assert (run / "report.md").read_text().startswith("#")
    assert "strata_ttft_p50_seconds" in (run / "metrics.txt").read_text()
    assert json.loads((run / "manifest.json").read_text())["complete"] is True


@pytest.mark.integration
def test_pytest_option_runs_the_generated_case_alone(project):
    with ScriptServer(completions_reply) as srv:
        result = project.runpytest_subprocess(
            "-p", "no:cacheprovider", f"--strata-server-url={srv.url}",
            "--strata-api=completions", f"--strata-workload={SPEC}", "--strata-run-id=a1")
        seen = list(srv.seen)
    result.assert_outcomes(passed=1)
    assert _peak_in_flight(seen) == 4  # the concurrency asked for, held
    _check_run(project.path / "reports" / "a1", seen)


@pytest.mark.integration
def test_generated_case_runs_beside_paths_given(project):
    project.makepyfile(test_mine="def test_mine():\n    pass\n")
    with ScriptServer(completions_reply) as srv:
        result = project.runpytest_subprocess(
            "-p", "no:cacheprovider", "test_mine.py", f"--strata-server-url={srv.url}",
            "--strata-api=completions", "--strata-workload=isl=8,osl=2,requests=2",
            "--strata-run-id=a2", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_mine.py::test_mine PASSED*",
                                 "*::test_strata_workload PASSED*"])


@pytest.mark.integration
def test_without_the_option_nothing_is_generated(project):
    project.makepyfile(test_theirs="def test_x():\n    pass\n")
    result = project.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert not (project.path / "reports").exists()


@pytest.mark.integration
def test_bad_workload_or_api_is_a_usage_error(project):
    result = project.runpytest_subprocess("-p", "no:cacheprovider",
                                          "--strata-workload=isl=8,osl=2,isll=3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--strata-workload: unknown key 'isll'" in result.stderr.str()
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "--strata-server-url=http://127.0.0.1:9",
        "--strata-api=openai", "--strata-workload=isl=8,osl=2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--strata-api 'openai': expected one of chat, completions" in result.stderr.str()


@pytest.mark.integration
def test_bench_command_writes_the_same_run(tmp_path):
    (tmp_path / "test_theirs.py").write_text(OTHER)
    with ScriptServer(completions_reply) as srv:
        out = subprocess.run(
            [sys.executable, "-m", "strata_plugin", "bench", srv.url, "--api", "completions",
             "--workload", SPEC, "--reports-dir", str(tmp_path / "reports"), "--run-id", "b1"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300)
        seen = list(srv.seen)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "1 passed" in out.stdout
    _check_run(tmp_path / "reports" / "b1", seen)
    # The results on the terminal: the table's header, the case's row, the report's path.
    lines = out.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("case "))
    assert lines[head].split() == ["case", "verdict", "ok/total", "output", "tok/s",
                                   "TTFT", "p50/p95", "ms", "TPOT", "p50/p95", "ms"]
    row = lines[head + 2].split()
    assert row[0] == "adhoc" and "40/40" in row
    assert f"report: {tmp_path / 'reports' / 'b1' / 'report.md'}" in lines
    assert "Warning" not in out.stdout + out.stderr  # no warning of Strata's own making


#: A scripted server in a process of its own whose command line names its model as
#: llama-server's does (``-m FILE``): what Strata reads of an attached server on this
#: machine (the listener's argv: its model file and KV cache type).
SERVE = """
import sys
from tests.sse_script_server import ScriptServer
from tests.test_packaging import completions_reply
with ScriptServer(completions_reply) as srv:
    print(srv.url, flush=True)
    sys.stdin.read()  # serves until the test closes stdin
"""


@pytest.mark.integration
def test_a_bench_run_has_its_roofline_per_case(tmp_path):
    """An attached (bench) run: the model's facts are recorded under the configuration its
    cases carry (``attached``), so its case is held against the roofline: report.md's
    section has the case's row and summary.json its figures, from the model's file."""
    from strata_plugin.embedded import make_model

    model = tmp_path / "m.gguf"
    assert make_model.main(["--out", str(model), "--dim", "64", "--layers", "2", "--heads",
                            "4", "--ff", "96", "--vocab", "512"]) == 0
    server = subprocess.Popen([sys.executable, "-c", SERVE, "-m", str(model)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        out = subprocess.run(
            [sys.executable, "-m", "strata_plugin", "bench", url, "--api", "completions",
             "--workload", "isl=32,osl=8,concurrency=2,requests=6",
             "--reports-dir", str(tmp_path / "reports"), "--run-id", "r1"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run = tmp_path / "reports" / "r1"
    manifest = json.loads((run / "manifest.json").read_text())
    assert list(manifest["roofline"]) == ["attached"]
    assert manifest["roofline"]["attached"]["model"]["facts"]["layers"]["value"] == 2
    (case,) = json.loads((run / "summary.json").read_text())["cases"]
    assert case["config_id"] == "attached"
    roof = case["roofline"]
    assert roof is not None and roof["model"] == str(model)
    assert roof["decode"] is not None and roof["decode"]["flops"] > 0, json.dumps(roof)
    text = (run / "report.md").read_text()
    sec = text[text.index("\n## Roofline\n"):text.index("<details><summary>The model's facts")]
    assert re.search(r"^(\| `adhoc` \| (decode|prefill) \||- `adhoc`: device limits)", sec,
                     re.M), sec


@pytest.mark.integration
def test_the_run_folder_stays_where_pytest_runs_whatever_the_profile_path(
        pytester, monkeypatch, tmp_path_factory):
    """``--strata-profile /elsewhere/p.toml``, the path a separate argument: pytest takes
    an existing path among the arguments as a hint for its rootdir before Strata's options
    are known (and then finds no configuration file there). The run folder is still the
    invoking project's ``reports/``, not one beside the profile or above it."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeini("[pytest]\n")  # the project's: no strata_reports_dir, the default
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # beside the project, not in it
    profile = elsewhere / "p.toml"
    profile.write_text((ROOT / "strata_plugin" / "profiles" / "local.toml").read_text())
    with ScriptServer(completions_reply) as srv:
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", f"--strata-server-url={srv.url}",
            "--strata-api=completions", "--strata-workload=isl=8,osl=2,requests=2",
            "--strata-run-id=p1", "--strata-profile", str(profile))
    result.assert_outcomes(passed=1)
    assert (pytester.path / "reports" / "p1" / "report.md").is_file()
    manifest = json.loads((pytester.path / "reports" / "p1" / "manifest.json").read_text())
    assert manifest["profile"]["_path"] == str(profile)
    assert not [p for p in (elsewhere, elsewhere.parent) if (p / "reports").exists()]


def test_the_invoking_root_is_not_pytests_guess_from_a_profile_path(pytester,
                                                                    tmp_path_factory):
    """pytest's own configuration of such a command line (parsed, nothing run): its
    rootdir is guessed from the profile's path; Strata's root is the project's folder,
    the nearest one from where pytest runs that holds a pytest configuration."""
    from strata_plugin.plugin.options import invoking_root

    elsewhere = tmp_path_factory.mktemp("elsewhere")
    profile = elsewhere / "p.toml"
    profile.write_text("")
    sub = pytester.mkdir("sub")
    pytester.makefile(".ini", tox="[tox]\nenvlist = py311\n[pytest]\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(sub)
        guessed = pytester.parseconfig("--strata-profile", str(profile))
        assert guessed.inipath is None and guessed.rootpath not in (pytester.path, sub)
        assert invoking_root(guessed) == pytester.path
        given = pytester.parseconfig(f"--strata-profile={profile}")
        assert given.inipath == pytester.path / "tox.ini"
        assert invoking_root(given) == pytester.path
        (pytester.path / "tox.ini").write_text("[tox]\nenvlist = py311\n")  # not pytest's
        assert invoking_root(pytester.parseconfig("--strata-profile", str(profile))) == sub


def test_bench_without_a_workload_says_so(tmp_path):
    out = subprocess.run([sys.executable, "-m", "strata_plugin", "bench", "http://x:1"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--workload" in out.stderr


@pytest.mark.integration
def test_against_the_real_llama_server(tmp_path):
    """The issue's command on the embedded target (llama-server's /v1/completions), with
    fewer output tokens and requests so it stays short on a shared 2-core machine."""
    reports = tmp_path / "reports"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--strata-api=completions",
         "--strata-workload=isl=256,osl=8,concurrency=4,requests=8",
         f"--strata-reports-dir={reports}", "--strata-run-id=real"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "1 passed" in out.stdout
    run = reports / "real"
    case = _last_case(run)
    assert case["api"] == "completions" and case["headline"]["n_ok"] == 8
    records = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    measured = [r for r in records if r["phase"] == "measured"]
    assert len(measured) == 8
    assert {(r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"]) for r in measured} == {
        (256, 8)}
    assert (run / "report.md").exists() and (run / "bencher.json").exists()

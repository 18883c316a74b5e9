"""What a run prints on the terminal: the results table, the live progress line, the
skipped cases and why, a misspelled configuration id as an error, no warning of ours."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata_plugin.plugin.progress import ProgressLine, in_ci, progress_mode
from strata_plugin.report.terminal import results_table, short_case_ids
from tests.sse_script_server import ScriptServer
from tests.test_packaging import completions_reply

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]


def _effect(metric, change, lo, hi, n=2):
    return {"metric": metric, "change_pct": change, "ci_lo_pct": lo, "ci_hi_pct": hi,
            "n_control": n, "n_treatment": n, "unit": "repetition", "method": "t-interval",
            "level": 0.95}


SUMMARY = {
    "cases": [
        {"case_id": "cases/test_matrix.py::test_decode[default-decode_c4]",
         "metrics": {"n_ok": 40, "n_requests": 40, "output_tok_s": 123.456, "ttft_p50_ms": 12.3,
                     "ttft_p95_ms": 45.6, "tpot_p50_ms": 7.1, "tpot_p95_ms": 9.99},
         "verdict": {"summary": "cpu_compute"}},
        {"case_id": "cases/test_matrix.py::test_failing",
         "metrics": {"n_ok": 0, "n_requests": 4},
         "verdict": {"summary": "requests_failed"}},
    ],
    "ab": [{"group": "prefill_batch", "effects": [{
        "control_arm": "default", "treatment_arm": "ub128",
        "effects": [_effect("ttft_p50_ms", 12.34, 3.2, 20.1),
                    _effect("output_tok_s", -1.0, None, None, 1),
                    _effect("e2e_p95_ms", 5.0, 1.0, 9.0)]}]}],
}


def test_the_results_table_is_a_function_of_the_analysed_cases():
    text = results_table(SUMMARY, "reports/r/report.md")
    lines = text.splitlines()
    assert lines[0].split() == ["case", "verdict", "ok/total", "output", "tok/s", "TTFT",
                                "p50/p95", "ms", "TPOT", "p50/p95", "ms"]
    assert lines[2].split() == ["test_decode[default-decode_c4]", "cpu_compute", "40/40",
                                "123.5", "12.3", "/", "45.6", "7.1", "/", "9.99"]
    assert lines[3].split() == ["test_failing", "requests_failed", "0/4", "-", "-", "-"]
    ab = [line for line in lines if line.startswith("prefill_batch")]
    # The table's own metrics only (e2e is in report.md), each with its interval or why not.
    assert [line.split()[5:7] for line in ab] == [["tok/s", "-1.0%"], ["p50", "+12.3%"]]
    assert ab[0].endswith("no interval (1/1 repetitions)")
    assert ab[1].endswith("[+3.2%, +20.1%] 95% t-interval, 2/2 repetitions")
    assert lines[-1] == "report: reports/r/report.md"
    assert results_table({"cases": []}, "r.md").startswith("no case was measured\n")


def test_case_ids_lose_their_path_only_where_that_stays_unique():
    ids = ["cases/a.py::test_x[p]", "cases/b.py::test_x[p]", "cases/a.py::test_y"]
    assert short_case_ids(ids) == {"cases/a.py::test_x[p]": "cases/a.py::test_x[p]",
                                   "cases/b.py::test_x[p]": "cases/b.py::test_x[p]",
                                   "cases/a.py::test_y": "test_y"}


@pytest.mark.parametrize("setting, tty, ci, quiet, mode", [
    ("auto", True, False, False, "live"),
    ("auto", False, False, False, "off"),  # piped to a file or a CI log
    ("auto", True, True, False, "off"),  # CI with a pseudo-terminal
    ("auto", True, False, True, "off"),  # -q
    ("on", False, True, False, "lines"),  # asked for in a CI log
    ("on", True, False, True, "live"),
    ("off", True, False, False, "off"),
])
def test_progress_mode(setting, tty, ci, quiet, mode):
    assert progress_mode(setting, isatty=tty, ci=ci, quiet=quiet) == mode


def test_ci_is_recognised_from_the_environment():
    assert in_ci({"CI": "true"}) and in_ci({"CI": "1"}) and in_ci({"CI_NO_PROGRESS": "1"})
    assert not in_ci({}) and not in_ci({"CI": "false"}) and not in_ci({"CI": "0"})


class _Terminal:
    """A terminal reporter's writing methods, recording what reaches the screen."""

    def __init__(self):
        self.out: list[str] = []

    def ensure_newline(self):
        self.out.append("<nl?>")

    def write(self, text, flush=False):
        self.out.append(text)

    def rewrite(self, text, erase=False):
        self.out.append("\r" + text)

    def write_line(self, text):
        self.out.append(text + "\n")

    def flush(self):
        pass


class _Capture:
    """CaptureManager's suspension, counted (the line is written with capture off)."""

    def __init__(self):
        self.suspended = 0

    def global_and_fixture_disabled(self):
        import contextlib

        @contextlib.contextmanager
        def off():
            self.suspended += 1
            yield

        return off()


def test_a_live_line_is_rewritten_in_place_and_ended_once():
    tr, cap = _Terminal(), _Capture()
    line = ProgressLine(tr, cap, "live", "test_x")
    line("1/4 requests", False)
    line("2/4 requests", False)
    line("4/4 requests", True)
    assert tr.out == ["<nl?>", "  [strata test_x] 1/4 requests", "\r  [strata test_x] 2/4 requests",
                      "\r  [strata test_x] 4/4 requests (done)", "\n"]
    assert cap.suspended == 3  # every write past pytest's capture


def test_log_lines_are_spaced_out_and_the_final_count_always_shows():
    tr = _Terminal()
    line = ProgressLine(tr, None, "lines", "t")
    for i in range(5):
        line(f"{i}/9 requests", False)
    line("9/9 requests", True)
    assert tr.out == ["  [strata t] 0/9 requests\n", "  [strata t] 9/9 requests (done)\n"]


#: As ``python -m strata_plugin bench`` runs pytest: the package imported first, then pytest
#: marking it for assertion rewriting, as it does for an installed (wheel) plugin's
#: package (an editable install is not marked, so a plain run of bench here would not
#: show it). ``json`` is marked too: a module without the opt-out warns.
BENCH_LIKE = """
import json, sys
import strata_plugin
import pytest

class MarkLikeAnInstalledPlugin:
    def pytest_configure(self, config):
        config.pluginmanager.rewrite_hook.mark_rewrite("strata_plugin", "json")

sys.exit(pytest.main(["-p", "no:cacheprovider", "-q"], plugins=[MarkLikeAnInstalledPlugin()]))
"""


def test_pytest_does_not_warn_about_rewriting_the_package_bench_imported(tmp_path):
    """Every `strata bench` printed PytestAssertRewriteWarning ("Module already imported so
    cannot be rewritten; strata_plugin"): bench imports the package before pytest starts."""
    import subprocess
    import sys

    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    out = subprocess.run([sys.executable, "-c", BENCH_LIKE], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={**__import__("os").environ,
                                                      "PYTHONPATH": str(ROOT)})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "cannot be rewritten; json" in text  # the check sees the warning where it is due
    assert "cannot be rewritten; strata_plugin" not in text, text


CASES = '''
import pytest
from strata_plugin import Workload

W = Workload("w", isl=8, osl=2, requests=2, warmups=0)

@pytest.mark.strata_configs("other", optional=True)
def test_needs_other(strata):
    strata.run(W, scale=False)

def test_plain(strata):
    strata.run(W, scale=False)
'''
PROFILE = '''
name = "p"
[server]
engine = "vllm"
api = "completions"
argv = []
[telemetry]
interval_s = 0.2
baseline_s = 0
cooldown_s = 0
collectors = ["cpu"]
'''


@pytest.fixture
def project(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("CI_NO_PROGRESS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    (pytester.path / "p.toml").write_text(PROFILE)
    pytester.makeini(f"[pytest]\nstrata_profile = p.toml\n"
                     f"strata_reports_dir = {pytester.path / 'reports'}\n")
    pytester.makepyfile(test_cases=CASES)
    return pytester


@pytest.mark.integration
def test_the_summary_names_skipped_cases_prints_the_table_and_progress(project):
    """Without -s and without -rs: each skipped case and why, the results table, and (asked
    for, output not a terminal) the progress line written past the capture."""
    with ScriptServer(completions_reply) as srv:
        quiet = project.runpytest_subprocess("-p", "no:cacheprovider", "--strata-run-id=q",
                                             f"--strata-server-url={srv.url}")
        shown = project.runpytest_subprocess("-p", "no:cacheprovider", "--strata-run-id=s",
                                             f"--strata-server-url={srv.url}",
                                             "--strata-progress=on")
    quiet.assert_outcomes(passed=1, skipped=1)
    out = quiet.stdout.str()
    assert ("skipped test_cases.py::test_needs_other[missing-config]: profile p has no "
            "configuration other (it has default) for this test") in out
    assert "[strata " not in out  # auto, not a terminal: no progress line
    table = out[out.index("\ncase "):]
    assert "test_plain" in table and "2/2" in table
    assert f"report: {project.path / 'reports' / 'q' / 'report.md'}" in table
    shown.assert_outcomes(passed=1, skipped=1)
    shown.stdout.fnmatch_lines(["  ?strata test_plain? 2/2 requests, * req/s, 0 errors, * "
                                "output tok/s (done)"])


@pytest.mark.integration
def test_a_config_id_no_configuration_has_is_an_error(project):
    project.makepyfile(test_typo='''
import pytest

@pytest.mark.strata_blocks("default", "defualt")
def test_ab(strata):
    pass
''')
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "test_typo.py",
                                          "--strata-server-url=http://127.0.0.1:9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: test_typo.py::test_ab: strata_blocks(...) names 'defualt', which the profile "
        "has no configuration of (it has default); fix the id, or mark the test "
        "strata_blocks(..., optional=True)*"])

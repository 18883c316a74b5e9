"""The plugin as users drive it, through pytester: markers, -k, JUnit, attach, dry run."""

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.sse_script_server import Reply, ScriptServer, Seen, sse

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

PROFILE = """
name = "attach-test"
[server]
engine = "llamacpp"
api = "llamacpp"
health_timeout_s = 5
token_id_range = [300, 1000]
[telemetry]
interval_s = 0.1
baseline_s = 0
cooldown_s = 0
collectors = ["proc", "cpu", "mem"]
"""

CASES = """
import pytest
from strata_plugin.load.workload import Workload

@pytest.mark.prefill
def test_prefill(strata):
    r = strata.run(Workload("p", isl=64, osl=1, requests=2), scale=False)
    assert not r.problems, r.problems

@pytest.mark.decode
def test_decode(strata):
    r = strata.run(Workload("d", isl=8, osl=6, concurrency=2, requests=4), scale=False)
    assert not r.problems, r.problems

@pytest.mark.decode
def test_decode_wrong_length(strata):
    # The fake server answers 6 tokens; asking for 9 must fail with the numbers.
    r = strata.run(Workload("d", isl=8, osl=9, requests=1), scale=False)
    assert not r.problems, r.problems
"""


def llama_reply(seen: Seen) -> Reply:
    """A llama.cpp /completion stream: n_predict tokens (6 at most) 5 ms apart, then timings."""
    if seen.method == "GET":
        return Reply([(0.0, b"ok")], framing="length", content_type="text/plain")
    body = seen.json
    n_prompt, n_out = len(body["prompt"]), min(6, body["n_predict"])
    items = [(0.01 if i == 0 else 0.005, sse({"content": "ab", "tokens": [400 + i], "stop": False}))
             for i in range(n_out)]
    items.append((0.005, sse({
        "content": "", "stop": True, "stop_type": "limit", "tokens_evaluated": n_prompt,
        "tokens_predicted": n_out, "tokens_cached": 0,
        "timings": {"prompt_n": n_prompt, "prompt_ms": 10.0, "predicted_n": n_out,
                    "predicted_ms": 25.0, "cache_n": 0}})))
    return Reply(items)


@pytest.fixture
def project(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest('"""Strata loads through its entry point."""\n')
    pytester.makeini(f"""
[pytest]
markers =
    prefill: p
    decode: d
strata_profile = {pytester.path / "profile.toml"}
strata_reports_dir = {pytester.path / "reports"}
""")
    (pytester.path / "profile.toml").write_text(PROFILE)
    pytester.makepyfile(test_cases=CASES)
    return pytester


@pytest.mark.integration
def test_attach_select_and_junit(project):
    with ScriptServer(llama_reply) as srv:
        xml = project.path / "junit.xml"
        result = project.runpytest_subprocess(
            "-k", "prefill or decode", "-p", "no:cacheprovider",
            f"--strata-server-url={srv.url}", f"--junitxml={xml}", "--strata-run-id=r1")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*completion tokens 6 != OSL 9*"])
    root = ET.parse(xml).getroot()
    suite = {p.get("name"): p.get("value")
             for p in root.find("testsuite").find("properties").iter("property")}
    assert suite["strata_run_id"] == "r1" and suite["strata_profile"] == "attach-test"
    cases = {c.get("name"): c for c in root.iter("testcase")}
    props = {p.get("name"): p.get("value")
             for p in cases["test_decode"].iter("property")}
    assert props["n_ok"] == "4" and props["n_errors"] == "0"
    assert props["case_id"] == "test_cases.py::test_decode"  # the node id; attached: no config
    assert float(props["tpot_p50_ms"]) == pytest.approx(5.0, abs=2.5)
    assert props["strata_run_dir"].endswith("r1")
    run = project.path / "reports" / "r1"
    records = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    assert len(records) == 2 + 4 + 1
    assert {r["usage"]["prompt_tokens"] for r in records} == {64, 8}
    assert json.loads((run / "manifest.json").read_text())["complete"] is True


@pytest.mark.integration
def test_marker_selection(project):
    with ScriptServer(llama_reply) as srv:
        result = project.runpytest_subprocess(
            "-m", "prefill", "-p", "no:cacheprovider", f"--strata-server-url={srv.url}")
    result.assert_outcomes(passed=1, deselected=2)


@pytest.mark.integration
def test_unknown_marker_is_an_error(project):
    project.makepyfile(test_bad="import pytest\n@pytest.mark.prefil\ndef test_x(): pass\n")
    result = project.runpytest_subprocess("--strict-markers", "test_bad.py")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*'prefil' not found in `markers`*"])


@pytest.mark.integration
def test_bad_profile_stops_the_run_naming_key(project):
    (project.path / "profile.toml").write_text(PROFILE.replace("interval_s = 0.1",
                                                               "interval_s = -1"))
    result = project.runpytest_subprocess()
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*profile.toml: key 'telemetry.interval_s'*"])


@pytest.mark.integration
def test_dry_run_writes_commands_and_starts_nothing(project):
    profile = ROOT / "fixtures" / "profiles" / "sglang-dsv4pro-2node.toml"
    result = project.runpytest_subprocess(f"--strata-profile={profile}", "--strata-dry-run",
                                          "--strata-run-id=dry", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=3)
    commands = json.loads((project.path / "reports" / "dry" / "dry_run.json").read_text())
    head = commands["commands"]["server-baseline"]["argv"]
    assert head[:3] == ["python3", "-m", "sglang.launch_server"]
    assert "--tp" in head and head[head.index("--tp") + 1] == "16"
    assert head[head.index("--node-rank") + 1] == "0"
    worker = commands["commands"]["worker-baseline-worker"]
    assert worker["argv"][worker["argv"].index("--node-rank") + 1] == "1"
    assert worker["ssh_host"] == "worker-node"
    agent = commands["commands"]["agent-worker"]["argv"]
    assert "ssh" in agent and "worker-node" in agent  # the agent is shipped over ssh
    assert not (project.path / "reports" / "dry" / "service").exists()


@pytest.mark.integration
def test_preflight_failure_stops_before_launch(project):
    argv = 'argv = ["/nonexistent/llama-server", "--port", "{port}"]'
    (project.path / "profile.toml").write_text(
        PROFILE.replace('api = "llamacpp"', f'api = "llamacpp"\n{argv}'))
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--strata-run-id=pf")
    assert result.ret == 3
    result.stdout.fnmatch_lines(["*preflight failed*/nonexistent/llama-server*"])
    manifest = json.loads((project.path / "reports" / "pf" / "manifest.json").read_text())
    assert manifest["complete"] is False
    assert "preflight failed" in manifest["incomplete_reason"]
    assert not (project.path / "reports" / "pf" / "service").exists()


@pytest.mark.integration
def test_verdict_properties_and_regression_gate(project):
    """A second run whose tokens come twice as slowly fails the gate against the first."""
    gap = {"s": 0.005}

    def reply(seen):
        r = llama_reply(seen)
        if seen.method == "GET":
            return r
        items = [(d if i == 0 else gap["s"], b) for i, (d, b) in enumerate(r.items)]
        return Reply(items)

    args = ["-k", "test_decode and not wrong", "-p", "no:cacheprovider"]
    with ScriptServer(reply) as srv:
        xml = project.path / "base.xml"
        base = project.runpytest_subprocess(*args, f"--strata-server-url={srv.url}",
                                            "--strata-run-id=base", f"--junitxml={xml}")
        base.assert_outcomes(passed=1)
        props = {p.get("name"): p.get("value") for p in ET.parse(xml).getroot().iter("property")}
        assert props["verdict"] and "verdict_confidence" in props
        same = project.runpytest_subprocess(
            *args, f"--strata-server-url={srv.url}", "--strata-run-id=same",
            f"--strata-baseline={project.path / 'reports' / 'base'}")
        same.assert_outcomes(passed=1)
        gap["s"] = 0.012
        slow = project.runpytest_subprocess(
            *args, f"--strata-server-url={srv.url}", "--strata-run-id=slow",
            f"--strata-baseline={project.path / 'reports' / 'base'}",
            "--strata-regression-metrics=tpot_ms", "--strata-max-regression=20")
    slow.assert_outcomes(failed=1)  # one failure, not a pass and a teardown error
    slow.stdout.fnmatch_lines(["*regression against the baseline run*", "*tpot_ms median*"])

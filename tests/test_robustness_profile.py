"""Profile values of the wrong type or out of range: an error at start naming the file
and the key, before anything is launched.

tests/test_config.py covers the interval, the API and engine names, unknown keys, the
argv list and a missing name; this covers the rest of the schema (ports, timeouts,
windows, collectors, token ranges, nodes, scale, vars, per-config env, booleans where
numbers belong) and, through a real ``pytest`` start, that the run stops before any
run folder or process exists.
"""

from __future__ import annotations

import time

import pytest

from strata_plugin.configure.profile import ProfileError, load_profile
from tests.test_robustness_support import PytestRun, make_project

GOOD = """
name = "t"
[vars]
model = "/m"
[server]
engine = "llamacpp"
api = "llamacpp"
argv = ["/bin/true", "--port", "{port}"]
port = 0
health_timeout_s = 30
stop_timeout_s = 5
request_timeout_s = 60
token_id_range = [300, 1000]
[server.configs.a]
args = ["-b", "512"]
env = { OMP_NUM_THREADS = "2" }
[telemetry]
interval_s = 0.5
baseline_s = 1
cooldown_s = 1
collectors = ["proc", "cpu"]
[[nodes]]
name = "local"
role = "head"
[scale]
context = 0.5
"""

CASES = [
    # (replace, with, key, expected words)
    ("port = 0", "port = 70000", "server.port", "[0, 65535]"),
    ("port = 0", 'port = "8080"', "server.port", "a number"),
    ("health_timeout_s = 30", "health_timeout_s = -1", "server.health_timeout_s", "[1, 7200]"),
    ("health_timeout_s = 30", "health_timeout_s = true", "server.health_timeout_s", "a number"),
    ("stop_timeout_s = 5", "stop_timeout_s = 0", "server.stop_timeout_s", "[0.1, 600]"),
    ("request_timeout_s = 60", "request_timeout_s = [60]", "server.request_timeout_s",
     "a number"),
    ("token_id_range = [300, 1000]", "token_id_range = [1000, 300]", "server.token_id_range",
     "low < high"),
    ("token_id_range = [300, 1000]", 'token_id_range = ["a", "b"]', "server.token_id_range",
     "low < high"),
    ("baseline_s = 1", 'baseline_s = "long"', "telemetry.baseline_s", "a number"),
    ("cooldown_s = 1", "cooldown_s = 99999", "telemetry.cooldown_s", "[0, 3600]"),
    ('collectors = ["proc", "cpu"]', 'collectors = ["proc", "gpu"]', "telemetry.collectors",
     "names from"),
    ('collectors = ["proc", "cpu"]', 'collectors = "proc"', "telemetry.collectors",
     "a list of strings"),
    ('role = "head"', 'role = "boss"', "nodes[0].role", "one of"),
    ('name = "local"', "name = 7", "nodes[0].name", "a string"),
    ('role = "head"', 'role = "head"\nport = 22', "nodes[0].port", "a known key"),
    ("context = 0.5", "context = 0", "scale.context", "[1e-06"),
    ("context = 0.5", 'context = "half"', "scale.context", "a number"),
    ('model = "/m"', "model = 3", "vars.model", "a string"),
    # typos that used to pass silently: a scale key, a node in link_caps, a placeholder
    ("context = 0.5", "concurency = 0.125", "scale.concurency",
     "one of ['context', 'output', 'concurrency']"),
    ("cooldown_s = 1", 'cooldown_s = 1\nlink_caps = { "lcoal/eth0" = 8e6 }',
     "telemetry.link_caps.lcoal/eth0", "with <node> one of ['local']"),
    ("cooldown_s = 1", 'cooldown_s = 1\nlink_caps = { "eth0" = 8e6 }',
     "telemetry.link_caps.eth0", '"<node>/<interface>"'),
    ('"{port}"]', '"{port}", "-m", "{modle}"]', "server.argv[4]",
     "placeholders from ['host', 'model', 'port', 'python', 'root', 'run_dir']"),
    ('"{port}"]', '"{port}", "-m", "{model"]', "server.argv[4]", "placeholders from"),
    ('env = { OMP_NUM_THREADS = "2" }', 'env = { HF_HOME = "{run_dri}/hf" }',
     "server.configs.a.env.HF_HOME", "placeholders from"),
    ('env = { OMP_NUM_THREADS = "2" }', "env = { OMP_NUM_THREADS = 2 }",
     "server.configs.a.env.OMP_NUM_THREADS", "a string"),
    ('args = ["-b", "512"]', 'args = ["-b", "512"]\nlabel = 5', "server.configs.a.label",
     "a string"),
]


@pytest.mark.parametrize(("old", "new", "key", "expected"), CASES,
                         ids=[f"{c[2]}={c[1].split('=', 1)[-1].strip()[:12]}" for c in CASES])
def test_bad_value_names_file_and_key(tmp_path, old, new, key, expected):
    assert old in GOOD
    p = tmp_path / "bad.toml"
    p.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(ProfileError) as info:
        load_profile(p)
    msg = str(info.value)
    assert str(p) in msg, msg
    assert f"'{key}'" in msg, msg
    assert expected in msg, msg


def test_a_section_that_is_not_a_table(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('name = "t"\nscale = 2\n[server]\nengine = "llamacpp"\napi = "llamacpp"\n')
    with pytest.raises(ProfileError, match=r"bad\.toml: key 'scale': expected a table"):
        load_profile(p)


def test_the_good_profile_loads(tmp_path):
    p = tmp_path / "good.toml"
    p.write_text(GOOD)
    prof = load_profile(p)
    assert prof.server.configs[0].config_id == "a" and prof.scale == (("context", 0.5),)


def test_a_bad_profile_stops_pytest_before_anything_starts(tmp_path):
    (tmp_path / "proj").mkdir()
    proj = make_project(tmp_path / "proj", "def test_x(strata):\n    pass\n")
    bad = proj / "profile.toml"
    bad.write_text(GOOD.replace('role = "head"', 'role = "boss"', 1))
    reports = tmp_path / "reports"
    t0 = time.monotonic()
    run = PytestRun.start([f"--strata-profile={bad}", f"--strata-reports-dir={reports}",
                           "--strata-run-id=run"], tmp_path / "out.txt", reports / "run",
                          cwd=proj)
    rc = run.wait(60)
    out = run.text()
    assert rc == 4, out  # pytest's usage error
    assert f"{bad}: key 'nodes[0].role': expected one of ['head', 'worker']" in out, out
    assert time.monotonic() - t0 < 30
    assert not reports.exists(), "a run folder was created for a profile that cannot run"

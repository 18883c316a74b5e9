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
    ("port = 0", 'port = "8080"', "server.port", "an integer in [0, 65535]"),
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
     "placeholders from ['host', 'model', 'port', 'python', 'root', 'run_dir', "
     "'strata_cache']"),
    ('"{port}"]', '"{port}", "-m", "{model"]', "server.argv[4]", "placeholders from"),
    ('env = { OMP_NUM_THREADS = "2" }', 'env = { HF_HOME = "{run_dri}/hf" }',
     "server.configs.a.env.HF_HOME", "placeholders from"),
    ('env = { OMP_NUM_THREADS = "2" }', "env = { OMP_NUM_THREADS = 2 }",
     "server.configs.a.env.OMP_NUM_THREADS", "a string"),
    ('args = ["-b", "512"]', 'args = ["-b", "512"]\nlabel = 5', "server.configs.a.label",
     "a string"),
    # issue 24: hostile input that used to pass load and break later (or escape)
    ("port = 0", "port = 8080.9", "server.port", "an integer in [0, 65535]"),
    ("port = 0", "port = 8080.0", "server.port", "an integer in [0, 65535]"),
    ('role = "head"', 'role = "head"\nssh_host = "-oProxyCommand=touch /tmp/strata-x"',
     "nodes[0].ssh_host", "an ssh host"),
    ('role = "head"', 'role = "head"\nssh_host = "gpu-b -oProxyCommand=x"',
     "nodes[0].ssh_host", "an ssh host"),
    ('role = "head"', 'role = "head"\nssh_host = "gpu-b\\n"', "nodes[0].ssh_host",
     "an ssh host"),
    ('role = "head"', 'role = "head"\nssh_host = "@gpu-b"', "nodes[0].ssh_host",
     "an ssh host"),
    ('role = "head"', 'role = "head"\nssh_host = "-l@gpu-b"', "nodes[0].ssh_host",
     "an ssh host"),
    ('role = "head"', 'role = "head"\nssh_host = "a@b@c"', "nodes[0].ssh_host",
     "an ssh host"),
    ('role = "head"', 'role = "head"\nssh_host = "host;rm"', "nodes[0].ssh_host",
     "an ssh host"),
    ('name = "local"', 'name = "../../../x"', "nodes[0].name", "[A-Za-z0-9_.-]"),
    ('name = "local"', 'name = ".."', "nodes[0].name", "[A-Za-z0-9_.-]"),
    ('name = "local"', 'name = "."', "nodes[0].name", "[A-Za-z0-9_.-]"),
    ('name = "local"', 'name = ""', "nodes[0].name", "[A-Za-z0-9_.-]"),
    ('name = "local"', 'name = "a/b"', "nodes[0].name", "[A-Za-z0-9_.-]"),
    ("[server.configs.a]", '[server.configs."../../x"]', "server.configs.../../x",
     "[A-Za-z0-9_.-]"),
    ("[server.configs.a]", '[server.configs."a b"]', "server.configs.a b", "[A-Za-z0-9_.-]"),
    ("[server.configs.a]", '[server.configs.".."]', "server.configs...", "[A-Za-z0-9_.-]"),
    ('role = "head"', 'role = "head"\n[[nodes]]\nname = "local"\nrole = "worker"',
     "nodes[1].name", "a name no other node has"),
    ('role = "head"', 'role = "worker"', "nodes", 'exactly one node with role = "head"'),
    ('role = "head"', 'role = "head"\n[[nodes]]\nname = "b"\nrole = "head"', "nodes",
     'exactly one node with role = "head"'),
    ("cooldown_s = 1", 'cooldown_s = 1\npid_pattern = "llama-server ("',
     "telemetry.pid_pattern", "a regular expression"),
    ("cooldown_s = 1", 'cooldown_s = 1\nlog_patterns = { oom = "out of (memory" }',
     "telemetry.log_patterns.oom", "a regular expression"),
    ("cooldown_s = 1", 'cooldown_s = 1\nlog_patterns = { "o m" = "x" }',
     "telemetry.log_patterns.o m", "a probe name"),
    ('"{port}"]', '"{port}", "{host.x}"]', "server.argv[3]", "plain {name} placeholders"),
    ('"{port}"]', '"{port}", "{host[9]}"]', "server.argv[3]", "plain {name} placeholders"),
    ('"{port}"]', '"{port}", "{port!z}"]', "server.argv[3]", "plain {name} placeholders"),
    ('"{port}"]', '"{port}", "{port!r}"]', "server.argv[3]", "plain {name} placeholders"),
    ('"{port}"]', '"{port}", "{model:>200000000}"]', "server.argv[3]",
     "plain {name} placeholders"),
    ('"{port}"]', '"{port}", "{}"]', "server.argv[3]", "plain {name} placeholders"),
    ('"{port}"]', '"{port}", "{0}"]', "server.argv[3]", "plain {name} placeholders"),
    ('env = { OMP_NUM_THREADS = "2" }', 'env = { OMP_NUM_THREADS = "{port.real}" }',
     "server.configs.a.env.OMP_NUM_THREADS", "plain {name} placeholders"),
    ('model = "/m"', 'model = "{run_dir.x}/m"', "vars.model", "plain {name} placeholders"),
    ('model = "/m"', 'model = "{port:>9}/m"', "vars.model", "plain {name} placeholders"),
    ('model = "/m"', 'model = "{model}/m"', "vars.model", "placeholders from"),
    ("port = 0", 'port = 0\nhost = "{port}"', "server.host", "placeholders from ['model']"),
    ("port = 0", 'port = 0\nhost = "{addr}"', "server.host", "placeholders from ['model']"),
    ("port = 0", 'port = 0\nhost = "evil.example/x?"', "server.host", "a host name"),
    ("port = 0", 'port = 0\nhost = "-x"', "server.host", "a host name"),
    ("port = 0", 'port = 0\nhost = "u@h"', "server.host", "a host name"),
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


@pytest.mark.integration
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


def test_a_profile_that_is_not_utf8_names_the_file_and_the_byte(tmp_path):
    p = tmp_path / "latin1.toml"
    p.write_bytes(GOOD.replace('model = "/m"', 'model = "/m\xe9"').encode("latin-1"))
    with pytest.raises(ProfileError) as info:
        load_profile(p)
    msg = str(info.value)
    assert str(p) in msg and "'<file>'" in msg and "UTF-8" in msg and "byte" in msg, msg


def test_a_folder_given_as_the_profile_is_a_profile_error(tmp_path):
    with pytest.raises(ProfileError, match="'<file>'"):
        load_profile(tmp_path)


def test_the_server_host_may_be_a_var(tmp_path):
    """The two-node profile binds its private address, the one in ``[vars]``."""
    p = tmp_path / "p.toml"
    p.write_text(GOOD.replace('model = "/m"', 'model = "/m"\naddr = "10.10.0.1"')
                 .replace("port = 0", 'port = 0\nhost = "{addr}"'))
    assert load_profile(p).server.host == "10.10.0.1"


def test_accepted_names_and_hosts_load(tmp_path):
    """Just inside the rules: the characters the rules allow, user@host, IPv4 and IPv6."""
    p = tmp_path / "ok.toml"
    hosts = ["gpu-b", "gpu_b.example.org", "ops@gpu-b", "10.0.0.2", "::1", "fe80::1%eth0",
             "ops.x-y@10.0.0.2", "root@fd00::2"]
    nodes = "".join(f'[[nodes]]\nname = "w{i}.x-y_Z"\nrole = "worker"\nssh_host = "{h}"\n'
                    for i, h in enumerate(hosts))
    p.write_text(GOOD.replace("[server.configs.a]", '[server.configs."A-1.b_c"]') + nodes)
    prof = load_profile(p)
    assert [n.ssh_host for n in prof.nodes[1:]] == hosts
    assert prof.server.configs[0].config_id == "A-1.b_c"


def _project(tmp_path):
    (tmp_path / "proj").mkdir()
    proj = make_project(tmp_path / "proj", "def test_x(strata):\n    pass\n")
    (proj / "profile.toml").write_text(GOOD)
    return proj


@pytest.mark.integration
def test_a_crafted_ssh_host_runs_nothing_even_when_attaching(tmp_path):
    """A host of ``-oProxyCommand=touch FILE`` once reached ssh's option parser in the
    preflight probe (FILE was created): now the profile is refused before anything runs."""
    proj = _project(tmp_path)
    canary = tmp_path / "pwned"
    profile = proj / "profile.toml"
    profile.write_text(GOOD + f'[[nodes]]\nname = "w"\nrole = "worker"\n'
                       f'ssh_host = "-oProxyCommand=touch {canary}"\n')
    reports = tmp_path / "reports"
    run = PytestRun.start([f"--strata-profile={profile}", f"--strata-reports-dir={reports}",
                           "--strata-run-id=run", "--strata-server-url=http://127.0.0.1:9"],
                          tmp_path / "out.txt", reports / "run", cwd=proj)
    rc = run.wait(60)
    out = run.text()
    assert not canary.exists(), "the ssh host was parsed as an ssh option"
    assert rc == 4, out
    assert "key 'nodes[1].ssh_host': expected an ssh host" in out, out
    assert not reports.exists()


@pytest.mark.integration
@pytest.mark.parametrize("run_id", ["../../x", "..", ".", "a/b", "a b", "x\ny"])
def test_a_run_id_that_is_not_a_name_is_a_usage_error(tmp_path, run_id):
    """``--strata-run-id=../../x`` once made a folder outside the reports folder."""
    proj = _project(tmp_path)
    reports = tmp_path / "a" / "reports"
    run = PytestRun.start([f"--strata-profile={proj / 'profile.toml'}",
                           f"--strata-reports-dir={reports}", "--strata-dry-run",
                           f"--strata-run-id={run_id}"], tmp_path / "out.txt", reports / "x",
                          cwd=proj)
    rc = run.wait(60)
    out = run.text()
    assert rc == 4, out
    assert "--strata-run-id" in out and "[A-Za-z0-9_.-]" in out, out
    assert not (tmp_path / "x").exists() and not (tmp_path / "a" / "x").exists()
    assert not reports.exists()


@pytest.mark.integration
def test_a_run_id_of_every_allowed_character_from_pytest_ini_is_used(tmp_path):
    proj = _project(tmp_path)
    (proj / "pytest.ini").write_text((proj / "pytest.ini").read_text()
                                     + "strata_run_id = ok_Run-1.2\n")
    reports = tmp_path / "reports"
    run = PytestRun.start([f"--strata-profile={proj / 'profile.toml'}",
                           f"--strata-reports-dir={reports}", "--strata-dry-run"],
                          tmp_path / "out.txt", reports / "ok_Run-1.2", cwd=proj)
    rc = run.wait(60)
    assert rc == 0, run.text()
    assert (reports / "ok_Run-1.2" / "dry_run.json").is_file()

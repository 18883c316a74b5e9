"""Profiles: the shipped ones load; bad ones fail naming the file and the key."""

from pathlib import Path

import pytest

from strata_plugin.configure.profile import (
    ProfileError,
    expand_placeholders,
    load_profile,
    packaged_profiles,
    resolve_profile,
)

ROOT = Path(__file__).resolve().parents[1]
PROFILES = sorted((ROOT / "fixtures" / "profiles").glob("*.toml")) + sorted(
    packaged_profiles().values())

GOOD = """
name = "t"
[vars]
llama_server = "/opt/llama-server"
[server]
engine = "llamacpp"
api = "llamacpp"
argv = ["{llama_server}", "--port", "{port}"]
[server.configs.a]
args = ["-b", "512"]
[server.configs.b]
args = ["-b", "2048"]
env = { OMP_NUM_THREADS = "2" }
[telemetry]
interval_s = 0.1
"""


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_shipped_profiles_load(path):
    profile = load_profile(path)
    assert profile.name
    assert profile.server.configs


def test_configs_extend_base_argv(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text(GOOD)
    prof = load_profile(p)
    a, b = prof.server.configs
    assert (a.config_id, b.config_id) == ("a", "b")
    assert a.argv[-2:] == ("-b", "512") and b.argv[-2:] == ("-b", "2048")
    assert dict(b.env) == {"OMP_NUM_THREADS": "2"}
    assert prof.telemetry.interval_s == 0.1


@pytest.mark.parametrize(
    ("edit", "key", "expected"),
    [
        (("interval_s = 0.1", "interval_s = 0.01"), "telemetry.interval_s", "[0.1, 60"),
        (("interval_s = 0.1", 'interval_s = "fast"'), "telemetry.interval_s", "a number"),
        (('api = "llamacpp"', 'api = "grpc"'), "server.api", "one of"),
        (('engine = "llamacpp"', "engine = 3"), "server.engine", "one of"),
        (('name = "t"', 'name = "t"\nbogus = 1'), "bogus", "a known key"),
        (('args = ["-b", "512"]', 'args = ["-b", 512]'), "server.configs.a.args",
         "a list of strings"),
        (('name = "t"', ""), "name", "missing"),
    ],
)
def test_bad_profiles_name_file_and_key(tmp_path, edit, key, expected):
    p = tmp_path / "bad.toml"
    p.write_text(GOOD.replace(*edit, 1))
    with pytest.raises(ProfileError) as info:
        load_profile(p)
    msg = str(info.value)
    assert str(p) in msg and f"'{key}'" in msg and expected in msg


def test_syntax_error_and_missing_file(tmp_path):
    p = tmp_path / "syntax.toml"
    p.write_text("name = \n")
    with pytest.raises(ProfileError, match="valid TOML"):
        load_profile(p)
    with pytest.raises(ProfileError, match="an existing TOML file"):
        load_profile(tmp_path / "nope.toml")


def test_placeholders_keep_arguments_whole():
    argv = expand_placeholders(("{bin}", "--model", "{model}"),
                               {"bin": "/x/server", "model": "a model; rm -rf /"})
    assert argv == ["/x/server", "--model", "a model; rm -rf /"]
    with pytest.raises(ProfileError, match="'undefined'"):
        expand_placeholders(("{undefined}",), {})


def test_link_caps_and_prometheus(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text(GOOD + """
[telemetry.link_caps]
"worker/eth0" = 8e6
[prometheus]
url = "http://127.0.0.1:9090"
jobs = { node = "node", dcgm = "dcgm" }
auth_env = "PROM_TOKEN"
[[nodes]]
name = "head"
[[nodes]]
name = "worker"
role = "worker"
""")
    prof = load_profile(p)
    assert dict(prof.telemetry.link_caps) == {"worker/eth0": 8e6}
    assert prof.prometheus.url.endswith(":9090") and dict(prof.prometheus.jobs)["dcgm"] == "dcgm"
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD + '[prometheus]\njobs = { node = "nodes" }\nurl = "http://x"\n')
    with pytest.raises(ProfileError, match=r"'prometheus\.jobs\.node'"):
        load_profile(bad)
    nourl = tmp_path / "nourl.toml"
    nourl.write_text(GOOD + '[prometheus]\njobs = { node = "node" }\n')
    with pytest.raises(ProfileError, match=r"'prometheus\.url'"):
        load_profile(nourl)


def test_a_packaged_name_resolves_from_any_rootdir_and_a_path_from_the_rootdir(tmp_path):
    assert resolve_profile("local", tmp_path) == packaged_profiles()["local"]
    assert resolve_profile("local", tmp_path).is_file()
    assert resolve_profile("mine.toml", tmp_path) == tmp_path / "mine.toml"
    assert resolve_profile("/abs/p.toml", tmp_path) == Path("/abs/p.toml")


def test_gpu_expected_only_where_the_profile_says_so(tmp_path):
    """The engine's name alone does not expect GPUs (vLLM runs on CPUs too): the profile
    says so (telemetry.gpu_expected), or a container given GPUs; else the run must show
    one (NVML samples, the engine's log: formats/telemetry.engine_gpu_line)."""
    assert load_profile(packaged_profiles()["vllm-cpu"]).telemetry_facts().gpu_expected is False
    p = tmp_path / "p.toml"
    vllm = GOOD.replace('engine = "llamacpp"', 'engine = "vllm"')
    assert 'engine = "vllm"' in vllm
    p.write_text(vllm)
    assert load_profile(p).telemetry_facts().gpu_expected is False
    p.write_text(vllm.replace("interval_s = 0.1", "interval_s = 0.1\ngpu_expected = true"))
    assert load_profile(p).telemetry_facts().gpu_expected is True
    p.write_text(vllm.replace("interval_s = 0.1", "interval_s = 0.1\ngpu_expected = false"))
    assert load_profile(p).telemetry_facts().gpu_expected is False
    docker = load_profile(ROOT / "fixtures/profiles/vllm-1gpu-docker.toml")
    assert docker.server.container.gpus and docker.telemetry.gpu_expected is None
    assert docker.telemetry_facts().gpu_expected is True  # its container is given a GPU
    for shipped in ("vllm-1gpu.toml", "sglang-dsv4pro-2node.toml"):  # GPU deployments say so
        assert load_profile(ROOT / "fixtures/profiles" / shipped).telemetry_facts().gpu_expected
    p.write_text(vllm.replace("interval_s = 0.1", 'interval_s = 0.1\ngpu_expected = "no"'))
    with pytest.raises(ProfileError, match=r"telemetry\.gpu_expected"):
        load_profile(p)


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_no_shipped_profile_serves_every_interface_without_an_api_key(path):
    """A shipped example is copied as is: one that binds 0.0.0.0 (or ::) with no API key
    serves anyone who reaches the port (the two-node example once did)."""
    server = load_profile(path).server
    assert server.host not in ("0.0.0.0", "::") or server.api_key_env, (path, server.host)


def test_the_two_node_example_binds_the_head_address_its_worker_joins():
    prof = load_profile(ROOT / "fixtures" / "profiles" / "sglang-dsv4pro-2node.toml")
    assert prof.server.host == prof.var("head_addr") == "10.10.0.1"
    assert "NO API KEY" in prof.path.read_text().split("\nname =")[0]  # said in the header

"""Every profile default is written once, on the dataclass (issue 26, item 6).

The loader takes a missing key's value from the field it fills, so changing a default on
``ServerSpec``, ``TelemetrySpec``, ``PrometheusSpec``, ``ContainerSpec``, ``NodeSpec`` or
``ServerConfig`` changes what a profile that leaves the key out gets. Checked two ways: a
minimal profile loads to exactly the dataclass defaults, and a default changed on the
dataclass (patched here) is what the loader then returns: a second copy of the number in
the loader would keep the old value and fail this.
"""

from __future__ import annotations

import dataclasses

import pytest

from strata_plugin.configure import profile as prof
from strata_plugin.configure.load_spec import LoadSpec
from strata_plugin.configure.profile import (
    ContainerSpec,
    NodeSpec,
    PrometheusSpec,
    ServerConfig,
    ServerSpec,
    TelemetrySpec,
    load_profile,
)

MINIMAL = """
name = "minimal"
[server]
engine = "llamacpp"
api = "llamacpp"
argv = ["server"]
[server.container]
runtime = "docker"
image = "img"
[server.configs.a]
args = []
"""


def _defaulted(cls):
    return [f for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]


def _default(f):
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def _loaded(tmp_path, text=MINIMAL):
    p = tmp_path / "p.toml"
    p.write_text(text)
    pr = load_profile(p)
    return {ServerSpec: pr.server, TelemetrySpec: pr.telemetry, PrometheusSpec: pr.prometheus,
            ContainerSpec: pr.server.container, NodeSpec: pr.nodes[0],
            ServerConfig: pr.server.configs[0], LoadSpec: pr.load}


#: fields a minimal profile sets (the required keys above, and what the loader builds from
#: them) and so does not leave to the default
SET_BY_MINIMAL = {(ServerSpec, "configs"), (ServerSpec, "container")}


def test_a_minimal_profile_gets_exactly_the_dataclass_defaults(tmp_path):
    got = _loaded(tmp_path)
    checked = 0
    for cls, obj in got.items():
        for f in _defaulted(cls):
            if (cls, f.name) in SET_BY_MINIMAL:
                continue
            assert getattr(obj, f.name) == _default(f), (cls.__name__, f.name)
            checked += 1
    assert checked >= 30


#: a different, valid value for each default the loader reads from a key of its own
CHANGED = {
    (ServerSpec, "host"): "127.0.0.2", (ServerSpec, "port"): 8123,
    (ServerSpec, "health_path"): "/ready", (ServerSpec, "health_timeout_s"): 301.0,
    (ServerSpec, "stop_timeout_s"): 16.0, (ServerSpec, "request_timeout_s"): 601.0,
    (ServerSpec, "api_key_env"): "KEY", (ServerSpec, "model_name"): "m",
    (ServerSpec, "worker_argv"): ("w",), (ServerSpec, "token_id_range"): (5, 9),
    (TelemetrySpec, "interval_s"): 1.5, (TelemetrySpec, "baseline_s"): 16.0,
    (TelemetrySpec, "cooldown_s"): 17.0, (TelemetrySpec, "collectors"): ("cpu",),
    (TelemetrySpec, "pid_pattern"): "llama", (TelemetrySpec, "gpu_expected"): True,
    (PrometheusSpec, "url"): "http://127.0.0.1:9090", (PrometheusSpec, "auth_env"): "TOK",
    (PrometheusSpec, "step_s"): 2.0,
    (ContainerSpec, "name"): "other", (ContainerSpec, "gpus"): "all",
    (ContainerSpec, "network"): "bridge", (ContainerSpec, "volumes"): ("/a:/b",),
    (ContainerSpec, "env_pass"): ("TOKEN",), (ContainerSpec, "args"): ("--rm",),
    (ContainerSpec, "runtime_args"): ("--log-level=debug",),
    (NodeSpec, "ssh_host"): "worker-1",
    (ServerConfig, "label"): "a label",
    (LoadSpec, "processes"): 2, (LoadSpec, "workers_per_node"): 3, (LoadSpec, "nodes"): 4,
    (LoadSpec, "num_cpus"): 2.0, (LoadSpec, "address"): "auto",
    (LoadSpec, "ship_package"): True, (LoadSpec, "namespace"): "ns",
}
#: defaults that are an empty table or list in the file, not a key with a value of its own
EMPTY_TABLES = {(ServerSpec, "configs"), (ServerSpec, "container"), (TelemetrySpec, "log_patterns"),
                (TelemetrySpec, "link_caps"), (PrometheusSpec, "jobs"), (ContainerSpec, "env"),
                (ServerConfig, "env"), (LoadSpec, "resources")}


def test_every_defaulted_field_is_covered():
    every = {(cls, f.name) for cls in (ServerSpec, TelemetrySpec, PrometheusSpec, ContainerSpec,
                                       NodeSpec, ServerConfig, LoadSpec) for f in _defaulted(cls)}
    # role and load.engine have one other value each, which a minimal profile cannot load
    # with (no head node; Ray without an address): tested apart below
    assert every == set(CHANGED) | EMPTY_TABLES | {(NodeSpec, "role"), (LoadSpec, "engine")}


@pytest.mark.parametrize("key", sorted(CHANGED, key=lambda k: (k[0].__name__, k[1])),
                         ids=lambda k: f"{k[0].__name__}.{k[1]}")
def test_the_loader_follows_a_changed_dataclass_default(tmp_path, monkeypatch, key):
    cls, name = key
    f = cls.__dataclass_fields__[name]
    assert CHANGED[key] != _default(f)  # a change, or the test proves nothing
    monkeypatch.setattr(f, "default", CHANGED[key])
    got = _loaded(tmp_path)[cls]
    assert getattr(got, name) == CHANGED[key]


def test_a_node_role_defaulting_to_worker_leaves_no_head(tmp_path, monkeypatch):
    """The role's only other value cannot load alone: the profile then has no head node,
    which is what the loader says (so it read the changed default)."""
    monkeypatch.setattr(NodeSpec.__dataclass_fields__["role"], "default", "worker")
    with pytest.raises(prof.ProfileError, match="exactly one node"):
        _loaded(tmp_path)


def test_a_load_engine_defaulting_to_ray_asks_for_its_address(tmp_path, monkeypatch):
    monkeypatch.setattr(LoadSpec.__dataclass_fields__["engine"], "default", "ray")
    with pytest.raises(prof.ProfileError, match="Ray cluster's address"):
        _loaded(tmp_path)

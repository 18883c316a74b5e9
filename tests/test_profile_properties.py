"""Property tests of the profile loader: whatever a profile holds, it loads or it is a
ProfileError, never another exception, and a profile that loads never fails at launch
because of a placeholder.

Hypothesis runs with a fixed seed (``derandomize=True``) and a small budget, so CI sees
the same examples every time and the file runs in a few seconds.
"""

from __future__ import annotations

import json
import math
import tempfile
import tomllib
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata_plugin.configure.profile import (
    BUILTIN_PLACEHOLDERS,
    Profile,
    ProfileError,
    expand_placeholders,
    expand_value,
    load_profile,
)

SETTINGS = settings(derandomize=True, max_examples=120, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

GOOD = """
name = "t"
setup_argv = ["{python}", "-c", "pass"]
[vars]
model = "{root}/m"
[server]
engine = "llamacpp"
api = "llamacpp"
argv = ["/bin/true", "-m", "{model}", "--port", "{port}"]
worker_argv = ["/bin/true", "{host}"]
token_id_range = [300, 1000]
[server.env]
HF_HOME = "{run_dir}/hf"
[server.configs.a]
args = ["-b", "512"]
env = { OMP_NUM_THREADS = "2" }
[telemetry]
interval_s = 0.5
collectors = ["proc", "cpu"]
pid_pattern = "llama-server"
log_patterns = { oom = "out of memory" }
[[nodes]]
name = "local"
role = "head"
[[nodes]]
name = "w"
role = "worker"
ssh_host = "ops@gpu-b"
[scale]
context = 0.5
[prometheus]
url = "http://127.0.0.1:9090"
jobs = { node = "node" }
"""
GOOD_DATA = tomllib.loads(GOOD)

#: Every key path the loader reads (a path into GOOD_DATA; ints index arrays).
KNOWN = [("name",), ("description",), ("setup_argv",), ("vars",), ("vars", "model"),
         ("server",), ("server", "engine"), ("server", "api"), ("server", "host"),
         ("server", "port"), ("server", "argv"), ("server", "argv", 2),
         ("server", "worker_argv"), ("server", "env"), ("server", "env", "HF_HOME"),
         ("server", "health_path"), ("server", "health_timeout_s"),
         ("server", "stop_timeout_s"), ("server", "request_timeout_s"),
         ("server", "api_key_env"), ("server", "model_name"), ("server", "token_id_range"),
         ("server", "configs"), ("server", "configs", "a"), ("server", "configs", "a", "args"),
         ("server", "configs", "a", "env"), ("server", "configs", "a", "label"),
         ("server", "container"), ("telemetry",), ("telemetry", "interval_s"),
         ("telemetry", "baseline_s"), ("telemetry", "collectors"),
         ("telemetry", "pid_pattern"), ("telemetry", "log_patterns"),
         ("telemetry", "link_caps"), ("telemetry", "gpu_expected"), ("nodes",),
         ("nodes", 0), ("nodes", 0, "name"), ("nodes", 1, "role"), ("nodes", 1, "ssh_host"),
         ("scale",), ("scale", "context"), ("prometheus",), ("prometheus", "url"),
         ("prometheus", "jobs"), ("prometheus", "step_s"), ("prometheus", "auth_env")]

#: Text with the characters that matter to the loader: braces and format syntax, path
#: separators, whitespace, option dashes, @, brackets, non-ASCII.
TRICKY = st.lists(st.sampled_from([*"{}[]!:.>0129ab_-@/ \t\n%é", "{port}", "{model}",
                                    "{host", "port}", "{{", "}}", "..", "{strata_cache}"]),
                  max_size=8).map("".join)
SCALARS = (st.booleans() | st.integers(-2**70, 2**70) | st.floats() | TRICKY
           | st.text(max_size=8))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(TRICKY | st.sampled_from(["a", "name", "env", "args"]),
                                        inner, max_size=4), max_leaves=12)


def toml_value(v: object) -> str:
    """A Python value as TOML (inline tables and arrays), as a user might write it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(
            v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml_doc(data: dict) -> str:
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in data.items())


def _with(data: object, path: tuple, value: object) -> object:
    """A copy of ``data`` with ``path`` set to ``value`` (creating tables on the way)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(data, list) and isinstance(head, int) and head < len(data):
        return [(_with(x, rest, value) if i == head else x) for i, x in enumerate(data)]
    table = dict(data) if isinstance(data, dict) else {}
    table[head] = _with(table.get(head, {}), rest, value)
    return table


def _load(text: str | bytes) -> Profile | None:
    """The profile, or None for a ProfileError; any other exception fails the test."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "p.toml"
        p.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        try:
            return load_profile(p)
        except ProfileError as exc:
            assert str(p) in str(exc) and exc.key  # the file and the key, always
            return None


def _launch(prof: Profile) -> None:
    """Render every placeholder the way the run does at launch (run/session.py)."""
    builtins = {k: f"<{k}>" for k in (*BUILTIN_PLACEHOLDERS, "strata_cache")}
    values = {k: expand_value(v, builtins) for k, v in prof.vars}
    values.update(builtins)
    s = prof.server
    for conf in s.configs:
        expand_placeholders(conf.argv, values)
        for _, v in conf.env:
            expand_value(v, values)
    expand_placeholders(s.worker_argv, values)
    expand_placeholders(prof.setup_argv, values)
    if s.container is not None:
        expand_placeholders((*s.container.volumes, *s.container.args, s.container.image),
                            values)
        for _, v in s.container.env:
            expand_value(v, values)
    prof.telemetry_facts()


def test_the_seed_profile_loads_and_launches():
    prof = _load(toml_doc(GOOD_DATA))
    assert prof is not None and [n.name for n in prof.nodes] == ["local", "w"]
    _launch(prof)


@SETTINGS
@given(path=st.sampled_from(KNOWN), value=VALUES)
def test_any_value_in_a_known_key_loads_or_is_a_profile_error(path, value):
    prof = _load(toml_doc(_with(GOOD_DATA, path, value)))
    if prof is not None:
        _launch(prof)


@SETTINGS
@given(pos=st.integers(0, len(GOOD)), cut=st.integers(0, 40),
       insert=st.text(max_size=30) | TRICKY | st.sampled_from(
           ["\n[server]\n", "\n[[nodes]]\nname = 'x'\n", "= ", "'''", "{", '"\\u00"']))
def test_edited_profile_text_loads_or_is_a_profile_error(pos, cut, insert):
    prof = _load(GOOD[:pos] + insert + GOOD[pos + cut:])
    if prof is not None:
        _launch(prof)


@SETTINGS
@given(pos=st.integers(0, len(GOOD)), junk=st.binary(min_size=1, max_size=8))
def test_any_bytes_load_or_are_a_profile_error(pos, junk):
    data = GOOD.encode()
    prof = _load(data[:pos] + junk + data[pos:])
    if prof is not None:
        _launch(prof)


@SETTINGS
@given(arg=TRICKY, where=st.sampled_from([("server", "argv", 2), ("server", "env", "HF_HOME"),
                                          ("vars", "model"), ("server", "worker_argv", 1),
                                          ("setup_argv", 0),
                                          ("server", "configs", "a", "env", "X")]))
def test_a_placeholder_renders_at_launch_or_is_refused_at_load(arg, where):
    """Never a crash at launch: a profile that loads renders all its placeholders, and
    one that does not names the key holding the placeholder."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "p.toml"
        p.write_text(toml_doc(_with(GOOD_DATA, where, arg)))
        try:
            prof = load_profile(p)
        except ProfileError as exc:
            key = "".join(f"[{w}]" if isinstance(w, int) else f".{w}" for w in where)[1:]
            assert exc.key == key, (exc.key, where)
            return
    _launch(prof)

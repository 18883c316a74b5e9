"""docs/profile.md: every profile key, generated from the dataclasses, and current; each
key declared once, on its field (configure/keys.py), the reader holding to its bounds."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import subprocess
import sys
from pathlib import Path

import pytest

from strata_plugin.configure import load_spec as L
from strata_plugin.configure import profile as P
from strata_plugin.configure.keys import key, key_of, toml_name
from strata_plugin.configure.profile_doc import SECTIONS, profile_keys, render, undocumented

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = [*sorted((ROOT / "fixtures" / "profiles").glob("*.toml")),
           *P.packaged_profiles().values()]
#: Tables whose keys the user names (a configuration id, a variable, a job ...).
NAMED = {"vars", "scale", "server.env", "server.configs", "server.container.env",
         "telemetry.log_patterns", "telemetry.link_caps", "prometheus.jobs"}


def test_the_committed_reference_is_current():
    """Regenerate with: python -m strata_plugin profile-doc -o docs/profile.md"""
    assert (ROOT / "docs" / "profile.md").read_text() == render()


def test_the_subcommand_prints_it():
    out = subprocess.run([sys.executable, "-m", "strata_plugin", "profile-doc"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout == render()


def test_every_key_has_a_type_a_default_and_a_meaning():
    assert undocumented() == []
    rows = {r.key: (r.type, r.default) for r in profile_keys()}
    assert rows["server.engine"] == ("string", "required")
    assert rows["telemetry.interval_s"] == ("number", "0.5")
    assert rows["telemetry.gpu_expected"] == ("true/false (or unset)", "unset")
    assert rows["server.configs.<id>.args"] == ("list of strings", "[]")


def test_the_bounds_are_the_declared_ones():
    rows = {r.key: r.bounds for r in profile_keys()}
    assert rows["server.port"] == "[0, 65535]"
    assert rows["telemetry.interval_s"] == "[0.1, 60]"
    assert rows["telemetry.link_caps"] == "each value: [1, 1e+13]"
    assert rows["load.workers_per_node"] == "[1, 256]"
    assert rows["server.api"] == "`chat`, `completions`, `llamacpp`, `sglang`"
    assert rows["prometheus.jobs"] == "each value: `node`, `dcgm`, `engine`"
    assert "| `health_timeout_s` | number | 300.0 | [1, 7200] |" in render()


def _keys(table: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in table.items():
        key = prefix + k
        if key in NAMED:
            out.add(key)
            if key == "server.configs":
                for cfg in v.values():
                    out |= {f"server.configs.<id>.{c}" for c in cfg}
            continue
        if isinstance(v, dict):
            out |= _keys(v, key + ".")
        elif key == "nodes":
            out |= {f"nodes.{n}" for node in v for n in node}
        else:
            out.add(key)
    return out


def test_every_key_a_shipped_profile_uses_is_documented():
    documented = {r.key for r in profile_keys()} | {
        "server.configs", "vars", "scale", "server.container.env", "server.env"}
    for path in SHIPPED:
        used = _keys(P.load_profile(path).raw)
        assert used - documented == set(), path


def test_the_documented_defaults_are_what_the_reader_applies(tmp_path):
    """A profile with only the required keys loads with each field at its documented
    (dataclass) default."""
    path = tmp_path / "p.toml"
    path.write_text('name = "p"\n[server]\nengine = "vllm"\napi = "chat"\nargv = ["x"]\n'
                    '[server.container]\nruntime = "docker"\nimage = "i"\n'
                    '[[nodes]]\nname = "n"\n')
    prof = P.load_profile(path)
    objects = {P.ServerSpec: prof.server, P.TelemetrySpec: prof.telemetry,
               P.PrometheusSpec: prof.prometheus, P.NodeSpec: prof.nodes[0],
               P.ContainerSpec: prof.server.container}
    checked = 0
    for _, cls in SECTIONS:
        if cls not in objects:
            continue
        for f in dataclasses.fields(cls):
            if key_of(f) is None or f.default is dataclasses.MISSING:
                continue
            assert getattr(objects[cls], f.name) == f.default, (cls.__name__, f.name)
            checked += 1
    assert checked >= 25


def _reader_keys() -> set[str]:
    """Every key name the profile reader asks for (``r.get("key", ...)``, ``number``,
    ``choice``, ``str_list``, ``sub``, ``_str_table(r, "key")``) in configure/profile.py."""
    tree = ast.parse(inspect.getsource(P))
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        args = node.args
        if isinstance(f, ast.Attribute) and f.attr in ("get", "number", "choice", "str_list",
                                                       "sub") and args:
            first = args[0]
        elif isinstance(f, ast.Name) and f.id == "_str_table" and len(args) > 1:
            first = args[1]
        else:
            continue
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            out.add(first.value)
    return out


def test_every_key_the_reader_reads_is_documented():
    """A key read by configure/profile.py but held in no dataclass field (a flag read from
    the raw table) still needs a row: the reader's own calls are the list."""
    names = {r.key.rsplit(".", 1)[-1] for r in profile_keys()}
    names |= {"server", "telemetry", "prometheus", "configs", "container", "nodes", "load"}
    missing = _reader_keys() - names
    assert missing == set(), missing


#: Where a section's keys are written in a minimal profile, and a table's one entry.
_BASE = 'name = "p"\n[server]\nengine = "vllm"\nargv = ["x"]\n'
_TABLE_ENTRY = {"scale": "context", "telemetry.link_caps": '"local/eth0"',
                "load.resources": "client"}


def _bounded() -> list[tuple[str, type, str, object, object]]:
    """(dotted key, field type, toml name, lo, hi) of every key declared with bounds."""
    out = []
    for section, cls in SECTIONS:
        for f in dataclasses.fields(cls):
            k = key_of(f)
            if k is not None and k.lo is not None:
                out.append((f"{section}.{toml_name(f)}".lstrip("."), cls, str(f.type), k.lo,
                            k.hi))
    return out


def _profile_with(tmp_path: Path, dotted: str, value: str) -> Path:
    section, _, name = dotted.rpartition(".")
    if dotted in _TABLE_ENTRY:
        section, name = dotted, _TABLE_ENTRY[dotted]
    text = _BASE
    if section == "server":
        text += f"{name} = {value}\n"
    else:
        text += f"[{section}]\n{name} = {value}\n"
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


def test_every_bound_is_declared_on_a_field():
    """Eleven single numbers and three tables of numbers: the reader's calls name no bound
    of their own (a bound in a call would be a second declaration)."""
    keys = [b[0] for b in _bounded()]
    assert len(keys) == 14, keys
    calls = [n for m in (P, L) for n in ast.walk(ast.parse(inspect.getsource(m)))
             if isinstance(n, ast.Call) and ast.unparse(n.func) != "key"]  # not a declaration
    assert not [ast.unparse(c) for c in calls
                if any(kw.arg in ("lo", "hi") and isinstance(kw.value, ast.Constant)
                       for kw in c.keywords)]


@pytest.mark.parametrize("dotted,cls,typ,lo,hi", _bounded(), ids=[b[0] for b in _bounded()])
def test_the_reader_holds_each_key_to_its_declared_bounds(tmp_path, dotted, cls, typ, lo, hi):
    """Each bound itself loads; just past it, the error names the declared bounds."""
    integer = typ == "int"
    what = f"an integer in [{lo}, {hi}]" if integer else f"a number in [{lo}, {hi}]"
    for inside in (lo, hi):
        P.load_profile(_profile_with(tmp_path, dotted, repr(inside)))
    below = lo - 1 if integer else math.nextafter(lo, -math.inf)
    above = hi + 1 if integer else math.nextafter(hi, math.inf)
    for outside in (below, above):
        with pytest.raises(P.ProfileError) as err:
            P.load_profile(_profile_with(tmp_path, dotted, repr(outside)))
        assert what in str(err.value), (dotted, outside)


def test_a_key_without_both_bounds_is_refused_where_it_is_declared():
    with pytest.raises(ValueError, match="both given or neither"):
        key(1.0, doc="x", lo=0)


#: Keys with declared values, where each goes in a minimal profile.
_CHOICES = {"server.api": ("server", "api"),
            "server.container.runtime": ("server.container", "runtime"),
            "nodes.role": ("nodes", "role"), "load.engine": ("load", "engine")}


@pytest.mark.parametrize("dotted", sorted(_CHOICES))
def test_the_reader_holds_each_key_to_its_declared_values(tmp_path, dotted):
    """A value not declared is refused, naming exactly the declared values (the reader
    read them from the field, the reference shows the same)."""
    section, name = _CHOICES[dotted]
    cls = dict(SECTIONS)[section]
    declared = key_of(cls.__dataclass_fields__[name]).choices
    rows = {r.key: r.bounds for r in profile_keys()}
    assert rows[dotted] == ", ".join(f"`{c}`" for c in declared)
    bad = '"' + declared[0] + 'x"'
    text = _BASE + {"server": f"{name} = {bad}\n",
                    "server.container": f'[server.container]\nimage = "i"\n{name} = {bad}\n',
                    "nodes": f'[[nodes]]\nname = "n"\n{name} = {bad}\n',
                    "load": f"[load]\n{name} = {bad}\n"}[section]
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(P.ProfileError) as err:
        P.load_profile(path)
    assert f"expected one of {list(declared)}" in str(err.value)

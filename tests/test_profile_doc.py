"""docs/profile.md: every profile key, generated from the dataclasses, and current."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

from strata_plugin.configure import profile as P
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
    rows = {k: (t, d) for k, t, d, _ in profile_keys()}
    assert rows["server.engine"] == ("string", "required")
    assert rows["telemetry.interval_s"] == ("number", "0.5")
    assert rows["telemetry.gpu_expected"] == ("true/false (or unset)", "unset")
    assert rows["server.configs.<id>.args"] == ("list of strings", "[]")


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
    documented = {k for k, _, _, _ in profile_keys()} | {
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
    for _, cls, left_out in SECTIONS:
        if cls not in objects:
            continue
        for f in dataclasses.fields(cls):
            if f.name in left_out or f.default is dataclasses.MISSING:
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
    names = {k.rsplit(".", 1)[-1] for k, _, _, _ in profile_keys()}
    names |= {"server", "telemetry", "prometheus", "configs", "container", "nodes", "load"}
    missing = _reader_keys() - names
    assert missing == set(), missing

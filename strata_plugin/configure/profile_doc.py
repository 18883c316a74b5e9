"""docs/profile.md: every profile key with its type, default, bounds and meaning.

Generated from the profile dataclasses (``configure/profile.py``, ``configure/load_spec.py``):
each key is declared once, on its field (``configure/keys.py``), whose annotation is its
type, whose default is its default, and whose declaration holds its bounds (or allowed
values, or rule) and its one-line meaning; the profile reader takes the same default,
bounds and values from the same field. The keys no field holds one to one
(``server.argv``, ``server.env``, ``allow_unsandboxed_code``) are declared beside them,
in ``profile.UNFIELDED_KEYS``. ``python -m strata_plugin profile-doc`` prints it (``-o
FILE`` writes it); a test checks that the committed docs/profile.md is current.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from strata_plugin.configure import load_spec as L
from strata_plugin.configure import profile as P
from strata_plugin.configure.keys import Key, key_of, toml_name

#: Where each section's keys come from: (TOML section, dataclass). Fields declared
#: without :func:`~strata_plugin.configure.keys.key` (sections, the path) are not keys.
SECTIONS: tuple[tuple[str, type], ...] = (
    ("", P.Profile),
    ("server", P.ServerSpec),
    ("server.configs.<id>", P.ServerConfig),
    ("server.container", P.ContainerSpec),
    ("telemetry", P.TelemetrySpec),
    ("prometheus", P.PrometheusSpec),
    ("nodes", P.NodeSpec),
    ("load", L.LoadSpec),
)


def _doc(cls: type, name: str) -> str:
    k = key_of(cls.__dataclass_fields__[name])
    return k.doc if k is not None else ""


#: What a section of tables is, above its table of keys.
SECTION_MEANINGS = {
    "server.configs.<id>": "One way of starting the server, a parameter of the session server "
                           "fixture (its table name is the configuration id cases name in "
                           "`strata_configs`/`strata_blocks`). None: one configuration "
                           "`default`, the server's own argv.",
    "nodes": _doc(P.Profile, "nodes"),
}


class Row(NamedTuple):
    """One key of the reference."""

    key: str  # dotted: server.health_timeout_s
    type: str
    default: str
    bounds: str  # [lo, hi], the allowed values or the rule; "" none
    meaning: str


_HEADER = """# Profile reference

Every key of a Strata profile (TOML), with its type, default, bounds and meaning. A
bad value stops the run at start-up naming the file, the key and what was expected (a
number outside its bounds, both inclusive, too); an unknown key is an error too (a typo
is not ignored). Examples: `fixtures/profiles/`, and the
packaged `local` profile (`strata_plugin/profiles/local.toml`).

Generated from the profile dataclasses (`strata_plugin/configure/profile.py`,
`configure/load_spec.py`), where each key is declared once, on its field, and the reader
takes its default and bounds from the same declaration (`configure/keys.py`), by
`python -m strata_plugin profile-doc -o docs/profile.md`; `tests/test_profile_doc.py`
fails when this file is not current.
"""


def _type(annotation: str) -> str:
    a = annotation.replace(" ", "")
    table = {
        "str": "string", "int": "integer", "float": "number", "bool": "true/false",
        "bool|None": "true/false (or unset)", "tuple[str,...]": "list of strings",
        "tuple[tuple[str,str],...]": "table of strings", "tuple[int,int]": "[low, high] integers",
        "tuple[tuple[str,float],...]": "table of numbers", "ContainerSpec|None": "table",
        "int|str": "integer or string",
        "tuple[NodeSpec,...]": "array of tables", "tuple[ServerConfig,...]": "tables",
    }
    return table.get(a, a)


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        v = f.default
    elif f.default_factory is not dataclasses.MISSING:
        v = f.default_factory()
    else:
        return "required"
    return _value(v, str(f.type))


def _value(v: object, annotation: str) -> str:
    """A default as TOML would write it."""
    if v is None:
        return "unset"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, tuple) and not v:
        return "{}" if "tuple[tuple" in annotation or "table" in annotation else "[]"
    if isinstance(v, tuple) and all(isinstance(x, tuple) for x in v):
        return "{" + ", ".join(f"{a} = {b}" for a, b in v) + "}"
    if isinstance(v, tuple) and all(isinstance(x, str) for x in v):
        return "[" + ", ".join(f'"{x}"' for x in v) + "]"
    if isinstance(v, tuple):
        return "[" + ", ".join(str(x) for x in v) + "]"
    return str(v)


def _bounds(k: Key, typ: str) -> str:
    text = k.bounds()
    if text and typ.startswith("table of") and (k.lo is not None or k.choices):
        return f"each value: {text}"
    return text


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def profile_keys() -> list[Row]:
    """Every profile key, in document order: each field declared as a key, then the keys
    no field holds (``profile.UNFIELDED_KEYS``)."""
    rows: list[Row] = []
    for section, cls in SECTIONS:
        prefix = f"{section}." if section else ""
        for f in dataclasses.fields(cls):
            k = key_of(f)
            if k is None:
                continue
            typ = _type(str(f.type))
            rows.append(Row(prefix + toml_name(f), typ, k.shown or _default(f), _bounds(k, typ),
                            k.doc))
        for where, name, typ, default, k in P.UNFIELDED_KEYS:
            if where == section:
                rows.append(Row(prefix + name, typ, k.shown or _value(default, typ),
                                _bounds(k, typ), k.doc))
    return rows


def undocumented() -> list[str]:
    """Keys with no meaning (a new key's declaration needs its ``doc``)."""
    return [r.key for r in profile_keys() if not r.meaning.strip()]


def render() -> str:
    by_section: dict[str, list[Row]] = {}
    for row in profile_keys():
        section = max((s for s, _ in SECTIONS if s and row.key.startswith(s + ".")),
                      key=len, default="")
        by_section.setdefault(section, []).append(row)
    out = [_HEADER]
    titles = {"": "Top level", "nodes": "[[nodes]]"}
    for section, _ in SECTIONS:
        rows = by_section.get(section)
        if not rows:
            continue
        title = titles.get(section, f"[{section}]")
        out.append(f"\n## {title}\n\n")
        if section in SECTION_MEANINGS:
            out.append(SECTION_MEANINGS[section] + "\n\n")
        out.append("| key | type | default | bounds | meaning |\n"
                   "| --- | --- | --- | --- | --- |\n")
        for r in rows:
            short = r.key[len(section) + 1:] if section else r.key
            out.append(f"| `{short}` | {_cell(r.type)} | {_cell(r.default)} | "
                       f"{_cell(r.bounds)} | {_cell(r.meaning)} |\n")
    return "".join(out)


def main(argv: list[str]) -> int:
    import argparse
    from pathlib import Path

    p = argparse.ArgumentParser(prog="python -m strata_plugin profile-doc",
                                description="Print the profile reference (docs/profile.md).")
    p.add_argument("-o", "--output", default="", help="write it to this file instead")
    a = p.parse_args(argv)
    text = render()
    if a.output:
        Path(a.output).write_text(text)
    else:
        print(text, end="")
    return 0


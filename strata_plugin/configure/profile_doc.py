"""docs/profile.md: every profile key with its type, default and meaning.

Generated from the profile dataclasses (``configure/profile.py``): a key's type and
default are its field's annotation and default, its meaning the field's comment (the
``#:`` lines above it or the ``#`` comment on its line). Keys the dataclasses do not
hold one to one (``server.argv``, ``server.env``, a configuration's ``args``) and
fields without a comment get their text in :data:`MEANINGS` below. The allowed values
come from the same constants the profile reader checks against. ``python -m
strata_plugin profile-doc`` prints it (``-o FILE`` writes it); a test checks that the
committed docs/profile.md is current.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize

from strata_plugin.configure import engines as E
from strata_plugin.configure import load_spec as L
from strata_plugin.configure import profile as P

#: Where each section's keys come from: (TOML section, dataclass, fields left out (not
#: keys, or documented under another name)).
SECTIONS: tuple[tuple[str, type, tuple[str, ...]], ...] = (
    ("", P.Profile, ("path", "raw", "server", "telemetry", "prometheus", "load")),
    ("server", P.ServerSpec, ("configs", "container")),
    ("server.configs.<id>", P.ServerConfig, ("config_id",)),
    ("server.container", P.ContainerSpec, ()),
    ("telemetry", P.TelemetrySpec, ()),
    ("prometheus", P.PrometheusSpec, ()),
    ("nodes", P.NodeSpec, ()),
    ("load", L.LoadSpec, ()),
)
#: A field's TOML name where it differs.
RENAMED = {"server.configs.<id>.argv": "args"}
#: Keys the dataclasses do not hold one to one, documented where their section is.
EXTRA_KEYS = {
    "": (("allow_unsandboxed_code", "true/false", "false"),),
    "server": (("argv", "list of strings", "required (may be [] for a profile only used "
                "attached, with --strata-server-url)"), ("env", "table of strings", "{}")),
}
#: Defaults the reader applies where the dataclass has none (the profile's top level is
#: built by the reader alone; a configuration's args and env start empty).
DEFAULTS = {"description": '""', "vars": "{}", "nodes": 'one node, `name = "local"`',
            "server.configs.<id>.argv": "[]", "server.configs.<id>.env": "{}",
            "server.api": "the engine's: " + ", ".join(
                f"`{e.default_api}` ({e.name})" for e in E.ENGINE_TABLE if e.default_api)
            + "; required for `other`"}
#: The meaning of keys whose field has no comment (or whose TOML form differs); where a
#: key has both, this text is used.
MEANINGS = {
    "name": "The profile's name, shown in reports and JUnit properties.",
    "description": "One line about the deployment, for the report.",
    "nodes": "The machines of the deployment (an array of tables, `[[nodes]]`); default one "
             "node `local`, this machine.",
    "vars": "Placeholders for argv and env values: `{name}` anywhere in `server.argv`, "
            "`server.env`, a configuration's `args`/`env`, `setup_argv` or `server.container`.",
    "scale": "Factors the workload matrix is scaled by (`Workload.scaled`): "
             + ", ".join(f"`{k}`" for k in P.SCALE_KEYS) + "; each a number.",
    "allow_unsandboxed_code": "Run model-written code (`code_passes`) without the sandbox, for "
                              "every case of the run; the verdicts name who opted in "
                              "(load/sandbox.py). Only where the sandbox cannot run.",
    "setup_argv": "The command that builds what `[vars]` point at (run by the dry run's "
                  "checklist, not by a run).",
    "server.engine": "The serving engine: " + ", ".join(f"`{e}`" for e in E.ENGINES)
                     + ", or an installed plugin's (docs/extending.md). Decides the "
                     "engine-specific readers (metrics, log, cache flush).",
    "server.api": "The API flavour Strata speaks: " + ", ".join(f"`{a}`" for a in E.API_FLAVOURS)
                  + " (`--strata-api` replaces it).",
    "server.argv": "The server command, an argv list with placeholders (`{host}`, `{port}`, "
                   "`{run_dir}`, `{python}`, `{root}` and any `[vars]` entry); never a shell "
                   "string.",
    "server.env": "Environment variables of the server process (values may use placeholders).",
    "server.host": "The address the server listens on and Strata connects to.",
    "server.health_path": "Polled until it answers 200 after the server starts.",
    "server.health_timeout_s": "Seconds a starting server may take to answer the health path.",
    "server.stop_timeout_s": "Seconds between SIGTERM and SIGKILL when the server stops.",
    "server.model_name": "The `model` field sent with each request (OpenAI APIs); \"\": the "
                         "server's only model.",
    "server.configs.<id>": "One way of starting the server, a parameter of the session server "
                           "fixture (its table name is the configuration id cases name in "
                           "`strata_configs`/`strata_blocks`). None: one configuration "
                           "`default`, the server's own argv.",
    "server.configs.<id>.argv": "Arguments appended to `server.argv` for this configuration.",
    "server.configs.<id>.env": "Environment variables added to `server.env` for this "
                               "configuration.",
    "server.configs.<id>.label": "What this configuration is, for the report.",
    "server.container.runtime": "The container runtime: "
                                + ", ".join(f"`{r}`" for r in P.CONTAINER_RUNTIMES) + ".",
    "server.container.image": "The image (name or id) the server's argv runs in.",
    "server.container.env": "Variables set inside the container, by name (`-e NAME`; the "
                            "value never appears in an argv or the run folder).",
    "server.container.env_pass": "Names of variables of Strata's own environment (secrets) "
                                 "passed into the container the same way.",
    "telemetry.interval_s": "Seconds between samples of every collector.",
    "telemetry.baseline_s": "Seconds of idle baseline sampled after the server is up, before "
                            "the first case.",
    "telemetry.cooldown_s": "Seconds sampled after the last case, before the server stops.",
    "telemetry.collectors": "Which collectors the agent runs, by name: docs/agent.md, "
                            "\"Collectors\", lists every name the agent's registry "
                            "(`agent/collectors/registry.py`) has and what each samples; "
                            "an installed plugin's too (docs/extending.md).",
    "telemetry.pid_pattern": "A regular expression matched against process command lines to "
                             "find the server's processes when Strata did not start it (an "
                             "attached server, a container's workers); \"\": none. Attached, "
                             "it names the engine and wins over the engine the request's "
                             "path leads to (docs/attribution.md, \"The request's path\").",
    "telemetry.log_patterns": "Named regular expressions the log collector matches in the "
                              "server's log; each named group becomes a sample.",
    "telemetry.link_caps": "`\"<node>/<interface>\" = bits/s` where the real limit is not the "
                           "NIC's rate (shaping, a shared uplink): the network rules measure "
                           "against it.",
    "prometheus.url": "An existing Prometheus to pull each case window from (clusters "
                      "without agents); \"\": none.",
    "prometheus.jobs": "`job name = kind`, the kind one of `node`, `dcgm`, `engine`.",
    "nodes.name": "The node's name (used in `telemetry.link_caps` and the report).",
    "nodes.role": "`head` (runs the server) or `worker` (runs `server.worker_argv`).",
    "load.engine": "Where the load generator runs: " + ", ".join(f"`{e}`" for e in L.ENGINES)
                   + " (`local`: this host, one loop or the worker pool; `ray`: Ray actors "
                   "on the user's cluster, docs/scale.md).",
    "load.workers_per_node": "Ray: actors per node, spread over the nodes by a placement group.",
    "nodes.ssh_host": "Where the node is reached over ssh; \"\": this machine.",
}
_HEADER = """# Profile reference

Every key of a Strata profile (TOML), with its type, default and meaning. A bad value
stops the run at start-up naming the file, the key and what was expected; an unknown
key is an error too (a typo is not ignored). Examples: `fixtures/profiles/`, and the
packaged `local` profile (`strata_plugin/profiles/local.toml`).

Generated from the profile dataclasses (`strata_plugin/configure/profile.py`) by
`python -m strata_plugin profile-doc -o docs/profile.md`; `tests/test_profile_doc.py`
fails when this file is not current.
"""


def _comments(cls: type) -> dict[str, str]:
    """Field name -> its comment in the class source (``#:`` lines above, or ``#`` after)."""
    src = textwrap.dedent(inspect.getsource(cls))
    by_line: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            by_line[tok.start[0]] = tok.string
    lines = src.splitlines()
    out: dict[str, str] = {}
    for node in ast.parse(src).body[0].body:  # type: ignore[attr-defined]
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, n = [], node.lineno - 1
        while n >= 1 and lines[n - 1].strip().startswith("#:"):
            above.insert(0, lines[n - 1].strip()[2:].strip())
            n -= 1
        after = by_line.get(node.end_lineno or node.lineno, "")
        after = after.lstrip("#").strip() if after and not after.startswith("#:") else ""
        text = " ".join(above + ([after] if after else []))
        if text:
            out[node.target.id] = text
    return out


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
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        v = f.default_factory()  # type: ignore[misc]
    else:
        return "required"
    if v is None:
        return "unset"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, tuple) and not v:
        return "{}" if "tuple[tuple" in str(f.type) else "[]"
    if isinstance(v, tuple) and all(isinstance(x, tuple) for x in v):
        return "{" + ", ".join(f"{a} = {b}" for a, b in v) + "}"
    if isinstance(v, tuple) and all(isinstance(x, str) for x in v):
        return "[" + ", ".join(f'"{x}"' for x in v) + "]"
    if isinstance(v, tuple):
        return "[" + ", ".join(str(x) for x in v) + "]"
    return str(v)


def _sentence(text: str) -> str:
    text = text.strip()
    if not text:
        return ""
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", ")", "`")) else text + "."


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def profile_keys() -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, meaning) for every profile key, in document order."""
    rows: list[tuple[str, str, str, str]] = []
    for section, cls, left_out in SECTIONS:
        comments = _comments(cls)
        prefix = f"{section}." if section else ""
        for f in dataclasses.fields(cls):
            if f.name in left_out:
                continue
            key = prefix + f.name
            name = prefix + RENAMED.get(key, f.name)
            meaning = MEANINGS.get(key) or _sentence(comments.get(f.name, ""))
            rows.append((name, _type(str(f.type)), DEFAULTS.get(key) or _default(f), meaning))
        for extra, typ, default in EXTRA_KEYS.get(section, ()):
            key = prefix + extra
            rows.append((key, typ, default, MEANINGS.get(key, "")))
    return rows


def undocumented() -> list[str]:
    """Keys with no meaning (a new field needs a comment or an entry in MEANINGS)."""
    return [k for k, _, _, meaning in profile_keys() if not meaning.strip()]


def render() -> str:
    by_section: dict[str, list[tuple[str, str, str, str]]] = {}
    for row in profile_keys():
        key = row[0]
        section = max((s for s, _, _ in SECTIONS if s and key.startswith(s + ".")),
                      key=len, default="")
        by_section.setdefault(section, []).append(row)
    out = [_HEADER]
    titles = {"": "Top level", "nodes": "[[nodes]]"}
    for section, _, _ in SECTIONS:
        rows = by_section.get(section)
        if not rows:
            continue
        title = titles.get(section, f"[{section}]")
        out.append(f"\n## {title}\n\n")
        if section in MEANINGS:
            out.append(MEANINGS[section] + "\n\n")
        out.append("| key | type | default | meaning |\n| --- | --- | --- | --- |\n")
        for key, typ, default, meaning in rows:
            short = key[len(section) + 1:] if section else key
            out.append(f"| `{short}` | {_cell(typ)} | {_cell(default)} | {_cell(meaning)} |\n")
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


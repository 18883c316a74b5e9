"""Profiles and options become one frozen, validated config.

A profile is a TOML file describing a deployment: how to start (or reach) the
server, which API flavour to speak, telemetry settings and how to scale the
workload matrix. A bad profile fails at start-up with the file, the key and
what was expected, before anything is launched.
"""

from __future__ import annotations

import os
import re
import string
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata_plugin.agent.collectors import registry as collector_registry
from strata_plugin.agent.collectors.log import parse_pattern
from strata_plugin.configure.credentials import UrlAuth
from strata_plugin.configure.engines import (
    API_FLAVOURS,
    ENGINE_TABLE,
    ENGINES,
    engine,
    engine_names,
)
from strata_plugin.configure.keys import Key, default_of, field_for, key, key_of
from strata_plugin.configure.load_spec import LoadSpec, read_load
from strata_plugin.configure.names import NAME_RULE, SSH_HOST_RULE, is_name, valid_ssh_host
from strata_plugin.entry_points import collector_names
from strata_plugin.errors import StrataError
from strata_plugin.formats.telemetry import TelemetryFacts

#: Strata's own telemetry collectors: the agent's registry (it owns the names). A
#: profile may also name an installed plugin's (``entry_points.collector_names``).
COLLECTORS = collector_registry.names()


#: The ``[scale]`` keys a profile may set (``Workload.scaled``'s factors).
SCALE_KEYS = ("context", "output", "concurrency")
#: Placeholders the harness fills in every argv and env value besides ``[vars]``
#: (``run/session.py``, ``placeholder_values``); ``[vars]`` values may use these too.
BUILTIN_PLACEHOLDERS = ("host", "port", "run_dir", "python", "root", "strata_cache")
#: A placeholder is a plain ``{name}``: no attribute, index, conversion or format spec
#: (``{x.y}``, ``{x[0]}``, ``{x!r}``, ``{x:>9}`` would fail, or blow up, at launch).
_PLACEHOLDER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: ``server.host``'s rule, as its error says it.
_HOST_RULE = "a host name or an IPv4 or IPv6 address (or a [vars] placeholder holding one)"
#: ``server.token_id_range``'s rule, as its error says it.
_ID_RANGE_RULE = "[low, high] with 0 <= low < high"


class ProfileError(StrataError, ValueError):
    """A profile that cannot be used, with the file and key at fault."""

    def __init__(self, path: Path | str, key: str, expected: str, got: object = None) -> None:
        self.path, self.key, self.expected = str(path), key, expected
        got_txt = "" if got is None else f", got {_short(repr(got))}"
        super().__init__(f"{path}: key '{key}': expected {expected}{got_txt}")


def _short(text: str, limit: int = 200) -> str:
    """A bad value as quoted in an error: a megabyte string is cut, not printed."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


@dataclass(frozen=True)
class ServerConfig:
    """One way of starting the server: a parameter of the session server fixture."""

    config_id: str
    #: ``server.argv`` and then the key's args, placeholders still in them ({host}, ...)
    argv: tuple[str, ...] = key(toml="args", shown="[]", doc="Arguments appended to "
                                "`server.argv` for this configuration.")
    env: tuple[tuple[str, str], ...] = key((), doc="Environment variables added to "
                                           "`server.env` for this configuration.")
    label: str = key("", doc="What this configuration is, for the report.")


@dataclass(frozen=True)
class NodeSpec:
    name: str = key(rule=f"a node name: {NAME_RULE}; unique",
                    doc="The node's name (used in `telemetry.link_caps` and the report).")
    role: str = key("head", choices=("head", "worker"),
                    doc="`head` runs the server (exactly one node), `worker` runs "
                        "`server.worker_argv`.")
    ssh_host: str = key("", rule=SSH_HOST_RULE,
                        doc="Where the node is reached over ssh; \"\": this machine.")

    @property
    def is_head(self) -> bool:
        """The server runs on this node. The one place the head rule is written: the
        loader requires exactly one head, the run's agent fleet (``run/agents.py``) names
        it, and everything else asks one of the two."""
        return self.role == "head"


@dataclass(frozen=True)
class TelemetrySpec:
    interval_s: float = key(0.5, lo=0.1, hi=60, doc="Seconds between samples of every "
                            "collector.")
    baseline_s: float = key(15.0, lo=0, hi=3600, doc="Seconds of idle baseline sampled after "
                            "the server is up, before the first case.")
    cooldown_s: float = key(15.0, lo=0, hi=3600, doc="Seconds sampled after the last case, "
                            "before the server stops.")
    collectors: tuple[str, ...] = key(
        ("proc", "cpu", "mem", "disk", "net", "nvml", "prom", "log"),
        rule="names the agent's registry or an installed plugin has",
        doc="Which collectors the agent runs, by name: docs/agent.md, \"Collectors\", lists "
            "every name the agent's registry (`agent/collectors/registry.py`) has and what "
            "each samples; an installed plugin's too (docs/extending.md).")
    pid_pattern: str = key(
        "", rule="a regular expression",
        doc="A regular expression matched against process command lines to find the "
            "server's processes when Strata did not start it (an attached server, a "
            "container's workers); \"\": none. Attached, it names the engine and wins over "
            "the engine the request's path leads to (docs/attribution.md, \"The request's "
            "path\"; run/listener.py).")
    log_patterns: tuple[tuple[str, str], ...] = key(
        (), rule="probe names like [A-Za-z_][A-Za-z0-9_.]*, each a regular expression",
        doc="Named regular expressions the log collector matches in the server's log; each "
            "named group becomes a sample.")
    link_caps: tuple[tuple[str, float], ...] = key(
        (), lo=1.0, hi=1e13,
        doc="`\"<node>/<interface>\" = bits/s` where the real limit is not the NIC's rate "
            "(shaping, a shared uplink): the network rules measure against it; <node> is "
            "one of `[[nodes]]`.")
    gpu_expected: bool | None = key(
        None, doc="Does the server run on GPUs? Unset: only when its container is given GPUs "
        "(server.container.gpus) or the run shows one (NVML samples, the engine's log naming "
        "a GPU device); the engine's name alone does not say (vLLM runs on CPUs too). Set "
        "true where Strata may not see the GPUs (an attached server on another host): the "
        "GPU rules then apply and name what they lack.")


@dataclass(frozen=True)
class PrometheusSpec:
    """An existing Prometheus to pull each case window from (clusters without agents)."""

    url: str = key("", doc="An existing Prometheus to pull each case window from (clusters "
                   "without agents); \"\": none. Required when `jobs` are given.")
    jobs: tuple[tuple[str, str], ...] = key(
        (), choices=("node", "dcgm", "engine"), doc="`job name = kind`, the kind one of the "
        "bounds' values.")
    auth_env: str = key("", doc="The environment variable holding a bearer token; never the "
                        "token.")
    step_s: float = key(0.0, lo=0.0, hi=3600, doc="Seconds between the points pulled; 0: the "
                        "telemetry interval.")


#: Container runtimes Strata drives (``run/container.py`` builds their argv).
CONTAINER_RUNTIMES = ("docker", "podman")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_NAMES = "environment variable names"


@dataclass(frozen=True)
class ContainerSpec:
    """``[server.container]``: the server's argv runs inside this container.

    Every environment variable of the server (``[server.env]``, a configuration's env,
    ``env`` here) is set inside the container by name (``-e NAME``, the value taken from
    the runtime client's environment), so no value appears in an argv or the run folder;
    ``env_pass`` names variables of the harness's own environment (secrets) passed the
    same way.
    """

    runtime: str = key(choices=CONTAINER_RUNTIMES, doc="The container runtime.")
    image: str = key(rule="an image name or id",
                     doc="The image (name or id) the server's argv runs in.")
    name: str = key("strata", rule="a container name ([A-Za-z0-9_.-])",
                    doc="Prefix of the containers' names; the run id and block make each "
                        "container's name unique.")
    gpus: str = key("", rule='"all" or device indices such as "0,1"',
                    doc="GPUs given to the container: \"\" none, \"all\", or device indices.")
    volumes: tuple[str, ...] = key((), doc="Volumes, each `\"host:container[:options]\"`.")
    env: tuple[tuple[str, str], ...] = key(
        (), rule=_ENV_NAMES, doc="Variables set inside the container, by name (`-e NAME`; "
        "the value never appears in an argv or the run folder).")
    env_pass: tuple[str, ...] = key(
        (), rule=_ENV_NAMES, doc="Names of variables of Strata's own environment (secrets) "
        "passed into the container the same way.")
    args: tuple[str, ...] = key((), doc="Extra options of `run`, before the image.")
    runtime_args: tuple[str, ...] = key((), doc="Global options of the runtime, before every "
                                        "subcommand.")
    network: str = key("host", doc="The container's network; anything but `host` publishes "
                       "the server's port.")


@dataclass(frozen=True)
class ServerSpec:
    engine: str = key(
        choices=engine_names, rule=", ".join(f"`{e}`" for e in ENGINES) + " or an installed "
        "plugin's (docs/extending.md)",
        doc="The serving engine. Decides the engine-specific readers (metrics, log, cache "
            "flush).")
    api: str = key(
        choices=API_FLAVOURS,
        shown="the engine's: " + ", ".join(f"`{e.default_api}` ({e.name})"
                                           for e in ENGINE_TABLE if e.default_api)
        + "; required for `other`",
        doc="The API flavour Strata speaks (`--strata-api` replaces it; chat: "
            "docs/writing-cases.md).")
    host: str = key("127.0.0.1", rule=_HOST_RULE,
                    doc="The address the server listens on and Strata connects to.")
    port: int = key(0, lo=0, hi=65535, doc="The server's port; 0: a free port picked at start.")
    health_path: str = key("/health", doc="Polled until it answers 200 after the server starts.")
    health_timeout_s: float = key(300.0, lo=1, hi=7200, doc="Seconds a starting server may "
                                  "take to answer the health path.")
    stop_timeout_s: float = key(15.0, lo=0.1, hi=600, doc="Seconds between SIGTERM and "
                                "SIGKILL when the server stops.")
    request_timeout_s: float = key(600.0, lo=0.1, hi=7200, doc="Seconds of silence allowed on "
                                   "one stream.")
    api_key_env: str = key("", doc="The environment variable that holds the API key; never "
                           "the key.")
    model_name: str = key("", doc="The `model` field sent with each request (OpenAI APIs); "
                          "\"\": the server's only model.")
    configs: tuple[ServerConfig, ...] = ()  # [server.configs.<id>]
    worker_argv: tuple[str, ...] = key((), doc="Multi-node: the worker's command (an argv "
                                       "list, placeholders as in `argv`).")
    token_id_range: tuple[int, int] = key((1000, 30000), rule=_ID_RANGE_RULE,
                                          doc="Random prompt tokens come from here.")
    container: ContainerSpec | None = None  # [server.container]


@dataclass(frozen=True)
class Profile:
    path: Path
    name: str = key(doc="The profile's name, shown in reports and JUnit properties.")
    server: ServerSpec  # type: ignore[misc]  # required: mypy takes name's key() for a default
    telemetry: TelemetrySpec  # type: ignore[misc]  # required, as server is
    description: str = key("", doc="One line about the deployment, for the report.")
    nodes: tuple[NodeSpec, ...] = key(
        (NodeSpec("local"),), shown='one node, `name = "local"`',
        doc="The machines of the deployment (an array of tables, `[[nodes]]`); default one "
            "node `local`, this machine.")
    vars: tuple[tuple[str, str], ...] = key(
        (), rule="values may use the built-in placeholders, not another var",
        doc="Placeholders for argv and env values: `{name}` anywhere in `server.argv`, "
            "`server.env`, a configuration's `args`/`env`, `setup_argv` or "
            "`server.container`.")
    scale: tuple[tuple[str, float], ...] = key(
        (), lo=1e-6, hi=1e6, doc="Factors the workload matrix is scaled by "
        "(`Workload.scaled`): " + ", ".join(f"`{k}`" for k in SCALE_KEYS) + ".")
    setup_argv: tuple[str, ...] = key(
        (), doc="The command that builds what `[vars]` point at (run by the dry run's "
        "checklist, not by a run).")
    prometheus: PrometheusSpec = PrometheusSpec()
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    load: LoadSpec = field(default_factory=LoadSpec)  # [load]: where the load runs

    @property
    def has_env_values(self) -> bool:
        """Does any env table (``[server.env]``, a configuration's, the container's) hold a
        non-empty value? Such a value may be a secret: the run folder is then kept to its
        owner (``run/run_folder.create_run_dir``)."""
        s = self.server
        tables = [c.env for c in s.configs] + ([s.container.env] if s.container else [])
        return any(v for table in tables for _, v in table)

    def recorded(self) -> dict[str, Any]:
        """The profile as written into run files (manifest.json, summary.json): every env
        table cut to its sorted variable names, so a literal value (a token) is never
        written; everything else as in the file."""
        return _names_only(self.raw)

    def var(self, name: str) -> str:
        return dict(self.vars)[name]

    def scale_factor(self, name: str, default: float = 1.0) -> float:
        return dict(self.scale).get(name, default)

    def telemetry_facts(self) -> TelemetryFacts:
        """What analysis needs from this profile, resolved once for manifest.json."""
        values = dict(self.vars)
        envs = [dict(c.env) for c in self.server.configs]
        hca = next((e["NCCL_IB_HCA"] for e in envs if "NCCL_IB_HCA" in e), "")
        try:
            hca = expand_value(hca, values)
        except ProfileError:  # a built-in ({run_dir}...) is not known here; rails have none
            pass
        rails = tuple(r.strip().lstrip("^=").split(":")[0] for r in hca.split(",") if r.strip())
        t = self.telemetry
        return TelemetryFacts(
            interval_s=t.interval_s, collectors=t.collectors,
            link_caps_bits_s=dict(t.link_caps),
            gpu_expected=(bool(self.server.container and self.server.container.gpus)
                          if t.gpu_expected is None else t.gpu_expected),
            expected_rails=rails, expects_rdma="rdma" in t.collectors or bool(rails))


#: Keys the reader reads that no field holds one to one, each declared here as a field's
#: key is: (section, TOML name, type as the reference says it, default, declaration).
UNFIELDED_KEYS: tuple[tuple[str, str, str, Any, Key], ...] = (
    ("", "allow_unsandboxed_code", "true/false", False, Key(
        doc="Run model-written code (`code_passes`) without the sandbox, for every case of "
            "the run; the verdicts name who opted in (load/sandbox.py; read by "
            "plugin/options.py). Only where the sandbox cannot run.")),
    ("server", "argv", "list of strings", (), Key(
        shown="[] (a profile only used attached, with --strata-server-url)",
        doc="The server command, an argv list with placeholders (`{host}`, `{port}`, "
            "`{run_dir}`, `{python}`, `{root}`, `{strata_cache}` and any `[vars]` entry); "
            "never a shell string. Each configuration starts it with its own `args`.")),
    ("server", "env", "table of strings", (), Key(
        doc="Environment variables of the server process (values may use placeholders); "
            "each configuration's `env` is added.")),
)


def _unfielded(section: str, name: str) -> Any:
    """The default of a key no field holds (:data:`UNFIELDED_KEYS`)."""
    return next(d for s, n, _, d, _ in UNFIELDED_KEYS if (s, n) == (section, name))


# --- validation helpers -------------------------------------------------------------------


class _Reader:
    """Reads typed values out of a TOML table, naming the dotted key on error.

    ``spec`` is the dataclass the table fills: a key left out takes that field's default,
    so every default is written once, on the dataclass (issue 26). A key whose field has no
    default (``server.engine``) is required, unless the call passes a default of its own.
    A number's bounds and a choice's values come from the field's declaration too
    (``configure/keys.py``), unless the call gives them (a table's values).
    """

    def __init__(self, path: Path, table: dict[str, Any], prefix: str = "",
                 spec: type | None = None) -> None:
        self.path, self.table, self.prefix, self.spec = path, table, prefix, spec
        self.seen: set[str] = set()

    def _key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def field_default(self, name: str) -> Any:
        """The default of the field key ``name`` fills (``...`` where it has none)."""
        f = field_for(self.spec, name)
        return ... if f is None else default_of(f)

    def declared(self, name: str) -> Key:
        """The declaration of the field key ``name`` fills (``configure/keys.py``)."""
        f = field_for(self.spec, name)
        k = key_of(f) if f is not None else None
        if k is None:
            raise TypeError(f"{self._key(name)}: no declared field of {self.spec} holds it")
        return k

    def _bounds(self, name: str, lo: float | None, hi: float | None) -> tuple[Any, Any]:
        if lo is None or hi is None:
            k = self.declared(name)
            lo, hi = k.lo, k.hi
        if lo is None or hi is None:
            raise TypeError(f"{self._key(name)}: declared without bounds")
        return lo, hi

    def get(self, name: str, typ: type | tuple[type, ...], default: Any = ..., *,
            expected: str = "") -> Any:
        self.seen.add(name)
        if default is ...:
            default = self.field_default(name)
        if name not in self.table:
            if default is ...:
                what = expected or _tname(typ)
                raise ProfileError(self.path, self._key(name), f"{what} (missing)")
            return default
        value = self.table[name]
        ok = isinstance(value, typ) and not (isinstance(value, bool) and bool not in _tup(typ))
        if not ok:
            raise ProfileError(self.path, self._key(name), expected or _tname(typ), value)
        return value

    def number(self, name: str, default: Any = ..., *, lo: float | None = None,
               hi: float | None = None) -> float:
        lo, hi = self._bounds(name, lo, hi)
        raw = self.get(name, (int, float), default)
        try:
            value = float(raw)
        except OverflowError:  # an integer too large for a float
            raise ProfileError(self.path, self._key(name), f"a number in [{lo}, {hi}]",
                               raw) from None
        if not lo <= value <= hi:
            raise ProfileError(self.path, self._key(name), f"a number in [{lo}, {hi}]", value)
        return value

    def integer(self, name: str, default: Any = ..., *, lo: int | None = None,
                hi: int | None = None) -> int:
        """A whole number: ``8080.9`` (or ``8080.0``) is refused, never truncated."""
        lo, hi = self._bounds(name, lo, hi)
        what = f"an integer in [{lo}, {hi}]"
        value = self.get(name, int, default, expected=what)
        if not lo <= value <= hi:
            raise ProfileError(self.path, self._key(name), what, value)
        return value

    def str_list(self, name: str) -> tuple[str, ...]:
        """A list of strings; missing: the field's default, else empty."""
        default = self.field_default(name)
        value = self.get(name, list, [] if default is ... else list(default),
                         expected="a list of strings")
        if not all(isinstance(v, str) for v in value):
            raise ProfileError(self.path, self._key(name), "a list of strings", value)
        return tuple(value)

    def choice(self, name: str, choices: tuple[str, ...] | None = None,
               default: Any = ...) -> str:
        if choices is None:
            declared = self.declared(name).choices
            choices = declared() if callable(declared) else declared
        value = self.get(name, str, default, expected=f"one of {list(choices)}")
        if value not in choices:
            raise ProfileError(self.path, self._key(name), f"one of {list(choices)}", value)
        return value

    def sub(self, name: str, spec: type | None = None) -> _Reader:
        table = self.get(name, dict, {}, expected="a table")
        return _Reader(self.path, table, f"{self._key(name)}.", spec)

    def reject_unknown(self) -> None:
        unknown = sorted(set(self.table) - self.seen)
        if unknown:
            raise ProfileError(self.path, self._key(unknown[0]), "a known key (typo?)")


def _tup(typ: type | tuple[type, ...]) -> tuple[type, ...]:
    return typ if isinstance(typ, tuple) else (typ,)


def _tname(typ: type | tuple[type, ...]) -> str:
    names = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true/false",
             "list": "a list", "dict": "a table"}
    return " or ".join(names.get(t.__name__, t.__name__) for t in _tup(typ))


def _str_table(r: _Reader, name: str) -> tuple[tuple[str, str], ...]:
    sub = r.sub(name)
    out = []
    for entry in list(sub.table):
        out.append((entry, sub.get(entry, str)))
    return tuple(out)


def _number_table(r: _Reader, name: str) -> tuple[tuple[str, float], ...]:
    """A table of numbers, each value within the bounds declared on the field ``name``."""
    lo, hi = r._bounds(name, None, None)
    sub = r.sub(name)
    return tuple((k, sub.number(k, lo=lo, hi=hi)) for k in list(sub.table))


def _server_configs(r: _Reader, base_argv: tuple[str, ...],
                    base_env: tuple[tuple[str, str], ...]) -> tuple[ServerConfig, ...]:
    table = r.sub("configs")
    if not table.table:
        return (ServerConfig("default", base_argv, base_env),)
    configs = []
    for cid in list(table.table):
        if not is_name(cid):  # it names the block's folders (service/<id>/)
            raise ProfileError(r.path, table._key(cid), f"a configuration id: {NAME_RULE}",
                               cid)
        c = table.sub(cid, ServerConfig)
        args = c.str_list("args")
        env = base_env + _str_table(c, "env")
        label = c.get("label", str)
        c.reject_unknown()
        configs.append(ServerConfig(cid, base_argv + args, env, label))
    return tuple(configs)


def _container(r: _Reader) -> ContainerSpec | None:
    if "container" not in r.table:
        r.seen.add("container")
        return None
    c = r.sub("container", ContainerSpec)
    gpus_rule = c.declared("gpus").rule
    gpus = c.get("gpus", str, expected=gpus_rule)
    if gpus and gpus != "all" and not re.fullmatch(r"\d+(,\d+)*", gpus):
        raise ProfileError(r.path, c._key("gpus"), gpus_rule, gpus)
    env = _str_table(c, "env")
    env_pass = c.str_list("env_pass")
    for name in [k for k, _ in env] + list(env_pass):
        if not _ENV_NAME.match(name):
            raise ProfileError(r.path, c._key("env"), _ENV_NAMES, name)
    spec = ContainerSpec(
        runtime=c.choice("runtime"), image=c.get("image", str),
        name=c.get("name", str), gpus=gpus, volumes=c.str_list("volumes"),
        env=env, env_pass=env_pass, args=c.str_list("args"),
        runtime_args=c.str_list("runtime_args"), network=c.get("network", str))
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", spec.name):
        raise ProfileError(r.path, c._key("name"), c.declared("name").rule, spec.name)
    if not spec.image:
        raise ProfileError(r.path, c._key("image"), c.declared("image").rule, spec.image)
    c.reject_unknown()
    return spec


def _id_range(r: _Reader) -> tuple[int, int]:
    value = r.get("token_id_range", list, expected="[low, high] token ids")
    if (len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            or not 0 <= value[0] < value[1]):
        raise ProfileError(r.path, r._key("token_id_range"), _ID_RANGE_RULE, value)
    return (value[0], value[1])


#: Profiles shipped inside the package, usable by name from any repository.
PACKAGED_PROFILES = Path(__file__).resolve().parent.parent / "profiles"


def packaged_profiles() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PACKAGED_PROFILES.glob("*.toml"))}


def resolve_profile(value: str, rootdir: Path) -> Path:
    """A profile option's file: a packaged profile's name (``local``), else a path,
    relative to the invoking repository's rootdir."""
    packaged = packaged_profiles()
    if value in packaged:
        return packaged[value]
    path = Path(value).expanduser()
    return path if path.is_absolute() else rootdir / path


def load_profile(path: Path | str) -> Profile:
    """Read and validate a profile; raise ProfileError naming the key at fault."""
    path = Path(path)
    data = _read_toml(path)
    top = _Reader(path, data, spec=Profile)
    name = top.get("name", str)
    description = top.get("description", str)
    vars_ = _str_table(top, "vars")
    setup_argv = top.str_list("setup_argv")
    top.get("allow_unsandboxed_code", bool, _unfielded("", "allow_unsandboxed_code"))

    s = top.sub("server", ServerSpec)
    engine_name = s.choice("engine")
    api = s.choice("api", default=engine(engine_name).default_api or ...)
    base_argv = s.str_list("argv")
    base_env = _str_table(s, "env")
    server = ServerSpec(
        engine=engine_name,
        api=api,
        host=_server_host(s, vars_),
        port=s.integer("port"),
        health_path=s.get("health_path", str),
        health_timeout_s=s.number("health_timeout_s"),
        stop_timeout_s=s.number("stop_timeout_s"),
        request_timeout_s=s.number("request_timeout_s"),
        api_key_env=s.get("api_key_env", str),
        model_name=s.get("model_name", str),
        configs=_server_configs(s, base_argv, base_env),
        worker_argv=s.str_list("worker_argv"),
        token_id_range=_id_range(s),
        container=_container(s),
    )
    s.reject_unknown()
    if server.container is not None:  # passed as `-e NAME`: a name must be one name
        for conf in server.configs:
            for k, _ in conf.env:
                if not _ENV_NAME.match(k):
                    raise ProfileError(path, f"server.configs.{conf.config_id}.env",
                                       "environment variable names (set inside the "
                                       "container by name)", k)
    if not server.configs[0].argv and len(server.configs) == 1:
        pass  # attach-only profiles have no argv; --strata-server-url is then required

    t = top.sub("telemetry", TelemetrySpec)
    collectors = t.str_list("collectors")
    known = collector_names()  # read now: the registry's and the installed plugins'
    for c in collectors:
        if c not in known:
            raise ProfileError(path, "telemetry.collectors", f"names from {list(known)}", c)
    telemetry = TelemetrySpec(
        interval_s=t.number("interval_s"),
        baseline_s=t.number("baseline_s"),
        cooldown_s=t.number("cooldown_s"),
        collectors=collectors,
        pid_pattern=_regex(t, "pid_pattern"),
        log_patterns=_log_patterns(t),
        link_caps=_number_table(t, "link_caps"),
        gpu_expected=t.get("gpu_expected", bool),
    )
    t.reject_unknown()

    pr = top.sub("prometheus", PrometheusSpec)
    jobs = _str_table(pr, "jobs")
    declared = pr.declared("jobs").choices
    kinds = declared() if callable(declared) else declared
    for job, kind in jobs:
        if kind not in kinds:
            raise ProfileError(path, f"prometheus.jobs.{job}", f"one of {', '.join(kinds)}",
                               kind)
    prometheus = PrometheusSpec(url=pr.get("url", str), jobs=jobs,
                                auth_env=pr.get("auth_env", str),
                                step_s=pr.number("step_s"))
    if jobs and not prometheus.url:
        raise ProfileError(path, "prometheus.url", "a URL when prometheus.jobs are given")
    pr.reject_unknown()

    nodes = _nodes(top)

    for k in top.sub("scale").table:
        if k not in SCALE_KEYS:
            raise ProfileError(path, f"scale.{k}", f"one of {list(SCALE_KEYS)} (typo?)")
    scale = _number_table(top, "scale")
    load = read_load(top.sub("load", LoadSpec), ProfileError)
    top.reject_unknown()
    _check_link_caps(path, telemetry.link_caps, [n.name for n in nodes])
    _check_placeholders(path, data, {k for k, _ in vars_} | set(BUILTIN_PLACEHOLDERS))
    for k, v in vars_:  # a var may use the built-ins, not another var (session.py)
        _check_text(path, f"vars.{k}", v, set(BUILTIN_PLACEHOLDERS))
    return Profile(path, name, server, telemetry, description=description, nodes=nodes,
                   vars=vars_, scale=scale, setup_argv=setup_argv, prometheus=prometheus,
                   raw=data, load=load)


def _read_toml(path: Path) -> dict[str, Any]:
    """The file's TOML, or a ProfileError saying why not (missing, unreadable, not UTF-8,
    not TOML): never a bare OSError or UnicodeDecodeError."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ProfileError(path, "<file>", "an existing TOML file") from None
    except OSError as exc:
        raise ProfileError(path, "<file>", f"a readable TOML file ({exc.strerror or exc})"
                           ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ProfileError(path, "<file>", f"UTF-8 text (byte {exc.start}, on line {line}, "
                           f"is {raw[exc.start:exc.start + 1]!r}: {exc.reason})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(path, "<syntax>", f"valid TOML ({exc})") from None
    except (ValueError, RecursionError) as exc:  # an integer of 5,000 digits, deep nesting
        raise ProfileError(path, "<syntax>", f"valid TOML ({type(exc).__name__}: "
                           f"{_short(str(exc))})") from None


def _server_host(s: _Reader, vars_: tuple[tuple[str, str], ...]) -> str:
    """``server.host``: the address the server binds and the client connects to. It may
    be a ``[vars]`` placeholder (``"{head_addr}"``, the address the workers also use),
    resolved here, once, so every use (URL, bind check, ``{host}``) sees one address."""
    text = s.get("host", str)
    plain = {k: v for k, v in vars_ if "{" not in v and "}" not in v}
    _check_text(s.path, s._key("host"), text, set(plain))
    host = expand_value(text, plain)
    if "@" in host or not valid_ssh_host(host):
        raise ProfileError(s.path, s._key("host"), _HOST_RULE, host)
    return host


def _regex(r: _Reader, name: str) -> str:
    """A regular expression the agent compiles: checked here, not when the agent starts."""
    value = r.get(name, str)
    try:
        re.compile(value)
    except re.error as exc:
        raise ProfileError(r.path, r._key(name), f"a regular expression ({exc})",
                           value) from None
    return value


def _log_patterns(r: _Reader) -> tuple[tuple[str, str], ...]:
    """``[telemetry.log_patterns]``: probe name -> regex, as the agent parses them."""
    out = _str_table(r, "log_patterns")
    for name, rx in out:
        key = f"{r._key('log_patterns')}.{name}"
        try:  # the agent's own rule for a name (an empty regex always compiles)
            parse_pattern(f"{name}=")
            ok = "=" not in name
        except ValueError:
            ok = False
        if not ok:
            raise ProfileError(r.path, key, "a probe name like [A-Za-z_][A-Za-z0-9_.]*", name)
        try:
            re.compile(rx)
        except re.error as exc:
            raise ProfileError(r.path, key, f"a regular expression ({exc})", rx) from None
    return out


def _nodes(top: _Reader) -> tuple[NodeSpec, ...]:
    """``[[nodes]]``: unique safe names, checked ssh hosts, exactly one head."""
    path = top.path
    nodes: list[NodeSpec] = []
    raw_nodes = top.get("nodes", list, expected="an array of tables")
    if isinstance(raw_nodes, tuple):  # left out: the field's default nodes, each read as
        raw_nodes = [{"name": n.name} for n in raw_nodes]  # a table naming it alone
    for i, n in enumerate(raw_nodes):
        if not isinstance(n, dict):
            raise ProfileError(path, f"nodes[{i}]", "a table", n)
        nr = _Reader(path, n, f"nodes[{i}].", NodeSpec)
        name = nr.get("name", str)
        if not is_name(name):  # it names the node's folder (nodes/<name>/)
            raise ProfileError(path, nr._key("name"), f"a node name: {NAME_RULE}", name)
        if name in [m.name for m in nodes]:
            raise ProfileError(path, nr._key("name"), "a name no other node has", name)
        role = nr.choice("role")
        host = nr.get("ssh_host", str)
        if host and not valid_ssh_host(host):
            raise ProfileError(path, nr._key("ssh_host"), SSH_HOST_RULE, host)
        nr.reject_unknown()
        nodes.append(NodeSpec(name, role, host))
    heads = [n.name for n in nodes if n.is_head]
    if len(heads) != 1:
        raise ProfileError(path, "nodes", 'exactly one node with role = "head" (the server '
                           "runs there; a node's role defaults to head)", heads)
    return tuple(nodes)


def _check_link_caps(path: Path, caps: tuple[tuple[str, float], ...], nodes: list[str]) -> None:
    """Each ``"node/iface"`` names a node of the profile (a typo would silently measure
    the link against its nominal speed)."""
    for cap, _ in caps:
        node, sep, iface = cap.rpartition("/")
        if not sep or not iface or node not in nodes:
            raise ProfileError(path, f"telemetry.link_caps.{cap}",
                               f'"<node>/<interface>" with <node> one of {nodes}')


def _check_placeholders(path: Path, data: dict[str, Any], known: set[str]) -> None:
    """Every ``{name}`` in argv lists and env values is one the harness will fill."""
    server = data.get("server", {})
    where: list[tuple[str, Any]] = [("setup_argv", data.get("setup_argv", []))]
    where += [("server.argv", server.get("argv", [])),
              ("server.worker_argv", server.get("worker_argv", []))]
    where += [(f"server.env.{k}", v) for k, v in server.get("env", {}).items()]
    ctr = server.get("container", {})
    where += [(f"server.container.{k}", ctr.get(k, []))
              for k in ("volumes", "args", "runtime_args")]
    where += [("server.container.image", ctr.get("image", ""))]
    where += [(f"server.container.env.{k}", v) for k, v in ctr.get("env", {}).items()]
    for cid, c in server.get("configs", {}).items():
        where.append((f"server.configs.{cid}.args", c.get("args", [])))
        where += [(f"server.configs.{cid}.env.{k}", v) for k, v in c.get("env", {}).items()]
    for at, value in where:
        items = [(f"{at}[{i}]", v) for i, v in enumerate(value)] if isinstance(
            value, list) else [(at, value)]
        for k, text in items:
            if isinstance(text, str):
                _check_text(path, k, text, known)


def _placeholders(text: str) -> list[tuple[str, str | None, str | None, str | None]]:
    """``string.Formatter`` parts of ``text``: (literal, field, spec, conversion)."""
    return list(string.Formatter().parse(text))


def _check_text(path: Path, key: str, text: str, known: set[str]) -> None:
    """Each placeholder of one value is a plain ``{name}`` the harness will fill."""
    expected = f"placeholders from {sorted(known)} (or {{{{ }}}} for a literal brace)"
    try:
        parts = _placeholders(text)
    except ValueError as exc:
        raise ProfileError(path, key, f"{expected}: {exc}", text) from None
    for _, name, spec, conv in parts:
        if name is None:
            continue
        if not _PLACEHOLDER.fullmatch(name) or spec or conv is not None:
            raise ProfileError(path, key, "plain {name} placeholders (no attribute, index, "
                               f"conversion or format spec) with name from {sorted(known)}",
                               text)
        if name not in known:
            raise ProfileError(path, key, expected, text)


# --- run-time options ---------------------------------------------------------------------


@dataclass(frozen=True)
class StrataConfig:
    """Everything a run needs to know, from the command line, pytest.ini and the profile."""

    profile: Profile
    reports_dir: Path
    run_id: str
    server_url: str  # "" = launch the server ourselves
    dry_run: bool
    baseline_dir: Path | None
    max_regression_pct: float
    rootdir: Path
    regression_metrics: tuple[str, ...] = ("ttft_ms", "tpot_ms")
    #: the diagnostic round: "auto" and/or case ids / workload names (run/diagnostic_round)
    escalate: tuple[str, ...] = ()
    #: cases (ids / workload names) whose repetition takes the engine's own profile
    #: (run/engine_profile.py, run/diagnostic_round.py)
    engine_profile: tuple[str, ...] = ()
    #: the credentials ``server_url`` was given with (configure/credentials.py): sent as
    #: Basic auth, never written; ``server_url`` itself holds none
    server_auth: UrlAuth | None = field(default=None, repr=False, compare=False)

    @property
    def run_dir(self) -> Path:
        return self.reports_dir / self.run_id


def expand_value(text: str, values: dict[str, str]) -> str:
    """Fill the plain ``{name}`` placeholders of one value (``{{``/``}}`` are braces).

    Not ``str.format_map``: it would follow ``{x.y}``/``{x[0]}`` into the value's
    attributes and pad ``{x:>200000000}`` to 200 MB. The loader has refused those
    already; this refuses them again for values that did not come through it."""
    if "{" not in text and "}" not in text:
        return text
    out = []
    try:
        parts = _placeholders(text)
    except ValueError as exc:
        raise ProfileError("<argv>", text, f"plain {{name}} placeholders ({exc})") from None
    for literal, name, spec, conv in parts:
        out.append(literal)
        if name is None:
            continue
        if not _PLACEHOLDER.fullmatch(name) or spec or conv is not None:
            raise ProfileError("<argv>", name, "a plain {name} placeholder", text)
        if name not in values:
            raise ProfileError("<argv>", name, "a defined placeholder", text)
        out.append(str(values[name]))
    return "".join(out)


def expand_placeholders(argv: tuple[str, ...], values: dict[str, str]) -> list[str]:
    """Fill ``{name}`` placeholders of one argv; each element stays one argument."""
    return [os.path.expanduser(expand_value(arg, values)) if "{" in arg else arg
            for arg in argv]


def _names_only(data: Any) -> Any:
    """``data`` with every ``env`` table replaced by its sorted keys (see Profile.recorded)."""
    if isinstance(data, dict):
        return {k: (sorted(v) if k == "env" and isinstance(v, dict) else _names_only(v))
                for k, v in data.items()}
    if isinstance(data, list):
        return [_names_only(v) for v in data]
    return data

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

from strata_plugin.agent.cli import ALL_COLLECTORS
from strata_plugin.formats.telemetry import TelemetryFacts

API_FLAVOURS = ("chat", "completions", "llamacpp", "sglang")
ENGINES = ("llamacpp", "vllm", "sglang", "other")
#: Telemetry collectors a profile may ask for: the agent's own list (it owns the names).
COLLECTORS = ALL_COLLECTORS


#: The ``[scale]`` keys a profile may set (``Workload.scaled``'s factors).
SCALE_KEYS = ("context", "output", "concurrency")
#: Placeholders the harness fills in every argv and env value besides ``[vars]``
#: (``run/session.py``, ``placeholder_values``).
BUILTIN_PLACEHOLDERS = ("host", "port", "run_dir", "python", "root")


class ProfileError(ValueError):
    """A profile that cannot be used, with the file and key at fault."""

    def __init__(self, path: Path | str, key: str, expected: str, got: object = None) -> None:
        self.path, self.key, self.expected = str(path), key, expected
        got_txt = "" if got is None else f", got {got!r}"
        super().__init__(f"{path}: key '{key}': expected {expected}{got_txt}")


@dataclass(frozen=True)
class ServerConfig:
    """One way of starting the server: a parameter of the session server fixture."""

    config_id: str
    argv: tuple[str, ...]  # with placeholders still in it ({host}, {port}, ...)
    env: tuple[tuple[str, str], ...] = ()
    label: str = ""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    role: str = "head"  # head | worker
    ssh_host: str = ""  # "" = this machine


@dataclass(frozen=True)
class TelemetrySpec:
    interval_s: float = 0.5
    baseline_s: float = 15.0
    cooldown_s: float = 15.0
    collectors: tuple[str, ...] = ("proc", "cpu", "mem", "disk", "net", "nvml", "prom", "log")
    pid_pattern: str = ""  # for a server started elsewhere
    log_patterns: tuple[tuple[str, str], ...] = ()
    #: "node/iface" -> bits/s where the real limit is not the NIC's rate (shaping, a
    #: shared uplink): the network rules measure against it.
    link_caps: tuple[tuple[str, float], ...] = ()
    #: Does the server run on GPUs? Unset: only when its container is given GPUs
    #: (server.container.gpus) or the run shows one (NVML samples, the engine's log naming
    #: a GPU device); the engine's name alone does not say (vLLM runs on CPUs too). Set
    #: true where Strata may not see the GPUs (an attached server on another host): the
    #: GPU rules then apply and name what they lack.
    gpu_expected: bool | None = None


@dataclass(frozen=True)
class PrometheusSpec:
    """An existing Prometheus to pull each case window from (clusters without agents)."""

    url: str = ""
    jobs: tuple[tuple[str, str], ...] = ()  # (job name, kind: node | dcgm | engine)
    auth_env: str = ""  # env var holding a bearer token; never the token
    step_s: float = 0.0  # 0 = the telemetry interval


#: Container runtimes Strata drives (``run/container.py`` builds their argv).
CONTAINER_RUNTIMES = ("docker", "podman")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ContainerSpec:
    """``[server.container]``: the server's argv runs inside this container.

    Every environment variable of the server (``[server.env]``, a configuration's env,
    ``env`` here) is set inside the container by name (``-e NAME``, the value taken from
    the runtime client's environment), so no value appears in an argv or the run folder;
    ``env_pass`` names variables of the harness's own environment (secrets) passed the
    same way.
    """

    runtime: str
    image: str
    name: str = "strata"  # prefix; the run id and block make each container's name unique
    gpus: str = ""  # "" none, "all", or device indices "0,1"
    volumes: tuple[str, ...] = ()  # "host:container[:options]"
    env: tuple[tuple[str, str], ...] = ()
    env_pass: tuple[str, ...] = ()
    args: tuple[str, ...] = ()  # extra options of `run`, before the image
    runtime_args: tuple[str, ...] = ()  # global options, before every subcommand
    network: str = "host"  # anything else publishes the server's port


@dataclass(frozen=True)
class ServerSpec:
    engine: str
    api: str
    host: str = "127.0.0.1"
    port: int = 0  # 0 = a free port picked at start
    health_path: str = "/health"
    health_timeout_s: float = 300.0
    stop_timeout_s: float = 15.0
    request_timeout_s: float = 600.0  # max silence on one stream
    api_key_env: str = ""  # name of the env var that holds the key; never the key
    model_name: str = ""
    configs: tuple[ServerConfig, ...] = ()
    worker_argv: tuple[str, ...] = ()  # multi-node: the worker's command
    token_id_range: tuple[int, int] = (1000, 30000)  # random prompt tokens come from here
    container: ContainerSpec | None = None


@dataclass(frozen=True)
class Profile:
    path: Path
    name: str
    description: str
    server: ServerSpec
    telemetry: TelemetrySpec
    nodes: tuple[NodeSpec, ...]
    vars: tuple[tuple[str, str], ...]  # placeholders usable in argv: {model}, ...
    scale: tuple[tuple[str, float], ...] = ()  # workload scaling (context, concurrency, ...)
    setup_argv: tuple[str, ...] = ()  # the command that builds what vars point at
    prometheus: PrometheusSpec = PrometheusSpec()
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

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
            hca = hca.format_map(values)
        except (KeyError, ValueError):
            pass
        rails = tuple(r.strip().lstrip("^=").split(":")[0] for r in hca.split(",") if r.strip())
        t = self.telemetry
        return TelemetryFacts(
            interval_s=t.interval_s, collectors=t.collectors,
            link_caps_bits_s=dict(t.link_caps),
            gpu_expected=(bool(self.server.container and self.server.container.gpus)
                          if t.gpu_expected is None else t.gpu_expected),
            expected_rails=rails, expects_rdma="rdma" in t.collectors or bool(rails))


# --- validation helpers -------------------------------------------------------------------


class _Reader:
    """Reads typed values out of a TOML table, naming the dotted key on error."""

    def __init__(self, path: Path, table: dict[str, Any], prefix: str = "") -> None:
        self.path, self.table, self.prefix = path, table, prefix
        self.seen: set[str] = set()

    def _key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def get(self, name: str, typ: type | tuple[type, ...], default: Any = ..., *,
            expected: str = "") -> Any:
        self.seen.add(name)
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

    def number(self, name: str, default: float, *, lo: float, hi: float) -> float:
        value = float(self.get(name, (int, float), default))
        if not lo <= value <= hi:
            raise ProfileError(self.path, self._key(name), f"a number in [{lo}, {hi}]", value)
        return value

    def str_list(self, name: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        value = self.get(name, list, list(default), expected="a list of strings")
        if not all(isinstance(v, str) for v in value):
            raise ProfileError(self.path, self._key(name), "a list of strings", value)
        return tuple(value)

    def choice(self, name: str, choices: tuple[str, ...], default: Any = ...) -> str:
        value = self.get(name, str, default, expected=f"one of {list(choices)}")
        if value not in choices:
            raise ProfileError(self.path, self._key(name), f"one of {list(choices)}", value)
        return value

    def sub(self, name: str) -> _Reader:
        table = self.get(name, dict, {}, expected="a table")
        return _Reader(self.path, table, f"{self._key(name)}.")

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
    for key in list(sub.table):
        out.append((key, sub.get(key, str)))
    return tuple(out)


def _server_configs(r: _Reader, base_argv: tuple[str, ...],
                    base_env: tuple[tuple[str, str], ...]) -> tuple[ServerConfig, ...]:
    table = r.sub("configs")
    if not table.table:
        return (ServerConfig("default", base_argv, base_env),)
    configs = []
    for cid in list(table.table):
        c = table.sub(cid)
        args = c.str_list("args")
        env = base_env + _str_table(c, "env")
        label = c.get("label", str, "")
        c.reject_unknown()
        configs.append(ServerConfig(cid, base_argv + args, env, label))
    return tuple(configs)


def _container(r: _Reader) -> ContainerSpec | None:
    if "container" not in r.table:
        r.seen.add("container")
        return None
    c = r.sub("container")
    gpus = c.get("gpus", str, "", expected='"all" or device indices such as "0,1"')
    if gpus and gpus != "all" and not re.fullmatch(r"\d+(,\d+)*", gpus):
        raise ProfileError(r.path, c._key("gpus"), '"all" or device indices such as "0,1"',
                           gpus)
    env = _str_table(c, "env")
    env_pass = c.str_list("env_pass")
    for name in [k for k, _ in env] + list(env_pass):
        if not _ENV_NAME.match(name):
            raise ProfileError(r.path, c._key("env"), "environment variable names", name)
    spec = ContainerSpec(
        runtime=c.choice("runtime", CONTAINER_RUNTIMES), image=c.get("image", str),
        name=c.get("name", str, "strata"), gpus=gpus, volumes=c.str_list("volumes"),
        env=env, env_pass=env_pass, args=c.str_list("args"),
        runtime_args=c.str_list("runtime_args"), network=c.get("network", str, "host"))
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", spec.name):
        raise ProfileError(r.path, c._key("name"), "a container name ([A-Za-z0-9_.-])",
                           spec.name)
    if not spec.image:
        raise ProfileError(r.path, c._key("image"), "an image name or id", spec.image)
    c.reject_unknown()
    return spec


def _caps(r: _Reader) -> tuple[tuple[str, float], ...]:
    sub = r.sub("link_caps")
    return tuple((k, sub.number(k, 0.0, lo=1.0, hi=1e13)) for k in list(sub.table))


def _id_range(r: _Reader) -> tuple[int, int]:
    value = r.get("token_id_range", list, [1000, 30000], expected="[low, high] token ids")
    if (len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            or not 0 <= value[0] < value[1]):
        raise ProfileError(r.path, r._key("token_id_range"), "[low, high] with 0 <= low < high",
                           value)
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
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(path, "<file>", "an existing TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(path, "<syntax>", f"valid TOML ({exc})") from None
    top = _Reader(path, data)
    name = top.get("name", str)
    description = top.get("description", str, "")
    vars_ = _str_table(top, "vars")
    setup_argv = top.str_list("setup_argv")

    s = top.sub("server")
    engine = s.choice("engine", ENGINES)
    api = s.choice("api", API_FLAVOURS)
    base_argv = s.str_list("argv")
    base_env = _str_table(s, "env")
    server = ServerSpec(
        engine=engine,
        api=api,
        host=s.get("host", str, "127.0.0.1"),
        port=int(s.number("port", 0, lo=0, hi=65535)),
        health_path=s.get("health_path", str, "/health"),
        health_timeout_s=s.number("health_timeout_s", 300.0, lo=1, hi=7200),
        stop_timeout_s=s.number("stop_timeout_s", 15.0, lo=0.1, hi=600),
        request_timeout_s=s.number("request_timeout_s", 600.0, lo=0.1, hi=7200),
        api_key_env=s.get("api_key_env", str, ""),
        model_name=s.get("model_name", str, ""),
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

    t = top.sub("telemetry")
    collectors = t.str_list("collectors", TelemetrySpec.collectors)
    for c in collectors:
        if c not in COLLECTORS:
            raise ProfileError(path, "telemetry.collectors", f"names from {list(COLLECTORS)}", c)
    telemetry = TelemetrySpec(
        interval_s=t.number("interval_s", 0.5, lo=0.1, hi=60),
        baseline_s=t.number("baseline_s", 15.0, lo=0, hi=3600),
        cooldown_s=t.number("cooldown_s", 15.0, lo=0, hi=3600),
        collectors=collectors,
        pid_pattern=t.get("pid_pattern", str, ""),
        log_patterns=_str_table(t, "log_patterns"),
        link_caps=_caps(t),
        gpu_expected=t.get("gpu_expected", bool, None),
    )
    t.reject_unknown()

    pr = top.sub("prometheus")
    jobs = _str_table(pr, "jobs")
    for job, kind in jobs:
        if kind not in ("node", "dcgm", "engine"):
            raise ProfileError(path, f"prometheus.jobs.{job}", "one of node, dcgm, engine", kind)
    prometheus = PrometheusSpec(url=pr.get("url", str, ""), jobs=jobs,
                                auth_env=pr.get("auth_env", str, ""),
                                step_s=pr.number("step_s", 0.0, lo=0.0, hi=3600))
    if jobs and not prometheus.url:
        raise ProfileError(path, "prometheus.url", "a URL when prometheus.jobs are given")
    pr.reject_unknown()

    nodes = []
    raw_nodes = top.get("nodes", list, [{"name": "local"}], expected="an array of tables")
    for i, n in enumerate(raw_nodes):
        if not isinstance(n, dict):
            raise ProfileError(path, f"nodes[{i}]", "a table", n)
        nr = _Reader(path, n, f"nodes[{i}].")
        nodes.append(NodeSpec(nr.get("name", str), nr.choice("role", ("head", "worker"), "head"),
                              nr.get("ssh_host", str, "")))
        nr.reject_unknown()

    sc = top.sub("scale")
    for k in sc.table:
        if k not in SCALE_KEYS:
            raise ProfileError(path, f"scale.{k}", f"one of {list(SCALE_KEYS)} (typo?)")
    scale = tuple((k, sc.number(k, 1.0, lo=1e-6, hi=1e6)) for k in list(sc.table))
    top.reject_unknown()
    _check_link_caps(path, telemetry.link_caps, [n.name for n in nodes])
    _check_placeholders(path, data, {k for k, _ in vars_} | set(BUILTIN_PLACEHOLDERS))
    return Profile(path, name, description, server, telemetry, tuple(nodes), vars_, scale,
                   setup_argv, prometheus, raw=data)


def _check_link_caps(path: Path, caps: tuple[tuple[str, float], ...], nodes: list[str]) -> None:
    """Each ``"node/iface"`` names a node of the profile (a typo would silently measure
    the link against its nominal speed)."""
    for key, _ in caps:
        node, sep, iface = key.rpartition("/")
        if not sep or not iface or node not in nodes:
            raise ProfileError(path, f"telemetry.link_caps.{key}",
                               f'"<node>/<interface>" with <node> one of {nodes}')


_FIELD_BASE = re.compile(r"[.\[]")


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
    expected = f"placeholders from {sorted(known)} (or {{{{ }}}} for a literal brace)"
    for key, value in where:
        items = [(f"{key}[{i}]", v) for i, v in enumerate(value)] if isinstance(
            value, list) else [(key, value)]
        for k, text in items:
            try:
                fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
            except ValueError as exc:
                raise ProfileError(path, k, f"{expected}: {exc}", text) from None
            for f in fields:
                if _FIELD_BASE.split(f, maxsplit=1)[0] not in known:
                    raise ProfileError(path, k, expected, text)


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

    @property
    def run_dir(self) -> Path:
        return self.reports_dir / self.run_id


def expand_placeholders(argv: tuple[str, ...], values: dict[str, str]) -> list[str]:
    """Fill ``{name}`` placeholders of one argv; each element stays one argument."""
    out = []
    for arg in argv:
        try:
            out.append(os.path.expanduser(arg.format_map(values)) if "{" in arg else arg)
        except KeyError as exc:
            raise ProfileError("<argv>", str(exc.args[0]), "a defined placeholder", arg) from None
    return out

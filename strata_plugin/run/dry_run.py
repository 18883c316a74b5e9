"""``--strata-dry-run``: the operator's checklist of a run, with nothing started.

Lets an engineer check a real deployment's profile (two-node SGLang, a vLLM box)
from a laptop. The run folder gets ``dry_run.json`` and its readable twin
``dry_run.md``: the preflight it would run; per node, every server, worker and
agent command as an argv list with the *names* of the environment it sets (never
values), and the commands the agent's collectors would spawn; the Prometheus range
queries; and the case plan, each case's nominal and scaled workload in run order
with its injection offset, A/B arm and server block. The plan comes from the tests
themselves: each ``strata.run`` is recorded by a planning runner instead of sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from strata_plugin.configure.profile import expand_placeholders
from strata_plugin.formats.atomic import atomic_write_text
from strata_plugin.formats.cases import CaseLine
from strata_plugin.load.case_runner import Injection, PlanEnds
from strata_plugin.run.server import write_command

if TYPE_CHECKING:
    from strata_plugin.run.session import StrataSession

#: The port a dry run writes where the live run would pick a free one.
DRY_RUN_PORT = 30000
#: Stands for the server's PID in a planned command (known only once it runs).
SERVER_PID = "<server pid>"


class NotStarted(PlanEnds):
    """A dry-run test asked for something only a running server has (its PID, its
    process): the test stops there, and the dry run reports how far it planned."""


class PlannedServer:
    """The server a dry-run test gets: where it would listen, and nothing running."""

    def __init__(self, config_id: str, block_id: str, base_url: str, log_path: Path) -> None:
        self.config_id, self.block_id, self.base_url = config_id, block_id, base_url
        self.log_path = log_path
        self.startup_s = None
        self.restarts = 0

    @property
    def block_key(self) -> str:
        return self.block_id or self.config_id

    def _not_started(self, what: str):
        raise NotStarted(f"the test needs the running server's {what}")

    pid = property(lambda self: self._not_started("PID"))
    spec = property(lambda self: self._not_started("launch spec"))
    proc = property(lambda self: self._not_started("process"))

    def alive(self) -> bool:
        return self._not_started("state")

    def start(self) -> None:
        self._not_started("start")

    def stop(self) -> None:
        self._not_started("stop")


def planned_server(sess: StrataSession, config_id: str, block_id: str) -> PlannedServer:
    p = sess.cfg.profile
    base = sess.cfg.server_url or f"http://{p.server.host}:{p.server.port or DRY_RUN_PORT}"
    log = sess.run_dir / "service" / (block_id or config_id) / "server.log"
    return PlannedServer(config_id, block_id or config_id, base.rstrip("/"), log)


def collector_commands(sess: StrataSession, head: bool) -> dict[str, object]:
    """What the agent's collectors on one node would spawn or read, by collector."""
    from strata_plugin.agent.collectors.dcgm import DEFAULT_FIELDS, dmon_argv
    from strata_plugin.agent.collectors.perf import DEFAULT_EVENTS, perf_argv

    t = sess.cfg.profile.telemetry
    interval_ms = max(100, round(t.interval_s * 1000))
    out: dict[str, object] = {}
    if "dcgm" in t.collectors:
        out["dcgm"] = dmon_argv("dcgmi", DEFAULT_FIELDS, interval_ms)
    if "perf" in t.collectors:
        out["perf"] = [SERVER_PID if a == "0" else a
                       for a in perf_argv("perf", DEFAULT_EVENTS, (0,), interval_ms)]
    if head:
        if "prom" in t.collectors:
            out["prom"] = "GET <server>/metrics every interval"
        if "log" in t.collectors:
            out["log"] = "follows the server log (the log probes' patterns)"
    return out


def dry_run_commands(sess: StrataSession) -> dict[str, dict]:
    p = sess.cfg.profile
    port = p.server.port or DRY_RUN_PORT
    values = sess.deployment.placeholder_values(port)
    head = sess.fleet.head
    out: dict[str, dict] = {}
    for conf in p.server.configs:
        spec = sess.deployment.launch_spec(conf.config_id)
        argv = expand_placeholders(conf.argv, values)
        env_names = sorted(k for k, _ in conf.env)
        out[f"server-{conf.config_id}"] = {
            "argv": argv, "env_names": env_names, "node": head,
            "base_url": sess.cfg.server_url or f"http://{p.server.host}:{port}",
            "log": str(spec.log_path)}
        if p.server.container is not None and not sess.cfg.server_url:
            # The runtime's command is what runs; the server's argv is its command inside.
            env = tuple((k, "") for k, _ in conf.env)
            launch = sess.deployment.container_launch(argv, env, conf.config_id, port,
                                                      values)
            out[f"server-{conf.config_id}"].update(
                argv=list(launch.run_argv), env_names=list(launch.env_names),
                container={**launch.to_json(p.server.stop_timeout_s), "command": argv,
                           "server_pid": f"State.Pid of `{' '.join(launch.inspect_argv())}`"})
        if p.server.worker_argv:
            for node in (n for n in p.nodes if not n.is_head):
                out[f"worker-{conf.config_id}-{node.name}"] = {
                    "argv": expand_placeholders(p.server.worker_argv, values),
                    "env_names": env_names, "node": node.name, "ssh_host": node.ssh_host}
    server = planned_server(sess, p.server.configs[0].config_id, "")
    for name, argv in sess.fleet.commands(server_pid=None, server=server).items():
        out[f"agent-{name}"] = {"argv": argv, "node": name,
                                "collectors": collector_commands(sess, name == head)}
    return out


def prometheus_queries(sess: StrataSession) -> dict:
    spec = sess.cfg.profile.prometheus
    if not spec.jobs:
        return {}
    from strata_plugin.run.prometheus import Job, job_queries

    return {"url": spec.url, "auth_env": spec.auth_env or None,
            "step_s": spec.step_s or sess.cfg.profile.telemetry.interval_s,
            "when": "after the run, over every case, baseline and cooldown window",
            "queries": {job: job_queries(Job(job, kind)) for job, kind in spec.jobs}}


@dataclass
class DryRunPlan:
    """The checklist, rewritten as the tests plan their cases (a cut-short dry run
    still leaves what it planned so far)."""

    run_dir: Path
    profile: str
    preflight: dict
    commands: dict
    prometheus: dict
    cases: list[CaseLine] = field(default_factory=list)
    tests: list[dict] = field(default_factory=list)

    def add_case(self, line: CaseLine) -> None:
        self.cases.append(line)
        self.write()

    def end_test(self, nodeid: str, block_id: str, planned: int, stopped: str) -> None:
        self.tests.append({"nodeid": nodeid, "block_id": block_id, "planned_cases": planned,
                           "stopped": stopped or None})
        self.write()

    def as_json(self) -> dict:
        blocks: list[str | None] = []
        for c in self.cases:
            if not blocks or blocks[-1] != c.block_id:
                blocks.append(c.block_id)
        return {"dry_run": True, "profile": self.profile, "preflight": self.preflight,
                "commands": self.commands, "prometheus": self.prometheus,
                "server_blocks": blocks, "cases": [c.to_dict() for c in self.cases],
                "tests": self.tests}

    def write(self) -> None:
        data = self.as_json()
        atomic_write_text(self.run_dir / "dry_run.json",
                          json.dumps(data, indent=2, sort_keys=True) + "\n")
        atomic_write_text(self.run_dir / "dry_run.md", checklist_markdown(data))


def _params(p: dict | None) -> str:
    if not p:
        return "-"
    keys = ("isl", "osl", "concurrency", "requests", "warmups", "seed", "prefix", "arrival")
    return " ".join(f"{k}={p[k]}" for k in keys if k in p and p[k] is not None)


def checklist_markdown(d: dict) -> str:
    """``dry_run.json`` as a checklist an operator reads before the real run."""
    lines = [f"# Dry run: {d['profile']}", "", "Nothing was started. This is what the run "
             "would do, in order.", "", "## Preflight", ""]
    pf = d["preflight"]
    for port in pf.get("ports", []):
        lines.append(f"- [ ] port {port} free on {pf.get('host')}")
    for tool in pf.get("tools", []):
        lines.append(f"- [ ] `{tool}` found (on PATH, or the file exists and is executable)")
    for name, host in pf.get("nodes", {}).items():
        lines.append(f"- [ ] node {name}: `ssh -o BatchMode=yes -- {host} true` succeeds")
    if pf.get("gpus"):
        lines.append("- [ ] every GPU idle (no compute process, memory near zero) via NVML")
    lines += ["", "## Commands per node", ""]
    by_node: dict[str, list[tuple[str, dict]]] = {}
    for name, c in d["commands"].items():
        by_node.setdefault(c.get("node", "local"), []).append((name, c))
    for node, cmds in sorted(by_node.items()):
        lines += [f"### {node}", ""]
        for name, c in cmds:
            env = ", ".join(c.get("env_names") or []) or "-"
            lines.append(f"- `{name}` (env names: {env}): `{json.dumps(c['argv'])}`")
            if c.get("container"):
                ctr = c["container"]
                lines.append(f"  - in {ctr['runtime']} container `{ctr['name']}` (image "
                             f"`{ctr['image']}`); the agent follows {ctr['server_pid']}; "
                             f"stop: `{json.dumps(ctr['stop_argv'])}`, then "
                             f"`{json.dumps(ctr['rm_argv'])}`")
            for coll, what in (c.get("collectors") or {}).items():
                lines.append(f"  - collector {coll}: `{json.dumps(what)}`")
        lines.append("")
    prom = d.get("prometheus") or {}
    if prom:
        lines += ["## Prometheus", "", f"{prom['url']} (token from env {prom['auth_env']}), "
                  f"step {prom['step_s']} s, {prom['when']}:", ""]
        for job, queries in prom["queries"].items():
            lines += [f"- job {job}: `{q}`" for q in queries]
        lines.append("")
    lines += ["## Case plan (run order)", "",
              "| # | case | block | config | workload as run | nominal | injection | A/B |",
              "|---|---|---|---|---|---|---|---|"]
    for i, raw in enumerate(d["cases"], 1):
        c = CaseLine.from_dict(raw, f"dry_run.json case {i}")
        inj = c.injection
        inj_s = (f"{inj['name']} ({_params(inj['params'])}) {Injection.placement(inj)}"
                 if inj else "-")
        ab = f"{c.ab_group}:{c.ab_arm}" if c.ab_group else "-"
        lines.append(f"| {i} | {c.case_id} | {c.block_id} | {c.config_id} | "
                     f"{_params(c.params)} | {_params(c.scaled_from)} | {inj_s} | {ab} |")
    lines += ["", "## Tests", ""]
    for t in d["tests"]:
        stop = f"; stopped: {t['stopped']}" if t["stopped"] else ""
        lines.append(f"- {t['nodeid']}: {t['planned_cases']} case(s) planned{stop}")
    return "\n".join(lines) + "\n"


def write_dry_run(sess: StrataSession) -> DryRunPlan:
    commands = dry_run_commands(sess)
    for name, payload in commands.items():
        write_command(sess.run_dir / "commands", name, payload)
    plan = DryRunPlan(sess.run_dir, sess.cfg.profile.name, sess.deployment.preflight_plan(),
                      commands, prometheus_queries(sess))
    plan.write()
    return plan

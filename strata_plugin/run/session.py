"""The live run: its folder, its servers, and cleanup on every path.

One ``StrataSession`` per pytest session, created the first time a test asks
for a Strata fixture (so ``pytest tests/`` of the harness itself creates no run
folder). Every process it starts is registered for teardown, which runs on a
normal end, on errors, on Ctrl-C and on SIGTERM (turned into KeyboardInterrupt).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from strata_plugin.configure.credentials import redact, redact_json, split_credentials
from strata_plugin.configure.profile import StrataConfig, expand_placeholders, expand_value
from strata_plugin.errors import StrataError
from strata_plugin.formats.cases import CaseLine
from strata_plugin.formats.outcome import RunOutcome
from strata_plugin.formats.records import ClockAnchor
from strata_plugin.load.case_runner import CaseRunner, CaseSetup
from strata_plugin.load.workload import TokenSpace
from strata_plugin.run import reaper
from strata_plugin.run.agents import AgentFleet
from strata_plugin.run.run_folder import (
    RunRecorder,
    base_manifest,
    create_run_dir,
    private_umask,
)
from strata_plugin.run.server import (
    LaunchSpec,
    Server,
    free_port,
    process_counters,
    write_command,
)


def case_id_from(nodeid: str) -> str:
    """A test's default case id: its pytest node id (``cases/x.py::test_a[default@1]``),
    the name JUnit, pytest's output and every file of the run share. (File names made
    from it are sanitized where they are made.)"""
    return nodeid


class RunFolderError(StrataError, OSError):
    """The run folder could not be written (a full or vanished results disk). The run
    itself no longer raises it: it records the reason (``run_folder_failed``) and fails
    with one line; kept for callers that catch it."""


def _drop_derived(run_dir: Path, since: float) -> None:
    """Remove derived files a failed report attempt left behind (they may be half-written)."""
    from strata_plugin.analysis.run_folder import DERIVED, DERIVED_DIRS

    paths = [run_dir / n for n in DERIVED]
    for d in DERIVED_DIRS:
        paths += sorted((run_dir / d).glob("*"))
    for p in paths:
        with contextlib.suppress(OSError):
            if p.is_file() and p.stat().st_mtime >= since - 1:
                p.unlink()


class ServerDown(StrataError, RuntimeError):
    """A server that died earlier and was not restarted: the tests that need it cannot run."""


class ContainerLeft(StrataError, RuntimeError):
    """A server's container could not be removed (it may still hold the GPUs)."""


class PreflightFailed(StrataError, RuntimeError):
    """The run cannot start: a port, tool, node or GPU is not ready."""


@dataclass
class Block:
    """One server configuration's lifetime; its agents are the fleet's, under its key."""

    server: Server


def _ssh_probe(host: str):
    def probe() -> bool | str:
        import subprocess

        from strata_plugin.run.remote import probe_argv

        try:  # a host that is not one is refused here too, before ssh sees it
            argv = probe_argv(host)
            out = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False,
                                 stdin=subprocess.DEVNULL)
        except (ValueError, OSError, subprocess.TimeoutExpired) as exc:
            return f"{type(exc).__name__}: {exc}"
        return True if out.returncode == 0 else (out.stderr.strip() or f"exit {out.returncode}")

    return probe


def public_profile(cfg: StrataConfig) -> dict:
    """The profile as recorded in the manifest (and summary.json): every env table cut to
    its variable names (``Profile.recorded``), so a literal value is never written, and
    no URL's credentials (configure/credentials.py)."""
    return redact_json(dict(cfg.profile.recorded(), _path=str(cfg.profile.path)))


class DryPlan(Protocol):
    """What the session and the plugin ask of a dry run's plan (run/dry_run.DryRunPlan,
    whose module imports this one)."""

    def add_case(self, line: CaseLine) -> None: ...

    def end_test(self, nodeid: str, block_id: str, planned: int, stopped: str) -> None: ...


class StrataSession:
    dry_plan: DryPlan | None  # the dry run's checklist (set in __init__)

    def __init__(self, cfg: StrataConfig, argv: list[str]) -> None:
        self.cfg = cfg
        # A profile with env values (a token, perhaps): everything this run writes (and its
        # agents, which inherit the umask) stays readable by the owner alone.
        self._umask = private_umask() if cfg.profile.has_env_values else None
        try:
            self.run_dir = create_run_dir(cfg.reports_dir, cfg.run_id,
                                          private=self._umask is not None)
        except BaseException:
            self.restore_umask()
            raise
        self.anchor = ClockAnchor.now()
        self.recorder = RunRecorder(self.run_dir, self.anchor, base_manifest(
            run_id=cfg.run_id, profile=public_profile(cfg), argv=argv, root=cfg.rootdir))
        self.started_ns = time.monotonic_ns()
        # What analysis needs from the profile, resolved once (formats/telemetry.py): the
        # interval, link caps, and whether GPUs and RDMA rails are expected (missing GPU
        # telemetry is then a gap, not just a CPU server).
        self.recorder.update_manifest(telemetry=cfg.profile.telemetry_facts().to_json())
        self.servers: dict[str, Server] = {}
        self.workers: dict[str, list] = {}  # remote worker processes by block id
        self.history: dict[str, list] = {}  # A/B results by group, across blocks
        self.repetitions: dict = {}  # runs of each workload (per A/B arm): prompt salts
        #: why the run is incomplete, appended to wherever it is found (formats/outcome.py)
        self.outcome = RunOutcome()
        #: the telemetry agents of every block (whose agents follow which server), and
        #: those lost (the manifest's "agents_lost")
        self.fleet = AgentFleet(cfg.profile.nodes, cfg.profile.telemetry, self.run_dir,
                                self.recorder, attached=bool(cfg.server_url),
                                health_path=cfg.profile.server.health_path)
        self.dry_plan = None  # the dry run's checklist (run/dry_run.DryRunPlan)
        self.gpu_checked: set[str] = set()  # blocks whose GPU release was checked
        #: each case's requests counted as they are recorded (analysis/failures.py): a case
        #: whose requests mostly failed makes the run incomplete, with its counts
        self.failures: dict[str, object] = {}
        self.allowed_errors: dict[str, object] = {}  # case id -> its allow_errors, if any

    @property
    def incomplete_reason(self) -> str:
        """The outcome's words (the manifest's ``incomplete_reason``); "" when complete."""
        return self.outcome.words

    def run_folder_failed(self, what: str, exc: OSError) -> None:
        """A raw file could not be written (a full or vanished disk): one reason per run,
        the first, naming the file(s); the run then fails (plugin/hooks.py)."""
        if not self.outcome.has("run_folder_failed"):
            self.add_reason("run_folder_failed", f"{self.run_dir} ({what}): {exc}")

    def add_reason(self, kind: str, detail: str = "") -> None:
        """The run is incomplete for one more reason: kept, and in the manifest at once
        (a full disk keeps it in memory, for the terminal and the next rewrite)."""
        if self.outcome.add(kind, detail):
            self.recorder.update_manifest(**self.outcome.manifest_fields())

    # --- servers -------------------------------------------------------------------------

    def placeholder_values(self, port: int) -> dict[str, str]:
        """Built-in placeholders, then the profile's [vars] (which may use the built-ins,
        e.g. ``{strata_cache}``, the cache ``python -m strata_plugin setup`` builds into)."""
        from strata_plugin.embedded.llama_setup import cache_root

        p = self.cfg.profile
        builtins = dict(host=p.server.host, port=str(port), run_dir=str(self.run_dir),
                        python=sys.executable, root=str(self.cfg.rootdir),
                        strata_cache=str(cache_root()))
        values = {k: os.path.expanduser(expand_value(v, builtins) if "{" in v else v)
                  for k, v in p.vars}
        values.update(builtins)
        return values

    def launch_spec(self, config_id: str, block_id: str = "") -> LaunchSpec:
        p = self.cfg.profile
        conf = next(c for c in p.server.configs if c.config_id == config_id)
        port = p.server.port or free_port(p.server.host)
        values = self.placeholder_values(port)
        argv = expand_placeholders(conf.argv, values)
        env = tuple((k, expand_value(v, values)) for k, v in conf.env)
        container = None
        if p.server.container is not None:
            container = self.container_launch(argv, env, block_id or config_id, port, values)
            env = env + tuple((k, expand_value(v, values)) for k, v in p.server.container.env)
            argv = list(container.run_argv)
        return LaunchSpec(
            config_id=config_id, argv=tuple(argv), env=env, container=container,
            base_url=f"http://{p.server.host}:{port}", health_path=p.server.health_path,
            health_timeout_s=p.server.health_timeout_s, stop_timeout_s=p.server.stop_timeout_s,
            log_path=self.run_dir / "service" / (block_id or config_id) / "server.log")

    def container_launch(self, command: list[str], env: tuple[tuple[str, str], ...],
                         block_id: str, port: int, values: dict[str, str]):
        """The server's command inside ``[server.container]``: every variable of the
        server and of the container section by name; ``env_pass`` names only where the
        harness's environment has them (a secret is never read here, only named)."""
        from strata_plugin.run.container import build_launch, container_name

        p = self.cfg.profile
        spec = p.server.container
        names = [k for k, _ in env] + [k for k, _ in spec.env]
        names += [n for n in spec.env_pass if n in os.environ or self.cfg.dry_run]
        return build_launch(
            spec, name=container_name(spec.name, self.cfg.run_id, block_id), command=command,
            env_names=list(dict.fromkeys(names)), host=p.server.host, port=port,
            volumes=[os.path.expanduser(v) for v in expand_placeholders(spec.volumes, values)],
            args=expand_placeholders(spec.args, values),
            image=expand_placeholders((spec.image,), values)[0])

    def start_server(self, config_id: str, block_id: str = "") -> Server:
        """Launch (or attach to) the server of one configuration for one block."""
        block_id = block_id or config_id
        if self.cfg.server_url:
            server = Server(None, self.cfg.server_url, auth=self.cfg.server_auth)
            server.wait_healthy(self.cfg.profile.server.health_timeout_s)
        else:
            spec = self.launch_spec(config_id, block_id)
            write_command(self.run_dir / "commands", f"server-{block_id}", spec.to_json())
            server = Server(spec, spec.base_url)
            # Workers first: a multi-node engine's head waits for them to join.
            self.workers[block_id] = self.start_workers(spec, block_id)
            reaper.register(server)
            try:
                server.start()
            except BaseException:
                self.stop_workers(block_id)
                raise
        server.block_id = block_id
        self.servers[block_id] = server
        self.record_servers()
        self.record_roofline(config_id, server)
        return server

    def record_roofline(self, config_id: str, server: Server) -> None:
        """The served model's facts and the CPUs' measured limits, once per configuration,
        before any case (run/roofline_facts.py; the analysis's roofline reads them)."""
        from strata_plugin.run import roofline_facts

        p = self.cfg.profile
        roofline_facts.record(self.recorder, p.server.engine, server, config_id,
                              p.telemetry_facts().gpu_expected)

    def record_servers(self) -> None:
        """Every server of the run in the manifest: its command (env names only), start-up
        time, restarts and, in a container, the container's facts and removal."""
        out = {}
        for bid, s in self.servers.items():
            entry = {**(s.spec.to_json() if s.spec else {"base_url": s.base_url}),
                     "startup_s": s.startup_s, "restarts": s.restarts}
            if s.container_facts is not None:
                entry["container"] = {**entry.get("container", {}), **s.container_facts}
            if s.container_removal is not None:
                entry.setdefault("container", {})["removal"] = s.container_removal.to_json()
            out[bid] = entry
        self.recorder.update_manifest(servers=out)

    def start_workers(self, spec: LaunchSpec, block_id: str) -> list:
        """The profile's worker command on every remote worker node, tied to its ssh session."""
        p = self.cfg.profile
        remote = [n for n in p.nodes if not n.is_head and n.ssh_host]
        if not p.server.worker_argv or not remote:
            return []
        from strata_plugin.run.remote import RemoteProcess

        port = int(spec.base_url.rsplit(":", 1)[1])
        argv = expand_placeholders(p.server.worker_argv, self.placeholder_values(port))
        workers = []
        for node in remote:
            log = self.run_dir / "service" / block_id / f"{node.name}.log"
            write_command(self.run_dir / "commands", f"worker-{block_id}-{node.name}",
                          {"argv": argv, "node": node.name, "ssh_host": node.ssh_host,
                           "env_names": sorted(k for k, _ in spec.env), "log": str(log)})
            w = RemoteProcess.start(node.name, node.ssh_host, argv, log, env=dict(spec.env),
                                    grace_s=p.server.stop_timeout_s)
            reaper.register(w)
            workers.append(w)
        return workers

    def stop_workers(self, block_id: str) -> None:
        for w in self.workers.pop(block_id, []):
            w.stop()
            reaper.unregister(w)

    def stop_server(self, server: Server, agents: list | None = None) -> None:
        """Stop the server and its workers, then confirm the GPU memory was released on
        every node, through that node's agent (the head alone, locally, when no agent
        runs any more)."""
        pid = server.pid
        server.stop()  # a stop cut short stays registered: the reaper tries again at exit
        removal = server.container_removal
        if removal is None or removal.removed:  # a container left: the reaper retries
            reaper.unregister(server)
        self.stop_workers(server.block_key)
        if server.container is not None:
            self.record_servers()
            if removal is not None and not removal.removed:
                why = f"server {server.block_key}: {removal.detail}"
                self.add_reason("container_left", why)
                raise ContainerLeft(why)
        if ("nvml" not in self.cfg.profile.telemetry.collectors or server.spec is None
                or server.block_key in self.gpu_checked):
            return  # an attached server was not stopped: its GPU memory stays, rightly
        self.gpu_checked.add(server.block_key)  # once per block: its agents' answer stands
        from strata_plugin.run.gpu_release import (
            release_on_nodes,
            require_gpu_release,
            wait_gpu_release,
        )

        live = [h for h in agents or [] if h.alive]
        if live:
            results = release_on_nodes(live, timeout_s=30.0)
        elif pid is not None:
            results = {self.fleet.head: wait_gpu_release([pid], timeout_s=30.0)}
        else:
            return
        releases = dict(self.recorder.manifest.get("gpu_release", {}))
        releases[server.block_key] = {
            node: {"ok": r.ok, "skipped": r.skipped, "detail": r.detail,
                   "waited_s": round(r.waited_s, 3)} for node, r in sorted(results.items())}
        self.recorder.update_manifest(gpu_release=releases)
        for node, r in sorted(results.items()):
            require_gpu_release(r, node)

    # --- before anything starts ---------------------------------------------------------

    def preflight(self) -> None:
        """Ports, tools, nodes and idle GPUs, checked before any server is launched."""
        from strata_plugin.run.preflight import PreflightError, preflight, require_preflight

        p = self.cfg.profile
        plan = self.preflight_plan()
        nodes = {name: _ssh_probe(host) for name, host in plan["nodes"].items()}
        checks = preflight(ports=plan["ports"], tools=plan["tools"], nodes=nodes,
                           gpus=plan["gpus"], host=plan["host"])
        self.recorder.update_manifest(preflight=[c.__dict__ for c in checks])
        try:
            require_preflight(checks)
        except PreflightError as exc:
            hint = (f"\n(the profile's setup command builds what it needs: "
                    f"{' '.join(expand_placeholders(p.setup_argv, self.placeholder_values(0)))})"
                    if p.setup_argv else "")
            raise PreflightFailed(f"{exc}{hint}") from None

    def preflight_plan(self) -> dict:
        """What the preflight checks: ports free, tools on PATH, nodes over ssh, idle GPUs."""
        p = self.cfg.profile
        tools: list[str] = []
        if not self.cfg.server_url:
            values = self.placeholder_values(p.server.port or 0)
            for conf in p.server.configs:
                argv = expand_placeholders(conf.argv, values)
                if p.server.container is not None:  # the command lives in the image
                    argv = [p.server.container.runtime]
                if argv and argv[0] not in tools:
                    tools.append(argv[0])
        remote = {n.name: n.ssh_host for n in p.nodes if n.ssh_host}
        if remote:
            tools.append("ssh")
        return {"ports": [p.server.port] if p.server.port and not self.cfg.server_url else [],
                "tools": tools, "nodes": remote, "gpus": "nvml" in p.telemetry.collectors,
                "host": p.server.host}

    # --- blocks: one server configuration's lifetime ------------------------------------

    def begin_block(self, server: Server) -> Block:
        """Start the telemetry agents on this server, then hold the idle baseline."""
        self.fleet.start(server)
        try:
            block = Block(server=server)
            self.fleet.snapshot(server, "before")
            t0 = time.monotonic_ns()
            time.sleep(self.cfg.profile.telemetry.baseline_s)
            self.recorder.mark("baseline", f"baseline:{server.config_id}", "", t0,
                               time.monotonic_ns())
        except BaseException:  # Ctrl-C in the baseline: the fixture's teardown never runs
            self.fleet.stop(server.block_key)
            raise
        return block

    def end_block(self, block: Block) -> None:
        """Hold the cooldown window, stop the agents, stop the server. Always runs."""
        try:
            if block.server.alive() and not reaper.INTERRUPTED.is_set():
                t0 = time.monotonic_ns()
                time.sleep(self.cfg.profile.telemetry.cooldown_s)
                self.recorder.mark("cooldown", f"cooldown:{block.server.config_id}", "", t0,
                                   time.monotonic_ns())
        finally:
            try:
                if not reaper.INTERRUPTED.is_set():
                    self.fleet.snapshot(block.server, "after")
            finally:
                self._stop_block(block)

    def _stop_block(self, block: Block) -> None:
        """The server first (its agents then check every node's GPUs were released), the
        agents last, whatever either does: a dead agent never keeps the server running."""
        key = block.server.block_key
        try:
            self.stop_server(block.server, self.fleet.handles(key))
        finally:
            self.fleet.stop(key)

    def dead_workers(self, server: Server) -> list:
        """The remote workers of this server's block that have exited."""
        return [w for w in self.workers.get(server.block_key, [])
                if not w.alive()]

    def ensure_alive(self, server: Server) -> Server:
        """A server (or a worker of it) that died in an earlier case is restarted once,
        head and workers together, else the test skips with the reason."""
        dead = self.dead_workers(server)
        if server.alive() and not dead:
            return server
        what = ", ".join([*([f"head exit {server.exit_code()}"] if not server.alive() else []),
                          *(f"worker {w.node} exit {w.exit_code()}" for w in dead)])
        if self.cfg.server_url or server.restarts >= 1:
            raise ServerDown(f"server {server.config_id} is down ({what}) and was not restarted")
        restart = {f"restart_{server.config_id}": server.exit_code()}
        if dead:
            restart[f"restart_{server.config_id}_workers"] = {w.node: w.exit_code() for w in dead}
        self.recorder.update_manifest(**restart)
        server.restarts += 1
        # A multi-node engine whose worker died cannot finish a collective: restart the
        # whole group, workers first (the head waits for them to join).
        server.stop()
        self.stop_workers(server.block_key)
        if server.spec is not None:
            self.workers[server.block_key] = self.start_workers(server.spec, server.block_key)
        server.start()
        self.fleet.retrack(server)
        return server

    def recover_agents(self, server: Server, cases: tuple[str, ...] = ()) -> list[str]:
        """Agents of this server's block that ended without being asked are recorded and
        started again (``AgentFleet.recover``); the run is then incomplete, and says why.
        Returns one line per lost agent, for the terminal."""
        lines = self.fleet.recover(server, cases)
        for line in lines:
            self.add_reason("agent_lost", line)
        return lines

    def case_runner(self, server: Server, nodeid: str, progress) -> CaseRunner:
        from strata_plugin.load.case_runner import PlanningRunner
        from strata_plugin.load.client import Timeouts

        p = self.cfg.profile
        headers = {}
        if p.server.api_key_env:
            key = os.environ.get(p.server.api_key_env)
            if key:
                headers["Authorization"] = f"Bearer {key}"
        auth = getattr(server, "auth", None)  # (a dry run's planned server has none)
        if auth is not None:  # the URL's credentials win, as requests sent them
            headers.update(auth.headers())
        lo, hi = p.server.token_id_range
        setup = CaseSetup(
            base_url=server.base_url, api=p.server.api, config_id=server.config_id,
            block_id=server.block_id, startup_s=server.startup_s,
            token_space=TokenSpace(lo, hi),
            timeouts=Timeouts(read_s=p.server.request_timeout_s), headers=headers,
            salt=self.cfg.run_id, model=p.server.model_name or None, scale=p.scale,
            engine=p.server.engine, load=p.load)
        if self.dry_plan is not None:
            return PlanningRunner(setup, plan=self.dry_plan.add_case,
                                  default_case_id=case_id_from(nodeid), history=self.history)
        kw = dict(record=self.record, mark=self.recorder.mark,
                  add_case=self.add_case, counters=process_counters(server),
                  progress_line=progress, default_case_id=case_id_from(nodeid),
                  history=self.history, repetitions=self.repetitions)
        if self.cfg.escalate:
            from strata_plugin.run.diagnostic_round import DiagnosticRunner

            return DiagnosticRunner(setup, escalate=self.cfg.escalate, run_dir=self.run_dir,
                                    server_pid=server.pid if server.spec else None,
                                    settle_s=p.telemetry.interval_s + 0.3, **kw)
        return CaseRunner(setup, **kw)

    def record(self, rec) -> None:
        """A request record to requests.jsonl, counted for its case's failures."""
        from strata_plugin.analysis.failures import FailureTally

        try:
            self.recorder.record(rec)
        except OSError as exc:  # a full disk: the reason first, then the load stops
            self.run_folder_failed("requests.jsonl", exc)
            raise
        tally = self.failures.get(rec.case_id)
        if tally is None:
            tally = self.failures[rec.case_id] = FailureTally()
        tally.add(rec)  # type: ignore[attr-defined]

    def add_case(self, line: CaseLine) -> None:
        """A case line to cases.jsonl; the failures it allows are kept for the end."""
        try:
            self.recorder.add_case(line)
        except OSError as exc:
            self.run_folder_failed("cases.jsonl", exc)
            raise
        if line.allow_errors and line.case_id:
            self.allowed_errors[line.case_id] = line.allow_errors

    def server_failed(self, why: str) -> None:
        """A server that could not be started or reached: the run is incomplete, and the
        manifest says why at once (the report repeats it in its first lines)."""
        self.add_reason("server_failed", why)

    def failed_cases(self) -> list[str]:
        """``case X: requests_failed: 4 of 4 requests failed (...)`` per case whose
        requests mostly failed in ways it did not allow (``allow_errors``)."""
        out = []
        for case_id, tally in self.failures.items():
            f = tally.summary()  # type: ignore[attr-defined]
            if f is None or not f.mostly_failed:
                continue
            allowed = self.allowed_errors.get(case_id)
            if allowed is True or (allowed and {c for c, _ in f.by_class} <= set(allowed)):
                continue  # a case that expects these failures (a fault case) measured them
            out.append(f"case {case_id}: requests_failed: {f.line()}")
        return out

    # --- end -----------------------------------------------------------------------------

    def pull_prometheus(self) -> None:
        """Case windows from the profile's Prometheus, as samples beside the agents'."""
        spec = self.cfg.profile.prometheus
        if not spec.jobs or self.cfg.dry_run:
            return
        from strata_plugin.run.prometheus import Job, PromClient, pull

        url, auth = split_credentials(spec.url)
        headers = auth.headers() if auth else {}
        if spec.auth_env and os.environ.get(spec.auth_env):
            headers["Authorization"] = f"Bearer {os.environ[spec.auth_env]}"
        windows = [(m.start_wall_ns, m.end_wall_ns) for m in self.recorder.markers
                   if m.kind in ("case", "baseline", "cooldown")]
        try:
            res = pull(self.run_dir, PromClient(url, headers=headers),
                       [Job(job, kind) for job, kind in spec.jobs], windows,
                       spec.step_s or self.cfg.profile.telemetry.interval_s)
            self.recorder.update_manifest(prometheus={
                "url": url, "samples": res.samples, "nodes": list(res.nodes),
                "clock_offset_ns": res.clock.offset_ns if res.clock else None,
                "clock_uncertainty_ns": res.clock.uncertainty_ns if res.clock else None})
        except Exception as exc:  # the agents' data stands; say what is missing
            self.recorder.update_manifest(prometheus={"url": url, "error": redact(
                f"{type(exc).__name__}: {exc}")})

    def finish(self, *, interrupted: bool) -> Path | None:
        """Stop what runs, then write the report; an interrupted run says so in both."""
        for server in list(self.servers.values()):
            try:
                self.stop_server(server)
            except ContainerLeft:  # recorded; the other servers still stop, the report is
                pass  # written
        try:
            self.recorder.mark("run", "run", "", self.started_ns, time.monotonic_ns())
            if not interrupted:
                self.pull_prometheus()
            if interrupted and not self.outcome.has("preflight_failed"):  # (a preflight
                self.outcome.add("interrupted")  # ends the run this way, for its reason)
            for line in self.failed_cases():
                self.outcome.add("requests_failed", line)
            self.recorder.flush_markers()
            lost = sorted(n for n in self.recorder.unwritten if n != "manifest.json")
            if lost:  # (the manifest is written next, or fails below)
                self.run_folder_failed(", ".join(lost), self.recorder.unwritten[lost[0]])
            self.recorder.update_manifest(  # the end marker: every raw file is whole
                **self.outcome.manifest_fields(),
                finished_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            # Complete only once the report is on disk: a run cut short while writing it
            # is not.
            self.recorder.write_manifest(complete=False)
        except OSError as exc:
            # A full or vanished results disk: the manifest on disk keeps complete=false
            # (written first, replaced atomically), and no report is attempted. The run
            # fails with this one reason (plugin/hooks.py), not a traceback.
            self.run_folder_failed("manifest.json", exc)
            with contextlib.suppress(OSError):
                self.recorder.close()
            self.restore_umask()
            return None
        try:
            return self._write_report()
        finally:
            with contextlib.suppress(OSError):
                self.recorder.close()
            self.restore_umask()

    def restore_umask(self) -> None:
        """The process's own umask again, once the run folder is written (pytest and the
        user's tests go on in this process)."""
        if self._umask is not None:
            os.umask(self._umask)
            self._umask = None

    def _write_report(self) -> Path | None:
        """The report, then ``complete`` from the outcome (the report adds a torn raw
        line it finds); a report that fails adds its reason to the others."""
        from strata_plugin.report import write_report

        modules = set(sys.modules)
        started = time.time()
        try:
            report = write_report(self.run_dir, outcome=self.outcome)
        except KeyboardInterrupt:
            # Ctrl-C / SIGTERM while the report was being written: say so, write it once
            # more (a second signal stops that too), and let pytest see the interrupt.
            # Modules whose import was cut short are dropped so the retry imports them whole.
            for name in set(sys.modules) - modules:
                sys.modules.pop(name, None)
            self.add_reason("interrupted_in_report")
            try:
                write_report(self.run_dir, outcome=self.outcome)
            except Exception as exc:  # the raw data is safe; say why there is no report
                self.add_reason("report_failed", f"{type(exc).__name__}: {exc}")
            raise
        except Exception as exc:  # the raw data is safe on disk; say why there is no report
            _drop_derived(self.run_dir, since=started)  # no half-written report stays
            self.add_reason("report_failed", f"{type(exc).__name__}: {exc}")
            return None  # complete=false is on disk already
        # The report's own finds (a torn raw line) are in the outcome by now.
        self.recorder.update_manifest(**self.outcome.manifest_fields())
        self.recorder.write_manifest(complete=self.outcome.complete)
        return report

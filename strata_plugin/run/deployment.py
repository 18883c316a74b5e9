"""The run's servers: how each is launched, started, kept alive and stopped.

The deployment is everything the run starts and must take down again: the profile's
placeholders and launch specs, a server's container, the remote workers of a multi-node
engine, their stop and the check that the GPU memory was released, and the preflight
before anything starts. The session (run/session.py) owns one and keeps what a run
does with its servers: blocks, cases and the end.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from strata_plugin.configure.profile import StrataConfig, expand_placeholders, expand_value
from strata_plugin.errors import StrataError
from strata_plugin.run import reaper
from strata_plugin.run.agents import AgentFleet
from strata_plugin.run.run_folder import RunRecorder
from strata_plugin.run.server import LaunchSpec, Server, free_port, write_command


class ServerDown(StrataError, RuntimeError):
    """A server that died earlier and was not restarted: the tests that need it cannot run."""


class ContainerLeft(StrataError, RuntimeError):
    """A server's container could not be removed (it may still hold the GPUs)."""


class PreflightFailed(StrataError, RuntimeError):
    """The run cannot start: a port, tool, node or GPU is not ready."""


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


class Deployment:
    """The servers and workers of one run, by block id, and their lifecycle."""

    def __init__(self, cfg: StrataConfig, run_dir: Path, recorder: RunRecorder,
                 fleet: AgentFleet, add_reason: Callable[[str, str], None]) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.recorder = recorder
        self.fleet = fleet  # the agents: the head's name, a restarted server retracked
        self.add_reason = add_reason  # the run's outcome (a container left behind)
        self.servers: dict[str, Server] = {}
        self.workers: dict[str, list] = {}  # remote worker processes by block id
        self.gpu_checked: set[str] = set()  # blocks whose GPU release was checked

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

    def request_headers(self, server: Server) -> dict[str, str]:
        """The headers every request to ``server`` carries: the profile's API key (from
        its environment variable) and the credentials of an attached server's URL."""
        headers = {}
        p = self.cfg.profile
        if p.server.api_key_env:
            key = os.environ.get(p.server.api_key_env)
            if key:
                headers["Authorization"] = f"Bearer {key}"
        auth = getattr(server, "auth", None)  # (a dry run's planned server has none)
        if auth is not None:  # the URL's credentials win, as requests sent them
            headers.update(auth.headers())
        return headers

    def launch_spec(self, config_id: str, block_id: str = "") -> LaunchSpec:
        p = self.cfg.profile
        conf = next(c for c in p.server.configs if c.config_id == config_id)
        port = p.server.port or free_port(p.server.host)
        values = self.placeholder_values(port)
        argv = expand_placeholders(conf.argv, values) + list(
            self.profiler_args(block_id or config_id))
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

    def profiler_folder(self, block_id: str) -> Path | None:
        """The folder a launched server's own profiler writes into, made here, where the
        run may take its profile (``--strata-engine-profile``, or the diagnostic round's)
        and the engine has one over HTTP (vLLM, SGLang; run/engine_http_profile.py); None
        elsewhere, and for a vLLM whose command configures a profiler itself."""
        from strata_plugin.run.engine_http_profile import server_trace_dir
        from strata_plugin.run.engine_profile import HTTP_PROFILER_ENGINES

        p = self.cfg.profile
        conf_argv = [a for c in p.server.configs for a in c.argv]
        if (not (self.cfg.engine_profile or self.cfg.escalate)
                or p.server.engine not in HTTP_PROFILER_ENGINES
                or (p.server.engine == "vllm"
                    and any(a.startswith("--profiler-config") for a in conf_argv))):
            return None
        d = server_trace_dir(self.run_dir, block_id)
        if not self.cfg.dry_run:
            d.mkdir(parents=True, exist_ok=True)
        return d

    def profiler_args(self, block_id: str) -> tuple[str, ...]:
        """vLLM's torch profiler flag, writing into :meth:`profiler_folder`. SGLang needs
        none: its start names the folder (``output_dir``)."""
        d = self.profiler_folder(block_id)
        if d is None or self.cfg.profile.server.engine != "vllm":
            return ()
        from strata_plugin.run.engine_http_profile import vllm_profiler_args

        return vllm_profiler_args(d)

    def profiler_volumes(self, block_id: str) -> list[str]:
        """In a container, :meth:`profiler_folder` mounted read-write at its own absolute
        path: the path vLLM's flag and SGLang's ``output_dir`` name is then the same
        folder inside the container and out, where the collector moves the files from."""
        d = self.profiler_folder(block_id)
        if d is None:
            return []
        if ":" in str(d):  # the runtime's -v splits at every ':'
            raise PreflightFailed(
                f"the run folder's path holds a ':' ({d}): a container cannot mount it for "
                "the engine's profiler; run with --strata-reports-dir elsewhere")
        return [f"{d}:{d}:rw"]

    def container_launch(self, command: list[str], env: tuple[tuple[str, str], ...],
                         block_id: str, port: int, values: dict[str, str]):
        """The server's command inside ``[server.container]``: every variable of the
        server and of the container section by name; ``env_pass`` names only where the
        harness's environment has them (a secret is never read here, only named)."""
        from strata_plugin.run.container import build_launch, container_name

        p = self.cfg.profile
        spec = p.server.container
        assert spec is not None  # (called for a profile with [server.container] only)
        names = [k for k, _ in env] + [k for k, _ in spec.env]
        names += [n for n in spec.env_pass if n in os.environ or self.cfg.dry_run]
        return build_launch(
            spec, name=container_name(spec.name, self.cfg.run_id, block_id), command=command,
            env_names=list(dict.fromkeys(names)), host=p.server.host, port=port,
            volumes=[os.path.expanduser(v) for v in expand_placeholders(spec.volumes, values)]
            + self.profiler_volumes(block_id),
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
        # under the id the cases carry: an attached server's cases say ``attached``
        self.record_roofline(server.config_id, server)
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
        if self.fleet is not None:  # Strata's own stop is no engine death
            self.fleet.stop_watch(server.block_key)
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
        restart: dict[str, object] = {f"restart_{server.config_id}": server.exit_code()}
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


    def stop_all(self) -> None:
        """Every server still up, at the end of the run: a container left behind is
        recorded (``stop_server``) and the other servers still stop."""
        for server in list(self.servers.values()):
            try:
                self.stop_server(server)
            except ContainerLeft:
                pass

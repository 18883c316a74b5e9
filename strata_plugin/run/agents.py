"""The run's telemetry agents: one per node of the profile, for each server block.

``AgentFleet`` owns their whole life: which command each node's agent runs, start
(with a clock offset per node), the static snapshots that bracket a block, the flush
before a case's verdict, the recovery of an agent that ended unasked, and the stop
(with a second clock offset, for drift). It is built from what it needs, the profile's
nodes and telemetry, the run folder and the recorder, and not from the session: the
session holds one fleet and calls it, nothing here calls the session back.

The agent itself (``strata_plugin.agent``) knows nothing of profiles or pytest; this
module turns a profile and a live server into agent command lines.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from strata_plugin.configure.profile import NodeSpec, TelemetrySpec
from strata_plugin.entry_points import collector_modules
from strata_plugin.formats.request_path import MANIFEST_KEY as PATH_KEY
from strata_plugin.formats.request_path import RequestPath

if TYPE_CHECKING:
    from strata_plugin.run.container import ContainerLaunch
    from strata_plugin.run.engine_lifetime import EngineWatch
    from strata_plugin.run.run_folder import RunRecorder
    from strata_plugin.run.server import Server


class ServerView(Protocol):
    """What an agent's command needs of its server: a running one (run/server.Server)
    or the one a dry run plans (run/dry_run.PlannedServer)."""

    @property
    def base_url(self) -> str: ...

    @property
    def log_path(self) -> Path | None: ...


#: The fine-grained run-state collector, enabled on every node that follows a server.
RUNSTATE = "runstate"
#: The proxies on the request's way (agent/collectors/path.py), enabled with it: silent
#: until the head agent is given a proxy to follow (an attached server behind one).
PATH = "path"
#: The server's CPU allowance (affinity, cpuset, CFS quota) and the busiest other
#: processes (agent/collectors/allowance.py), every tick, where a server is followed.
ALLOWANCE = "allowance"
#: Each engine's connections on a 20 ms grid (agent/collectors/conns.py): silent unless
#: the server is several engines, where they tell which engine served each request.
CONNS = "conns"


def local_argv(telemetry: TelemetrySpec, node: str, server_pid: int | Sequence[int] | None,
               log_file: str | None, prom_url: str | None,
               path_pids: Sequence[int] = ()) -> list[str]:
    """One node's agent command as it runs on that node (before any ssh prefix).

    ``server_pid``: the process(es) followed as the server; none with the profile's
    ``pid_pattern`` set, the agent matching it itself. ``path_pids``: the proxies in front
    of it (an attached server reached through a router or a gateway)."""
    from strata_plugin.agent.handle import agent_argv

    t = telemetry
    pids = ([server_pid] if isinstance(server_pid, int) else list(server_pid or ()))
    follows = bool(pids or t.pid_pattern)
    # The server's own cgroup (its quota, throttling, memory limit), not the agent's: on
    # a node without a server process to follow there is no cgroup worth reading.
    cgroup = "server" if follows else "none"
    collectors = list(t.collectors)
    if follows:
        # The server's run state on its grid of 20 ms (docs/agent.md, "runstate"): where
        # the server runs, always; the ledger's decode gaps are classified by it. The
        # path's proxies beside it, apart from the server and from "other processes". The
        # CPUs the server may use, sampled every tick (a taskset or a cpuset written
        # mid-case is seen), and who else used the CPUs.
        collectors += [c for c in (RUNSTATE, PATH, ALLOWANCE, CONNS) if c not in collectors]
    # Another package's collectors, by module: the agent reads no entry points itself.
    plugins = {n: m for n, m in collector_modules().items() if n in collectors}
    return agent_argv(
        node=node, interval_s=t.interval_s, pids=pids,
        pid_pattern=t.pid_pattern or None, prom_url=prom_url, log_file=log_file,
        log_patterns=dict(t.log_patterns), collectors=collectors,
        python=sys.executable, cgroup=cgroup, path_pids=path_pids,
        collector_modules=plugins)


class AgentFleet:
    """The agents of every server block of a run, by block key.

    ``attached`` is a run against a server Strata did not start (``--strata-server-url``):
    before its first case the request's path is looked at (``run/listener.discover``:
    the URL's listener, the proxies it connects on through, the engine), recorded in the
    manifest (``request_path``), and the head agent follows the engine as the server and
    the proxies as the path. The profile's ``telemetry.pid_pattern`` names the engine
    instead, where given: the agent is then given the pattern and no PID (a PID given
    beside a pattern wins in the agent, ``agent/targets.py``; the listener's PID passed
    with it is why the pattern lost to a proxy before).
    """

    def __init__(self, nodes: Sequence[NodeSpec], telemetry: TelemetrySpec, run_dir: Path,
                 recorder: RunRecorder, *, attached: bool = False,
                 health_path: str = "/health") -> None:
        self.nodes = tuple(nodes)
        self.telemetry = telemetry
        self.run_dir = Path(run_dir)
        self.recorder = recorder
        self.attached = attached
        self.health_path = health_path
        #: the request's path of each server block, where one was looked at
        self.paths: dict[str, RequestPath] = {}
        #: the live agent handles of each server block (the list a recovery restarts into)
        self.blocks: dict[str, list] = {}
        #: every agent that ended unasked, as in the manifest's ``agents_lost``
        self.lost: list[dict] = []
        #: the engine lifetime watch of each server block (run/engine_lifetime.py)
        self.watches: dict[str, EngineWatch] = {}

    # --- which node is which ------------------------------------------------------------

    @property
    def head(self) -> str:
        """The node the server runs on (``local`` for a profile without nodes): its agent
        follows the server's process, log and metrics. The profile has exactly one."""
        return next((n.name for n in self.nodes if n.is_head), "local")

    def commands(self, server_pid: int | None,
                 server: ServerView | None = None) -> dict[str, list[str]]:
        """The agent command for every node of the profile (ssh-prefixed for remote ones);
        the head's follows ``server_pid`` (an attached server: the engine its path found,
        or the profile's pattern), the server's log and its ``/metrics``."""
        out = {}
        path = self.paths.get(str(getattr(server, "block_key", ""))) if server else None
        if path is None and server_pid is None and server is not None and self.attached:
            # No path looked at yet (the dry run): the sockets as they are, nothing sent.
            from strata_plugin.run.listener import discover

            path = discover(server.base_url, pid_pattern=self.telemetry.pid_pattern,
                            probe=False)
        engine: list[int] = [server_pid] if server_pid else []
        proxies: tuple[int, ...] = ()
        if path is not None:
            engine = list(path.engine_pids) if path.engine_from == "path" else []
            proxies = path.proxy_pids
        log_file = str(server.log_path) if server is not None and server.log_path else None
        prom_url = f"{server.base_url}/metrics" if server is not None else None
        for node in self.nodes:
            head = node.name == self.head
            argv = local_argv(self.telemetry, node.name, engine if head else None,
                              log_file if head else None, prom_url if head else None,
                              path_pids=proxies if head else ())
            if node.ssh_host:
                from strata_plugin.run.remote import remote_agent_argv

                # The agent package travels over the connection: the node needs only python3.
                argv = remote_agent_argv(node.ssh_host, argv,
                                         env_names=self.env(node.name, server) or {})
            out[node.name] = argv
        return out

    def look_at_path(self, server: Server) -> RequestPath | None:
        """An attached server's path, looked at once per block before its agents start
        (about a second: the probe's window), and recorded; None for a server we started
        (the client connects to it directly)."""
        if not self.attached:
            return None
        from strata_plugin.run.listener import attached_server_pid, discover

        head = next((n for n in self.nodes if n.name == self.head), None)
        if head is not None and head.ssh_host:  # its sockets are there, not here
            pattern = self.telemetry.pid_pattern
            path = RequestPath(server.base_url, engine_from="pid_pattern" if pattern else "none",
                               how="none", reason="" if pattern else (
                                   f"The server's node {head.name} is reached over ssh: the "
                                   "path is not looked at from here; name the engine with "
                                   "telemetry.pid_pattern for that node's agent to follow"))
            self._record_path(server.block_key, path)
            return path
        try:
            auth = getattr(server, "auth", None)
            path = discover(server.base_url, pid_pattern=self.telemetry.pid_pattern,
                            health_path=self.health_path,
                            auth=auth.header() if auth else "")
        except Exception as exc:  # a look that failed must not stop the run: the listener
            pid = attached_server_pid(server.base_url)
            path = RequestPath(server.base_url, engine_from="path" if pid else "none",
                               engine_pids=(pid,) if pid else (), how="listener",
                               notes=(f"the path could not be looked at ({type(exc).__name__}:"
                                      f" {exc}): the URL's listener is followed",))
        self._record_path(server.block_key, path)
        return path

    def _record_path(self, block_key: str, path: RequestPath | None) -> None:
        if path is None:
            self.paths.pop(block_key, None)
        else:
            self.paths[block_key] = path
        if self.recorder is not None:
            recorded = dict(self.recorder.manifest.get(PATH_KEY) or {})
            if path is None:
                recorded.pop(block_key, None)
            else:
                recorded[block_key] = path.to_json()
            self.recorder.update_manifest(**{PATH_KEY: recorded})

    def follow(self, server: Server, path: RequestPath | None) -> None:
        """Point the head's agent along ``path`` from now on (the engine as the server, the
        proxies as the path), as attach mode does at its start, and record it; ``None``:
        back to the server itself, with no path. The fault suite puts a proxy in front of
        the server it started and follows it like this (cases/test_faults.py)."""
        self._record_path(server.block_key, path)
        engine = ([server.pid] if server.pid else []) if path is None else (
            list(path.engine_pids) if path.engine_from == "path" else [])
        for h in self.blocks.get(server.block_key, []):
            if h.alive and h.node == self.head:
                if engine:
                    h.track_pids(engine)
                h.track_path(path.proxy_pids if path is not None else ())

    def env(self, node: str, server: ServerView | None) -> dict[str, str] | None:
        """What the agent of ``node`` gets in its environment beyond the harness's: the
        server's credentials for the head's ``/metrics`` scrape (a URL given as
        ``http://user:pw@host``), never in its argv, which any local user can read
        (/proc/PID/cmdline, ``ps``). None: nothing more."""
        auth = getattr(server, "auth", None)
        if auth is None or node != self.head:
            return None
        from strata_plugin.agent.collectors.prom import AUTH_ENV

        return {AUTH_ENV: auth.header()}

    def _start(self, node: str, out_dir: Path, argv: list[str], server: Server):
        from strata_plugin.agent.handle import AgentHandle
        from strata_plugin.run.remote import on_agent_exit

        more = self.env(node, server)
        return AgentHandle.start(node, out_dir, argv, on_exit=on_agent_exit(out_dir),
                                 env={**os.environ, **more} if more else None)

    def handles(self, block_key: str) -> list:
        """The agents of one server block (empty when it has none)."""
        return self.blocks.get(block_key, [])

    # --- a block's life -----------------------------------------------------------------

    def start(self, server: Server) -> list:
        """One agent per node for this server's lifetime; clock offsets measured at start.
        Nothing stays running when a start or a clock measurement fails (Ctrl-C too)."""
        from strata_plugin.analysis.clocks import fit

        handles = []
        if server.block_key not in self.paths:
            self.look_at_path(server)
        nodes = dict(self.recorder.manifest.get("nodes", {}))
        try:
            for name, argv in self.commands(server.pid, server).items():
                out_dir = self.run_dir / "nodes" / name
                h = self._start(name, out_dir, argv, server)
                handles.append(h)
                nodes[name] = fit(name, h.measure_clock_offset()).manifest()
            self.recorder.update_manifest(nodes=nodes)  # a Ctrl-C here too: handles not kept
        except BaseException:  # Ctrl-C (in a clock measurement too) or a failed start:
            # the agents already up must not stay
            for h in handles:
                with contextlib.suppress(Exception):
                    h.stop(2.0)
            raise
        self.blocks[server.block_key] = handles
        self.watch(server)
        return handles

    def watch(self, server: Server) -> None:
        """Watch the engine this block's head agent follows (run/engine_lifetime.py): its
        end and the engine that takes over the URL's port are markers.csv events, and the
        head agent follows the new engine. Not for a head reached over ssh (its processes
        are not this machine's) nor an engine named by a pattern (the agent matches it)."""
        from strata_plugin.formats.engine_events import EngineEvent
        from strata_plugin.run.engine_lifetime import EngineWatch, PortListener, url_port

        self.stop_watch(server.block_key)
        head = next((n for n in self.nodes if n.name == self.head), None)
        path = self.paths.get(server.block_key)
        pids = (list(path.engine_pids) if path is not None and path.engine_from == "path"
                else [server.pid] if path is None and server.pid else [])
        if (head is not None and head.ssh_host) or not pids:
            return
        recorder, key = self.recorder, server.block_key

        def record(ev: EngineEvent) -> None:
            a = recorder.anchor
            recorder.mark("event", ev.marker_name, "", ev.after_ns - a.wall_ns + a.mono_ns,
                          ev.wall_ns - a.wall_ns + a.mono_ns)

        def retarget(new: list[int]) -> None:
            for h in self.blocks.get(key, []):
                if h.alive and h.node == self.head:
                    h.track_pids(new)

        port = url_port(server.base_url)
        self.watches[key] = EngineWatch(
            pids, port, record=record, retarget=retarget, find_listener=PortListener(port),
            child=getattr(server, "proc", None)).start()  # a container's is its runtime's

    def stop_watch(self, block_key: str) -> None:
        """Stop watching the block's engine (before Strata stops it: that end is no news)."""
        w = self.watches.pop(block_key, None)
        if w is not None:
            w.stop()

    def restart(self, server: Server, node: str):
        """A fresh agent for ``node`` (one that was lost), appending to the same folder; its
        clock offset is measured again. Raises AgentStartError when it cannot start."""
        from strata_plugin.analysis.clocks import fit

        argv = self.commands(server.pid, server)[node]
        out_dir = self.run_dir / "nodes" / node
        h = self._start(node, out_dir, argv, server)
        nodes = dict(self.recorder.manifest.get("nodes", {}))
        nodes[node] = fit(node, h.measure_clock_offset()).manifest()
        self.recorder.update_manifest(nodes=nodes)
        return h

    def snapshot(self, server: Server, label: str) -> None:
        """Static snapshots of every node through its agent, into ``nodes/<node>/static/<label>``.

        ``before`` is taken once per node (the first block), ``after`` at every block's end
        (the last one stays), so the two bracket the whole run. A snapshot that fails is
        recorded in the manifest with its reason and never stops the run. A server in a
        container adds ``container.json`` to the head's snapshot: the runtime's ``inspect``
        of the container and of its image (environment cut to names).
        """
        import shutil

        done = dict(self.recorder.manifest.get("static_snapshots", {}))
        for h in self.handles(server.block_key):
            dest = self.run_dir / "nodes" / h.node / "static" / label
            if label == "before" and dest.is_dir():
                continue
            shutil.rmtree(dest, ignore_errors=True)  # an earlier block's "after"
            try:
                if not h.alive:
                    raise RuntimeError("the agent is not running")
                h.snapshot(label, timeout_s=120.0)
                result = "ok"
            except Exception as exc:  # the run goes on; the report says the snapshot is missing
                result = f"{type(exc).__name__}: {exc}"
            done.setdefault(h.node, {})[label] = result
            if server.container is not None and h.node == self.head:
                done[h.node][f"{label}_container"] = _container_snapshot(server.container, dest)
        self.recorder.update_manifest(static_snapshots=done)

    def flush(self, block_key: str, timeout_s: float | None = None) -> bool:
        """Wait until every live agent of the block has sent a line one sampling interval
        after now: the samples covering a case's last moments are then on disk (the handle
        writes each line as it reads it), so a verdict computed next sees the same window
        the report will. False when an agent stayed silent past the timeout (default two
        intervals and a second)."""
        agents = self.blocks.get(block_key)
        if agents is None:
            return True
        interval = self.telemetry.interval_s
        due = time.monotonic() + interval
        deadline = due + (timeout_s if timeout_s is not None else 2 * interval + 1.0)
        while any(h.alive and h.last_line_mono < due for h in agents):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def recover(self, server: Server, cases: tuple[str, ...] = ()) -> list[str]:
        """Agents of this server's block that ended without being asked: each is recorded
        in ``lost`` and the manifest's ``agents_lost`` (``cases`` lacked its signals) and
        started again for the next case. Returns one line per lost agent, for the terminal
        and the run's incomplete reason."""
        agents = self.blocks.get(server.block_key)
        if agents is None:
            return []
        lines = []
        for i, h in enumerate(list(agents)):
            if h.alive:
                continue
            with contextlib.suppress(Exception):
                h.stop(2.0)  # collect its exit and close its files
            info = h.exit_info
            reason = info.reason if info is not None else "ended"
            entry = {"node": h.node, "reason": reason, "cases": list(cases),
                     "detected_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            try:
                agents[i] = self.restart(server, h.node)
                entry["restarted"] = True
            except Exception as exc:  # the run goes on without this node's telemetry
                entry["restarted"] = False
                entry["restart_error"] = f"{type(exc).__name__}: {exc}"
            self.lost.append(entry)
            during = f"during {', '.join(cases)}" if cases else "between cases"
            again = ("restarted" if entry["restarted"]
                     else f"not restarted: {entry['restart_error']}")
            lines.append(f"agent on {h.node} lost {during} ({reason}); {again}")
        if lines:
            self.recorder.update_manifest(agents_lost=self.lost)
        return lines

    def retrack(self, server: Server) -> None:
        """Point the head's agent at a restarted server's new PID (else it loses it)."""
        agents = self.blocks.get(server.block_key)
        if agents is None or server.pid is None:
            return
        for h in agents:
            if h.alive and h.node == self.head:
                h.track_pids([server.pid])
        if server.block_key in self.watches:  # the new process is watched from now on
            self.watch(server)

    def stop(self, block_key: str) -> None:
        """Measure each clock of the block again (for drift), then stop its agents, every
        one whatever another does; deaths are recorded. Raises RuntimeError naming each
        agent that could not be stopped."""
        from strata_plugin.analysis.clocks import fit

        self.stop_watch(block_key)
        handles = self.blocks.pop(block_key, [])
        nodes = dict(self.recorder.manifest.get("nodes", {}))
        failed: list[tuple[str, BaseException]] = []
        for h in handles:  # every agent is stopped, whatever one of them does
            try:
                if h.alive and h.offsets:
                    end = h.measure_clock_offset()
                    nodes[h.node] = fit(h.node, h.offsets[0], end).manifest()
            except Exception as exc:  # the start-of-run offset still aligns this node
                nodes.setdefault(h.node, {})["clock_end_error"] = f"{type(exc).__name__}: {exc}"
            try:
                h.stop(5.0)
            except Exception as exc:
                failed.append((h.node, exc))
            if h.exit_info and not h.exit_info.expected:
                nodes.setdefault(h.node, {})["agent_exit"] = str(h.exit_info.reason)
        self.recorder.update_manifest(nodes=nodes)
        if failed:
            raise RuntimeError("could not stop the agent on " + "; ".join(
                f"{node}: {type(exc).__name__}: {exc}" for node, exc in failed)) from failed[0][1]


def _container_snapshot(launch: ContainerLaunch, dest: Path) -> str:
    """``container.json``: the container's and its image's inspect, as now."""
    import json

    from strata_plugin.run.container import ContainerError, image_inspect, inspect

    try:
        info = inspect(launch)
        image = image_inspect(launch, str(info.get("Image") or launch.image))
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "container.json").write_text(json.dumps(
            {"runtime": launch.runtime, "container": info, "image": image},
            indent=1, sort_keys=True, default=str) + "\n")
        return "ok"
    except (ContainerError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"

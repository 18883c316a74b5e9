"""Glue between the run and the sampling agents: which agents, with what arguments.

The agent itself (``strata_plugin.agent``) knows nothing of profiles or pytest;
this module turns a profile and a live server into agent command lines, starts
one agent per node for a server's lifetime, and records clock offsets.
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

#: The fine-grained run-state collector, enabled on every node that follows a server.
RUNSTATE = "runstate"

if TYPE_CHECKING:
    from strata_plugin.run.server import Server
    from strata_plugin.run.session import StrataSession


def _local_argv(sess: StrataSession, node: str, server_pid: int | None,
                log_file: str | None, prom_url: str | None) -> list[str]:
    from strata_plugin.agent.handle import agent_argv

    t = sess.cfg.profile.telemetry
    # The server's own cgroup (its quota, throttling, memory limit), not the agent's: on
    # a node without a server process to follow there is no cgroup worth reading.
    cgroup = "server" if server_pid or t.pid_pattern else "none"
    collectors = list(t.collectors)
    if (server_pid or t.pid_pattern) and RUNSTATE not in collectors:
        # The server's run state on its grid of 20 ms (docs/agent.md, "runstate"): where
        # the server runs, always; the ledger's decode gaps are classified by it.
        collectors.append(RUNSTATE)
    return agent_argv(
        node=node, interval_s=t.interval_s, pids=[server_pid] if server_pid else [],
        pid_pattern=t.pid_pattern or None, prom_url=prom_url, log_file=log_file,
        log_patterns=dict(t.log_patterns), collectors=collectors,
        python=sys.executable, cgroup=cgroup)


def agent_commands(sess: StrataSession, server_pid: int | None,
                   server: Server | None = None) -> dict[str, list[str]]:
    """The agent command for every node of the profile (ssh-prefixed for remote ones)."""
    out = {}
    if server_pid is None and server is not None and sess.cfg.server_url:
        # An attached server on this machine: follow the process listening on its port.
        from strata_plugin.run.listener import attached_server_pid

        server_pid = attached_server_pid(server.base_url)
    log_file = str(server.log_path) if server is not None and server.log_path else None
    prom_url = f"{server.base_url}/metrics" if server is not None else None
    for node in sess.cfg.profile.nodes:
        argv = _local_argv(sess, node.name, server_pid if node.role == "head" else None,
                           log_file if node.role == "head" else None,
                           prom_url if node.role == "head" else None)
        if node.ssh_host:
            from strata_plugin.run.remote import remote_agent_argv

            # The agent package travels over the connection: the node needs only python3.
            argv = remote_agent_argv(node.ssh_host, argv)
        out[node.name] = argv
    return out


def start_agents(sess: StrataSession, server: Server) -> list:
    """One agent per node for this server's lifetime; clock offsets measured at start."""
    from strata_plugin.agent.handle import AgentHandle
    from strata_plugin.analysis.clocks import fit
    from strata_plugin.run.remote import on_agent_exit

    handles = []
    nodes = dict(sess.recorder.manifest.get("nodes", {}))
    try:
        for name, argv in agent_commands(sess, server.pid, server).items():
            out_dir = sess.run_dir / "nodes" / name
            h = AgentHandle.start(name, out_dir, argv, on_exit=on_agent_exit(out_dir))
            handles.append(h)
            nodes[name] = fit(name, h.measure_clock_offset()).manifest()
        sess.recorder.update_manifest(nodes=nodes)  # a Ctrl-C here too: handles not returned
    except BaseException:  # Ctrl-C (in a clock measurement too) or a failed start:
        # the agents already up must not stay
        for h in handles:
            with contextlib.suppress(Exception):
                h.stop(2.0)
        raise
    return handles


def restart_agent(sess: StrataSession, server: Server, node: str):
    """A fresh agent for ``node`` (one that was lost), appending to the same folder; its
    clock offset is measured again. Raises AgentStartError when it cannot start."""
    from strata_plugin.agent.handle import AgentHandle
    from strata_plugin.analysis.clocks import fit
    from strata_plugin.run.remote import on_agent_exit

    argv = agent_commands(sess, server.pid, server)[node]
    out_dir = sess.run_dir / "nodes" / node
    h = AgentHandle.start(node, out_dir, argv, on_exit=on_agent_exit(out_dir))
    nodes = dict(sess.recorder.manifest.get("nodes", {}))
    nodes[node] = fit(node, h.measure_clock_offset()).manifest()
    sess.recorder.update_manifest(nodes=nodes)
    return h


def snapshot_agents(sess: StrataSession, handles: list, label: str,
                    server: Server | None = None) -> None:
    """Static snapshots of every node through its agent, into ``nodes/<node>/static/<label>``.

    ``before`` is taken once per node (the first block), ``after`` at every block's end
    (the last one stays), so the two bracket the whole run. A snapshot that fails is
    recorded in the manifest with its reason and never stops the run. A server in a
    container adds ``container.json`` to the head's snapshot: the runtime's ``inspect``
    of the container and of its image (environment cut to names).
    """
    import shutil

    done = dict(sess.recorder.manifest.get("static_snapshots", {}))
    for h in handles:
        dest = sess.run_dir / "nodes" / h.node / "static" / label
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
        if server is not None and server.container is not None and h.node in _heads(sess):
            done[h.node][f"{label}_container"] = _container_snapshot(server, dest)
    sess.recorder.update_manifest(static_snapshots=done)


def _heads(sess: StrataSession) -> set[str]:
    return {n.name for n in sess.cfg.profile.nodes if n.role == "head"}


def _container_snapshot(server: Server, dest) -> str:
    """``container.json``: the container's and its image's inspect, as now."""
    import json

    from strata_plugin.run.container import ContainerError, image_inspect, inspect

    try:
        info = inspect(server.container)
        image = image_inspect(server.container, str(info.get("Image") or server.container.image))
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "container.json").write_text(json.dumps(
            {"runtime": server.container.runtime, "container": info, "image": image},
            indent=1, sort_keys=True, default=str) + "\n")
        return "ok"
    except (ContainerError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"


def stop_agents(sess: StrataSession, handles: list) -> None:
    """Measure each clock again (for drift), then stop the agents; deaths are recorded."""
    from strata_plugin.analysis.clocks import fit

    nodes = dict(sess.recorder.manifest.get("nodes", {}))
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
    sess.recorder.update_manifest(nodes=nodes)
    if failed:
        raise RuntimeError("could not stop the agent on " + "; ".join(
            f"{node}: {type(exc).__name__}: {exc}" for node, exc in failed)) from failed[0][1]

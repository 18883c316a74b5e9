"""``--strata-dry-run``: expand every command a run would execute, start nothing.

Lets an engineer check a real deployment's profile (two-node SGLang, a vLLM
box) from a laptop: the server, worker and agent commands land in the run
folder as argv lists, exactly as they would be executed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from strata_plugin.configure.profile import expand_placeholders
from strata_plugin.run.nodes import agent_commands
from strata_plugin.run.server import write_command

if TYPE_CHECKING:
    from strata_plugin.run.session import StrataSession

#: The port a dry run writes where the live run would pick a free one.
DRY_RUN_PORT = 30000


def dry_run_commands(sess: StrataSession) -> dict[str, dict]:
    p = sess.cfg.profile
    port = p.server.port or DRY_RUN_PORT
    values = sess.placeholder_values(port)
    out: dict[str, dict] = {}
    for conf in p.server.configs:
        spec = sess.launch_spec(conf.config_id)
        argv = expand_placeholders(conf.argv, values)
        out[f"server-{conf.config_id}"] = {
            "argv": argv, "env_names": sorted(k for k, _ in conf.env),
            "node": next((n.name for n in p.nodes if n.role == "head"), "local"),
            "base_url": sess.cfg.server_url or f"http://{p.server.host}:{port}",
            "log": str(spec.log_path)}
        if p.server.worker_argv:
            for node in (n for n in p.nodes if n.role == "worker"):
                out[f"worker-{conf.config_id}-{node.name}"] = {
                    "argv": expand_placeholders(p.server.worker_argv, values),
                    "node": node.name, "ssh_host": node.ssh_host}
    for name, argv in agent_commands(sess, server_pid=None).items():
        out[f"agent-{name}"] = {"argv": argv, "node": name}
    return out


def write_dry_run(sess: StrataSession) -> None:
    commands = dry_run_commands(sess)
    for name, payload in commands.items():
        write_command(sess.run_dir / "commands", name, payload)
    (sess.run_dir / "dry_run.json").write_text(
        json.dumps({"dry_run": True, "commands": commands}, indent=2, sort_keys=True) + "\n")

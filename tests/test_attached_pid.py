"""An attached server on this machine is followed by its PID, found from its port."""

from __future__ import annotations

import socket
import subprocess
import sys
from types import SimpleNamespace

from strata_plugin.configure.profile import load_profile, packaged_profiles
from strata_plugin.run.agents import AgentFleet
from strata_plugin.run.listener import attached_server_pid

LISTEN = """
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
time.sleep(60)
"""


def _listener():
    proc = subprocess.Popen([sys.executable, "-c", LISTEN], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def test_the_process_listening_on_a_loopback_port_is_found():
    proc, port = _listener()
    try:
        assert attached_server_pid(f"http://127.0.0.1:{port}") == proc.pid
        assert attached_server_pid(f"http://localhost:{port}/v1") == proc.pid
        assert attached_server_pid(f"http://10.0.0.5:{port}") is None  # another host
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        unused = free.getsockname()[1]
        free.close()
        assert attached_server_pid(f"http://127.0.0.1:{unused}") is None  # nobody listens
        assert attached_server_pid("http://127.0.0.1:notaport") is None
    finally:
        proc.kill()
        proc.wait()


def test_the_agent_follows_the_attached_server_it_found(tmp_path):
    proc, port = _listener()
    url = f"http://127.0.0.1:{port}"
    try:
        prof = load_profile(packaged_profiles()["local"])
        server = SimpleNamespace(base_url=url, log_path=None)
        attached = AgentFleet(prof.nodes, prof.telemetry, tmp_path, None, attached=True)
        argv = attached.commands(None, server)["local"]
        assert argv[argv.index("--pid") + 1] == str(proc.pid)
        assert argv[argv.index("--cgroup") + 1] == "server"
        launched = AgentFleet(prof.nodes, prof.telemetry, tmp_path, None, attached=False)
        assert "--pid" not in launched.commands(None, server)["local"]
    finally:
        proc.kill()
        proc.wait()

"""The engine inside a rootful podman container on a bridge network, its port published
(run/listener.py, run/netns.py): podman's monitor (conmon) holds the host's port and never
accepts, and a NAT rule sends every connection to the container's address. Discovery
follows the translation to llama-server in the container's network namespace by its host
PID, and names the container as podman knows it. The image is imported from a rootfs
into a private storage root (tests/test_container_podman.py's fixture)."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request

import pytest
from test_container_podman import IMAGE, ULIMITS, podman  # noqa: F401  (the fixture)

from strata_plugin.run.listener import discover
from strata_plugin.run.server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.root]


def _paths() -> dict[str, str]:
    import json
    import sys

    out = subprocess.run([sys.executable, "-m", "strata_plugin", "setup", "--print-paths"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_engine_in_a_container_behind_a_published_port_is_found_and_named(podman):  # noqa: F811
    model = _paths()["model"]
    port = free_port("127.0.0.1")
    name = f"strata-listener-{os.getpid()}"
    run = subprocess.run([*podman, "run", "-d", "--name", name, "--network", "bridge",
                          "-p", f"{port}:8080", *ULIMITS, "-v", f"{model}:/model.gguf:ro",
                          IMAGE, "/bin/llama-server", "-m", "/model.gguf", "--host",
                          "0.0.0.0", "--port", "8080", "-t", "1", "-c", "256", "-np", "1",
                          "--no-webui"], capture_output=True, text=True, timeout=120)
    if run.returncode != 0 and "network" in run.stderr.lower():
        pytest.skip(f"podman cannot make a bridge network here: {run.stderr.strip()[-400:]}")
    assert run.returncode == 0, run.stderr
    cid = run.stdout.strip().splitlines()[-1]
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "llama-server in the container did not start"
            time.sleep(0.2)
        pid = int(subprocess.run([*podman, "inspect", "--format", "{{.State.Pid}}", name],
                                 capture_output=True, text=True, check=True).stdout)
        addr = subprocess.run([*podman, "inspect", "--format",
                               "{{.NetworkSettings.IPAddress}}", name],
                              capture_output=True, text=True, check=True).stdout.strip()
        path = discover(url)
        assert [[(h.kind, h.pid) for h in c] for c in path.chains] == [[("engine", pid)]]
        assert path.observable and path.engine_pids == (pid,) and path.proxy_pids == ()
        (e,) = path.engines
        assert e.container is not None
        assert (e.container.runtime, e.container.id, e.container.name) == ("podman", cid, name)
        assert e.address == f"{addr}:8080" and cid in e.cgroup
        assert e.netns_inode == int(os.readlink(f"/proc/{pid}/ns/net")[5:-1])
        assert path.notes == (f"127.0.0.1:{port} is forwarded by a NAT rule to {addr}:8080 "
                              "(connection tracking)",)
        assert path.line().startswith(f"{addr}:8080 (network namespace net:[")
        assert f"-> PID {pid} `llama-server` in container podman {name} ({cid[:12]})" in \
            path.line()
    finally:
        subprocess.run([*podman, "rm", "-f", name], capture_output=True, timeout=120,
                       check=False)

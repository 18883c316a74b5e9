"""The engine inside a rootful podman container on a bridge network, its port published
(run/listener.py, run/netns.py): podman's monitor (conmon) holds the host's port and never
accepts, and a NAT rule sends every connection to the container's address. Discovery
follows the translation to llama-server in the container's network namespace by its host
PID, and names the container as podman knows it. The image is imported from a rootfs
into a private storage root (tests/test_container_podman.py's fixture)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest
from test_container_podman import IMAGE, ULIMITS, podman  # noqa: F401  (the fixture)

from strata_plugin.run.listener import discover
from strata_plugin.run.server import free_port
from strata_plugin.testing import faults

pytestmark = [pytest.mark.integration, pytest.mark.root]


def _paths() -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "strata_plugin", "setup", "--print-paths"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def _engine_in_a_container(runtime: list[str], *extra: str) -> Iterator[tuple[str, str, str]]:
    """llama-server in a podman container on a bridge network, its port published on
    127.0.0.1: (its URL, the container's name, its id); removed at the end."""
    model = _paths()["model"]
    port = free_port("127.0.0.1")
    name = f"strata-listener-{os.getpid()}"
    run = subprocess.run([*runtime, "run", "-d", "--name", name, "--network", "bridge",
                          "-p", f"{port}:8080", *ULIMITS, *extra,
                          "-v", f"{model}:/model.gguf:ro",
                          IMAGE, "/bin/llama-server", "-m", "/model.gguf", "--host",
                          "0.0.0.0", "--port", "8080", "-t", "1", "-c", "256", "-np", "2",
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
        yield url, name, cid
    finally:
        subprocess.run([*runtime, "rm", "-f", name], capture_output=True, timeout=120,
                       check=False)


def _inspect(runtime: list[str], name: str, what: str) -> str:
    return subprocess.run([*runtime, "inspect", "--format", what, name],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_an_engine_in_a_container_behind_a_published_port_is_found_and_named(podman):  # noqa: F811
    with _engine_in_a_container(podman) as (url, name, cid):
        port = int(url.rsplit(":", 1)[1])
        pid = int(_inspect(podman, name, "{{.State.Pid}}"))
        addr = _inspect(podman, name, "{{.NetworkSettings.IPAddress}}")
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


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                    reason="the engine's CPU and the client's must differ: 2 CPUs")
@pytest.mark.parametrize("reached", ["published port", "its namespace's address"])
def test_a_hog_beside_the_contained_engine_is_named_cpu_contention(podman, tmp_path,  # noqa: F811
                                                                   reached):
    """Attached to the engine in its container (on the first CPU), by its published port
    or by the container's own address on the bridge, with two CPU hogs on that CPU
    started before the run and the client on the other: the report names the engine's
    host PID and its container, and the verdict is ``cpu_contention`` naming the hogs."""
    cpus = sorted(os.sched_getaffinity(0))
    with _engine_in_a_container(podman, "--cpuset-cpus", str(cpus[0])) as (url, name, cid):
        pid = int(_inspect(podman, name, "{{.State.Pid}}"))
        if reached != "published port":
            url = f"http://{_inspect(podman, name, '{{.NetworkSettings.IPAddress}}')}:8080"
        with faults.CpuHogs(cpus[:1], per_core=2, max_s=300):
            out = subprocess.run(
                [sys.executable, "-m", "strata_plugin", "bench", url, "--api", "llamacpp",
                 "--workload", "isl=64,osl=48,concurrency=2,requests=8",
                 "--reports-dir", str(tmp_path), "--run-id", "hogged"],
                capture_output=True, text=True, timeout=600,
                preexec_fn=lambda: os.sched_setaffinity(0, set(cpus[1:])))
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run = tmp_path / "hogged"
    report = (run / "report.md").read_text()
    assert f"PID {pid} `llama-server` in container podman {name} ({cid[:12]})" in report
    (case,) = json.loads((run / "summary.json").read_text())["cases"]
    verdict = case["verdict"]
    assert verdict["classes"][0] == "cpu_contention", json.dumps(verdict)[:3000]
    named = next(e["detail"] for e in verdict["evidence"]
                 if e["metric"] == "other_processes_allowed_cpus_frac")
    assert "strata_plugin.testing.faults hog" in named, named  # the hogs, by command line

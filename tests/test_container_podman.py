"""A real Strata run with the embedded llama-server inside a podman container.

The image is built here from a local directory (no registry): the cached llama-server
binary and the shared libraries ``ldd`` lists, as a rootfs tarball, ``podman import``ed
into a private storage root (vfs, cgroupfs, runc), so the host's own podman storage is
never touched. Checked: the environment is set inside the container (and a secret's
value never reaches the run folder), the agent follows the container's main process,
``inspect`` is in the static snapshot and the manifest, and no container remains after a
normal end or after SIGTERM, SIGINT or SIGHUP of the pytest process.

Where the machine cannot run a container, the probe's exact command and error is the
skip reason (docs/containers.md says what this machine needed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import default_signals
import pytest
from system_packages import require

pytestmark = pytest.mark.integration

IMAGE = "localhost/strata-llama-test:1"
SECRET = "s3cr3t-value-never-written"


def _llama_server() -> Path:
    out = subprocess.run([sys.executable, "-m", "strata_plugin", "setup", "--print-paths"],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.fail("llama-server is not built: run `bash scripts/setup.sh` first\n"
                    + out.stderr)
    return Path(json.loads(out.stdout.strip().splitlines()[-1])["llama_server"])


def _rootfs_tar(binary: Path, dest: Path) -> Path:
    """/bin/llama-server and every library ldd lists, at their own paths."""
    libs = re.findall(r"(/\S+\.so[.\d]*)", subprocess.run(
        ["ldd", str(binary)], capture_output=True, text=True, check=True).stdout)
    tar = dest / "rootfs.tar"
    with tarfile.open(tar, "w") as t:
        t.add(binary, "bin/llama-server")
        for lib in sorted(set(libs)):
            t.add(os.path.realpath(lib), lib.lstrip("/"))
        info = tarfile.TarInfo("tmp")
        info.type, info.mode = tarfile.DIRTYPE, 0o1777
        t.addfile(info)
    return tar


@pytest.fixture(scope="module")
def podman(tmp_path_factory) -> list[str]:
    """The podman argv prefix with this module's private storage, the image imported."""
    if os.geteuid() != 0:
        pytest.skip("rootful podman needs root (this test runs it with its own storage)")
    require("podman", "runc")
    root = tmp_path_factory.mktemp("podman")
    base = ["podman", "--root", str(root / "storage"), "--runroot", str(root / "run"),
            "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--runtime", "runc"]
    tar = _rootfs_tar(_llama_server(), root)
    imp = subprocess.run([*base, "import", str(tar), IMAGE], capture_output=True, text=True,
                         timeout=300, check=False)
    assert imp.returncode == 0, imp.stderr
    probe = [*base, "run", "--rm", "--network", "host", *ULIMITS, IMAGE,
             "/bin/llama-server", "--version"]
    out = subprocess.run(probe, capture_output=True, text=True, timeout=120, check=False)
    if out.returncode != 0:
        pytest.skip(f"this machine cannot run a container: `{' '.join(probe)}` exited "
                    f"{out.returncode}: {out.stderr.strip()[-400:]}")
    yield base
    subprocess.run([*base, "rm", "-af"], capture_output=True, timeout=120, check=False)
    subprocess.run([*base, "rmi", "-af"], capture_output=True, timeout=120, check=False)
    shutil.rmtree(root, ignore_errors=True)


#: Without CAP_SYS_RESOURCE the OCI runtime may not raise a limit to podman's defaults;
#: limits below the current ones are always allowed.
ULIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


def _profile(base: list[str], cache: Path) -> str:
    runtime_args = json.dumps(base[1:])
    return f"""
name = "podman-llama"
[vars]
model = "/cache/models/tiny-llama.gguf"
[server]
engine = "llamacpp"
api = "llamacpp"
host = "127.0.0.1"
port = 0
argv = ["/bin/llama-server", "-m", "{{model}}", "--host", "{{host}}", "--port", "{{port}}",
        "-t", "1", "-c", "2048", "-np", "2", "--metrics", "--no-webui"]
health_timeout_s = 120
stop_timeout_s = 5
token_id_range = [300, 1000]
[server.env]
STRATA_SERVER_ENV = "from-server-env"
[server.container]
runtime = "podman"
image = "{IMAGE}"
name = "strata-test"
runtime_args = {runtime_args}
volumes = ["{cache}:/cache:ro"]
args = {json.dumps(ULIMITS)}
env_pass = ["STRATA_TEST_SECRET"]
[server.container.env]
STRATA_INSIDE = "inside-port-{{port}}"
[telemetry]
interval_s = 0.25
baseline_s = 0.5
cooldown_s = 0
collectors = ["proc", "cpu", "mem", "prom", "log"]
"""


CASE = """
import json, os, time
from pathlib import Path

from strata_plugin.load.workload import Workload


def test_in_container(strata, strata_server):
    pid = strata_server.pid
    env = dict(e.split("=", 1) for e in
               Path(f"/proc/{pid}/environ").read_bytes().decode().split("\\0") if "=" in e)
    Path("seen.json").write_text(json.dumps({
        "pid": pid, "client_pid": strata_server.proc.pid,
        "cmdline": Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\\0"),
        "env": {k: v for k, v in env.items() if k.startswith("STRATA_")},
        "container": strata_server.container.name}))
    if os.environ.get("HOLD"):
        Path("ready").touch()
        time.sleep(120)
    r = strata.run(Workload("tiny", isl=16, osl=4, requests=2), scale=False)
    assert not r.problems, r.problems
"""


def _run_dir(tmp: Path, podman_base: list[str]) -> None:
    (tmp / "test_in_container.py").write_text(CASE)
    (tmp / "conftest.py").write_text("")
    cache = _llama_server().parents[3]  # <cache>/llama.cpp/<version>/bin/llama-server
    (tmp / "podman.toml").write_text(_profile(podman_base, cache))


def _pytest_argv(tmp: Path, run_id: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "test_in_container.py",
            "--strata-profile=podman.toml", f"--strata-reports-dir={tmp / 'reports'}",
            f"--strata-run-id={run_id}", "-p", "no:cacheprovider", "-q"]


def _containers(base: list[str]) -> list[str]:
    out = subprocess.run([*base, "ps", "-a", "--format", "{{.Names}}"], capture_output=True,
                         text=True, timeout=60, check=True)
    return out.stdout.split()


def _env(**extra: str) -> dict:
    return {**os.environ, "STRATA_TEST_SECRET": SECRET, **extra}


def test_a_case_runs_in_the_container_and_nothing_remains(podman, tmp_path):
    _run_dir(tmp_path, podman)
    out = subprocess.run(_pytest_argv(tmp_path, "ctr"), cwd=tmp_path, capture_output=True,
                         text=True, timeout=400, check=False, env=_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    seen = json.loads((tmp_path / "seen.json").read_text())
    run = tmp_path / "reports" / "ctr"
    manifest = json.loads((run / "manifest.json").read_text())
    ctr = manifest["servers"]["default"]["container"]
    port = manifest["servers"]["default"]["base_url"].rsplit(":", 1)[1]
    # the server is the container's main process, not the podman client
    assert seen["cmdline"][0] == "/bin/llama-server"
    assert seen["pid"] == ctr["main_pid"] != seen["client_pid"]
    assert ctr["name"] == seen["container"] == "strata-test-ctr-default"
    assert ctr["removal"]["removed"] is True
    assert ctr["image"] == IMAGE and ctr["image_id"]
    # every variable set inside the container, the secret's value included
    assert seen["env"] == {"STRATA_SERVER_ENV": "from-server-env",
                           "STRATA_INSIDE": f"inside-port-{port}",
                           "STRATA_TEST_SECRET": SECRET}
    # ... and named in the argv, never valued
    argv = manifest["servers"]["default"]["argv"]
    for name in ("STRATA_SERVER_ENV", "STRATA_INSIDE", "STRATA_TEST_SECRET"):
        assert argv[argv.index(name) - 1] == "-e"
    for path in run.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    # the agent followed the container's processes: the main PID's samples
    agent_argv = (run / "nodes" / "local" / "agent_log.jsonl").read_text()
    samples = (run / "nodes" / "local" / "samples" / "proc.csv").read_text()
    assert f"pid{ctr['main_pid']},cpu_user_s" in samples
    assert f"pid{seen['client_pid']}," not in samples, agent_argv[-500:]
    # inspect in both static snapshots, the environment cut to names
    for label in ("before", "after"):
        snap = json.loads((run / "nodes" / "local" / "static" / label /
                           "container.json").read_text())
        assert snap["container"]["Id"] == ctr["id"]
        assert "STRATA_TEST_SECRET" in snap["container"]["Config"]["Env"]
        assert snap["image"]["Id"].endswith(ctr["image_id"].split(":")[-1])
        assert manifest["static_snapshots"]["local"][f"{label}_container"] == "ok"
    report = (run / "report.md").read_text()
    image_id = ctr["image_id"].removeprefix("sha256:")[:12]
    assert (f"The server on local ran in a podman container strata-test-ctr-default of image "
            f"{IMAGE} (id {image_id})") in report
    assert _containers(podman) == []
    assert not _llama_servers_in(podman, seen["pid"])


def _llama_servers_in(base: list[str], pid: int) -> bool:
    try:
        return "llama-server" in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=lambda s: s.name)
def test_a_signal_to_pytest_leaves_no_container(podman, tmp_path, sig):
    _run_dir(tmp_path, podman)
    proc = subprocess.Popen(_pytest_argv(tmp_path, f"sig{sig.name.lower()}"), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=_env(HOLD="1"), start_new_session=True,
                            preexec_fn=default_signals.restore)
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "ready").exists():
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the case never started"
            time.sleep(0.2)
        seen = json.loads((tmp_path / "seen.json").read_text())
        assert seen["container"] in _containers(podman)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert _containers(podman) == [], out.decode()[-3000:]
    assert not _llama_servers_in(podman, seen["pid"])
    manifest = json.loads((tmp_path / "reports" / f"sig{sig.name.lower()}" /
                           "manifest.json").read_text())
    assert manifest["complete"] is False
    assert manifest["servers"]["default"]["container"]["removal"]["removed"] is True


def _start(podman: list[str], tmp_path: Path, command: list[str], health_path: str,
           timeout_s: float, volumes: tuple[str, ...] = ()):
    from strata_plugin.configure.profile import ContainerSpec
    from strata_plugin.run.container import build_launch
    from strata_plugin.run.server import LaunchSpec, Server, free_port

    port = free_port()
    spec = ContainerSpec(runtime="podman", image=IMAGE, runtime_args=tuple(podman[1:]))
    launch = build_launch(spec, name=f"strata-fail-{tmp_path.name}"[:60],
                          command=[*command, "--port", str(port)], env_names=[],
                          host="127.0.0.1", port=port, volumes=list(volumes), args=ULIMITS,
                          image=IMAGE)
    ls = LaunchSpec("default", launch.run_argv, (), f"http://127.0.0.1:{port}", health_path,
                    timeout_s, 3.0, tmp_path / "server.log", container=launch)
    return Server(ls, ls.base_url)


@pytest.mark.parametrize(("command", "health", "expected"), [
    (["/bin/llama-server", "--no-such-flag"], "/health", "exited with code"),
    (["/bin/llama-server", "-m", "/nonexistent.gguf"], "/health", "exited with code"),
])
def test_a_container_whose_server_fails_to_start_is_removed(podman, tmp_path, command, health,
                                                            expected):
    from strata_plugin.run.server import ServerStartError

    server = _start(podman, tmp_path, command, health, 60)
    with pytest.raises(ServerStartError, match=expected):
        server.start()
    assert server.container_removal.removed, server.container_removal.detail
    assert _containers(podman) == []


def test_a_container_never_healthy_is_stopped_and_removed(podman, tmp_path):
    """The server runs but never answers the health path: stopped at the timeout."""
    from strata_plugin.run.server import ServerStartError

    model = Path(json.loads(subprocess.run(
        [sys.executable, "-m", "strata_plugin", "setup", "--print-paths"], capture_output=True,
        text=True, check=True).stdout.strip().splitlines()[-1])["model"])
    # the server is up (the model mounted read-only); /no-such-path answers 404
    server = _start(podman, tmp_path, ["/bin/llama-server", "-m", "/m/" + model.name,
                                       "-t", "1", "-c", "512"], "/no-such-path", 6,
                    volumes=(f"{model.parent}:/m:ro",))
    with pytest.raises(ServerStartError, match=r"not healthy .* \(last: HTTP 404\)"):
        server.start()
    assert server.container_removal.removed, server.container_removal.detail
    assert _containers(podman) == []


def test_a_container_outlives_its_killed_client_and_the_stop_still_removes_it(podman,
                                                                               tmp_path):
    """Why a stop cannot be the client's process group: with the client SIGKILLed the
    server goes on running in its container; Server.stop removes it anyway."""
    model = Path(json.loads(subprocess.run(
        [sys.executable, "-m", "strata_plugin", "setup", "--print-paths"], capture_output=True,
        text=True, check=True).stdout.strip().splitlines()[-1])["model"])
    server = _start(podman, tmp_path, ["/bin/llama-server", "-m", "/m/" + model.name,
                                       "-t", "1", "-c", "512"], "/health", 60,
                    volumes=(f"{model.parent}:/m:ro",))
    try:
        server.start()
        main = server.pid
        assert main != server.proc.pid and "llama-server" in Path(
            f"/proc/{main}/cmdline").read_text()
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
        time.sleep(1.0)
        assert server.spec.container.name in _containers(podman)  # still running
        assert Path(f"/proc/{main}").exists()
    finally:
        server.stop()
    assert server.container_removal.removed, server.container_removal.detail
    assert _containers(podman) == []
    assert not _llama_servers_in(podman, main)


RESTART_CASES = """
import json, os, signal, time
from pathlib import Path

from strata_plugin.load.workload import Workload


def test_a_kills_the_server(strata, strata_server):
    r = strata.run(Workload("tiny", isl=16, osl=4, requests=1), scale=False)
    assert not r.problems, r.problems
    Path("first.json").write_text(json.dumps({"pid": strata_server.pid}))
    os.kill(strata_server.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while strata_server.alive() and time.monotonic() < deadline:
        time.sleep(0.1)


def test_b_runs_on_the_restarted_container(strata, strata_server):
    r = strata.run(Workload("tiny", isl=16, osl=4, requests=1), scale=False)
    assert not r.problems, r.problems
    Path("second.json").write_text(json.dumps({"pid": strata_server.pid,
                                               "restarts": strata_server.restarts}))
"""


def test_a_server_killed_in_its_container_restarts_in_a_new_one(podman, tmp_path):
    """The restart path: the dead container's name is free again (stop, rm, gone) and the
    agent follows the new container's main PID."""
    _run_dir(tmp_path, podman)
    (tmp_path / "test_in_container.py").write_text(RESTART_CASES)
    out = subprocess.run(_pytest_argv(tmp_path, "restart"), cwd=tmp_path,
                         capture_output=True, text=True, timeout=400, check=False, env=_env())
    # the case whose server died is one failure, judged when its body ends (as for a bare
    # process, never a pass plus a teardown error); the next one runs on the restarted
    # container
    assert "server default died during the case (exit 137)" in out.stdout, out.stdout[-3000:]
    assert "1 failed, 1 passed" in out.stdout and " error" not in out.stdout.splitlines()[-1], \
        out.stdout[-3000:]
    first = json.loads((tmp_path / "first.json").read_text())
    second = json.loads((tmp_path / "second.json").read_text())
    assert second["restarts"] == 1 and second["pid"] != first["pid"]
    run = tmp_path / "reports" / "restart"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["servers"]["default"]["container"]["main_pid"] == second["pid"]
    samples = (run / "nodes" / "local" / "samples" / "proc.csv").read_text()
    assert f"pid{first['pid']},cpu_user_s" in samples
    assert f"pid{second['pid']},cpu_user_s" in samples  # retracked after the restart
    assert _containers(podman) == []


def test_the_gpu_release_check_follows_the_container_and_passes_once_it_is_removed(
        podman, tmp_path):
    """The agent given the container's main PID (as a run gives it): with the scripted
    NVML stub saying that PID holds gpu0 while it lives (the GPU is the only fake), the
    release check fails while the container runs and passes once Server.stop removed it."""
    from test_gpu_release_nodes import STUB, TESTS, _agent

    from strata_plugin.run.gpu_release import release_on_nodes

    model = Path(json.loads(subprocess.run(
        [sys.executable, "-m", "strata_plugin", "setup", "--print-paths"], capture_output=True,
        text=True, check=True).stdout.strip().splitlines()[-1])["model"])
    server = _start(podman, tmp_path, ["/bin/llama-server", "-m", "/m/" + model.name,
                                       "-t", "1", "-c", "512"], "/health", 60,
                    volumes=(f"{model.parent}:/m:ro",))
    agent = None
    try:
        server.start()
        stub = tmp_path / "stub.py"
        stub.write_text(STUB.format(tests=str(TESTS), holder=server.pid))
        agent = _agent(tmp_path, "head", stub, [server.pid])
        held = release_on_nodes([agent], timeout_s=1.0)["head"]
        assert not held.ok and f"pid {server.pid} on gpu0" in held.detail
        server.stop()
        assert server.container_removal.removed
        released = release_on_nodes([agent], timeout_s=10.0)["head"]
        assert released.ok, released.detail
    finally:
        server.stop()
        if agent is not None:
            agent.stop()
    assert _containers(podman) == []

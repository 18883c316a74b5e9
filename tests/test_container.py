"""``[server.container]`` without a runtime: the profile section, the argv, the stop order.

The real lifecycle (podman running llama-server) is tests/test_container_podman.py; here
the parts whose mistakes a real run would not show on one machine: typos and bad types,
docker's and podman's GPU options, values never in an argv, the removal's verdicts, and
that a stop removes the container whatever interrupts it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from strata_plugin.configure.profile import ContainerSpec, ProfileError, load_profile
from strata_plugin.run import container as ctr
from strata_plugin.run.server import LaunchSpec, Server

BASE = """
name = "c"
[server]
engine = "vllm"
api = "completions"
argv = ["--model", "m", "--port", "{port}"]
[server.env]
VLLM_SERVER_DEV_MODE = "1"
"""


def _load(tmp_path: Path, section: str):
    path = tmp_path / "p.toml"
    path.write_text(BASE + "[server.container]\n" + section)
    return load_profile(path)


def test_the_section_is_read(tmp_path):
    p = _load(tmp_path, 'runtime = "podman"\nimage = "img:1"\ngpus = "0,1"\n'
                        'volumes = ["/a:/b:ro"]\nenv_pass = ["HF_TOKEN"]\n'
                        'args = ["--ipc=host"]\nruntime_args = ["--root", "/x"]\n'
                        'network = "bridge"\n[server.container.env]\nA = "{port}"\n')
    assert p.server.container == ContainerSpec(
        runtime="podman", image="img:1", gpus="0,1", volumes=("/a:/b:ro",),
        env=(("A", "{port}"),), env_pass=("HF_TOKEN",), args=("--ipc=host",),
        runtime_args=("--root", "/x"), network="bridge")


@pytest.mark.parametrize(("section", "key"), [
    ('runtime = "docker"\nimgae = "x"\n', "server.container.image"),  # missing: typo below
    ('runtime = "docker"\nimage = "x"\nimgae = "x"\n', "server.container.imgae"),
    ('runtime = "lxc"\nimage = "x"\n', "server.container.runtime"),
    ('runtime = "docker"\nimage = "x"\nvolumes = "/a:/b"\n', "server.container.volumes"),
    ('runtime = "docker"\nimage = "x"\ngpus = 1\n', "server.container.gpus"),
    ('runtime = "docker"\nimage = "x"\ngpus = "0;1"\n', "server.container.gpus"),
    ('runtime = "docker"\nimage = "x"\nenv_pass = ["A=B"]\n', "server.container.env"),
    ('runtime = "docker"\nimage = "x"\nname = "a b"\n', "server.container.name"),
    ('runtime = "docker"\nimage = "x"\nvolumes = ["{nope}:/m"]\n',
     "server.container.volumes[0]"),
    ('runtime = "docker"\nimage = "x"\n[server.container.env]\nA = 1\n',
     "server.container.env.A"),
])
def test_a_bad_section_names_the_key(tmp_path, section, key):
    with pytest.raises(ProfileError) as err:
        _load(tmp_path, section)
    assert err.value.key == key


def test_a_server_env_name_that_cannot_be_passed_by_name_is_refused(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(BASE.replace("VLLM_SERVER_DEV_MODE", '"A=B"')
                    + '[server.container]\nruntime = "docker"\nimage = "x"\n')
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert err.value.key == "server.configs.default.env"


def _launch(runtime="docker", gpus="", network="host") -> ctr.ContainerLaunch:
    spec = ContainerSpec(runtime=runtime, image="img", gpus=gpus, network=network,
                         runtime_args=("--root", "/r"))
    return ctr.build_launch(spec, name="strata-r1-default", command=["serve", "--port", "81"],
                            env_names=["TOKEN", "A"], host="127.0.0.1", port=81,
                            volumes=["/m:/m"], args=["--ipc=host"], image="img")


def test_the_run_argv_names_variables_and_puts_the_command_after_the_image():
    argv = list(_launch().run_argv)
    assert argv[:5] == ["docker", "--root", "/r", "run", "--rm"]
    assert argv[argv.index("--name") + 1] == "strata-r1-default"
    assert argv[argv.index("--network") + 1] == "host" and "-p" not in argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-e"] == ["TOKEN", "A"]
    label = argv[argv.index("--label") + 1]
    assert label == f"strata.owner={ctr.owner_label()}"
    assert argv.index("--label") < argv.index("img")
    assert not any("=" in a for a in argv if a not in ("--ipc=host", label))  # no NAME=value
    assert argv[-4:] == ["img", "serve", "--port", "81"]
    assert argv.index("--ipc=host") < argv.index("img")


def test_a_network_other_than_host_publishes_the_servers_port():
    argv = list(_launch(network="bridge").run_argv)
    assert argv[argv.index("--network") + 1] == "bridge"
    assert argv[argv.index("-p") + 1] == "127.0.0.1:81:81"


@pytest.mark.parametrize(("runtime", "gpus", "expected"), [
    ("docker", "all", ["--gpus", "all"]),
    ("docker", "0,1", ["--gpus", "device=0,1"]),
    ("podman", "all", ["--device", "nvidia.com/gpu=all"]),
    ("podman", "0,1", ["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"]),
    ("podman", "", []),
])
def test_gpus_in_each_runtimes_terms(runtime, gpus, expected):
    assert ctr.gpu_args(runtime, gpus) == expected


def test_container_names_are_unique_per_run_and_block_and_valid():
    a = ctr.container_name("strata", "2026-11-30T11:00:00Z", "ub128@2")
    b = ctr.container_name("strata", "2026-11-30T11:00:01Z", "ub128@2")
    assert a != b and a == "strata-2026-11-30T11-00-00Z-ub128-2"
    assert ctr.container_name("strata", "r", "x") != ctr.container_name("strata", "r", "y")


def test_inspect_output_keeps_variable_names_only():
    info = {"Config": {"Env": ["HF_TOKEN=hf_abc", "PATH=/bin"], "Image": "img"},
            "State": {"Pid": 42, "Status": "running"}, "Id": "abc", "Image": "sha256:1"}
    red = ctr.redact(info)
    assert red["Config"]["Env"] == ["HF_TOKEN", "PATH"]
    assert ctr.facts(red) == {"id": "abc", "name": "", "image": "img", "image_id": "sha256:1",
                              "main_pid": 42, "status": "running"}


class Script:
    """A runtime's answers, by subcommand, with every call kept."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers, self.calls = answers, []

    def __call__(self, argv, timeout):
        self.calls.append(argv)
        sub = argv[3] if argv[3] in ("stop", "rm") else "inspect"
        return self.answers[sub]


@pytest.mark.parametrize(("inspect_answer", "removed", "detail"), [
    ((125, "", "Error: no such container strata-r1-default"), True, "rm ok"),
    ((1, "", "Error: No such container: strata-r1-default"), True, "rm ok"),
    ((0, "0123456789abcdef\n", ""), False, "still exists"),
    ((1, "", "Cannot connect to the Docker daemon"), False, "cannot check"),
    ((127, "", "docker: not found"), False, "cannot check"),
])
def test_a_removal_is_believed_only_when_the_runtime_says_no_such_container(
        inspect_answer, removed, detail):
    launch = _launch()
    run = Script({"rm": (0, "", ""), "inspect": inspect_answer})
    r = ctr.remove_container(launch, runner=run)
    assert (r.removed, detail in r.detail) == (removed, True)
    assert run.calls[0] == ["docker", "--root", "/r", "rm", "-f", "strata-r1-default"]
    assert run.calls[1][3:6] == ["container", "inspect", "--format"]


def _server(tmp_path: Path) -> Server:
    launch = _launch()
    spec = LaunchSpec("default", (sys.executable, "-c", "import time; time.sleep(60)"), (),
                      "http://127.0.0.1:81", "/health", 5, 2.0, tmp_path / "s.log",
                      container=launch)
    server = Server(spec, spec.base_url)
    server.proc = subprocess.Popen(list(spec.argv), start_new_session=True)
    return server


def test_a_stop_stops_the_container_then_the_client_then_removes(tmp_path, monkeypatch):
    log = []
    monkeypatch.setattr(ctr, "stop_container", lambda launch, g: log.append(("stop", g)))
    monkeypatch.setattr(ctr, "remove_container",
                        lambda launch: log.append("rm") or ctr.Removal(True, "rm ok"))
    server = _server(tmp_path)
    client = server.proc
    server.stop()
    assert log == [("stop", 2.0), "rm"] and client.poll() == -signal.SIGTERM
    server.stop()  # idempotent: a removed container is not stopped twice
    assert log == [("stop", 2.0), "rm"]


def test_an_interrupted_stop_still_removes_the_container(tmp_path, monkeypatch):
    log = []

    def stop(launch, grace):
        raise KeyboardInterrupt  # Ctrl-C while `docker stop` waits

    monkeypatch.setattr(ctr, "stop_container", stop)
    monkeypatch.setattr(ctr, "remove_container",
                        lambda launch: log.append("rm") or ctr.Removal(True, "rm ok"))
    server = _server(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        server.stop()
    assert log == ["rm"] and server.container_removal.removed
    server.stop()  # the reaper's second call: the client group goes, nothing is re-removed
    assert server.proc.poll() is not None and log == ["rm"]


def test_a_container_left_behind_is_retried_by_the_next_stop(tmp_path, monkeypatch):
    answers = iter([ctr.Removal(False, "still exists"), ctr.Removal(True, "rm ok")])
    stops = []
    monkeypatch.setattr(ctr, "stop_container", lambda launch, g: stops.append(g))
    monkeypatch.setattr(ctr, "remove_container", lambda launch: next(answers))
    server = _server(tmp_path)
    server.stop()
    assert not server.container_removal.removed
    server.stop()
    assert server.container_removal.removed and len(stops) == 2


def test_sighup_and_sigterm_become_keyboard_interrupt(monkeypatch):
    from strata_plugin.run import reaper

    monkeypatch.setattr(signal, "getsignal", lambda s: signal.SIG_DFL)
    installed = {}
    monkeypatch.setattr(signal, "signal", lambda s, h: installed.__setitem__(s, h))
    reaper.install_sigterm_handler()
    assert set(installed) == {signal.SIGTERM, signal.SIGHUP}
    monkeypatch.setattr(reaper, "_signals_seen", 0)
    with pytest.raises(KeyboardInterrupt, match=f"signal {int(signal.SIGHUP)}"):
        installed[signal.SIGHUP](signal.SIGHUP, None)
    # Still ours: a second signal is not left to the default (tests/test_reaper_signals.py)
    assert installed[signal.SIGHUP] is reaper._on_signal


def test_a_container_left_fails_the_block_marks_the_run_and_stays_registered(tmp_path,
                                                                            monkeypatch):
    from types import SimpleNamespace

    from strata_plugin.formats.outcome import RunOutcome
    from strata_plugin.run import reaper
    from strata_plugin.run.session import ContainerLeft, StrataSession

    monkeypatch.setattr(ctr, "stop_container", lambda launch, g: None)
    monkeypatch.setattr(ctr, "remove_container",
                        lambda launch: ctr.Removal(False, "container x still exists"))
    server = _server(tmp_path)
    server.block_id = "default"
    sess = object.__new__(StrataSession)  # only what stop_server touches
    manifest: dict = {}
    sess.recorder = SimpleNamespace(update_manifest=manifest.update, manifest=manifest)
    sess.servers, sess.workers = {"default": server}, {}
    sess.outcome = RunOutcome()
    sess.cfg = SimpleNamespace(profile=SimpleNamespace(telemetry=SimpleNamespace(
        collectors=("proc",))))
    reaper.register(server)
    try:
        with pytest.raises(ContainerLeft, match="still exists"):
            sess.stop_server(server)
        assert id(server) in reaper._live  # the reaper tries again at exit
        assert manifest["servers"]["default"]["container"]["removal"]["removed"] is False
        assert "server default: container x still exists" in manifest["incomplete_reason"]
        with pytest.raises(ContainerLeft):
            sess.stop_server(server)  # a second stop: the same reason, not twice
        assert manifest["incomplete_reason"].count("still exists") == 1
    finally:
        reaper.unregister(server)

"""A server inside a container: the runtime's argv, the container's facts, its removal.

``[server.container]`` turns the server's argv into the command of a container that
docker or podman runs in the foreground: the client process is what ``run/server.py``
launches and watches (its output is the server log), while the server itself is the
container's main process, found with ``inspect`` (``State.Pid``, a PID of this host's
namespace) and handed to the agent as the server PID, so every per-process collector,
the server's cgroup and the GPU release check follow the container's processes.

Killing the client does not stop a container (the runtime's daemon or conmon holds it),
so a stop is ``<runtime> stop`` (SIGTERM, SIGKILL after the grace period), the client's
process group, then ``<runtime> rm -f``, and a last ``container inspect`` that must
fail: a container still there is reported, never silently left holding the GPUs.

Environment values never reach an argv: every variable is passed as ``-e NAME`` and
the runtime client copies the value from its own environment. ``inspect`` output is
recorded with ``Config.Env`` cut to names for the same reason.

**A harness killed with SIGKILL** (a CI job's timeout, the OOM killer) runs no stop: its
runtime client dies, its container does not. Two things remove it. Every container is
started with the label ``strata.owner=<host>:<pid>:<start time>`` naming the harness
process; a *watchdog* (``start_watchdog``), started before the container in a session of
its own, holds the read end of a pipe only the harness writes to, and when that pipe
closes without the harness's ``done`` (the harness died, however) it runs ``rm -f``. If
the watchdog was killed too (a whole cgroup killed), the next container start on this
host *sweeps* (``sweep_orphans``): every container labelled ``strata.owner`` whose owner
on this host is gone (no such PID, or a PID reused: another start time) is removed.
Containers owned by another host or by a live harness are left alone.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import IO, Any

from strata_plugin.agent.targets import Runner, run_tool
from strata_plugin.configure.profile import ContainerSpec
from strata_plugin.errors import StrataError

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def container_name(prefix: str, run_id: str, block_id: str) -> str:
    """``<prefix>-<run id>-<block>``: unique per run (run ids are never reused) and per
    block, in the characters container names allow."""
    text = _NAME_BAD.sub("-", f"{prefix}-{run_id}-{block_id}").strip("-.")
    return text[:200] or "strata"


@dataclass(frozen=True)
class ContainerLaunch:
    """One container of one block: everything needed to run, inspect and remove it."""

    runtime: str
    runtime_args: tuple[str, ...]
    name: str
    image: str
    run_argv: tuple[str, ...]
    env_names: tuple[str, ...]

    def _base(self) -> list[str]:
        return [self.runtime, *self.runtime_args]

    def inspect_argv(self) -> list[str]:
        return [*self._base(), "container", "inspect", self.name]

    def exists_argv(self) -> list[str]:
        return [*self._base(), "container", "inspect", "--format", "{{.Id}}", self.name]

    def image_inspect_argv(self, image: str) -> list[str]:
        return [*self._base(), "image", "inspect", image]

    def stop_argv(self, grace_s: float) -> list[str]:
        return [*self._base(), "stop", "-t", str(max(0, math.ceil(grace_s))), self.name]

    def rm_argv(self) -> list[str]:
        return [*self._base(), "rm", "-f", self.name]

    def to_json(self, grace_s: float) -> dict:
        return {"runtime": self.runtime, "name": self.name, "image": self.image,
                "env_names": list(self.env_names),
                "inspect_argv": self.inspect_argv(), "stop_argv": self.stop_argv(grace_s),
                "rm_argv": self.rm_argv()}


def gpu_args(runtime: str, gpus: str) -> list[str]:
    """Docker's ``--gpus`` (NVIDIA container toolkit); podman's CDI devices."""
    if not gpus:
        return []
    ids = ["all"] if gpus == "all" else gpus.split(",")
    if runtime == "docker":
        return ["--gpus", "all" if gpus == "all" else f"device={gpus}"]
    return [a for i in ids for a in ("--device", f"nvidia.com/gpu={i}")]


OWNER_LABEL = "strata.owner"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22):
    with the PID, it names one process, never a later one that reused the PID."""
    try:
        stat = open(f"/proc/{pid}/stat", encoding="ascii", errors="replace").read()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


def owner_label(pid: int | None = None) -> str:
    """``<host>:<pid>:<start time>`` of the harness process (this one by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def owner_gone(label: str, host: str | None = None) -> bool:
    """Whether the harness a label names is gone: on this host, no such PID or one with
    another start time. A label of another host, or one that does not parse, is not ours
    to judge (False)."""
    parts = label.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return False
    owner_host, pid, start = parts
    if owner_host != (host or socket.gethostname()):
        return False
    now = _start_time(int(pid))
    return now == "" or now != start


def build_launch(spec: ContainerSpec, *, name: str, command: list[str],
                 env_names: list[str], host: str, port: int,
                 volumes: list[str], args: list[str], image: str,
                 owner: str | None = None) -> ContainerLaunch:
    """The ``run`` argv: the container in the foreground, removed when it exits
    (``--rm``), labelled with its owner (``owner_label``), every variable by name, the
    server's ``command`` after the image. ``volumes``, ``args`` and ``image`` come with
    their placeholders filled."""
    argv = [spec.runtime, *spec.runtime_args, "run", "--rm", "--name", name,
            "--label", f"{OWNER_LABEL}={owner or owner_label()}"]
    if spec.network == "host":
        argv += ["--network", "host"]
    else:  # the server's port published on the address the harness connects to
        argv += ["--network", spec.network, "-p", f"{host}:{port}:{port}"]
    argv += gpu_args(spec.runtime, spec.gpus)
    for v in volumes:
        argv += ["-v", v]
    for n in env_names:
        argv += ["-e", n]
    argv += [*args, image, *command]
    return ContainerLaunch(runtime=spec.runtime, runtime_args=spec.runtime_args, name=name,
                           image=image, run_argv=tuple(argv), env_names=tuple(env_names))


# --- facts of a running container ------------------------------------------------------


class ContainerError(StrataError, RuntimeError):
    """The runtime could not say what the container is (inspect failed)."""


def redact(inspect: Any) -> Any:
    """``inspect`` output with every ``Env`` list cut to the variables' names."""
    if isinstance(inspect, dict):
        return {k: ([str(e).split("=", 1)[0] for e in v] if k == "Env" and isinstance(v, list)
                    else redact(v)) for k, v in inspect.items()}
    if isinstance(inspect, list):
        return [redact(v) for v in inspect]
    return inspect


def inspect(launch: ContainerLaunch, runner: Runner = run_tool) -> dict:
    """The container's ``inspect`` object (redacted); ContainerError when there is none."""
    rc, out, err = runner(launch.inspect_argv(), 20.0)
    if rc != 0:
        raise ContainerError(f"`{' '.join(launch.inspect_argv())}` failed (exit {rc}): "
                             f"{err.strip()[:300]}")
    try:
        data = json.loads(out)
    except ValueError as exc:
        raise ContainerError(f"{launch.runtime} inspect printed no JSON: {exc}") from None
    if isinstance(data, list):
        data = data[0] if data else {}
    return redact(data)


def facts(info: dict) -> dict:
    """What the manifest keeps of an inspect object: id, image (name and id), main PID."""
    state = info.get("State") or {}
    config = info.get("Config") or {}
    return {"id": info.get("Id", ""), "name": str(info.get("Name", "")).lstrip("/"),
            "image": info.get("ImageName") or config.get("Image", ""),
            "image_id": info.get("Image", ""), "main_pid": int(state.get("Pid") or 0),
            "status": state.get("Status", "")}


def image_inspect(launch: ContainerLaunch, image: str, runner: Runner = run_tool) -> Any:
    """The image's ``inspect`` object (redacted), or the reason there is none."""
    rc, out, err = runner(launch.image_inspect_argv(image), 20.0)
    if rc != 0:
        return {"error": f"exit {rc}: {err.strip()[:300]}"}
    try:
        data = json.loads(out)
    except ValueError as exc:
        return {"error": f"no JSON: {exc}"}
    return redact(data[0] if isinstance(data, list) and data else data)


# --- removal -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Removal:
    """The result of stopping and removing one container."""

    removed: bool
    detail: str

    def to_json(self) -> dict:
        return {"removed": self.removed, "detail": self.detail}


def stop_container(launch: ContainerLaunch, grace_s: float, runner: Runner = run_tool) -> str:
    """``<runtime> stop``: SIGTERM inside, SIGKILL after the grace period. Returns what
    the runtime said (an already-gone container is not an error here)."""
    rc, _out, err = runner(launch.stop_argv(grace_s), grace_s + 30.0)
    return "stopped" if rc == 0 else f"stop exit {rc}: {err.strip()[:200]}"


def remove_container(launch: ContainerLaunch, runner: Runner = run_tool) -> Removal:
    """``<runtime> rm -f``, then check it is gone: ``container inspect`` must fail."""
    rc, _out, err = runner(launch.rm_argv(), 60.0)
    said = "rm ok" if rc == 0 else f"rm exit {rc}: {err.strip()[:200]}"
    rc2, out2, err2 = runner(launch.exists_argv(), 20.0)
    if rc2 == 0 and out2.strip():
        return Removal(False, f"container {launch.name} ({out2.strip()[:12]}) still exists "
                              f"after `{' '.join(launch.rm_argv())}` ({said})")
    if "no such" not in err2.lower():  # a runtime that cannot answer proves nothing
        return Removal(False, f"cannot check that container {launch.name} is gone "
                              f"(exit {rc2}: {err2.strip()[:200]}; {said})")
    return Removal(True, said)


# --- a killed harness: the watchdog and the next run's sweep ---------------------------

WATCHDOG = """
import os, signal, subprocess, sys, time
for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
    signal.signal(sig, signal.SIG_IGN)
argv = sys.argv[1:]
said = sys.stdin.buffer.read()  # returns when the harness closes the pipe, or dies
if said.strip() != b"done":
    for attempt in range(3):
        try:
            if subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=120).returncode == 0:
                break
        except (OSError, subprocess.TimeoutExpired):
            pass
        time.sleep(2)
"""


class Watchdog:
    """Removes one container if the harness dies without saying ``done``."""

    def __init__(self, proc: subprocess.Popen, pipe: IO[bytes]) -> None:
        self.proc, self.pipe = proc, pipe

    def done(self) -> None:
        """The harness removed the container itself: the watchdog exits doing nothing."""
        self.close(b"done")

    def close(self, word: bytes = b"") -> None:
        """Close the pipe; without ``done`` the watchdog runs ``rm -f`` (one more try)."""
        if self.pipe.closed:
            return
        try:
            if word:
                self.pipe.write(word)
            self.pipe.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=0.5 if word else 0)
        except subprocess.TimeoutExpired:
            pass  # it finishes on its own (an ``rm -f`` takes a while)


def start_watchdog(launch: ContainerLaunch) -> Watchdog | None:
    """A process in its own session that runs ``launch.rm_argv()`` when the harness dies
    (the pipe's only writer is this process: non-inheritable, so no other child keeps it
    open). None if it cannot start; the next run's sweep still applies."""
    r, w = os.pipe()  # both non-inheritable; r is passed as the watchdog's stdin only
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", WATCHDOG,
                                 *launch.rm_argv()], stdin=r, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True,
                                close_fds=True)
    except OSError:
        os.close(w)
        return None
    finally:
        os.close(r)
    return Watchdog(proc, os.fdopen(w, "wb", buffering=0))


def sweep_orphans(runtime: str, runtime_args: tuple[str, ...] = (),
                  runner: Runner = run_tool) -> list[str]:
    """Remove every container labelled ``strata.owner`` whose owning harness on this
    host is gone; returns their names. A runtime that cannot list removes nothing."""
    base = [runtime, *runtime_args]
    rc, out, _err = runner([*base, "ps", "-a", "--filter", f"label={OWNER_LABEL}",
                            "--format", "{{.Names}}"], 30.0)
    if rc != 0:
        return []
    removed = []
    for name in (n.strip() for n in out.splitlines()):
        if not name:
            continue
        rc, label, _ = runner([*base, "container", "inspect", "--format",
                               f'{{{{index .Config.Labels "{OWNER_LABEL}"}}}}', name], 20.0)
        if rc == 0 and owner_gone(label.strip()):
            rc, _, _ = runner([*base, "rm", "-f", name], 60.0)
            if rc == 0:
                removed.append(name)
    return removed

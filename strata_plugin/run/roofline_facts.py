"""What the roofline needs from a live server, recorded in the manifest once per server
configuration (``manifest.json`` ``roofline.<config>``): the served model's facts, read
from its file, and, for a CPU server, the CPUs' measured limits.

Why at the block's start: the server is up (so an attached server can say where its
model is, and a launched one's CPU affinity is set), no case has started, and the
probe's few seconds fall before the idle baseline, in no measured window. The analysis
(analysis/roofline.py) reads only the manifest: the report is rebuilt offline from it.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import Any

from strata_plugin.configure.model_facts import ModelFacts, read_model_facts
from strata_plugin.limits import MODEL_FACTS_READ_S
from strata_plugin.run import model_source


def _proc_argv(pid: int) -> tuple[list[str], Path] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None
    argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    return (argv, cwd) if argv else None


def locate(engine: str, server: Any) -> tuple[model_source.ModelLocation, int | None]:
    """Where the server's model is, and the PID whose CPUs it runs on (None: not a
    process of this machine we can pin to)."""
    spec = getattr(server, "spec", None)
    if spec is not None and spec.container is not None:
        return model_source.ModelLocation(
            None, "server argv", "the server runs in a container: its model path is the "
            "container's, not this machine's"), None
    if spec is not None:
        return model_source.from_argv(engine, spec.argv), server.pid
    from strata_plugin.run.listener import attached_server_pid

    pid = attached_server_pid(server.base_url)
    if pid is not None:
        seen = _proc_argv(pid)
        if seen is not None:
            loc = model_source.from_argv(engine, seen[0], cwd=seen[1])
            if loc.path is not None:
                return loc, pid
    auth = getattr(server, "auth", None)
    return model_source.from_server(engine, server.base_url,
                                    headers=auth.headers() if auth else None), pid


def cpu_entry(pid: int | None, gpu_expected: bool,
              earlier: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """The CPU probe on the server's own CPUs (an earlier configuration's of this run when
    it ran on the same CPUs), or why there is none."""
    if gpu_expected:
        return {"unavailable": "a GPU server: its limits come from NVML and datasheets"}
    if pid is None:
        return {"unavailable": "the server is no process of this machine (another host, or "
                "a container): its CPUs were not probed"}
    try:
        cpus = sorted(os.sched_getaffinity(pid))
    except OSError as e:
        return {"unavailable": f"the server's CPU affinity could not be read: {e}"}
    from strata_plugin.run.cpu_probe import cpu_limits, engine_python

    try:
        python = engine_python(pid)
    except (OSError, subprocess.SubprocessError):
        python = None
    same = next((e for e in earlier if e.get("cpus") == cpus
                 and (e.get("fingerprint") or {}).get("engine_python") == python), None)
    if same is not None:
        return same
    try:
        return cpu_limits(cpus, engine_python=python)
    except (OSError, RuntimeError, ValueError) as e:
        return {"unavailable": f"the CPU probe failed: {e}"}


def _server_pid(server: Any) -> int | None:
    """The server's PID found without touching its model's files (see :func:`locate`)."""
    spec = getattr(server, "spec", None)
    if spec is not None:
        return None if spec.container is not None else server.pid
    from strata_plugin.run.listener import attached_server_pid

    return attached_server_pid(server.base_url)


def model_entry(engine: str, server: Any,
                limit_s: float = MODEL_FACTS_READ_S) -> tuple[ModelFacts, int | None]:
    """The served model's facts and the server's PID, the model located and read in a
    daemon thread waited for at most ``limit_s``; past it the facts are UNAVAILABLE
    naming the limit (and the file, where it was located)."""
    seen: dict[str, Any] = {}

    def read() -> None:
        try:
            loc, pid = locate(engine, server)
            seen["loc"] = loc
            if loc.path is None:
                model = ModelFacts.unavailable("", loc.why, loc.located_by)
            else:
                model = read_model_facts(loc.path, loc.kv, loc.located_by)
            seen["done"] = (model, pid)
        except BaseException as e:  # handed to the caller, which says why
            seen["error"] = e

    worker = threading.Thread(target=read, name="strata-model-facts", daemon=True)
    worker.start()
    worker.join(limit_s)
    if "done" in seen:
        return seen["done"]
    if "error" in seen:
        raise seen["error"]
    loc = seen.get("loc")
    where = f" ({loc.path})" if loc is not None and loc.path is not None else ""
    why = (f"reading the model files{where} took longer than {limit_s:g} s: a hung mount? "
           "(MODEL_FACTS_READ_S; the run went on without them)")
    path = str(loc.path) if loc is not None and loc.path is not None else ""
    return (ModelFacts.unavailable(path, why, loc.located_by if loc is not None else ""),
            _server_pid(server))


def block_facts(engine: str, server: Any, gpu_expected: bool,
                earlier: tuple[dict[str, Any], ...] = (),
                read_limit_s: float = MODEL_FACTS_READ_S) -> dict[str, Any]:
    model, pid = model_entry(engine, server, read_limit_s)
    return {"model": model.to_json(), "cpu": cpu_entry(pid, gpu_expected, earlier)}


def record(recorder: Any, engine: str, server: Any, config_id: str,
           gpu_expected: bool, read_limit_s: float = MODEL_FACTS_READ_S) -> None:
    """Once per configuration: the facts into the manifest's ``roofline`` entry, under
    ``config_id``, the id the configuration's cases carry (an attached server's cases:
    ``attached``, whatever configuration of the profile it stands for), which the
    analysis looks each case's facts up by."""
    have = dict(recorder.manifest.get("roofline") or {})
    if config_id in have:
        return
    earlier = tuple(e["cpu"] for e in have.values()
                    if isinstance(e, dict) and isinstance(e.get("cpu"), dict))
    try:
        have[config_id] = block_facts(engine, server, gpu_expected, earlier, read_limit_s)
    except Exception as e:  # the run goes on without its roofline, saying why
        why = f"the roofline's facts could not be read: {type(e).__name__}: {e}"
        have[config_id] = {"model": ModelFacts.unavailable("", why).to_json(),
                           "cpu": {"unavailable": why}}
    recorder.update_manifest(roofline=have)

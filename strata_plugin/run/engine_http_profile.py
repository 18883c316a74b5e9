"""An engine's own profiler driven over HTTP: ``POST /start_profile`` at the measured
window's start, ``POST /stop_profile`` at its end (vLLM's and SGLang's endpoints).

Why the answer is read, not assumed: vLLM serves these routes only when it was started
with a profiler (``--profiler-config``, ``vllm/entrypoints/serve/profile/api_router.py``:
the router is attached only when ``profiler_config.profiler`` is set), so an attached
server without one answers 404 (405 behind some proxies). That is said in words, as
"the server has no profiler", and costs the case nothing else. A stop the engine does
not answer within the timeout is said the same way.

:func:`vllm_profiler_args` is the flag a launched vLLM needs for its torch profiler to
write its traces into a folder of the run (:func:`server_trace_dir`, one per server);
SGLang serves its profiler without a flag and takes the folder in the start's body
(``output_dir``, :func:`start_body`). :func:`collect` moves the files one window's stop
wrote from there into the case's own capture folder, by either engine's file names.

Why the prefix is made, not passed: vLLM takes a ``profile_prefix`` of 1-128 ASCII
letters, digits, '.', '_' and '-' starting with a letter or digit
(``vllm/config/profiler.py``: ``validate_profile_prefix``) and refuses any other; a case
id (``cases/x.py::test_a[default]~traced``) is not one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from strata_plugin.errors import StrataError


class ProfileUnavailable(StrataError, RuntimeError):
    """The engine's profile cannot be taken here; the message says why, in words. (Here,
    below run/engine_profile.py, which re-exports it for its own perf capture.)"""


KIND = "the engine's own profiler (POST /start_profile, /stop_profile)"
#: Seconds a start or stop may take. vLLM's stop writes the torch trace (gzip) before it
#: answers: tens of seconds for a long window on a loaded 2-core host.
TIMEOUT_S = 120.0
#: Statuses that mean the route is not there: no profiler configured.
NO_PROFILER = frozenset({404, 405})


@dataclass(frozen=True)
class Answer:
    status: int
    body: str


def _post(base_url: str, path: str, body: Mapping[str, object] | None, timeout_s: float,
          headers: Mapping[str, str]) -> Answer:
    data = json.dumps(dict(body)).encode() if body is not None else b""
    req = urllib.request.Request(base_url.rstrip("/") + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return Answer(r.status, r.read(4096).decode(errors="replace"))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.read(4096).decode(errors="replace") if exc.fp else "")
    except TimeoutError:
        raise ProfileUnavailable(f"the engine did not answer POST {path} within "
                                 f"{timeout_s:g} s") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            raise ProfileUnavailable(f"the engine did not answer POST {path} within "
                                     f"{timeout_s:g} s") from None
        raise ProfileUnavailable(f"POST {path} failed: {reason}") from None


#: Why a route can be missing, by engine: vLLM attaches it only with a profiler at
#: launch; SGLang serves it always (``sglang/srt/entrypoints/http_server.py``), so a 404
#: there is something in front of it, or no SGLang.
_WHY_NONE = {
    "vllm": "vLLM serves it only when started with --profiler-config",
    "sglang": ("SGLang serves it always: the URL's server is not SGLang's /start_profile, or "
               "a proxy in front of it refuses the route"),
}


def _check(path: str, a: Answer, engine: str) -> None:
    if a.status in NO_PROFILER:
        why = _WHY_NONE.get(engine, _WHY_NONE["vllm"])
        raise ProfileUnavailable(
            f"the server has no profiler: POST {path} answered {a.status} ({why})")
    if not 200 <= a.status < 300:
        raise ProfileUnavailable(f"POST {path} answered {a.status}: {a.body.strip()[:200]}")


#: What SGLang's start asks for beyond the folder and the prefix, so that its capture
#: is as small as vLLM's and comparable to it (``ProfileReq`` in
#: ``sglang/srt/managers/io_struct.py``; its defaults in ``tokenizer_control_mixin.py``
#: and ``scheduler_components/profiler_manager.py``): the CPU and, where there is one,
#: the GPU activity (SGLang's default too, asked so an environment cannot change it;
#: torch leaves the GPU's out where there is none), and none of Python stacks and
#: input shapes, which SGLang records by default and vLLM's flag here turns off.
SGLANG_START = {"activities": ["CPU", "GPU"], "with_stack": False, "record_shapes": False}


def start_body(engine: str, prefix: str, output_dir: Path | None = None
               ) -> dict[str, object]:
    """The JSON body of ``/start_profile`` for ``engine``. vLLM reads its folder from its
    launch flag and takes the prefix only; SGLang takes the folder here (``output_dir``:
    absolute, as the server's working directory is not the run's), or writes where its
    ``SGLANG_TORCH_PROFILER_DIR`` says (``/tmp`` without it) when none is given."""
    if engine != "sglang":
        return {"profile_prefix": prefix}
    body: dict[str, object] = {"profile_prefix": prefix, **SGLANG_START}
    if output_dir is not None:
        body["output_dir"] = str(Path(output_dir).resolve())
    return body


def start(base_url: str, prefix: str, *, engine: str = "vllm",
          output_dir: Path | None = None, timeout_s: float = TIMEOUT_S,
          headers: Mapping[str, str] | None = None) -> None:
    """The engine's profiler started; ProfileUnavailable, in words, when it is not."""
    _check("/start_profile", _post(base_url, "/start_profile",
                                   start_body(engine, prefix, output_dir), timeout_s,
                                   headers or {}), engine)


def stop(base_url: str, *, engine: str = "vllm", timeout_s: float = TIMEOUT_S,
         headers: Mapping[str, str] | None = None) -> None:
    """The engine's profiler stopped (its files written); ProfileUnavailable otherwise."""
    _check("/stop_profile", _post(base_url, "/stop_profile", None, timeout_s, headers or {}),
           engine)


def vllm_profiler_args(trace_dir: Path) -> tuple[str, ...]:
    """vLLM's flag for a torch profiler writing into ``trace_dir`` (an absolute path, as
    vLLM requires), its CPU and, where there is one, GPU activities by platform default.

    Without Python stacks and without the API server's own profile: with them (vLLM's
    defaults) a 0.16 s window of three requests on the CPU build wrote 52,000 Python
    frames (1.2 MB gzipped), the stop took 5.9 s to write them, and the API server's
    file held frames only, no operation; the engine's operations are in the worker's."""
    return ("--profiler-config",
            json.dumps({"profiler": "torch", "torch_profiler_dir": str(Path(trace_dir).resolve()),
                        "torch_profiler_with_stack": False, "ignore_frontend": True},
                       sort_keys=True))

#: Where a launched server's torch profiler writes, beside the cases' capture folders:
#: ``traces/engine/_server/<block>/``. Its files are moved out of it, per window, by
#: :func:`collect`; readers of ``traces/engine/`` skip it. A server in a container sees
#: it at the same absolute path (run/deployment.py mounts it there).
SERVER_FOLDER = ("traces", "engine", "_server")
#: The torch traces' file names. vLLM's (``torch.profiler.tensorboard_trace_handler``):
#: ``<prefix>_<worker>.<time_ns>.pt.trace.json`` or ``.gz``; SGLang's (its scheduler's
#: ``export_chrome_trace``): ``<prefix>-<profile_id>-TP-<rank>.trace.json.gz``. Both end
#: in one of these. Beside them vLLM's key-averages table (``<...>.profiler_out.txt``).
TRACE_SUFFIXES = (".trace.json.gz", ".trace.json")
TABLE_SUFFIX = ".profiler_out.txt"
#: What follows the prefix in a window's file name: vLLM's '_', SGLang's '-'.
PREFIX_ENDS = ("_", "-")
#: Each engine's trace name for a prefix, as said when a stop wrote none.
TRACE_NAME = {"vllm": "{prefix}_*.pt.trace.json.gz",
              "sglang": "{prefix}-*-TP-*.trace.json.gz"}
_PREFIX_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
PREFIX_MAX = 128


def server_trace_dir(run_dir: Path, block_id: str) -> Path:
    """The folder a launched server's torch profiler writes into (absolute)."""
    safe = "".join(c if c in _PREFIX_OK else "_" for c in block_id) or "server"
    return Path(run_dir).resolve().joinpath(*SERVER_FOLDER, safe)


def profile_prefix(case_id: str) -> str:
    """A ``profile_prefix`` vLLM accepts, made from the case's folder name: characters it
    refuses become '_', a first one that is not a letter or digit gets an 's' before it,
    and a name past 128 characters is cut with a hash of the whole id (still unique).
    SGLang takes any string; the same prefix serves it (a file name without '/')."""
    name = "".join(c if c in _PREFIX_OK else "_" for c in case_id.replace("/", "__"))
    if not name[:1].isalnum() or not name[:1].isascii():
        name = "s" + name
    if len(name) > PREFIX_MAX:
        digest = hashlib.sha1(case_id.encode()).hexdigest()[:12]
        name = name[: PREFIX_MAX - len(digest) - 1] + "-" + digest
    return name


def listing(folder: Path | None) -> frozenset[str]:
    """The names in ``folder`` now (none when it is not there)."""
    if folder is None:
        return frozenset()
    with contextlib.suppress(OSError):
        return frozenset(os.listdir(folder))
    return frozenset()


def collect(server_dir: Path, before: frozenset[str], prefix: str, dest: Path) -> list[str]:
    """The files one window's stop wrote (named ``<prefix>_...`` by vLLM, ``<prefix>-...``
    by SGLang, not in ``before``) moved from ``server_dir`` into ``dest``; their names,
    traces first. Moved, not copied: the server's folder keeps nothing a later window
    could take for its own."""
    new = sorted(n for n in listing(server_dir) - before
                 if n.startswith(tuple(prefix + e for e in PREFIX_ENDS))
                 and n.endswith((*TRACE_SUFFIXES, TABLE_SUFFIX)))
    if not new:
        return []
    dest.mkdir(parents=True, exist_ok=True)
    for n in new:
        os.replace(server_dir / n, dest / n)
    return sorted(new, key=lambda n: (not n.endswith(TRACE_SUFFIXES), n))

"""An engine's own profiler driven over HTTP: ``POST /start_profile`` at the measured
window's start, ``POST /stop_profile`` at its end (vLLM's and SGLang's endpoints).

Why the answer is read, not assumed: vLLM serves these routes only when it was started
with a profiler (``--profiler-config``, ``vllm/entrypoints/serve/profile/api_router.py``:
the router is attached only when ``profiler_config.profiler`` is set), so an attached
server without one answers 404 (405 behind some proxies). That is said in words, as
"the server has no profiler", and costs the case nothing else. A stop the engine does
not answer within the timeout is said the same way.

:func:`vllm_profiler_args` is the flag a launched vLLM needs for its torch profiler to
write its traces into a folder of the run.
"""

from __future__ import annotations

import json
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


def _check(path: str, a: Answer) -> None:
    if a.status in NO_PROFILER:
        raise ProfileUnavailable(
            f"the server has no profiler: POST {path} answered {a.status} (vLLM serves it "
            "only when started with --profiler-config)")
    if not 200 <= a.status < 300:
        raise ProfileUnavailable(f"POST {path} answered {a.status}: {a.body.strip()[:200]}")


def start(base_url: str, prefix: str, *, timeout_s: float = TIMEOUT_S,
          headers: Mapping[str, str] | None = None) -> None:
    """The engine's profiler started; ProfileUnavailable, in words, when it is not."""
    _check("/start_profile", _post(base_url, "/start_profile", {"profile_prefix": prefix},
                                   timeout_s, headers or {}))


def stop(base_url: str, *, timeout_s: float = TIMEOUT_S,
         headers: Mapping[str, str] | None = None) -> None:
    """The engine's profiler stopped (its files written); ProfileUnavailable otherwise."""
    _check("/stop_profile", _post(base_url, "/stop_profile", None, timeout_s, headers or {}))


def vllm_profiler_args(trace_dir: Path) -> tuple[str, ...]:
    """vLLM's flag for a torch profiler writing into ``trace_dir`` (an absolute path, as
    vLLM requires), its CPU and, where there is one, GPU activities by platform default."""
    return ("--profiler-config",
            json.dumps({"profiler": "torch", "torch_profiler_dir": str(Path(trace_dir).resolve())},
                       sort_keys=True))

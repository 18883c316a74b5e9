"""Emptying an engine's prefix cache before a cold-prefix case, where the engine offers it.

A cold prefix means no prompt token is served from a cache. Prompts are salted per
repetition (load/case_runner.py), so no repetition shares a prefix with an earlier one
of the same arm; the arms of an A/B pair send the same prompts (their outputs pair by
SHA), so between them the engine's own cache must be emptied:

* SGLang: ``POST /flush_cache`` (refused while requests run; the case starts after);
* vLLM: ``POST /reset_prefix_cache`` (served when ``VLLM_SERVER_DEV_MODE=1``);
* llama.cpp: every request sends ``cache_prompt: false``, so no slot reuses a prefix.

The result is recorded with the case; a flush that failed does not stop the case, and
the cached-token count the server reports afterwards is what proves the prefix cold.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from strata_plugin.configure.engines import engine as engine_spec


@dataclass(frozen=True)
class Flush:
    how: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, object]:
        return {"how": self.how, "ok": self.ok, "detail": self.detail}


def flush_prefix_cache(engine: str, base_url: str, headers: Mapping[str, str] | None = None,
                       timeout_s: float = 30.0) -> Flush:
    """Empty ``engine``'s prefix cache at ``base_url``; never raises."""
    spec = engine_spec(engine)  # the engine table (configure/engines.py)
    if spec.cold_per_request:
        return Flush(spec.cold_per_request, True, "no flush needed")
    if spec.flush is None:
        return Flush("none", False, f"no known way to flush a {engine or 'unnamed'} engine's "
                     "prefix cache")
    method, path = spec.flush
    how = f"{method} {path}"
    req = urllib.request.Request(base_url.rstrip("/") + path, data=b"", method=method,
                                 headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = resp.read(500).decode("utf-8", errors="replace").strip()
            return Flush(how, True, f"HTTP {resp.status}{': ' + body if body else ''}")
    except urllib.error.HTTPError as exc:
        body = exc.read(500).decode("utf-8", errors="replace").strip()
        hint = f" ({spec.flush_404_hint})" if spec.flush_404_hint and exc.code == 404 else ""
        return Flush(how, False, f"HTTP {exc.code}{': ' + body if body else ''}{hint}")
    except (OSError, ValueError) as exc:
        return Flush(how, False, f"{type(exc).__name__}: {exc}")

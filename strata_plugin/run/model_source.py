"""Where the served model is, and how its KV cache is stored: read from the server's
command (or, for an attached server, from what it says about itself).

* llama.cpp: ``-m`` / ``--model`` (``-hf`` names a Hugging Face repository: not a file
  here); the KV cache types ``-ctk`` / ``--cache-type-k`` and ``-ctv`` / ``--cache-type-v``
  (default f16, llama-server ``--help``).
* vLLM: ``vllm serve <model>`` or ``--model``; ``--kv-cache-dtype`` (default ``auto``:
  the model's dtype; vLLM's engine arguments).
* SGLang: ``--model-path`` / ``--model``; ``--kv-cache-dtype`` (default ``auto``).
* An attached server: llama.cpp's ``GET /props`` (``model_path``), else an OpenAI
  server's ``GET /v1/models`` (vLLM puts the path it loaded in ``root``). The path must
  exist on this machine; a model inside a container or on another host is UNAVAILABLE
  with that reason.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata_plugin.configure.model_facts import GGML_ELEM_BYTES, KvCacheSetting
from strata_plugin.limits import MODEL_ID_SHOWN_MAX

_KV_NAMED = {"fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_inc": 1.0, "bfloat16": 2.0,
             "float16": 2.0, "half": 2.0, "float32": 4.0, "fp16": 2.0, "bf16": 2.0,
             "int8": 1.0, "fp4_e2m1": 0.5}


#: an attached server whose command line this machine cannot read
_NOT_VISIBLE = KvCacheSetting("unknown", "the attached server's KV cache type is not "
                              "visible (its command line is not on this machine)")


@dataclass(frozen=True)
class ModelLocation:
    path: str | None  # None: not found (``why`` says why)
    located_by: str
    why: str = ""
    kv: KvCacheSetting | None = None


def shown_id(v: str) -> str:
    """A model id or path as a reason shows it: at most MODEL_ID_SHOWN_MAX characters,
    a longer one cut with its length said (the reason is repeated per fact)."""
    if len(v) <= MODEL_ID_SHOWN_MAX:
        return v
    return f"{v[:MODEL_ID_SHOWN_MAX]}... ({len(v)} characters)"


def _local(v: str) -> bool:
    """Whether ``v`` names a path on this machine; a name too long for a path (past
    PATH_MAX, or with a NUL) names none."""
    try:
        return Path(v).exists()
    except (OSError, ValueError):
        return False


def _flag(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last of these flags (``--x v`` or ``--x=v``)."""
    found = None
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                found = argv[i + 1]
            elif a.startswith(n + "=") and n.startswith("--"):
                found = a[len(n) + 1:]
    return found


def _llamacpp_kv(argv: Sequence[str]) -> KvCacheSetting:
    k = _flag(argv, "-ctk", "--cache-type-k")
    v = _flag(argv, "-ctv", "--cache-type-v")
    if k is None and v is None:
        return KvCacheSetting("f16", "llama.cpp's default KV cache type (--cache-type-k/-v "
                              "f16)", 2.0, 2.0)
    kk, vv = (k or "f16").upper(), (v or "f16").upper()
    bk, bv = GGML_ELEM_BYTES.get(kk), GGML_ELEM_BYTES.get(vv)
    src = f"server argv --cache-type-k {kk.lower()} --cache-type-v {vv.lower()}"
    if bk is None or bv is None:
        return KvCacheSetting(f"{kk.lower()}/{vv.lower()}", src + ": a type this reader does "
                              "not know (KV bytes unavailable)")
    name = kk.lower() if kk == vv else f"{kk.lower()}/{vv.lower()}"
    return KvCacheSetting(name, src, bk, bv)


def _hf_kv(argv: Sequence[str], engine: str) -> KvCacheSetting | None:
    d = _flag(argv, "--kv-cache-dtype")
    if d is None or d == "auto":
        # auto: the type the model runs in, which --dtype sets where given, else the
        # model's own (model_facts reads it from config.json)
        m = _flag(argv, "--dtype")
        b = _KV_NAMED.get((m or "").lower())
        if b is None:
            return None
        return KvCacheSetting(m or "", f"server argv --dtype {m} (--kv-cache-dtype auto "
                              "follows it)", b, b)
    b = _KV_NAMED.get(d.lower())
    src = f"server argv --kv-cache-dtype {d}"
    return KvCacheSetting(d, src if b else src + " (bytes per element unknown)", b, b)


def _vllm_model(argv: Sequence[str]) -> str | None:
    m = _flag(argv, "--model")
    if m:
        return m
    for i, a in enumerate(argv[:-1]):
        if a == "serve" and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None


def from_argv(engine: str, argv: Sequence[str], cwd: Path | None = None) -> ModelLocation:
    """The model path and KV cache setting a server command names."""
    argv = list(argv)
    cwd = cwd or Path.cwd()
    kv: KvCacheSetting | None
    if engine == "llamacpp":
        kv = _llamacpp_kv(argv)
        hf = _flag(argv, "-hf", "--hf-repo", "-mu", "--model-url")
        path = _flag(argv, "-m", "--model")
        how = "llama.cpp argv -m"
        if path is None and hf:
            return ModelLocation(None, "llama.cpp argv", f"the server downloads its model "
                                 f"({shown_id(hf)}); no local file named", kv)
    elif engine in ("vllm", "sglang"):
        kv = _hf_kv(argv, engine)
        if engine == "vllm":
            path, how = _vllm_model(argv), "vLLM argv (serve <model> / --model)"
        else:
            path, how = _flag(argv, "--model-path", "--model"), "SGLang argv --model-path"
    else:
        return ModelLocation(None, "argv", f"engine {engine or 'other'!r}: Strata does not "
                             "know which argument names its model")
    if not path:
        return ModelLocation(None, how, "no model argument in the server command", kv)
    p = Path(os.path.expanduser(path))
    if not p.is_absolute():
        p = cwd / p
    if not _local(str(p)):
        return ModelLocation(None, how, f"{shown_id(path)} is not a path on this machine (a "
                             "hub id, or a path inside a container or on another host)", kv)
    return ModelLocation(str(p), how, "", kv)


def from_server(engine: str, base_url: str,
                get_json: Callable[[str], Any] | None = None,
                headers: Mapping[str, str] | None = None) -> ModelLocation:
    """An attached server's model path, from what it reports: llama.cpp's ``/props``
    ``model_path``, else ``/v1/models`` (``root``, vLLM's loaded path; else ``id``).
    ``headers``: the URL's credentials as the client sends them (configure/credentials.py),
    so a server behind Basic auth answers as it does to the load."""
    get = get_json or functools.partial(_get_json, headers=headers)
    tried = []
    props = get(base_url.rstrip("/") + "/props")
    if isinstance(props, dict) and isinstance(props.get("model_path"), str):
        path = props["model_path"]
        tried.append(f"/props model_path {shown_id(path)}")
        if _local(path):
            return ModelLocation(path, "the server's /props model_path", "", _NOT_VISIBLE)
    models = get(base_url.rstrip("/") + "/v1/models")
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        for key in ("root", "id"):
            v = data[0].get(key)
            if isinstance(v, str):
                tried.append(f"/v1/models {key} {shown_id(v)}")
                if _local(v):
                    return ModelLocation(v, f"the server's /v1/models {key}", "",
                                         _NOT_VISIBLE)
    why = ("the server names no path on this machine (" + "; ".join(tried) + ")") if tried else (
        "the server reports no model path (/props model_path, /v1/models root)")
    return ModelLocation(None, "the attached server", why)


def _get_json(url: str, headers: Mapping[str, str] | None = None) -> Any:
    import requests

    try:
        r = requests.get(url, timeout=5, headers=dict(headers) if headers else None)
        if r.status_code != 200:
            return None
        return r.json()
    except (requests.RequestException, ValueError):
        return None

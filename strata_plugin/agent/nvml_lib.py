"""Loading NVML (the ``pynvml`` module of nvidia-ml-py) lazily, and naming its errors.

Callers may pass their own module object (tests inject a fake at this
boundary); otherwise ``pynvml`` is imported on first use. Every failure becomes
a reason string naming the NVML error constant, e.g.
``"NVML_ERROR_NOT_SUPPORTED (Not Supported)"``.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()


def error_text(nv: Any, exc: BaseException) -> str:
    """``NVML_ERROR_<NAME> (<message>)`` for an NVMLError, else ``Type: message``."""
    value = getattr(exc, "value", None)
    nvml_error = getattr(nv, "NVMLError", None)
    if isinstance(value, int) and nvml_error is not None and isinstance(exc, nvml_error):
        name = None
        for attr in dir(nv):
            if attr.startswith("NVML_ERROR_") and getattr(nv, attr, None) == value:
                name = attr
                break
        try:
            msg = str(exc)
        except Exception:  # str() of an NVMLError may itself call into NVML
            msg = f"code {value}"
        return f"{name or f'NVML error {value}'} ({msg})"
    return f"{type(exc).__name__}: {exc}"


def load_nvml(module: Any | None = None) -> tuple[Any | None, str | None]:
    """``(nvml module, None)`` after a successful ``nvmlInit``, or ``(None, reason)``.

    Every successful call must be paired with :func:`shutdown` (NVML counts inits).
    """
    nv: Any = module
    if nv is None:
        try:
            import pynvml

            nv = pynvml
        except ImportError as e:
            return None, f"pynvml not installed ({e}); pip install nvidia-ml-py"
    with _lock:
        try:
            nv.nvmlInit()
        except Exception as e:
            return None, f"nvmlInit failed: {error_text(nv, e)}"
    return nv, None


def shutdown(nv: Any) -> None:
    try:
        nv.nvmlShutdown()
    except Exception:
        pass


def decode(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def const(nv: Any, name: str, default: Any) -> Any:
    """A pynvml constant, with the documented value as fallback for older bindings."""
    return getattr(nv, name, default)


def load_stub(path: str) -> Any:
    """A pynvml stand-in from a file outside the package (``--nvml-stub``): the stub never
    ships with the agent; its ``stub()`` returns the module object the callers use."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("strata_nvml_stub", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--nvml-stub {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    # registered before it runs: a dataclass in the stub looks its module up there
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.stub()

"""After a server stops: confirm through NVML that its processes no longer hold GPU memory.

A server that exits but leaves a worker holding memory poisons the next
configuration's numbers (and its memory budget). :func:`wait_gpu_release`
polls until no listed PID (or, with ``require_idle``, no process at all) holds
GPU memory, or the timeout passes. It lives in the agent (standard library,
Python 3.8+) so every node checks its own GPUs (control line ``gpu_release``);
``run/gpu_release.py`` asks every node's agent and fails the run loudly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from . import nvml_lib


@dataclass(frozen=True)
class GpuHolder:
    gpu: int
    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class GpuReleaseResult:
    """``ok`` when released; ``skipped`` (and ok) when NVML is not available here."""

    ok: bool
    skipped: bool
    detail: str
    waited_s: float
    holders: tuple[GpuHolder, ...] = ()


def gpu_holders(nv: Any) -> list[GpuHolder]:
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            if hasattr(nv, fn):
                for p in getattr(nv, fn)(h):
                    out.append(GpuHolder(i, int(p.pid), getattr(p, "usedGpuMemory", None)))
    return out


def wait_gpu_release(
    pids: Iterable[int],
    timeout_s: float = 30.0,
    poll_s: float = 0.5,
    require_idle: bool = False,
    nvml: Any | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> GpuReleaseResult:
    """Poll NVML until none of ``pids`` holds GPU memory (any process, with ``require_idle``).

    In a container NVML may report host PIDs that differ from the ones the
    harness knows; pass ``require_idle=True`` when the GPUs were idle before
    the server started (preflight checked that).
    """
    watched = set(pids)
    nv, reason = nvml_lib.load_nvml(nvml)
    if nv is None:
        return GpuReleaseResult(True, True, f"skipped: {reason}", 0.0)
    start = clock()
    try:
        while True:
            try:
                holders = [h for h in gpu_holders(nv) if require_idle or h.pid in watched]
            except Exception as e:
                return GpuReleaseResult(
                    False,
                    False,
                    f"NVML query failed: {nvml_lib.error_text(nv, e)}",
                    clock() - start,
                )
            waited = clock() - start
            if not holders:
                what = (
                    "no process holds GPU memory"
                    if require_idle
                    else (f"none of pids {sorted(watched)} holds GPU memory")
                )
                return GpuReleaseResult(True, False, f"{what} after {waited:.1f}s", waited)
            if waited >= timeout_s:
                held = ", ".join(
                    f"pid {h.pid} on gpu{h.gpu}"
                    + (f" ({h.used_bytes / 2**20:.0f} MiB)" if h.used_bytes is not None else "")
                    for h in holders
                )
                return GpuReleaseResult(
                    False, False, f"still held after {waited:.1f}s: {held}", waited, tuple(holders)
                )
            sleep(poll_s)
    finally:
        nvml_lib.shutdown(nv)


def result_json(r: GpuReleaseResult) -> dict:
    """The result as the agent sends it back (and the manifest records it)."""
    return {"ok": r.ok, "skipped": r.skipped, "detail": r.detail,
            "waited_s": round(r.waited_s, 3),
            "holders": [[h.gpu, h.pid, h.used_bytes] for h in r.holders]}

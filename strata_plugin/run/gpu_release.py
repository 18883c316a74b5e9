"""GPU memory released on every node after a server stops, asked of each node's agent.

The check itself (``agent/gpu_release.py``) runs in the agent, next to the GPUs: a
worker node's leftover process is seen there, not only the head's. Each agent
watches every PID it followed as the server (its process tree, over the block); an
agent that followed nothing requires its GPUs idle, as the preflight found them.
:func:`require_gpu_release` raises :class:`GpuNotReleased` so the run fails loudly.
"""

from __future__ import annotations

from collections.abc import Sequence

from strata_plugin.agent.gpu_release import (
    GpuHolder,
    GpuReleaseResult,
    gpu_holders,
    wait_gpu_release,
)
from strata_plugin.errors import StrataError

__all__ = ["GpuHolder", "GpuNotReleased", "GpuReleaseResult", "gpu_holders",
           "release_on_nodes", "require_gpu_release", "wait_gpu_release"]


class GpuNotReleased(StrataError, RuntimeError):
    def __init__(self, result: GpuReleaseResult, node: str = "") -> None:
        where = f" on {node}" if node else ""
        super().__init__(f"GPU memory not released{where}: {result.detail}")
        self.result = result
        self.node = node


def require_gpu_release(result: GpuReleaseResult, node: str = "") -> GpuReleaseResult:
    if not result.ok:
        raise GpuNotReleased(result, node)
    return result


def release_on_nodes(handles: Sequence, timeout_s: float = 30.0) -> dict[str, GpuReleaseResult]:
    """Every live agent checks its node's GPUs at once; results by node. An agent that
    cannot answer gives a failed result with the reason (never a silent pass)."""
    asked = []
    out: dict[str, GpuReleaseResult] = {}
    for h in handles:
        try:
            if not h.alive:
                raise RuntimeError("the agent is not running")
            asked.append((h, h.ask_gpu_release(timeout_s)))
        except Exception as exc:
            out[h.node] = GpuReleaseResult(False, False, f"could not ask the agent: {exc}", 0.0)
    for h, label in asked:
        try:
            r = h.wait_gpu_release(label, timeout_s + 15.0)
            holders = tuple(GpuHolder(int(g), int(p), u) for g, p, u in r.get("holders", []))
            out[h.node] = GpuReleaseResult(bool(r["ok"]), bool(r["skipped"]), str(r["detail"]),
                                           float(r["waited_s"]), holders)
        except Exception as exc:
            out[h.node] = GpuReleaseResult(False, False,
                                           f"no answer from the agent: {type(exc).__name__}: "
                                           f"{exc}", 0.0)
    return out

"""The sampling agent: one small process per node that streams telemetry samples.

This package is self-contained on purpose: it imports nothing from the rest of
``strata_plugin`` and needs only the standard library (plus ``pynvml`` when it
is installed), so the same code can be copied to a bare GPU node and started
there over ssh. The harness side lives in :mod:`strata_plugin.agent.handle`.
"""

from __future__ import annotations

from typing import Any

from .protocol import AGENT_VERSION

__all__ = ["AGENT_VERSION", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run the agent (``python -m strata_plugin agent ...``); returns the exit status."""
    from .cli import main as _main

    return _main(argv)


def __getattr__(name: str) -> Any:
    # Harness-side names resolve lazily so that starting the agent stays cheap.
    if name in ("AgentHandle", "AgentDied", "AgentExit", "ClockOffset", "agent_argv"):
        from . import handle

        return getattr(handle, name)
    if name in ("read_process_counters", "process_tree", "ProcessCounters"):
        from . import procfs

        return getattr(procfs, name)
    if name == "static_snapshot":
        from .snapshot import static_snapshot

        return static_snapshot
    raise AttributeError(name)

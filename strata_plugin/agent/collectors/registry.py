"""The collector registry: every name ``--collectors`` (and a profile's
``telemetry.collectors``) may take, and where its factory is.

One line per collector: its name -> the module (relative to this package) whose
``from_args(args, targets)`` builds it from the agent's parsed options and the server's
:class:`~strata_plugin.agent.targets.ProcessTargets`, returning a
:class:`~.base.Collector` (a :class:`~.base.Missing` with the reason when an option it
needs was not given). The module is imported only when its collector is asked for: the
agent must not load NVML bindings, or start any tool, for a collector nobody turned on.
The order is the default ``--collectors`` order. Adding a collector is its module and
one line here (docs/extending.md, "Adding a collector").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

    from ..targets import ProcessTargets
    from .base import Collector

COLLECTORS: dict[str, str] = {
    "proc": ".proc",
    "cpu": ".cpu",
    "mem": ".mem",
    "disk": ".disk",
    "net": ".net",
    "rdma": ".rdma",
    "nvml": ".nvml",
    "dcgm": ".dcgm",
    "prom": ".prom",
    "log": ".log",
    "perf": ".perf",
    "numa": ".numa",
    "runstate": ".runstate",
    "path": ".path",
}

#: Collectors that read only /proc and /sys (the agent-cost benchmark turns these on).
CPU_SIDE = ("proc", "cpu", "mem", "disk", "net", "rdma", "log", "numa")


def names() -> tuple[str, ...]:
    """Every registered name, in the default order."""
    return tuple(COLLECTORS)


def make(name: str, args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The collector called ``name``; ValueError naming the known ones when there is none."""
    module = COLLECTORS.get(name)
    if module is None:
        raise ValueError(f"unknown collector {name!r}; known: {', '.join(COLLECTORS)}")
    return importlib.import_module(module, __package__).from_args(args, targets)

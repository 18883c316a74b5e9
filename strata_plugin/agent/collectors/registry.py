"""The collector registry: every name ``--collectors`` (and a profile's
``telemetry.collectors``) may take, and where its factory is.

One line per collector: its name -> the module (relative to this package) whose
``from_args(args, targets)`` builds it from the agent's parsed options and the server's
:class:`~strata_plugin.agent.targets.ProcessTargets`, returning a
:class:`~.base.Collector` (a :class:`~.base.Missing` with the reason when an option it
needs was not given). The module is imported only when its collector is asked for: the
agent must not load NVML bindings, or start any tool, for a collector nobody turned on.
The order is the default ``--collectors`` order. Adding one of Strata's own collectors
is its module and one line here.

Another package's collector (the ``strata.collectors`` entry-point group,
docs/extending.md, "A collector") is handed to the agent by module name,
``--collector-module NAME=MODULE``: the agent reads no entry points itself, since on
another node the package that declares them is not installed (the harness ships a
standard-library-only plugin module in the agent's zip, and says why it did not for
one that is not: ``--collector-unavailable NAME=REASON``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .base import Missing

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
    "allowance": ".allowance",
    "conns": ".conns",
}

#: Collectors that read only /proc and /sys (the agent-cost benchmark turns these on).
CPU_SIDE = ("proc", "cpu", "mem", "disk", "net", "rdma", "log", "numa")


def names() -> tuple[str, ...]:
    """Every registered name, in the default order."""
    return tuple(COLLECTORS)


def _pairs(values: list[str] | None, option: str) -> dict[str, str]:
    out = {}
    for v in values or ():
        name, sep, rest = v.partition("=")
        if not sep or not name or not rest:
            raise ValueError(f"{option} takes NAME=VALUE, not {v!r}")
        out[name] = rest
    return out


def make(name: str, args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The collector called ``name``: a built-in, or a plugin's module given with
    ``--collector-module`` (a :class:`~.base.Missing` with the reason when that module
    cannot be imported here, or was not shipped: ``--collector-unavailable``);
    ValueError naming the known ones when there is none."""
    module = COLLECTORS.get(name)
    if module is not None:
        return importlib.import_module(module, __package__).from_args(args, targets)
    plugins = _pairs(getattr(args, "collector_module", None), "--collector-module")
    refused = _pairs(getattr(args, "collector_unavailable", None), "--collector-unavailable")
    if name in refused:
        return Missing(name, refused[name])
    if name not in plugins:
        known = [*COLLECTORS, *plugins]
        raise ValueError(f"unknown collector {name!r}; known: {', '.join(known)}")
    try:
        factory = importlib.import_module(plugins[name]).from_args
    except Exception as e:  # the plugin's module: whatever its import raises on this node
        return Missing(name, f"plugin module {plugins[name]} could not be imported on this "
                             f"node: {type(e).__name__}: {e}")
    try:
        return factory(args, targets)
    except Exception as e:  # the plugin's own code; the agent and its other collectors run on
        return Missing(name, f"plugin module {plugins[name]}: from_args raised "
                             f"{type(e).__name__}: {e}")

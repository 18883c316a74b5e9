"""The profile's ``[load]`` table: where the load generator runs.

::

    [load]
    processes = "auto"        # or a number: worker processes on this host (1: one loop)

    [load]                    # or: the same loop as Ray actors on the user's cluster
    engine = "ray"
    address = "ray://raycluster-head-svc:10001"   # what ray.init(address=...) takes
    workers_per_node = 2      # actors per node, spread over nodes by a placement group
    nodes = 0                 # how many nodes (0: every alive node)
    num_cpus = 1.0            # CPUs each actor reserves
    resources = { client = 1 } # custom resources each actor reserves (ray start --resources)
    ship_package = false      # true: runtime_env py_modules carries strata_plugin

Kept apart from ``configure/profile.py`` (which calls :func:`read_load`) so the load's
vocabulary has one owner; standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ENGINES = ("local", "ray")


@dataclass(frozen=True)
class LoadSpec:
    engine: str = "local"  # "local": this host (one loop or the pool); "ray": Ray actors
    processes: int | str = "auto"  # local: "auto" (load/pool.plan) or a number
    address: str = ""  # ray: ray.init(address=...): "ray://head:10001", "auto", "host:6379"
    workers_per_node: int = 1
    nodes: int = 0  # ray: nodes to spread over; 0: every alive node
    num_cpus: float = 1.0  # ray: CPUs each actor reserves
    resources: tuple[tuple[str, float], ...] = ()  # ray: custom resources per actor
    ship_package: bool = False  # ray: runtime_env py_modules = [strata_plugin]
    namespace: str = "strata"  # ray: the namespace the driver's actors live in


def read_load(r: Any, error: Callable[..., Exception]) -> LoadSpec:
    """``[load]`` through the profile's reader ``r`` (built with :class:`LoadSpec`, whose
    fields give every default); ``error(path, key, expected, value)``."""
    engine = r.choice("engine", ENGINES)
    processes = r.get("processes", (str, int), expected='"auto" or a number >= 1')
    if isinstance(processes, str) and processes != "auto":
        raise error(r.path, r._key("processes"), '"auto" or a number >= 1', processes)
    if isinstance(processes, int) and processes < 1:
        raise error(r.path, r._key("processes"), '"auto" or a number >= 1', processes)
    address = r.get("address", str)
    if engine == "ray" and not address:
        raise error(r.path, r._key("address"), 'the Ray cluster\'s address when engine = "ray" '
                    '(what ray.init takes: "ray://head:10001", "auto" or "host:6379")')
    res = r.sub("resources")
    resources = tuple((k, res.number(k, lo=1e-4, hi=1e6)) for k in list(res.table))
    spec = LoadSpec(
        engine=engine, processes=processes, address=address,
        workers_per_node=r.integer("workers_per_node", lo=1, hi=256),
        nodes=r.integer("nodes", lo=0, hi=10_000),
        num_cpus=r.number("num_cpus", lo=0.01, hi=1024),  # a Ray bundle is never empty
        resources=resources,
        ship_package=r.get("ship_package", bool),
        namespace=r.get("namespace", str),
    )
    r.reject_unknown()
    return spec

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
vocabulary has one owner; standard library only. Each key is declared once, on its field
(``configure/keys.py``): the reader and docs/profile.md take its default, bounds and
meaning from there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from strata_plugin.configure.keys import key

ENGINES = ("local", "ray")
#: ``processes``: its rule, as the error says it.
_PROCESSES_RULE = '"auto" or a number >= 1'


@dataclass(frozen=True)
class LoadSpec:
    engine: str = key("local", choices=ENGINES, doc="Where the load generator runs (`local`: "
                      "this host, one loop or the worker pool; `ray`: Ray actors on the "
                      "user's cluster, docs/scale.md).")
    processes: int | str = key("auto", rule=_PROCESSES_RULE, doc="Local: worker processes on "
                               "this host; \"auto\" (load/pool.plan) or a number (1: one loop).")
    address: str = key("", doc="Ray: what ray.init(address=...) takes: \"ray://head:10001\", "
                       "\"auto\", \"host:6379\". Required when `engine = \"ray\"`.")
    workers_per_node: int = key(1, lo=1, hi=256, doc="Ray: actors per node, spread over the "
                                "nodes by a placement group.")
    nodes: int = key(0, lo=0, hi=10_000, doc="Ray: nodes to spread over; 0: every alive node.")
    num_cpus: float = key(1.0, lo=0.01, hi=1024, doc="Ray: CPUs each actor reserves (a Ray "
                          "bundle is never empty).")
    resources: tuple[tuple[str, float], ...] = key((), lo=1e-4, hi=1e6, doc="Ray: custom "
                                                   "resources each actor reserves (ray start "
                                                   "--resources).")
    ship_package: bool = key(False, doc="Ray: runtime_env py_modules = [strata_plugin].")
    namespace: str = key("strata", doc="Ray: the namespace the driver's actors live in.")


def read_load(r: Any, error: Callable[..., Exception]) -> LoadSpec:
    """``[load]`` through the profile's reader ``r`` (built with :class:`LoadSpec`, whose
    fields give every default); ``error(path, key, expected, value)``."""
    engine = r.choice("engine")
    processes = r.get("processes", (str, int), expected=_PROCESSES_RULE)
    if isinstance(processes, str) and processes != "auto":
        raise error(r.path, r._key("processes"), _PROCESSES_RULE, processes)
    if isinstance(processes, int) and processes < 1:
        raise error(r.path, r._key("processes"), _PROCESSES_RULE, processes)
    address = r.get("address", str)
    if engine == "ray" and not address:
        raise error(r.path, r._key("address"), 'the Ray cluster\'s address when engine = "ray" '
                    '(what ray.init takes: "ray://head:10001", "auto" or "host:6379")')
    lo, hi = r.declared("resources").lo, r.declared("resources").hi
    res = r.sub("resources")
    resources = tuple((k, res.number(k, lo=lo, hi=hi)) for k in list(res.table))
    spec = LoadSpec(
        engine=engine, processes=processes, address=address,
        workers_per_node=r.integer("workers_per_node"),
        nodes=r.integer("nodes"),
        num_cpus=r.number("num_cpus"),
        resources=resources,
        ship_package=r.get("ship_package", bool),
        namespace=r.get("namespace", str),
    )
    r.reject_unknown()
    return spec

"""The processes on the request's way to the server (proxies): their CPU and run-queue wait.

An attached server is often reached through a proxy on the same host (a router, a
gateway, a TLS terminator, a container runtime's port forwarder). The harness finds
them (``run/listener.py``) and passes them as ``--path-pid``; the server's own
collectors (``proc``, ``runstate``) follow the engine. This one samples the proxies
exactly as ``proc`` samples the server (same metrics, same devices: ``""`` summed over
every proxy and its descendants, ``pid<N>`` per process, each announced once with its
command line), under source ``path``: their CPU is then neither the server's nor
"other processes'", and a proxy that is itself starved (its threads runnable without a
CPU: ``run_delay_s``) is a finding the analysis can read.

A process of the server's own tree is never counted here (a proxy that starts its
engine as a child, as llama-swap does): the server's collectors have it. Without
``--path-pid`` it waits, silent (no samples, not unavailable): a ``path <pid> ...``
control line starts it, and ``path`` alone stops it following anyone.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..targets import ProcessTargets
from .proc import ProcCollector

if TYPE_CHECKING:
    import argparse

    from .base import Collector


class PathTargets(ProcessTargets):
    """The proxies' trees, less whatever the server's targets hold."""

    def __init__(self, pids: list[int] | tuple[int, ...], server: ProcessTargets,
                 rescan_s: float = 2.0) -> None:
        super().__init__(pids=pids, rescan_s=rescan_s)
        self.server = server

    def set_pids(self, pids: list[int]) -> None:
        if not pids:  # following nobody: an empty tree (the base keeps the last one)
            self.pids, self.roots, self.tree = (), (), ()
            self.generation += 1
            return
        super().set_pids(pids)

    def refresh(self, now: float | None = None, force: bool = False) -> bool:
        changed = super().refresh(now, force)
        skip = set(self.server.tree)
        if skip & set(self.tree):
            # Rare (an engine that is a proxy's child): the base sees the whole tree
            # again at each rescan and the filter bumps the generation again.
            self.tree = tuple(p for p in self.tree if p not in skip)
            self.generation += 1
            changed = True
        return changed


class PathCollector(ProcCollector):
    source = "path"
    follows_targets = False  # the server's ``pids`` lines are not for it
    follows_path = True  # ``path`` lines are

    def probe(self) -> None:
        if not self.targets.configured:
            return  # nobody on the path yet: silent until a ``path`` line
        super().probe()

    def set_pids(self, pids: list[int]) -> None:
        self.targets.set_pids(pids)
        self._next_task_scan = time.monotonic()


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory: the proxies given by ``--path-pid``, the server's targets
    to keep out of them."""
    return PathCollector(PathTargets(list(args.path_pid), targets, rescan_s=args.rescan),
                         top_threads=0, threads=not args.no_threads)

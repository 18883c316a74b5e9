"""The state Strata keeps for the whole process, declared in one place.

Strata runs inside pytest's process, so what it keeps for the process is shared with the
user's tests and outlives every object of a run. Each piece is declared here, in one
object (``STATE``, as structlog keeps its configuration in one ``_CONFIG``), with the
module that writes it and why it must be process-wide. No other module of the package
keeps a mutable global of its own: each reads and writes its part of ``STATE``.

Nothing is registered at import. Importing Strata (pytest imports the plugin in every
repository that has it installed) starts no thread, installs no signal handler and
registers no ``atexit`` hook: the hooks that stop what a run started are registered by
the first thing that starts one, through :func:`at_exit`.

Not listed, because no run depends on them: caches of values derived from files or
constants (``functools.cache``, the prompts files read once, the zip shipped to other
nodes), registries filled at import from constants (``formats/typed.py``'s readers),
counters that only make names unique, and sentinels. ``agent/`` runs as its own process
on every node and keeps its own.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProcessState:
    """Every process-wide value, by the module that owns it."""

    #: run/reaper.py, plugin/hooks.py: the run was interrupted (SIGTERM or SIGHUP turned
    #: into KeyboardInterrupt, or pytest's own Ctrl-C); the teardown then skips the
    #: cooldowns and marks the run incomplete. Set from a signal handler: an Event.
    interrupted: threading.Event = field(default_factory=threading.Event)
    #: run/reaper.py: servers and workers still to stop at exit, by ``id()``, in start
    #: order (a signal handler SIGKILLs them; atexit stops them).
    live_processes: dict[int, Any] = field(default_factory=dict)
    #: run/reaper.py: SIGTERM/SIGHUP caught by the run's handler (a second one kills every
    #: registered group and exits at once).
    signals_seen: int = 0
    #: load/sandbox.py: who opted this process in to running model-written code unconfined
    #: where confinement is unavailable (a profile); "" nobody.
    unconfined_by: str = ""
    #: testing/faults.py: fault injectors started and not yet stopped (stopped at exit).
    live_faults: set[Any] = field(default_factory=set)
    #: run/tracing.py: tracefs captures live now, by instance name (removed at exit or on
    #: SIGTERM), and the SIGTERM handler a live capture replaced ([]: none replaced).
    live_traces: dict[str, Any] = field(default_factory=dict)
    prev_sigterm: list[int | None] = field(default_factory=list)
    #: load/client/gcpause.py: event loops of this process with requests in flight (the
    #: garbage collector's heap stays frozen while any has), under its lock.
    gc_busy_loops: int = 0
    gc_lock: threading.Lock = field(default_factory=threading.Lock)
    #: load/pool.py: the streams one loop keeps exact on this host, lowered by what this
    #: session's self-checks show (a ``pool.Capacity``; made on first use).
    loop_capacity: Any = None
    #: :func:`at_exit`: the hooks registered so far, under its lock.
    exit_hooks: list[Callable[[], None]] = field(default_factory=list)
    exit_lock: threading.Lock = field(default_factory=threading.Lock)


STATE = ProcessState()


def at_exit(hook: Callable[[], None]) -> None:
    """Run ``hook`` at interpreter exit: registered once, when a run first needs it
    (a server, a fault or a trace started), never at import."""
    with STATE.exit_lock:
        if hook in STATE.exit_hooks:
            return
        STATE.exit_hooks.append(hook)
    atexit.register(hook)

"""No process Strata starts outlives it, whatever way the run ends.

Servers and remote workers register here when started and leave when stopped;
whatever is still registered at interpreter exit is stopped. SIGTERM and SIGHUP become
KeyboardInterrupt (installed only once a Strata run starts, so a repository
that merely has the plugin installed keeps its own signal handling), and
``INTERRUPTED`` tells the teardown code to skip cooldowns and mark the run
incomplete.
"""

from __future__ import annotations

import atexit
import signal
import threading
from typing import Protocol


class Stoppable(Protocol):
    def stop(self) -> object: ...


INTERRUPTED = threading.Event()
_live: dict[int, Stoppable] = {}  # by id(), in start order
_atexit_registered = False


def register(proc: Stoppable) -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(stop_all)
        _atexit_registered = True
    _live[id(proc)] = proc


def unregister(proc: Stoppable) -> None:
    _live.pop(id(proc), None)


def stop_all() -> None:
    """Last line of defence: stop every server and worker still registered, newest first
    (a head before the workers it was started after)."""
    for key, proc in reversed(list(_live.items())):
        proc.stop()
        _live.pop(key, None)


def install_sigterm_handler() -> None:
    """SIGTERM and SIGHUP (a closed terminal or ssh session) become KeyboardInterrupt, so
    pytest's teardown runs as for Ctrl-C: by default either would end the interpreter
    without teardown or atexit, leaving servers in their own sessions and containers
    running.

    Leaves a handler someone else installed alone, and does nothing off the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) not in (signal.SIG_DFL, None):
            continue

        def handler(signum: int, frame: object) -> None:
            signal.signal(signum, signal.SIG_DFL)
            raise KeyboardInterrupt(f"signal {signum}")

        signal.signal(sig, handler)

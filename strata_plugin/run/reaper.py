"""No process Strata starts outlives it, whatever way the run ends.

Servers and remote workers register here when started and leave when stopped;
whatever is still registered at interpreter exit is stopped. SIGTERM and SIGHUP become
KeyboardInterrupt (installed only once a Strata run starts, so a repository
that merely has the plugin installed keeps its own signal handling), and
``INTERRUPTED`` tells the teardown code to skip cooldowns and mark the run
incomplete.

A second SIGTERM or SIGHUP while the first is still being handled (a stop waiting out
a server's grace period, a CI runner that sends TERM twice) ends the interpreter at
once, but only after every registered process group got SIGKILL (``kill_all``): the
servers run in their own sessions, so dying by default would leave them running.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Protocol

from strata_plugin.process_globals import STATE, at_exit


class Stoppable(Protocol):
    """What the reaper holds. A stoppable may also offer ``kill_group()``: SIGKILL its
    process group now, waiting for nothing and taking no lock (the second-signal path
    calls it from a signal handler, possibly in the middle of that object's ``stop()``)."""

    def stop(self) -> object: ...


#: Set once the run is interrupted (process_globals.STATE.interrupted, the same Event).
INTERRUPTED = STATE.interrupted


def register(proc: Stoppable) -> None:
    """Stop ``proc`` at exit unless it is unregistered first (``stop_all`` is registered
    with atexit by the first process registered)."""
    at_exit(stop_all)
    STATE.live_processes[id(proc)] = proc


def die_with_parent(sig: int = signal.SIGTERM, *, main_thread_only: bool = False
                    ) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get ``sig`` when the harness dies (Linux
    ``PR_SET_PDEATHSIG``; None elsewhere). Why: a SIGKILLed pytest (a CI job's timeout, an
    OOM kill) runs no atexit hook and no signal handler, and a server in its own session
    would go on holding its port, its memory and its GPUs. The signal reaches the process
    Strata started, which survives its exec: a server that is that process (llama-server,
    ``vllm serve``) stops with its own children; a wrapper that does not pass SIGTERM on (a
    shell script) or a container runtime's client does not stop what it started.

    The kernel sends it when the *thread* that forked the child ends, not the process:
    ``main_thread_only`` sets it only from the main thread, for a child that must outlive
    a worker thread which started it (a server restarted from a monitor thread).
    ``run/remote.py`` keeps a copy of its own: it is shipped alone to other nodes."""
    if not sys.platform.startswith("linux"):
        return None
    if main_thread_only and threading.current_thread() is not threading.main_thread():
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None

    parent = os.getpid()

    def set_it() -> None:
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the harness died before the signal was armed
            os._exit(1)

    return set_it


def unregister(proc: Stoppable) -> None:
    STATE.live_processes.pop(id(proc), None)


def stop_all() -> None:
    """Last line of defence: stop every server and worker still registered, newest first
    (a head before the workers it was started after).

    A stop that raises (an interrupt in the middle of it included) does not spare the
    ones after it: that process group gets SIGKILL, the rest are still stopped, and the
    first error is raised at the end.
    """
    first: BaseException | None = None
    for key, proc in reversed(list(STATE.live_processes.items())):
        try:
            proc.stop()
        except BaseException as exc:  # re-raised below, after the rest
            _kill_group(proc)
            first = first or exc
            continue
        STATE.live_processes.pop(key, None)
    if first is not None:
        raise first


def kill_all() -> int:
    """SIGKILL every registered process group now, newest first; returns how many were
    signalled. Calls no ``stop()``: it runs from a signal handler that may have interrupted
    one, so it must not wait on that process or take a lock that code holds."""
    n = 0
    for proc in reversed(list(STATE.live_processes.values())):
        n += _kill_group(proc)
    return n


def _kill_group(proc: Stoppable) -> int:
    kill = getattr(proc, "kill_group", None)
    if kill is None:
        return 0
    try:
        kill()
    except Exception:  # the last resort goes on to the next process
        return 0
    return 1


def _on_signal(signum: int, frame: object) -> None:
    """First SIGTERM/SIGHUP: KeyboardInterrupt, so pytest's teardown stops the servers
    (with their grace periods, and the run is marked incomplete). Any later one: the
    teardown is being cut short, so SIGKILL every registered group and exit with the
    conventional 128 + signal status, without unwinding into the interrupted stop."""
    STATE.signals_seen += 1
    if STATE.signals_seen == 1:
        raise KeyboardInterrupt(f"signal {signum}")
    n = kill_all()
    try:
        os.write(2, f"\nstrata: signal {signum} during teardown: killed {n} process "
                    f"group(s) still registered, exiting now\n".encode())
    except OSError:
        pass
    os._exit(128 + signum)


def install_sigterm_handler() -> None:
    """SIGTERM and SIGHUP (a closed terminal or ssh session) become KeyboardInterrupt, so
    pytest's teardown runs as for Ctrl-C: by default either would end the interpreter
    without teardown or atexit, leaving servers in their own sessions and containers
    running. The handler stays installed after the first signal (see ``_on_signal``):
    giving the default back would let a second signal kill us mid-teardown with the
    servers still up.

    Leaves a handler someone else installed alone, and does nothing off the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) not in (signal.SIG_DFL, None):
            continue
        signal.signal(sig, _on_signal)

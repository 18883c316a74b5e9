"""Whether a followed process still lives, and how one that ended ended.

Standard library only (the agent's rule). A PID alone does not name a process: once
the process ends and is reaped, the kernel may give its number to the next process
started, and a check of ``/proc/PID`` alone would then follow a stranger as the
engine. So a process is named by its PID *and* its start time (``/proc/PID/stat``
field 22, clock ticks since boot), which no later process with the same number shares.

How it ended is known only to its parent: a process Strata started (``Popen``) gives
its exit code or the signal that killed it; any other process has merely gone.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Optional

from . import procfs

#: ``how`` of a followed process that is no more, where its parent is not Strata.
GONE = "gone"
#: ``how`` of a followed process whose PID now names another process (it ended, was
#: reaped, and its number was given to a newer one).
REUSED = "gone (its PID now names another process)"


def start_ticks(pid: int, proc: str = procfs.PROC) -> Optional[int]:
    """The process's start time (clock ticks after boot), or None when no process of
    this PID is running: none at all, or one that ended and awaits its parent (zombie,
    ``Z``; ``X`` dead)."""
    data = procfs.read_bytes(f"{proc}/{pid}/stat")
    if not data:
        return None
    try:
        fields = data[data.rindex(b")") + 2 :].split()
        if fields[0] in (b"Z", b"X"):
            return None
        return int(fields[19])  # field 22 of proc(5): fields[n - 3]
    except (ValueError, IndexError):
        return None


def signal_word(signo: int) -> str:
    try:
        return signal.Signals(signo).name
    except ValueError:
        return f"signal {signo}"


def describe_returncode(returncode: int) -> str:
    """``Popen.returncode`` in words: ``exit code 3`` or ``signal SIGKILL`` (a negative
    returncode is the signal that ended the child, subprocess's convention)."""
    if returncode < 0:
        return "signal " + signal_word(-returncode)
    return f"exit code {returncode}"


def describe_wait_status(status: int) -> str:
    """A ``waitpid`` status in words, as :func:`describe_returncode`."""
    if os.WIFSIGNALED(status):
        return "signal " + signal_word(os.WTERMSIG(status))
    if os.WIFEXITED(status):
        return f"exit code {os.WEXITSTATUS(status)}"
    return f"wait status {status}"


@dataclass(frozen=True)
class Life:
    """One process as it was first seen: its PID and its start time."""

    pid: int
    started: int

    @classmethod
    def observe(cls, pid: int, proc: str = procfs.PROC) -> Optional[Life]:
        """The running process ``pid``, or None when none runs under that number."""
        t = start_ticks(pid, proc)
        return None if t is None else cls(pid, t)

    def ended(self, proc: str = procfs.PROC) -> Optional[str]:
        """None while this very process runs; :data:`GONE` once no process has its PID
        (or it is a zombie), :data:`REUSED` once another process holds the PID."""
        t = start_ticks(self.pid, proc)
        if t is None:
            return GONE
        return None if t == self.started else REUSED

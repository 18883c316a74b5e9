"""Room for every connection a run will open, made before the run's clock starts.

Two costs of opening many sockets fall on the loop at the worst moment, the
ramp, unless they are paid first:

* The kernel grows a process's file table by doubling, and in a process with
  more than one thread it waits for an RCU grace period each time
  (``expand_fdtable`` in the kernel's ``fs/file.c``). Measured on this host: one
  ``socket()`` call in the closed loop's ramp took 11-14 ms at the 256th stream
  while the loop read nothing, and that single wait set the run's
  handling-delay p99 at 256 streams. Opening one descriptor at the highest
  number the run needs, and closing it, grows the table once, before the run;
  the table never shrinks.
* The soft ``RLIMIT_NOFILE`` is often 1024, below what 1024 streams need. It is
  raised towards the hard limit (as load generators such as wrk and locust do);
  past the hard limit, requests fail with the kernel's "Too many open files",
  recorded per request as a ``client`` error.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource

#: Descriptors besides the run's sockets: the interpreter, pytest, collectors, logs.
HEADROOM = 64


def reserve(connections: int) -> int:
    """Make the file table hold ``connections`` more sockets; the highest fd it now holds.

    Returns the descriptor number the table was grown to (0 when nothing was done).
    """
    want = _open_fds() + connections + HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
    top = want if soft == resource.RLIM_INFINITY else min(want, soft) - 1
    if top <= 2:
        return 0
    try:
        src = os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return 0
    try:
        fd = fcntl.fcntl(src, fcntl.F_DUPFD, top)  # the lowest free number >= top
        os.close(fd)
    except OSError:
        return 0
    finally:
        os.close(src)
    return fd


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0

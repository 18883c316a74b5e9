"""A block's own CPU cost, for the tests that bound one.

Why not ``time.thread_time()`` around the block: the cyclic garbage collector runs inside
whichever allocation crosses its threshold, and late in a whole ``pytest tests/`` session it
walks every object the session still holds. CI once charged 1.18 s of CPU to a trace read of
five bytes that took milliseconds when Hypothesis replayed it (``test_trace_properties``);
nothing in the read costs that, and one full collection does: timed with ``gc.callbacks``
in each worker of the fast lane (``pytest tests/ -m "not integration" -n 2``), the longest
took 1.08 s of CPU over 765,000 live objects. That cost is the session's, not the
reader's. The collector is held off over the block and switched back on, if it was on,
when the block ends; its pass then comes at the next allocation past its threshold,
outside the block.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def own_cpu() -> Iterator[Callable[[], float]]:
    """This thread's CPU seconds over the block, without the collector's passes; the
    yielded function reads them (after the block, the block's whole cost)."""
    was_on = gc.isenabled()
    gc.disable()
    t0 = time.thread_time()
    end: list[float] = []

    def spent() -> float:
        return (end[0] if end else time.thread_time()) - t0

    try:
        yield spent
    finally:
        end.append(time.thread_time())
        if was_on:
            gc.enable()

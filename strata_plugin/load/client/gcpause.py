"""Keep the garbage collector's full passes out of the loop's measurements.

CPython's cyclic collector stops every thread while it walks the generation it
collects, and the oldest generation holds everything a run keeps: its records,
one ``TokenEvent`` per token, and in a pytest session every earlier case's
results. One full pass in the middle of a closed loop at 256 streams paused the
loop for 29.5 ms (timed with ``gc.callbacks`` around
``benchmarks/closed_loop_clients.run_loop``), and that pause alone made the
run's handling-delay p99 27 ms instead of 2 ms; a full pass over a million
objects took 100 ms on this host.

So while a loop has requests in flight, every object that has lived to one of
its ticks is moved to the permanent generation (``gc.freeze``: constant time,
under 10 us with a million objects): a collection then walks only what was made
since the last tick, and the young generations are still collected as usual.
When the last busy loop of the process goes idle, the objects are handed back
(``gc.unfreeze``) and the next full pass, between measurements, frees any cycle
among them. Nothing piles up meanwhile: the client makes no cyclic garbage per
request (``tests/test_client_gc.py`` holds it to that).

Process-wide, like the collector: loops in one process share one count. A
caller's own ``gc.freeze`` is undone when the last loop goes idle.
"""

from __future__ import annotations

import gc

from strata_plugin.process_globals import STATE  # gc_busy_loops: loops with requests in flight


def hold() -> None:
    """A loop has requests in flight: freeze everything alive now."""
    with STATE.gc_lock:
        STATE.gc_busy_loops += 1
        gc.freeze()


def tick() -> None:
    """A busy loop's periodic tick: freeze what has lived since the last one."""
    gc.freeze()


def release() -> None:
    """A loop went idle; the last one hands every frozen object back to the collector."""
    with STATE.gc_lock:
        STATE.gc_busy_loops -= 1
        if STATE.gc_busy_loops == 0:
            gc.unfreeze()


def busy_loops() -> int:
    return STATE.gc_busy_loops

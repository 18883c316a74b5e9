"""What the loop does about the garbage collector and the file table, on real runs.

A loopback emitter in its own process streams to ``run_load``. The loop keeps
the collector's full passes off while requests are in flight (``gcpause``), which
is safe only if the client makes no cyclic garbage per request, so that nothing
piles up while the passes are off: that is held here by counting what a full
collection finds after runs of 4 and of 40 requests. And ``fdtable.reserve``
grows the kernel's file table before a run (``FDSize`` in /proc/self/status).
"""

from __future__ import annotations

import gc
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from strata_plugin.load.client import RequestSpec, Timeouts, fdtable, gcpause
from strata_plugin.load.generator import Job, LoadParams, run_load
from strata_plugin.testing.emitter import EmitterProcess, emitter_process


@pytest.fixture(scope="module")
def emitter() -> Iterator[EmitterProcess]:
    with emitter_process() as em:
        yield em


def _run(em: EmitterProcess, n: int, on_token_mark=None) -> None:
    extra = (("emit_interval_s", 0.001),)
    jobs = [Job(RequestSpec(f"g{i}", "gc", "measured", 5, prompt="x", extra_body=extra))
            for i in range(n)]
    res = run_load(jobs, LoadParams(base_url=em.url, api="chat", concurrency=4,
                                    timeouts=Timeouts(connect_s=10, read_s=20),
                                    on_token_mark=on_token_mark))
    assert all(r.ok for r in res.records)


def _cyclic_garbage_after(em: EmitterProcess, n: int) -> int:
    gc.collect()
    gc.disable()
    try:
        _run(em, n)
        return gc.collect()  # objects found only through cycles
    finally:
        gc.enable()


def test_the_client_makes_no_cyclic_garbage_per_request(emitter: EmitterProcess) -> None:
    _run(emitter, 2)  # imports and first-use caches are not the run's
    few = _cyclic_garbage_after(emitter, 4)
    many = _cyclic_garbage_after(emitter, 40)
    # 36 more requests (each an Attempt, a prepared request, a parser, records...)
    # may not leave even one more object to the collector.
    assert many - few < 36, (few, many)


def test_full_passes_are_held_off_only_while_requests_are_in_flight(
        emitter: EmitterProcess) -> None:
    frozen: list[int] = []
    assert gcpause.busy_loops() == 0
    # called from the loop thread as each stream's first token arrives
    _run(emitter, 12, on_token_mark=lambda rid, t: frozen.append(gc.get_freeze_count()))
    assert len(frozen) == 12
    assert min(frozen) > 0  # everything that lived to then was out of the collector's reach
    # handed back once the loop went idle (its next lag-probe tick, 20 ms later)
    for _ in range(50):
        if not gc.get_freeze_count():
            break
        time.sleep(0.01)
    assert gc.get_freeze_count() == 0
    assert gcpause.busy_loops() == 0


def _fdsize() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("FDSize:"):
                return int(line.split()[1])
    raise AssertionError("no FDSize")


def test_reserve_grows_the_file_table_before_the_run() -> None:
    before = _fdsize()
    want = before * 2 + 100  # past the next doubling
    top = fdtable.reserve(want)
    assert top >= want
    assert _fdsize() > top
    assert _fdsize() >= before * 2


def test_reserve_raises_a_low_soft_limit_towards_the_hard_one() -> None:
    """In a child with soft RLIMIT_NOFILE 256: 1000 connections need it raised."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2000:
        pytest.skip(f"the hard file limit here is {hard}")
    code = (
        "import resource\n"
        "from strata_plugin.load.client import fdtable\n"
        "h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, h))\n"
        "top = fdtable.reserve(1000)\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], top)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    new_soft, top = (int(x) for x in out.stdout.split())
    assert new_soft >= 1000 + fdtable.HEADROOM
    assert 1000 <= top < new_soft

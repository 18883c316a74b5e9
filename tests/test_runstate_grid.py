"""The run-state grid stretches with the server's thread count (issue 30, item 5).

The collector's cost is per thread and sample (benchmarks/test_agent_cost.py, "at scale":
docs/agent.md), so above ``ADAPT_ABOVE_THREADS`` threads its interval is ``THREAD_SLOT_S``
a thread, up to ``MAX_ADAPTED_S``. These tests hold the rule at its edges and
show it on a real process and through the agent process, with the gauge that says the
grid in use.
"""

from __future__ import annotations

import csv
import itertools
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata_plugin.agent.collectors.runstate import (
    ADAPT_ABOVE_THREADS,
    MAX_ADAPTED_S,
    THREAD_SLOT_S,
    RunstateCollector,
)
from strata_plugin.agent.handle import AgentHandle, agent_argv
from strata_plugin.agent.targets import ProcessTargets

#: A process of N threads in all, every one but the main thread asleep.
IDLE = (
    "import sys, threading, time\n"
    "for _ in range(int(sys.argv[1]) - 1):\n"
    "    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    "print('up', flush=True)\n"
    "time.sleep(3600)\n"
)


@pytest.fixture
def threads_proc():
    started: list[subprocess.Popen] = []

    def start(n: int) -> int:
        p = subprocess.Popen([sys.executable, "-c", IDLE, str(n)], stdout=subprocess.PIPE,
                             text=True)
        started.append(p)
        assert p.stdout is not None and p.stdout.readline() == "up\n"
        return p.pid

    yield start
    for p in started:
        p.kill()
        p.wait(10)


def _collector(pid: int = 1, **kw) -> RunstateCollector:
    targets = ProcessTargets(pids=[pid], rescan_s=0.0)
    targets.probe()
    return RunstateCollector(targets, **kw)


def test_the_grid_is_fixed_up_to_the_threshold_and_per_thread_above_it():
    c = _collector(interval_s=0.02)
    assert (ADAPT_ABOVE_THREADS, THREAD_SLOT_S, MAX_ADAPTED_S) == (16, 0.002, 0.5)
    assert c.grid_for(15) == 0.02  # the local llama-server keeps its 20 ms grid
    assert c.grid_for(16) == 0.02
    assert c.grid_for(17) == pytest.approx(0.034)  # just past: 2 ms a thread
    assert c.grid_for(100) == pytest.approx(0.2)
    assert c.grid_for(249) == pytest.approx(0.498)
    assert c.grid_for(250) == MAX_ADAPTED_S
    assert c.grid_for(5000) == MAX_ADAPTED_S  # capped: never coarser than the main grid
    # a coarse asked grid is never made finer, and 0 keeps the grid fixed
    assert _collector(interval_s=0.8).grid_for(1000) == 0.8
    assert _collector(interval_s=0.02, adapt_above=0).grid_for(5000) == 0.02
    with pytest.raises(ValueError, match="adapt_above"):
        _collector(adapt_above=-1)


def test_a_sample_of_a_many_threaded_process_sets_and_states_the_grid(threads_proc):
    pid = threads_proc(40)
    c = _collector(pid, interval_s=0.02)
    emits = c.sample_now()
    got = {m: v for _w, dev, m, v, _k in emits if dev == ""}
    assert got["threads"] == 40
    assert c.grid_s == pytest.approx(0.08) and got["interval_s"] == pytest.approx(0.08)
    fixed = _collector(pid, interval_s=0.02, adapt_above=0)
    got = {m: v for _w, dev, m, v, _k in fixed.sample_now() if dev == ""}
    assert got["interval_s"] == 0.02 and fixed.grid_s == 0.02
    c.close()
    fixed.close()


@pytest.mark.parametrize(("adapt", "want_ms"), (("16", 60.0), ("0", 20.0)))
def test_the_agent_samples_a_30_thread_server_on_the_stretched_grid(tmp_path: Path,
                                                                     threads_proc, adapt: str,
                                                                     want_ms: float):
    """30 threads above 16: 2 ms x 30 = 60 ms between samples; fixed: 20 ms."""
    pid = threads_proc(30)
    argv = agent_argv("n1", 0.5, pids=[pid], collectors=["runstate"],
                      extra=["--runstate-interval", "0.02", "--runstate-adapt-above", adapt])
    h = AgentHandle.start("n1", tmp_path, argv)
    try:
        assert h.hello["collectors"]["runstate"] == {"status": "ok"}
        time.sleep(2.0)
    finally:
        info = h.stop()
    assert info.expected, info
    with open(tmp_path / "samples" / "runstate.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    t = sorted(int(r["wall_ns"]) for r in rows if r["metric"] == "run_s")
    gaps = sorted(b - a for a, b in itertools.pairwise(t))
    assert len(t) > 1.5e3 / want_ms / 2, len(t)
    assert abs(gaps[len(gaps) // 2] / 1e6 - want_ms) < 3, gaps[len(gaps) // 2]
    grid = {float(r["value"]) for r in rows if r["metric"] == "interval_s"}
    assert grid == {want_ms / 1e3}, grid

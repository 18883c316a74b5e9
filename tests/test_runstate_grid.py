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
    _NS_PER_TICK,
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


def test_close_ends_the_sampling_thread_in_the_middle_of_its_wait(threads_proc):
    """close() ends the sampling thread in the middle of its wait for the next grid
    point: on a grid of a minute it ends at close(), not when the minute is up."""
    c = _collector(threads_proc(3), interval_s=60.0)
    c.probe()
    deadline = time.monotonic() + 30
    while c.samples < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert c.samples == 1  # the first sample, then the wait for the next grid point
    thread = c._thread
    assert thread is not None and thread.is_alive()
    c.close()
    thread.join(30)  # half the grid: only close() can have ended the wait
    assert not thread.is_alive()
    assert c.samples == 1
    c.close()  # a second close() is harmless


@pytest.mark.integration  # waits out real seconds (>= 2 s on a quiet host)
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


# --- hot mode: the busy threads on the fine grid, every thread on the stretched one ------

#: N threads: two busy ones that sleep 1 ms between short bursts (an engine's loop), the
#: rest pollers that wake once a second; on a line on stdin one poller starts spinning.
POLLERS = (
    "import os, sys, threading, time\n"
    "n = int(sys.argv[1])\n"
    "go = threading.Event()\n"
    "def poll():\n"
    "    while True:\n"
    "        time.sleep(1.0)\n"
    "def busy():\n"
    "    while True:\n"
    "        t = time.thread_time() + 0.002\n"
    "        while time.thread_time() < t:\n"
    "            pass\n"
    "        time.sleep(0.001)\n"
    "late_tid = []\n"
    "def late():\n"
    "    late_tid.append(threading.get_native_id())\n"
    "    go.wait()\n"
    "    while True:\n"
    "        pass\n"
    "for _ in range(n - 4):\n"
    "    threading.Thread(target=poll, daemon=True).start()\n"
    "for _ in range(2):\n"
    "    threading.Thread(target=busy, daemon=True).start()\n"
    "threading.Thread(target=late, daemon=True).start()\n"
    "while not late_tid:\n"
    "    time.sleep(0.001)\n"
    "print('up', late_tid[0], flush=True)\n"
    "sys.stdin.readline()\n"
    "go.set()\n"
    "time.sleep(3600)\n"
)


@pytest.fixture
def pollers():
    started: list[subprocess.Popen] = []

    def start(n: int) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", POLLERS, str(n)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        started.append(p)
        assert p.stdout is not None
        up, late_tid = p.stdout.readline().split()
        assert up == "up"
        p.late_tid = int(late_tid)  # the thread that spins on the line
        return p

    yield start
    for p in started:
        p.kill()
        p.wait(10)


def _thread_run_ns(pid: int, tid: int) -> int:
    return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])


def _all_stopped(pid: int) -> bool:
    """Every thread of ``pid`` reads T (stopped) in its stat."""
    for tid in Path(f"/proc/{pid}/task").iterdir():
        st = (tid / "stat").read_text()
        if st[st.rfind(")") + 2] != "T":
            return False
    return True


#: Tries of a check against the collector's own schedule: a try decides only when its
#: samples all came before the full read the schedule had due (a host paused past it
#: cannot tell a promotion from the schedule); one try that decides is enough.
TRIES = 5


def _settle(c: RunstateCollector) -> tuple[int, int]:
    """Sample until the hot set settled and every thread was just read; the schedule's
    next full read (monotonic ns) and the last one's."""
    _grid(c, 0.6)  # two full reads: the hot set is what ran between them
    last_full = c._last_full
    while c._last_full == last_full:  # from just after a full read: the whole grid ahead
        c.sample_now()
        time.sleep(c.grid_s)
    return c._next_full, c._last_full


def _kernel_run_s(pid: int) -> float:
    total = 0
    for tid in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((tid / "schedstat").read_text().split()[0])
        except (OSError, IndexError):
            continue
    return total / 1e9


def _grid(c: RunstateCollector, seconds: float) -> list[dict[str, float]]:
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out.append({m: v for _w, d, m, v, _k in c.sample_now() if d == ""})
        time.sleep(c.grid_s)
    return out


def test_hot_mode_keeps_the_busy_threads_on_the_fine_grid(pollers):
    """500 threads, two of them busy: hot mode samples on the 20 ms grid (the stretched
    one would be 0.5 s), reads every thread on the 0.5 s grid, and its run time is the
    kernel's sum over all the threads (the pollers' too, as last read)."""
    p = pollers(500)
    c = _collector(p.pid, hot=True)
    assert c.grid_for(500) == MAX_ADAPTED_S
    grid = _grid(c, 1.5)
    before = _kernel_run_s(p.pid)  # every thread's, each no more than at the sample
    grid.append({m: v for _w, d, m, v, _k in c.sample_now() if d == ""})
    after = _kernel_run_s(p.pid)
    assert grid[-1]["threads"] == 500
    assert c.grid_s == 0.02 and all(g["interval_s"] == 0.02 for g in grid[5:]), grid[-1]
    # the last sample holds every thread as last read: the busy ones now, the pollers at
    # the last full read; behind the kernel by at most what calls for a full read (two
    # of the process stat's 10 ms ticks) and a tick of its resolution
    assert before - 0.04 <= grid[-1]["run_s"] <= after, (before, grid[-1]["run_s"], after)
    c.close()


def test_hot_mode_reads_every_thread_when_one_outside_the_hot_ones_runs(pollers):
    """A poller that starts spinning: the process's CPU (its stat) outgrows the hot
    threads', so every thread is read at the next sample, before the 0.5 s grid has a
    full read due, and the spinner is followed from then on: the tree's run time keeps
    up with the kernel's."""
    for _ in range(TRIES):
        p = pollers(500)
        c = _collector(p.pid, hot=True)
        due, last_full = _settle(c)
        assert p.stdin is not None
        ran0 = _thread_run_ns(p.pid, p.late_tid)
        p.stdin.write("go\n")
        p.stdin.flush()
        # the spinner ran well past the promotion's bound (stat ticks rounding both ways)
        deadline = time.monotonic() + 10
        while _thread_run_ns(p.pid, p.late_tid) - ran0 < 6 * _NS_PER_TICK:
            assert time.monotonic() < deadline, "the spinner never ran"
            time.sleep(0.005)
        c.sample_now()  # sees the process's CPU outgrow the hot threads'
        c.sample_now()  # must read every thread
        decided = time.monotonic_ns() < due
        if decided:
            # both samples before the scheduled full read: a full read was a promotion
            assert c._last_full > last_full, "no full read before the 0.5 s grid's"
            before = _kernel_run_s(p.pid)
            last = {m: v for _w, d, m, v, _k in c.sample_now() if d == ""}
            after = _kernel_run_s(p.pid)
            assert before - 0.04 <= last["run_s"] <= after, (before, last["run_s"], after)
        c.close()
        p.kill()
        p.wait(10)
        if decided:
            return
    pytest.fail(f"no try of {TRIES} sampled before the scheduled full read (host paused)")


def test_hot_mode_sees_a_stopped_tree_at_once(pollers):
    """SIGSTOP: the hot threads read T, so every thread is read at the next sample: the
    whole tree reads T before the 0.5 s grid has a full read due."""
    import os
    import signal

    p = pollers(500)
    c = _collector(p.pid, hot=True)
    for _ in range(TRIES):
        due, last_full = _settle(c)
        os.kill(p.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 10
            while not _all_stopped(p.pid):
                assert time.monotonic() < deadline, "the tree never stopped"
                time.sleep(0.002)
            c.sample_now()  # the hot threads read T
            last = {m: v for _w, d, m, v, _k in c.sample_now() if d == ""}  # every thread
            decided = time.monotonic_ns() < due
        finally:
            os.kill(p.pid, signal.SIGCONT)
        if decided:
            # both samples before the scheduled full read: a full read was a promotion
            assert c._last_full > last_full, "no full read before the 0.5 s grid's"
            assert last["state_T"] == last["threads"] == 500, last
            break
    else:
        pytest.fail(f"no try of {TRIES} sampled before the scheduled full read (host paused)")
    c.close()

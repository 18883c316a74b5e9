"""The run-state collector on real processes: states, scheduler time, the freezer, quota.

Each test makes the state it checks real (a busy thread, a SIGSTOP, a v1/v2 freezer
cgroup, a CFS quota) and reads it back through the collector the agent runs, then
through the agent process itself at its 20 ms grid. The cgroup ones need root and skip
with the reason elsewhere.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata_plugin.agent.cgroups import freezer_files, is_frozen
from strata_plugin.agent.collectors.runstate import RunstateCollector
from strata_plugin.agent.handle import AgentHandle, agent_argv
from strata_plugin.agent.targets import ProcessTargets
from strata_plugin.testing import faults, pauses

#: A process with ``busy`` spinning threads (the main one among them when busy > 0) and
#: ``idle`` sleeping ones; with a third argument it forks a child like itself first.
TREE = (
    "import os, sys, threading, time\n"
    "busy, idle = int(sys.argv[1]), int(sys.argv[2])\n"
    "if len(sys.argv) > 3 and os.fork() == 0:\n"
    "    time.sleep(3600)\n"
    "def spin():\n"
    "    x = 0\n"
    "    while True:\n"
    "        x += 1\n"
    "for _ in range(idle):\n"
    "    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    "for _ in range(max(0, busy - 1)):\n"
    "    threading.Thread(target=spin, daemon=True).start()\n"
    "print('up', flush=True)\n"
    "spin() if busy else time.sleep(3600)\n"
)


def _start(busy: int, idle: int, child: bool = False) -> subprocess.Popen:
    argv = [sys.executable, "-c", TREE, str(busy), str(idle)] + (["child"] if child else [])
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "up\n"
    return p


def _kill(p: subprocess.Popen) -> None:
    from strata_plugin.agent.procfs import process_tree

    for pid in reversed(process_tree(p.pid)):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    p.wait(10)


def _collector(pid: int, **kw) -> RunstateCollector:
    """A collector whose sampling thread is not started: the test calls ``sample_now``."""
    targets = ProcessTargets(pids=[pid], rescan_s=0.0)
    targets.probe()
    return RunstateCollector(targets, **kw)


def _state(pid: int, tid: int | str | None = None) -> str:
    """The state letter of a process's main thread, or of its thread ``tid``."""
    data = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text()
    return data[data.rfind(")") + 2]


def values(emits) -> dict[str, float]:
    return {m: v for _w, dev, m, v, _k in emits if dev == ""}


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        _kill(p)


def test_states_threads_and_run_time_of_a_tree(procs):
    """One spinning thread and five sleeping ones, plus a forked child: every thread of
    the tree is counted, by state, and the run time grows by about the busy thread's."""
    p = _start(busy=1, idle=5, child=True)
    procs.append(p)
    c = _collector(p.pid)
    time.sleep(0.2)
    c.targets.refresh(force=True)  # the child
    ta0 = time.monotonic()
    a = values(c.sample_now())
    ta1 = time.monotonic()
    time.sleep(0.5)
    tb0 = time.monotonic()
    b = values(c.sample_now())
    tb1 = time.monotonic()
    assert b["threads"] == 7, b  # 6 in the parent, 1 in the child
    assert b["state_R"] >= 1 and b["state_S"] >= 5, b
    assert b["state_R"] + b["state_S"] + b["state_D"] + b["state_T"] + b["state_other"] == 7
    # the spinning thread is always on a CPU or waiting for one: run + wait is its wall
    # time, however loaded the host (the sleeping threads add next to nothing). Where in
    # its call each read fell is unknown: at least the time between the calls passed
    # between the two reads, at most the time from the first's start to the second's end
    busy = (b["run_s"] - a["run_s"]) + (b["wait_s"] - a["wait_s"])
    assert 0.85 * (tb0 - ta1) < busy < 1.1 * (tb1 - ta0) + 0.02, (ta0, ta1, tb0, tb1, a, b)
    assert b["run_s"] > a["run_s"]
    assert b["ctx_voluntary"] >= a["ctx_voluntary"]
    assert b["ctx_involuntary"] >= a["ctx_involuntary"]
    c.close()


def test_a_stopped_tree_reads_as_state_t_and_does_not_run(procs):
    p = _start(busy=1, idle=2)
    procs.append(p)
    c = _collector(p.pid)
    os.kill(p.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10  # every thread stopped (SIGSTOP reaches each)
        while not all(_state(p.pid, t) == "T" for t in os.listdir(f"/proc/{p.pid}/task")):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        a = values(c.sample_now())
        time.sleep(0.3)
        b = values(c.sample_now())
    finally:
        os.kill(p.pid, signal.SIGCONT)
    assert b["state_T"] == b["threads"] == 3, b
    assert b["run_s"] - a["run_s"] < 0.005, (a, b)  # not a tick of CPU while stopped
    t0 = time.monotonic()
    time.sleep(0.2)
    dt = time.monotonic() - t0  # continued at t0 at the latest; read after this at least
    d = values(c.sample_now())
    # running (or runnable) again: its run + wait time grows by its wall time
    assert d["state_T"] == 0, d
    assert (d["run_s"] - b["run_s"]) + (d["wait_s"] - b["wait_s"]) > 0.7 * dt, (b, d)
    c.close()


def test_exited_threads_stay_in_the_counters(procs):
    """Three threads each use 0.1 s of CPU, are read while they live, then exit, and the
    main thread then uses 0.05 s more: the tree's run time never steps back, and it grows
    by the main thread's 0.05 s on top of what was read of the threads (the tree's
    counters never step back, so a lost thread would show only once the tree runs on).
    A thread's run after the collector's last read of it cannot be kept (it is gone
    before the next read), so the threads wait, spun, until the test has read them."""
    code = ("import sys, threading, time\n"
            "spun = threading.Barrier(4)\n"
            "go = threading.Event()\n"
            "def spin():\n"
            "    while time.thread_time() < 0.1:\n"
            "        pass\n"
            "    spun.wait()\n"
            "    go.wait()\n"
            "ts = [threading.Thread(target=spin) for _ in range(3)]\n"
            "[t.start() for t in ts]\n"
            "spun.wait()\n"
            "print('spun', flush=True)\n"
            "sys.stdin.readline()\n"
            "go.set()\n"
            "[t.join() for t in ts]\n"
            "sys.stdin.readline()\n"
            "t0 = time.thread_time()\n"
            "while time.thread_time() < t0 + 0.05:\n"
            "    pass\n"
            "print('ran', flush=True)\n"
            "time.sleep(3600)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    procs.append(p)
    assert p.stdout is not None and p.stdin is not None
    assert p.stdout.readline() == "spun\n"
    c = _collector(p.pid)
    seen = [values(c.sample_now())]
    alive = seen[0]
    assert alive["threads"] == 4 and alive["run_s"] >= 0.3, alive
    p.stdin.write("go\n")
    p.stdin.flush()
    deadline = time.monotonic() + 20
    while seen[-1]["threads"] > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
        seen.append(values(c.sample_now()))
    assert seen[-1]["threads"] == 1, seen[-1]
    p.stdin.write("on\n")
    p.stdin.flush()
    assert p.stdout.readline() == "ran\n"
    # asleep: the kernel books a thread's run time when it leaves the CPU, so read then
    while _state(p.pid) != "S" and time.monotonic() < deadline:
        time.sleep(0.005)
    seen.append(values(c.sample_now()))
    runs = [s["run_s"] for s in seen]
    assert runs == sorted(runs), runs
    assert runs[-1] >= alive["run_s"] + 0.05, runs  # the exited threads' run time is kept
    c.close()


def test_freezer_files_and_states(tmp_path):
    """The layouts: a v1 freezer root (no state file: never frozen), a v1 child, a v2
    child; and the states that count as frozen."""
    (tmp_path / "freezer" / "g").mkdir(parents=True)
    (tmp_path / "freezer" / "g" / "freezer.state").write_text("THAWED\n")
    root = freezer_files(b"6:freezer:/\n0::/\n", str(tmp_path))
    assert root.available and root.v1_state == "" and root.v2_events == ""
    child = freezer_files(b"6:freezer:/g\n", str(tmp_path))
    assert child.v1_state == str(tmp_path / "freezer" / "g" / "freezer.state")
    none = freezer_files(b"4:memory:/x\n", str(tmp_path))
    assert not none.available
    (tmp_path / "v2" / "a").mkdir(parents=True)
    for f in ("cgroup.controllers",):
        (tmp_path / "v2" / f).write_text("")
    (tmp_path / "v2" / "a" / "cgroup.freeze").write_text("0\n")
    (tmp_path / "v2" / "a" / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    v2 = freezer_files(b"0::/a\n", str(tmp_path / "v2"))
    assert v2.available and v2.v2_freeze.endswith("a/cgroup.freeze")
    assert is_frozen(b"FROZEN\n", None, None) and is_frozen(b"FREEZING\n", None, None)
    assert not is_frozen(b"THAWED\n", None, None)
    assert is_frozen(None, b"populated 1\nfrozen 1\n", b"0\n")
    assert is_frozen(None, b"populated 1\nfrozen 0\n", b"1\n")  # freezing
    assert not is_frozen(None, b"populated 1\nfrozen 0\n", b"0\n")


def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("moving a process between cgroups needs root here")


def test_frozen_follows_the_server_into_a_freezer_and_out(procs):
    """The collector follows the process into a freezer cgroup made for it (as the fault
    suite's FreezerPause does), reads ``frozen`` 1 while FROZEN and 0 after, and the run
    time stops meanwhile; then the process is moved back and the cgroup removed."""
    _needs_root()
    try:
        root, version = pauses.freezer_root()
    except faults.FaultUnavailable as exc:
        pytest.skip(str(exc))
    p = _start(busy=1, idle=1)
    procs.append(p)
    home = pauses.home_cgroup(p.pid, root, version)
    d = home / f"strata-freeze-test-{os.getpid()}"
    d.mkdir()
    try:
        pauses._move([p.pid], d)
        c = _collector(p.pid, cgroup_rescan_s=0.0)
        assert values(c.sample_now())["frozen"] == 0
        pauses._set_frozen(d, version, True)
        for _ in range(200):
            if pauses.read_state(d, version) == "FROZEN":
                break
            time.sleep(0.005)
        a = values(c.sample_now())
        time.sleep(0.3)
        b = values(c.sample_now())
        assert a["frozen"] == b["frozen"] == 1, b
        assert b["run_s"] - a["run_s"] < 0.005, (a, b)
        assert b["state_R"] == 0, b  # frozen tasks are never runnable
        pauses._set_frozen(d, version, False)
        t0 = time.monotonic()
        time.sleep(0.2)
        dt = time.monotonic() - t0  # thawed by t0; read after this at least
        e = values(c.sample_now())
        # thawed: on a CPU or waiting for one again, the whole time
        assert e["frozen"] == 0, e
        assert (e["run_s"] - b["run_s"]) + (e["wait_s"] - b["wait_s"]) > 0.7 * dt, (b, e)
        c.close()
    finally:
        pauses.undo_freezer(d, home, version)
    assert not d.exists()


def test_throttled_s_only_where_a_quota_exists(procs):
    _needs_root()
    p = _start(busy=1, idle=0)
    procs.append(p)
    c = _collector(p.pid, cgroup_rescan_s=0.0)
    first = values(c.sample_now())
    c.sample(0)  # the main thread hands the queued reasons on
    reasons, *_ = c.drain()
    assert "throttled_s" not in first
    assert "no CPU quota" in reasons["throttled_s"]
    try:
        quota = faults.ServerCpuQuota(p.pid, quota_cores=0.2).start()
    except faults.FaultUnavailable as exc:
        pytest.skip(str(exc))
    try:
        t_a = time.monotonic()
        a = values(c.sample_now())
        time.sleep(1.0)
        t_b = time.monotonic()
        b = values(c.sample_now())
        between = time.monotonic() - t_a  # the two reads were inside this
    finally:
        facts = quota.stop().as_dict()
    since_b = time.monotonic() - t_b
    # 0.2 of a core for a spinning thread: throttled in most periods
    assert b["throttled_s"] - a["throttled_s"] > 0.1, (a, b, facts)
    # and the counter is the group's own: what the injector read from its cpu.stat as it
    # stopped, less only what the group was throttled for after the sample: at most that
    # wall time on each CPU's runqueue. (CI once read the two 79 ms apart, which a fixed
    # 50 ms tolerance refused: the stop came that much later on a loaded host.)
    # (one spinning thread: a runqueue at a time, on the CPUs it may use)
    slack = since_b * len(os.sched_getaffinity(p.pid)) + 0.002  # cpu.stat: rounded to ms
    assert -0.002 <= facts["throttled_s"] - b["throttled_s"] <= slack, (b, facts, since_b)
    # and it ran no more than its quota of that time, with 0.1 s of slack (a period's
    # 0.02 s quota at each end, and some)
    assert b["run_s"] - a["run_s"] < 0.2 * between + 0.1, (a, b, between)
    c.close()


@pytest.mark.integration  # waits out real seconds (>= 2 s on a quiet host)
def test_the_agent_samples_runstate_on_its_own_grid(tmp_path, procs):
    """The agent process at --interval 0.5 and --runstate-interval 0.02: every point of a
    20 ms grid is a runstate sample in the file or counted as an overrun (a sampler woken
    too late skips the points it missed and says so), about 50 a second."""
    p = _start(busy=0, idle=3)
    procs.append(p)
    argv = agent_argv("n1", 0.5, pids=[p.pid], collectors=["runstate"],
                      extra=["--runstate-interval", "0.02"])
    h = AgentHandle.start("n1", tmp_path, argv)
    try:
        assert h.hello["collectors"]["runstate"] == {"status": "ok"}
        time.sleep(2.0)
    finally:
        info = h.stop()
    assert info.expected, info
    with open(tmp_path / "samples" / "runstate.csv", newline="") as fh:
        every = list(csv.DictReader(fh))
    rows = [r for r in every if r["metric"] == "run_s"]
    t = sorted(int(r["wall_ns"]) for r in rows)
    over = [float(r["value"]) for r in sorted(
        (r for r in every if r["metric"] == "overruns"), key=lambda r: int(r["wall_ns"]))]
    span = (t[-1] - t[0]) / 1e9
    points = len(t) - 1 + (over[-1] - over[0])
    assert span > 1.5 and 45 < points / span <= 51, (len(t), over[-1] - over[0], span)
    gaps = sorted(b - a for a, b in itertools.pairwise(t))
    assert abs(gaps[len(gaps) // 2] / 1e6 - 20) < 3, gaps[len(gaps) // 2]
    assert {r["kind"] for r in rows} == {"counter"}


def test_a_runstate_interval_under_the_floor_is_refused():
    with pytest.raises(ValueError, match=r">= 0\.005"):
        RunstateCollector(ProcessTargets(pids=[os.getpid()]), interval_s=0.001)


def test_the_agent_command_adds_runstate_where_the_server_runs(tmp_path):
    from types import SimpleNamespace

    from strata_plugin.run.agents import ALLOWANCE, CONNS, PATH, RUNSTATE, local_argv

    t = SimpleNamespace(interval_s=0.5, pid_pattern="", log_patterns={},
                        collectors=("proc", "cpu"))
    head = local_argv(t, "head", 1234, None, None)
    worker = local_argv(t, "w1", None, None, None)
    assert head[head.index("--collectors") + 1] == \
        f"proc,cpu,{RUNSTATE},{PATH},{ALLOWANCE},{CONNS}"
    assert worker[worker.index("--collectors") + 1] == "proc,cpu"


def test_switch_counts_match_the_kernels_while_idle_threads_are_skipped(procs):
    """One thread sleeping 10 ms in a loop, four asleep for good: the voluntary switches
    the collector sums (reading a thread's switch counts only when its schedstat moved)
    are the kernel's /proc/.../status sums, and they grow by the loop's sleeps."""
    code = ("import threading, time\n"
            "for _ in range(4):\n"
            "    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
            "print('up', flush=True)\n"
            "while True:\n"
            "    time.sleep(0.01)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    procs.append(p)
    assert p.stdout is not None and p.stdout.readline() == "up\n"
    c = _collector(p.pid)
    a = values(c.sample_now())
    time.sleep(0.5)
    b = values(c.sample_now())
    from strata_plugin.agent.procfs import parse_ctx_switches

    direct = sum(parse_ctx_switches(Path(f"/proc/{p.pid}/task/{t}/status").read_bytes())[0]
                 for t in os.listdir(f"/proc/{p.pid}/task"))
    assert b["ctx_voluntary"] - a["ctx_voluntary"] >= 20, (a, b)  # ~50 sleeps in 0.5 s
    assert b["ctx_voluntary"] <= direct <= b["ctx_voluntary"] + 3, (b, direct)
    c.close()


# --- preemption seen: a thread kept from its CPU reads as waiting while it waits ---------
#
# Neighbours on the victim's CPU (tests/cpu_neighbours.py). Parameters: the tuning arm is
# the reproduction (a SCHED_FIFO loop 150 ms of every 500 ms, priority 5), the
# one the collector was built and checked against; the set-aside arms (80 of 250 at
# priority 1, 240 of 600 at priority 10) were run only once it was done, unchanged after.
RT_ARMS = {
    "tuning-150of500-p5": (150, 500, 5),
    "set_aside-80of250-p1": (80, 250, 1),
    "set_aside-240of600-p10": (240, 600, 10),
}


def _pin_elsewhere(cpu: int) -> set[int]:
    """Keep this (sampling) thread off ``cpu``; returns the mask to put back."""
    was = os.sched_getaffinity(0)
    os.sched_setaffinity(0, was - {cpu})
    return was


def _sample_grid(c: RunstateCollector, seconds: float, neighbour: int
                 ) -> list[tuple[float, float, dict[str, float], int]]:
    """The collector sampled every ~20 ms for ``seconds``: (monotonic before the sample,
    after it, its values, the neighbour's run ns as the kernel counts it, read after)."""
    from cpu_neighbours import schedstat

    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        v = values(c.sample_now())
        t1 = time.monotonic()
        out.append((t0, t1, v, schedstat(neighbour)[0]))
        time.sleep(0.02)
    return out


def _booked_after(pid: int, timeout_s: float = 5.0) -> float:
    """The kernel's run-queue wait of ``pid``'s main thread once it has been back on a
    CPU since this call: every wait before the call is booked by then (the kernel books
    a wait when the thread reaches a CPU)."""
    from cpu_neighbours import schedstat

    slices = schedstat(pid)[2]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _run, wait, now = schedstat(pid)
        if now > slices:
            return wait / 1e9
        time.sleep(0.005)
    raise AssertionError(f"pid {pid} did not reach a CPU in {timeout_s} s")


def _no_lumps(grid) -> list[tuple[int, float, float]]:
    """Intervals whose queued_s grew by more than a wait booked at its end could leave
    uncounted: the part of the interval in which the thread last ran before it (the wait
    began there, and is counted from the next sample on) and the part of this one (from
    the last sample to the thread's return). (index, growth, room). From the second
    interval in which the thread ran on: a wait in progress when sampling began is as
    long as it was."""
    ran = [i for i in range(1, len(grid)) if grid[i][2]["run_s"] > grid[i - 1][2]["run_s"]]
    bad = []
    for i in range(ran[0] + 1 if ran else len(grid), len(grid)):
        j = max(k for k in ran if k < i)
        grew = grid[i][2]["queued_s"] - grid[i - 1][2]["queued_s"]
        room = (grid[i][1] - grid[i - 1][0]) + (grid[j][1] - grid[j - 1][0])
        if grew > room + 0.002:
            bad.append((i, grew, room))
    return bad


@pytest.mark.integration  # waits out real seconds (>= 2 s on a quiet host)
@pytest.mark.root
@pytest.mark.parametrize("arm", list(RT_ARMS))
def test_a_thread_preempted_by_a_real_time_task_reads_as_waiting_while_it_waits(procs, arm):
    """A busy thread and a SCHED_FIFO loop on the same CPU. In every interval the
    real-time task held wholly (its own run time, the kernel's counter, grew by most of
    the interval, and in the interval before too), the grid says the thread was waiting
    (state_R_wait, and queued_s grew by most of the interval), although the kernel's own
    run-queue wait (wait_s) books nothing until the thread is back on its CPU. Over the
    whole span queued_s is the kernel's wait, no more: at least the real-time task's run
    time (the thread waited whenever it ran) and at most the wait the kernel books."""
    import cpu_neighbours as nb

    why = nb.can_run_real_time()
    if why:
        pytest.skip(why)
    on_ms, period_ms, prio = RT_ARMS[arm]
    cpu = max(os.sched_getaffinity(0))
    victim = _start(busy=1, idle=0)  # one thread: the tree's wait is the kernel's for it
    procs.append(victim)
    os.sched_setaffinity(victim.pid, {cpu})
    c = _collector(victim.pid)
    was = _pin_elsewhere(cpu)
    rt = nb.rt_bursts(cpu, on_ms, period_ms, max_s=10.0, priority=prio)
    try:
        grid = _sample_grid(c, max(2.2, 4.5 * period_ms / 1000), rt.pid)
        rt_run_end = nb.schedstat(rt.pid)[0]
        nb.stop(rt)
        last = values(c.sample_now())
        booked_later = _booked_after(victim.pid)
    finally:
        nb.stop(rt)
        os.sched_setaffinity(0, was)
    c.close()
    held = []
    for i in range(2, len(grid)):
        dt = grid[i][0] - grid[i - 1][1]  # at least this passed between the two reads
        wide = grid[i][1] - grid[i - 1][0]  # at most this
        rt_i = (grid[i][3] - grid[i - 1][3]) / 1e9
        rt_before = (grid[i - 1][3] - grid[i - 2][3]) / 1e9
        if rt_i >= 0.75 * wide and rt_before >= 0.75 * (grid[i - 1][1] - grid[i - 2][0]):
            v, u = grid[i][2], grid[i - 1][2]
            held.append((i, v["queued_s"] - u["queued_s"], dt, v["state_R_wait"],
                         v["wait_s"] - u["wait_s"]))
    bursts = (grid[-1][0] - grid[0][0]) / (period_ms / 1000)
    assert len(held) >= bursts, (len(held), bursts)  # the arm held the CPU as asked
    assert all(q >= 0.5 * dt and w == 1 for _i, q, dt, w, _b in held), held
    assert not _no_lumps(grid), _no_lumps(grid)
    first = grid[0][2]
    queued = last["queued_s"] - first["queued_s"]
    rt_run = (rt_run_end - grid[0][3]) / 1e9
    assert queued >= 0.95 * rt_run - 0.01, (queued, rt_run)
    assert last["queued_s"] >= last["wait_s"], last
    assert queued <= booked_later - first["wait_s"] + 0.002, (queued, booked_later, first)
    for _t0, _t1, v, _n in grid:
        assert v["state_R_run"] + v["state_R_wait"] == v["state_R"], v


@pytest.mark.root
def test_a_thread_sharing_its_cpu_with_a_nice_0_neighbour_waits_its_share(procs):
    """A busy thread and a nice-0 busy loop on one CPU (the kernel shares it between
    them): the thread's queued_s grows by at least the neighbour's run time there (it
    waited whenever the neighbour ran), at most by the wait the kernel books, and with no
    lumps; in R, every sample splits it into running or waiting."""
    import cpu_neighbours as nb

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two CPUs: the neighbours' and the sampler's")
    cpu = max(os.sched_getaffinity(0))
    victim = _start(busy=1, idle=0)
    procs.append(victim)
    os.sched_setaffinity(victim.pid, {cpu})
    c = _collector(victim.pid)
    was = _pin_elsewhere(cpu)
    other = nb.spinner(cpu, max_s=10.0, nice=0)
    try:
        grid = _sample_grid(c, 1.5, other.pid)
        other_end = nb.schedstat(other.pid)[0]
        nb.stop(other)
        last = values(c.sample_now())
        booked_later = _booked_after(victim.pid)
    finally:
        nb.stop(other)
        os.sched_setaffinity(0, was)
    c.close()
    first = grid[0][2]
    queued = last["queued_s"] - first["queued_s"]
    other_run = (other_end - grid[0][3]) / 1e9
    assert other_run > 0.02, other_run  # the neighbour had its share (a loaded host's)
    assert queued >= 0.95 * other_run - 0.01, (queued, other_run)
    assert queued <= booked_later - first["wait_s"] + 0.002, (queued, booked_later, first)
    assert not _no_lumps(grid), _no_lumps(grid)
    waiting = sum(v["state_R_wait"] for _a, _b, v, _n in grid)
    assert all(v["state_R_run"] + v["state_R_wait"] == v["state_R"] == 1
               for _a, _b, v, _n in grid)
    assert 0 < waiting < len(grid), waiting

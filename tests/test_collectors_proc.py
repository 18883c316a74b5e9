"""The server-process collector against real processes on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata_plugin.agent import procfs
from strata_plugin.agent.collectors.base import Unavailable
from strata_plugin.agent.collectors.proc import ProcCollector
from strata_plugin.agent.targets import ProcessTargets

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
BUSY = "import time\nt=time.time()\nwhile time.time()-t<30: pass\n"
ALLOC = (
    "import sys,time\nsys.stdin.readline()\nb=bytearray(200<<20)\n"
    "for i in range(0,len(b),4096): b[i]=1\nprint('done',flush=True)\ntime.sleep(30)\n"
)


def wait_cmdline(pid: int, text: str, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in (procfs.cmdline(pid) or ""):
            return True
        time.sleep(0.01)
    return False


def by_key(emits):
    return {(dev, metric): value for _, dev, metric, value, _ in emits}


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []

    def start(*argv: str, **kw) -> subprocess.Popen:
        p = subprocess.Popen(list(argv), **kw)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()


def collector(**kw) -> ProcCollector:
    c = ProcCollector(ProcessTargets(**kw, rescan_s=0.2))
    c.probe()
    return c


def _proc_cpu_s(pid: int) -> float:
    """The process's utime + stime (its stat, the kernel's sum over its threads)."""
    data = Path(f"/proc/{pid}/stat").read_bytes()
    f = data[data.rfind(b")") + 2 :].split()
    return (int(f[11]) + int(f[12])) / TICKS_PER_S


def _timed_sample(c: ProcCollector, pid: int) -> tuple[list, float, float, float, float]:
    """One sample, with the monotonic clock and the process's CPU read on both sides."""
    cpu0, t0 = _proc_cpu_s(pid), time.monotonic()
    emits = c.sample(time.time_ns())
    t1, cpu1 = time.monotonic(), _proc_cpu_s(pid)
    return emits, t0, t1, cpu0, cpu1


def test_busy_process_cpu_and_top_thread(procs) -> None:
    p = procs(sys.executable, "-c", BUSY)
    c = collector(pids=[p.pid])
    cpu = lambda d: d[("", "cpu_user_s")] + d[("", "cpu_system_s")]  # noqa: E731
    emits, *stamps = _timed_sample(c, p.pid)
    first = second = by_key(emits)
    # wait for CPU time, not wall time: this host may be shared and loaded
    deadline = time.monotonic() + 10
    while True:
        time.sleep(0.3)
        prev, prev_stamps = second, stamps
        emits, *stamps = _timed_sample(c, p.pid)
        second = by_key(emits)
        if cpu(second) - cpu(first) >= 0.3 or time.monotonic() > deadline:
            break
    assert cpu(second) - cpu(first) >= 0.3
    # The one spinning thread carries the process's CPU over the collector's last
    # interval (prev to second): its share of a core times that interval (no longer than
    # from before prev to after second) is the process's CPU in it, short by at most
    # what the process ran while prev was read (its stat is read before its thread's)
    # and the stat's rounding (utime and stime truncated to a tick each).
    p_t0, _, p_cpu0, p_cpu1 = prev_stamps
    _, s_t1, _, _ = stamps
    top = second[("", "top_thread_cpu_frac")]
    carried = top * (s_t1 - p_t0)
    assert carried >= cpu(second) - cpu(prev) - (p_cpu1 - p_cpu0) - 2 / TICKS_PER_S, (
        top, s_t1 - p_t0, cpu(second) - cpu(prev), p_cpu1 - p_cpu0)
    assert second[("", "top_thread_tid")] == p.pid
    assert (f"tid{p.pid}", "cpu_frac") in second
    assert second[(f"pid{p.pid}", "num_threads")] >= 1
    assert second[("", "nprocs")] == 1
    kinds = {metric: kind for _, _, metric, _, kind in emits}
    assert kinds["cpu_user_s"] == "counter" and kinds["rss_bytes"] == "gauge"
    _, info, _, _ = c.drain()
    assert any(i.get("device") == f"pid{p.pid}" and "python" in i["comm"] for i in info)
    c.close()


def test_rss_of_a_200mb_allocation(procs) -> None:
    p = procs(sys.executable, "-c", ALLOC, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    c = collector(pids=[p.pid])
    before = by_key(c.sample(time.time_ns()))[(f"pid{p.pid}", "rss_bytes")]
    p.stdin.write("go\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "done"
    after = by_key(c.sample(time.time_ns()))
    assert after[(f"pid{p.pid}", "rss_bytes")] - before >= 150 << 20
    assert after[("", "minor_faults")] > 40_000  # 200 MiB of 4 KiB pages touched
    c.close()


def test_tree_includes_children_and_sums_stay_monotonic(procs) -> None:
    # The parent starts a busy child, and kills it when told to on stdin.
    code = (
        "import subprocess,sys,time\n"
        f"c=subprocess.Popen([sys.executable,'-c',{BUSY!r}])\n"
        "print(c.pid, flush=True); sys.stdin.readline(); c.kill(); c.wait()\n"
        "print('killed', flush=True); time.sleep(30)\n"
    )
    parent = procs(
        sys.executable, "-c", code, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    child = int(parent.stdout.readline())
    c = collector(pids=[parent.pid])
    last_cpu = 0.0

    def step() -> dict:
        nonlocal last_cpu
        d = by_key(c.sample(time.time_ns()))
        cpu = d.get(("", "cpu_user_s"), 0) + d.get(("", "cpu_system_s"), 0)
        assert cpu >= last_cpu - 1e-9, "tree sum went backwards"
        last_cpu = cpu
        time.sleep(0.1)
        return d

    deadline = time.monotonic() + 30  # CPU time, not wall time, decides: the host may be busy
    d = step()
    while d.get((f"pid{child}", "cpu_user_s"), 0) < 0.3 and time.monotonic() < deadline:
        d = step()
    assert d[("", "nprocs")] == 2
    child_cpu = d[(f"pid{child}", "cpu_user_s")]
    assert child_cpu >= 0.3
    parent.stdin.write("kill\n")
    parent.stdin.flush()
    assert parent.stdout.readline() == "killed\n"
    while d.get(("", "nprocs")) != 1 and time.monotonic() < deadline:
        d = step()
    for _ in range(3):
        d = step()
    assert d[("", "nprocs")] == 1
    assert last_cpu >= child_cpu  # the exited child's CPU is still in the sum
    c.close()


def test_pattern_finds_the_server_not_the_agent(procs) -> None:
    marker = "strata-fake-server-91c2"
    p = procs(sys.executable, "-c", "import time; time.sleep(30)", marker)
    # Popen returns while execve may still be filling in the new command line
    assert wait_cmdline(p.pid, marker)
    c = collector(pattern=marker)
    assert c.targets.roots == (p.pid,)
    assert (f"pid{p.pid}", "rss_bytes") in by_key(c.sample(time.time_ns()))
    c.close()


def test_pattern_with_no_match_waits_and_emits_nothing_fake() -> None:
    c = collector(pattern="no-such-process-5b1e")
    assert c.sample(time.time_ns()) == []
    _, info, _, _ = c.drain()
    assert info and info[0]["kind"] == "waiting"


def test_unconfigured_and_dead_targets_are_unavailable() -> None:
    with pytest.raises(Unavailable, match="no server process given"):
        ProcCollector(ProcessTargets()).probe()
    dead = subprocess.Popen(["true"])
    dead.wait()
    with pytest.raises(Unavailable, match="no such process"):
        ProcCollector(ProcessTargets(pids=[dead.pid])).probe()


def test_container_targets_through_docker_top(procs, monkeypatch) -> None:
    p = procs("sleep", "30")
    calls = []

    def runner(argv, timeout):
        calls.append(argv)
        return 0, f"PID\n{p.pid}\n", ""

    monkeypatch.setattr("strata_plugin.agent.targets.shutil.which", lambda name: "/usr/bin/docker")
    t = ProcessTargets(container="llm", runner=runner)
    c = ProcCollector(t)
    c.probe()
    assert calls[0] == ["docker", "top", "llm", "-eo", "pid"]
    assert t.roots == (p.pid,)
    _, _, commands, _ = c.drain()
    assert commands == [("docker_top", ["docker", "top", "llm", "-eo", "pid"])]


def test_container_probe_failure_has_the_reason(monkeypatch) -> None:
    monkeypatch.setattr("strata_plugin.agent.targets.shutil.which", lambda name: "/usr/bin/docker")
    t = ProcessTargets(container="llm", runner=lambda a, t: (1, "", "Cannot connect to the daemon"))
    with pytest.raises(Unavailable, match="Cannot connect to the daemon"):
        ProcCollector(t).probe()
    monkeypatch.setattr("strata_plugin.agent.targets.shutil.which", lambda name: None)
    with pytest.raises(Unavailable, match="docker not found"):
        ProcCollector(ProcessTargets(container="llm")).probe()

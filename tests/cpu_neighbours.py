"""Real neighbours on a CPU, for the tests that check what the agent sees of them.

Each is a process of its own, started from an argv list, that says ``up`` once it is set
up (pinned, its policy set) and ends itself after ``max_s`` whatever happens to the test
(a killed test run leaves no busy loop behind, and never a real-time one):

* :func:`spinner` - a busy loop pinned to one CPU (a server's busy thread, a victim);
* :func:`rt_bursts` - a SCHED_FIFO busy loop pinned to one CPU, on for ``on_ms`` of every
  ``period_ms`` and asleep the rest (a real-time task that preempts whatever runs there;
  the kernel's ``sched_rt_runtime_us`` keeps 5% of each second for the others anyway);
* :func:`fork_storm` - a parent that starts ``/bin/true`` (or another program) every
  ``every_ms`` and reaps it (a shell loop calling tools, a build), counting what it
  started;
* :func:`duty` - a loop that uses ``cpu_ms`` of CPU time every ``period_ms`` (a process
  of a known, small appetite).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_SPIN = (
    "import os, sys, time\n"
    "cpu, nice, max_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])\n"
    "os.sched_setaffinity(0, {cpu})\n"
    "os.nice(nice)\n"
    "end = time.monotonic() + max_s\n"
    "print('up', flush=True)\n"
    "while time.monotonic() < end:\n"
    "    pass\n"
)

_RT = (
    "import os, sys, time\n"
    "cpu, prio, on, period, max_s = (int(sys.argv[1]), int(sys.argv[2]),\n"
    "    float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))\n"
    "os.sched_setaffinity(0, {cpu})\n"
    "os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))\n"
    "end = time.monotonic() + max_s\n"
    "print('up', flush=True)\n"
    "while True:\n"
    "    t = time.monotonic()\n"
    "    if t >= end:\n"
    "        break\n"
    "    phase = t % period\n"
    "    if phase < on:\n"
    "        stop = min(t - phase + on, end)\n"
    "        while time.monotonic() < stop:\n"
    "            pass\n"
    "    else:\n"
    "        time.sleep(period - phase)\n"
)

_STORM = (
    "import os, subprocess, sys, time\n"
    "every, max_s, out = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]\n"
    "child = sys.argv[4:]\n"
    "end = time.monotonic() + max_s\n"
    "n = 0\n"
    "print('up', flush=True)\n"
    "while time.monotonic() < end:\n"
    "    subprocess.run(child, check=False)\n"
    "    n += 1\n"
    "    with open(out + '.tmp', 'w') as fh:\n"
    "        fh.write(str(n))\n"
    "    os.replace(out + '.tmp', out)\n"
    "    time.sleep(every)\n"
)


def _start(code: str, *args: object) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code, *map(str, args)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    if line != "up\n":
        p.kill()
        p.wait(10)
        raise RuntimeError(f"the neighbour did not start: {line!r}, exit {p.poll()}")
    return p


_DUTY = (
    "import sys, time\n"
    "cpu, period, max_s = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])\n"
    "end = time.monotonic() + max_s\n"
    "print('up', flush=True)\n"
    "while time.monotonic() < end:\n"
    "    t = time.thread_time() + cpu\n"
    "    while time.thread_time() < t:\n"
    "        pass\n"
    "    time.sleep(period)\n"
)


def duty(cpu_ms: float, period_ms: float, max_s: float) -> subprocess.Popen:
    """A loop that uses ``cpu_ms`` of CPU time, then sleeps ``period_ms``, for ``max_s``."""
    return _start(_DUTY, cpu_ms / 1000.0, period_ms / 1000.0, max_s)


def spinner(cpu: int, max_s: float, nice: int = 0) -> subprocess.Popen:
    """A busy loop on ``cpu`` at ``nice``, for ``max_s`` at most."""
    return _start(_SPIN, cpu, nice, max_s)


def rt_bursts(cpu: int, on_ms: float, period_ms: float, max_s: float,
              priority: int = 5) -> subprocess.Popen:
    """A SCHED_FIFO loop at ``priority`` on ``cpu``: busy ``on_ms`` of every ``period_ms``
    (needs CAP_SYS_NICE, root here), for ``max_s`` at most."""
    if not 1 <= priority <= 10:
        raise ValueError("a test's real-time neighbour runs at priority 1 to 10")
    return _start(_RT, cpu, priority, on_ms / 1000.0, period_ms / 1000.0, max_s)


def fork_storm(every_ms: float, max_s: float, count_file: Path,
               child: tuple[str, ...] = ("/bin/true",)) -> subprocess.Popen:
    """A parent that runs ``child`` (an argv) every ``every_ms`` for ``max_s``, waiting
    for each; the number it started so far is in ``count_file``."""
    return _start(_STORM, every_ms / 1000.0, max_s, count_file, *child)


def started(count_file: Path) -> int:
    """How many children a :func:`fork_storm` started so far."""
    try:
        return int(count_file.read_text() or 0)
    except (OSError, ValueError):
        return 0


def schedstat(pid: int, tid: int | None = None) -> tuple[int, int, int]:
    """The kernel's (run ns, run-queue wait ns, timeslices) of one thread."""
    a, b, c = Path(f"/proc/{pid}/task/{tid or pid}/schedstat").read_text().split()[:3]
    return int(a), int(b), int(c)


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(10)
    if p.stdout is not None:
        p.stdout.close()


def can_run_real_time() -> str | None:
    """Why a SCHED_FIFO neighbour cannot run here, or None."""
    if os.geteuid() != 0:
        return "a SCHED_FIFO neighbour needs root (CAP_SYS_NICE) here"
    if len(os.sched_getaffinity(0)) < 2:
        return "two CPUs: the neighbours' and the sampler's"
    try:
        rt = int(Path("/proc/sys/kernel/sched_rt_runtime_us").read_text())
    except (OSError, ValueError):
        rt = -1
    if rt == 0:
        return "sched_rt_runtime_us is 0: no real-time task may run"
    probe = subprocess.run(
        [sys.executable, "-c", "import os; os.sched_setscheduler(0, os.SCHED_FIFO, "
                               "os.sched_param(1))"], capture_output=True, text=True,
        check=False)
    if probe.returncode != 0:  # a cgroup without real-time runtime, a seccomp profile
        return "SCHED_FIFO refused here: " + (probe.stderr.strip().splitlines() or ["?"])[-1]
    return None

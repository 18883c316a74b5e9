"""Who did the other work: short-lived processes named by the parent that reaped them.

A neighbour that starts a process every 30 ms (a shell loop calling tools, a build) has
no process that lives through two ticks of the ``allowance`` collector; its parent does,
and the kernel adds each reaped child's CPU to the parent's cutime + cstime. Each test
starts the processes it checks (tests/cpu_neighbours.py) and holds what the collector
says against the kernel's own counters read in the same test. The rest of this shared
host is left out of the ranking (``exclude``), so the processes compete only with each
other for the places.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import cpu_neighbours as nb
import pytest

from strata_plugin.agent.collectors.allowance import AllowanceCollector
from strata_plugin.agent.collectors.cpu import CpuCollector
from strata_plugin.agent.targets import ProcessTargets


def _cpu(pid: int) -> tuple[float, float]:
    """The kernel's (utime + stime, cutime + cstime) of ``pid``, in seconds."""
    data = Path(f"/proc/{pid}/stat").read_bytes()
    f = data[data.rfind(b")") + 2 :].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(f[11]) + int(f[12])) / tick, (int(f[13]) + int(f[14])) / tick


def _ppid(pid: int) -> int:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0
    return int(data[data.rfind(b")") + 2 :].split()[1])


def _rest(*keep: int) -> set[int]:
    """Every process on the host but ``keep`` and their children: the rest of this
    shared host, left out of the ranking (read again before each sample, as processes
    come and go)."""
    return {int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) not in keep
            and _ppid(int(n)) not in keep}


def _sample(c: AllowanceCollector, *keep: int) -> list:
    c.exclude = _rest(*keep)
    return c.sample(time.time_ns())


def _series(emits, pid: int, metric: str) -> list[float]:
    return [v for _w, dev, m, v, _k in sorted(emits) if m == metric
            and dev.startswith(f"pid{pid} ")]


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        nb.stop(p)


@pytest.fixture
def server(procs):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    procs.append(p)
    return p


@pytest.mark.integration  # 3.1 s of real waiting on the quiet VM
def test_a_fork_storm_is_named_by_its_parent_with_its_childrens_cpu(server, procs, tmp_path):
    """A parent that starts a short Python every 60 ms, and a loop using 3 ms of CPU every
    50 ms: the loop uses more CPU than the parent does itself, less than the parent and
    its children (the kernel's counters, read in the test, say so). With one place in
    the list the parent is named (in most samples: a child reaped just past a sample's
    edge can hand one interval to the loop; ranked without its children, the parent is
    never named), and its children_cpu_s grows by what the kernel added to its cutime +
    cstime; the host's process starts (cpu ``forks``) grow by at least the children it
    started."""
    storm = nb.fork_storm(60, 30.0, tmp_path / "started",
                          child=(sys.executable, "-S", "-c", "pass"))
    procs.append(storm)
    loop = nb.duty(3, 50, 30.0)
    procs.append(loop)
    c = AllowanceCollector(ProcessTargets(pids=[server.pid]), top=1, own=(os.getpid(),))
    c.probe()
    host = CpuCollector(per_core=False)
    host.probe()
    emits = []
    try:
        f0 = {m: v for _w, _d, m, v, _k in host.sample(time.time_ns())}["forks"]
        n0 = nb.started(tmp_path / "started")
        k0, l0 = _cpu(storm.pid), _cpu(loop.pid)
        per_sample, edges = [], []  # each sample's emits; the kernel's children either side
        for i in range(7):
            if i:
                time.sleep(0.5)
            before = _cpu(storm.pid)[1]
            per_sample.append(_sample(c, storm.pid, loop.pid))
            edges.append((before, _cpu(storm.pid)[1]))
        emits = [e for one in per_sample for e in one]
        k1, l1 = _cpu(storm.pid), _cpu(loop.pid)
        n1 = nb.started(tmp_path / "started")
        f1 = {m: v for _w, _d, m, v, _k in host.sample(time.time_ns())}["forks"]
    finally:
        c.close()
        host.close()
    own, children = k1[0] - k0[0], k1[1] - k0[1]
    loop_cpu = l1[0] - l0[0]
    assert own < loop_cpu < own + children, (own, children, loop_cpu)  # the premise
    named = [{dev.split(" ", 1)[0] for _w, dev, m, _v, _k in one if m == "cpu_s"}
             for one in per_sample]
    assert {n for one in named for n in one} <= {f"pid{storm.pid}", f"pid{loop.pid}"}, named
    assert sum(f"pid{storm.pid}" in one for one in named) >= 5, named
    kids = _series(emits, storm.pid, "children_cpu_s")
    assert kids == sorted(kids) and len(kids) >= 5, kids
    # what the kernel added from the collector's first reading (the first sample: the
    # counter starts there) to the last sample that named the parent: at most the outer
    # edges' difference, at least the inner edges' less a child or two reaped between a
    # reading and its edge
    last = max(i for i, one in enumerate(named) if f"pid{storm.pid}" in one)
    (b0, a0), (b1, a1) = edges[0], edges[last]
    assert b1 - a0 - 0.1 <= kids[-1] - kids[0] <= a1 - b0 + 1e-9, (kids, edges, last)
    assert kids[-1] - kids[0] > _series(emits, storm.pid, "cpu_s")[-1] - _series(
        emits, storm.pid, "cpu_s")[0], "its children's CPU is most of it"
    # (one child may have been started before the first reading of forks)
    assert n1 - n0 >= 10 and f1 - f0 >= n1 - n0 - 1, (n0, n1, f0, f1)


def test_a_named_child_reaped_by_a_named_parent_is_not_counted_twice(server, procs):
    """A parent whose child uses 0.6 s of CPU over several ticks, named under its own
    name, then ends and is reaped: the parent's children_cpu_s grows only by what was
    not counted under the child's name (its CPU before its first reading in the list and
    after its last), and the two together are what the kernel added to the parent's
    cutime + cstime."""
    code = ("import subprocess, sys, time\n"
            "print('up', flush=True)\n"
            "sys.stdin.readline()\n"
            "subprocess.run([sys.executable, '-S', '-c', 'import time\\n"
            "while time.process_time() < 0.6: pass'])\n"
            "print('reaped', flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    procs.append(parent)
    assert parent.stdout is not None and parent.stdout.readline() == "up\n"
    # every process left in counts (min_cores 0): the parent is named from the start
    c = AllowanceCollector(ProcessTargets(pids=[server.pid]), top=5, min_cores=0.0,
                           own=(os.getpid(),))
    c.probe()
    emits = []
    try:
        k0 = _cpu(parent.pid)[1]
        emits += _sample(c, parent.pid)
        assert parent.stdin is not None
        parent.stdin.write("go\n")
        parent.stdin.flush()
        deadline = time.monotonic() + 20
        with contextlib.suppress(OSError):
            os.set_blocking(parent.stdout.fileno(), False)
        done = False
        while time.monotonic() < deadline:
            time.sleep(0.15)
            emits += _sample(c, parent.pid)
            if done:
                break
            done = (parent.stdout.readline() or "") == "reaped\n"
        emits += _sample(c, parent.pid)
        k1 = _cpu(parent.pid)[1]
    finally:
        c.close()
    child = {dev.split(" ", 1)[0] for _w, dev, m, _v, _k in emits
             if m == "cpu_s" and "process_time" in dev}
    assert len(child) == 1, child  # the child, named while it ran
    cpid = int(next(iter(child))[3:])
    seen_child = _series(emits, cpid, "cpu_s")
    counted = seen_child[-1] - seen_child[0]
    # seen running (its CPU before the first reading and after the last is not in its own
    # series: a gap of the loop's each side, longer on a loaded host)
    assert len(seen_child) >= 2 and counted > 0, seen_child
    kids = _series(emits, parent.pid, "children_cpu_s")
    reaped = k1 - k0
    assert reaped >= 0.55, reaped  # 0.6 s, as the kernel's ticks count it
    # together the kernel's figure, not counted twice: the parent's share is what the
    # child's own series did not hold
    assert kids[-1] - kids[0] == pytest.approx(reaped - counted, abs=0.021), (
        kids, reaped, counted)


def test_the_series_declared_in_formats_are_the_ones_the_agent_writes(server, procs):
    """formats/telemetry.SAMPLE_METRICS (what the analysis may read) against what the
    collectors emit, by source, name, device and kind: a busy process named with its
    children's CPU, the server's run state, the host's process starts."""
    from strata_plugin.agent.collectors.runstate import RunstateCollector
    from strata_plugin.formats.telemetry import SAMPLE_METRICS

    hog = nb.duty(40, 10, 30.0)
    procs.append(hog)
    targets = ProcessTargets(pids=[server.pid], rescan_s=0.0)
    targets.probe()
    run = RunstateCollector(targets)
    allow = AllowanceCollector(ProcessTargets(pids=[server.pid]), top=1)
    allow.probe()
    host = CpuCollector(per_core=False)
    host.probe()
    try:
        emitted = {("runstate", d, m, k) for _w, d, m, _v, k in run.sample_now()}
        _sample(allow, hog.pid)
        time.sleep(0.3)
        emitted |= {("allowance", d, m, k) for _w, d, m, _v, k in _sample(allow, hog.pid)}
        emitted |= {("cpu", d, m, k) for _w, d, m, _v, k in host.sample(time.time_ns())}
    finally:
        run.close()
        allow.close()
        host.close()
    for row in SAMPLE_METRICS:
        device = f"pid{hog.pid} " if row.device == "pid<N> <command>" else row.device
        found = {k for s, d, m, k in emitted if s == row.source and m == row.metric
                 and (d.startswith(device) if device else d == "")}
        assert found == {row.kind}, (row, found)

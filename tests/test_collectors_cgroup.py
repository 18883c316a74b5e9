"""The server's own cgroup, read by the agent: a real CPU quota and memory limit made here.

The test makes a cgroup with a CFS quota (and, where the memory controller is there,
a memory limit), puts a busy process in it, and reads it the way the agent does for a
server (``pid:<N>`` and ``server``). On cgroup v1 (this project's VM has the cpu
controller on v1) and v2 alike; a layout the machine lacks is covered from files.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from strata_plugin.agent import cgroups
from strata_plugin.agent.collectors.cpu import CpuCollector
from strata_plugin.agent.collectors.mem import MemCollector
from strata_plugin.agent.targets import ProcessTargets
from strata_plugin.analysis.signals import HwView, cgroup_mem_free_frac, cgroup_throttled_frac
from strata_plugin.analysis.timeline import HwStat
from strata_plugin.testing.faults import FaultUnavailable, _cpu_cgroup_root

QUOTA_CORES = 0.05  # low enough to bind even when other work shares the 2 cores
MEM_LIMIT = 256 << 20


def _values(col, wall_ns: int) -> dict[str, float]:
    return {m: v for _, d, m, v, _ in col.sample(wall_ns) if d == ""}


@contextlib.contextmanager
def quota_cgroup():
    """A cgroup with a 0.05-core CFS quota (and a 256 MB memory limit on v1 when the memory
    controller is mounted), holding one busy process; removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    try:
        root, version = _cpu_cgroup_root()
    except FaultUnavailable as exc:
        pytest.skip(str(exc))
    name = f"strata-test-{os.getpid()}"
    made: list[Path] = []
    # A v1 memory cgroup is charged for the pages a task touches after it joins, not
    # before: the busy loop touches 8 MiB once the go file says it has been moved in.
    go = Path(tempfile.mkdtemp()) / "moved"
    busy = subprocess.Popen([sys.executable, "-c",
                             "import os\nheld = None\nwhile True:\n"
                             f"    if held is None and os.path.exists({str(go)!r}):\n"
                             "        held = b'x' * (8 << 20)\n"])
    try:
        d = root / name
        d.mkdir()
        made.append(d)
        if version == "v1":
            (d / "cpu.cfs_period_us").write_text("100000")
            (d / "cpu.cfs_quota_us").write_text(str(int(QUOTA_CORES * 100000)))
            mem = Path(cgroups.CGROUP_ROOT) / "memory"
            if (mem / "memory.limit_in_bytes").exists():
                md = mem / name
                md.mkdir()
                made.append(md)
                (md / "memory.limit_in_bytes").write_text(str(MEM_LIMIT))
        else:
            (d / "cpu.max").write_text(f"{int(QUOTA_CORES * 100000)} 100000")
            if (d / "memory.max").exists():
                (d / "memory.max").write_text(str(MEM_LIMIT))
        for m in made:
            (m / "cgroup.procs").write_text(str(busy.pid))
        go.touch()
        yield busy.pid, version, len(made) > 1 or version == "v2"
    finally:
        busy.send_signal(signal.SIGKILL)
        busy.wait()
        shutil.rmtree(go.parent, ignore_errors=True)
        for m in reversed(made):
            for _ in range(50):
                try:
                    m.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


@pytest.mark.integration  # waits out real seconds (>= 2 s on a quiet host)
@pytest.mark.root
def test_a_quota_cgroup_is_read_for_the_server_not_the_agent():
    with quota_cgroup() as (pid, _version, has_mem):
        for spec, targets in ((f"pid:{pid}", None), ("server", ProcessTargets(pids=[pid]))):
            col = CpuCollector(cgroup=spec, per_core=False, targets=targets)
            col.probe()
            assert "cgroup" not in col._unavailable, col._unavailable
            a = _values(col, 1)
            time.sleep(1.0)
            b = _values(col, 2)
            col.close()
            assert b["cgroup_quota_cores"] == pytest.approx(QUOTA_CORES)
            periods = b["cgroup_nr_periods"] - a["cgroup_nr_periods"]
            throttled = b["cgroup_nr_throttled"] - a["cgroup_nr_throttled"]
            # a busy loop under 5% of a core runs out of quota in nearly every period
            assert periods >= 5 and throttled / periods >= 0.5, (spec, periods, throttled)
            assert b["cgroup_throttled_s"] > a["cgroup_throttled_s"]
        # The agent's own cgroup (the old default) shows none of it.
        own = CpuCollector(cgroup="self", per_core=False)
        own.probe()
        assert "cgroup_quota_cores" not in _values(own, 3)
        own.close()
        if has_mem:
            mem = MemCollector(cgroup=f"pid:{pid}")
            mem.probe()
            v = _values(mem, 4)
            mem.close()
            assert v["cgroup_mem_limit_bytes"] == MEM_LIMIT
            assert 0 < v["cgroup_mem_usage_bytes"] < MEM_LIMIT
            assert "cgroup_mem_max_events" in v


def test_a_missing_server_says_why():
    col = CpuCollector(cgroup="server", per_core=False, targets=None)
    col.probe()
    assert "no server process found" in col._unavailable["cgroup"]
    col.close()


def test_v2_files_are_read_where_the_machine_has_no_v2_cpu_controller(tmp_path):
    # A v2 directory as the kernel writes it (admin-guide/cgroup-v2.rst).
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    (tmp_path / "cpu.stat").write_text(
        "usage_usec 5000000\nuser_usec 4000000\nsystem_usec 1000000\nnr_periods 40\n"
        "nr_throttled 30\nthrottled_usec 2500000\n")
    (tmp_path / "memory.max").write_text("1073741824\n")
    (tmp_path / "memory.current").write_text("1000000000\n")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 17\noom 1\noom_kill 1\n")
    dirs, _ = cgroups.resolve(str(tmp_path))
    assert dirs.v2 == str(tmp_path)
    assert cgroups.cpu_quota_cores(dirs) == 0.5
    assert cgroups.memory_values(dirs) == {
        "cgroup_mem_limit_bytes": (1073741824, "gauge"),
        "cgroup_mem_usage_bytes": (1000000000, "gauge"),
        "cgroup_mem_max_events": (17, "counter"),
        "cgroup_mem_oom_kills": (1, "counter"),
    }
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroups.cpu_quota_cores(dirs) is None
    assert "cgroup_mem_limit_bytes" not in cgroups.memory_values(dirs)


def _row(metric: str, rate: float | None, source: str = "cpu", device: str = "",
         **kw) -> HwStat:
    base = dict(window="w", node="n", source=source, device=device, metric=metric,
                kind="counter", n=10, coverage=1.0,
                delta=None if rate is None else rate * 10, rate=rate)
    base.update(kw)
    return HwStat(**base)


def test_throttled_fraction_is_of_periods_and_never_above_one():
    # 2 CPUs throttled at once for the whole window: 2 s of throttled time per second.
    rows = [_row("cgroup_nr_periods", 10.0), _row("cgroup_nr_throttled", 9.0),
            _row("cgroup_throttled_us", 2e6)]
    assert cgroup_throttled_frac(HwView(rows), "n") == pytest.approx(0.9)
    cores = [_row("busy_s", 1.0, device=f"cpu{i}") for i in range(2)]
    # no period counts (an old kernel): throttled time per core, capped
    only_time = [_row("cgroup_throttled_us", 5e6), *cores]
    assert cgroup_throttled_frac(HwView(only_time), "n") == 1.0


def test_a_cgroup_memory_limit_tighter_than_the_host_is_the_free_memory():
    gauge = dict(source="mem", kind="gauge", delta=None)
    rows = [
        _row("cgroup_mem_limit_bytes", None, mean=1000.0, min=1000.0, max=1000.0, **gauge),
        _row("cgroup_mem_usage_bytes", None, mean=900.0, min=850.0, max=960.0, **gauge),
    ]
    assert cgroup_mem_free_frac(HwView(rows), "n") == pytest.approx(0.04)
    assert cgroup_mem_free_frac(HwView(rows[1:]), "n") is None  # no limit


@pytest.mark.root
def test_the_agent_follows_a_server_moved_into_a_quota_cgroup_and_back():
    """A server put under a quota while the agent runs (the fault suite's cpu_limited
    arm, a container started around a running process) is read in its new cgroup, and
    in its old one again once it is moved back; the injector leaves no cgroup behind."""
    from strata_plugin.testing import faults

    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    col = CpuCollector(cgroup="server", per_core=False, targets=ProcessTargets(pids=[busy.pid]))
    inj = faults.ServerCpuQuota(busy.pid, quota_cores=QUOTA_CORES)
    try:
        col.probe()
        before = _values(col, 1)
        assert "cgroup_quota_cores" not in before  # no quota where it started
        try:
            inj.start()
        except faults.FaultUnavailable as exc:
            pytest.skip(str(exc))
        a = _values(col, 2)
        time.sleep(1.0)
        b = _values(col, 3)
        facts = inj.stop().as_dict()
        after = _values(col, 4)
    finally:
        inj.stop()
        col.close()
        busy.kill()
        busy.wait()
    assert a["cgroup_quota_cores"] == pytest.approx(QUOTA_CORES)
    periods = b["cgroup_nr_periods"] - a["cgroup_nr_periods"]
    throttled = b["cgroup_nr_throttled"] - a["cgroup_nr_throttled"]
    assert periods >= 5 and throttled / periods >= 0.5, (periods, throttled)
    assert facts["nr_throttled"] > 0 and facts["throttled_s"] > 0, facts
    assert facts["quota_cores"] == QUOTA_CORES, facts
    assert "cgroup_quota_cores" not in after  # back in its own cgroup, unlimited
    assert inj.dir is not None and not inj.dir.exists()


@pytest.mark.root
def test_a_server_at_its_cgroup_memory_limit_is_memory_pressure():
    """A process that allocates past its cgroup's memory limit (64 MB, no swap to spill
    into) is reclaimed at the limit and OOM-killed; the agent's counters see both, and
    the classifier names memory_pressure from them on a host with plenty free."""
    import dataclasses

    from strata_plugin.analysis.rules import classify
    from strata_plugin.analysis.signals import cgroup_mem_events
    from tests.test_attribution import CPU_CLEAN

    mem = Path(cgroups.CGROUP_ROOT) / "memory"
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    if not (mem / "memory.limit_in_bytes").exists():
        pytest.skip("no cgroup v1 memory controller here (v2 is covered from files above)")
    d = mem / f"strata-memtest-{os.getpid()}"
    d.mkdir()
    hog = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.readline(); "
         "b = [bytearray(8 << 20) for _ in range(32)]; print(len(b))"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        (d / "memory.limit_in_bytes").write_text(str(64 << 20))
        (d / "cgroup.procs").write_text(str(hog.pid))
        col = MemCollector(cgroup=f"pid:{hog.pid}")
        col.probe()
        a = _values(col, 1)
        hog.stdin.write(b"go\n")
        hog.stdin.flush()
        rc = hog.wait(30)
        b = _values(col, 2)
        col.close()
    finally:
        if hog.poll() is None:
            hog.kill()
            hog.wait()
        for _ in range(50):
            try:
                d.rmdir()
                break
            except OSError:
                time.sleep(0.05)
    assert rc == -signal.SIGKILL  # 256 MB asked under a 64 MB limit: the OOM killer
    assert b["cgroup_mem_oom_kills"] - a["cgroup_mem_oom_kills"] >= 1, (a, b)
    assert b["cgroup_mem_max_events"] > a["cgroup_mem_max_events"], (a, b)
    rows = [_row(m, (b[m] - a[m]) / 10, source="mem")  # as if over a 10 s window
            for m in ("cgroup_mem_max_events", "cgroup_mem_oom_kills")]
    events = cgroup_mem_events(HwView(rows), "n")
    assert events is not None and events >= 2
    v = classify(dataclasses.replace(CPU_CLEAN, cgroup_mem_events=events))
    assert v.classes == ("memory_pressure",), v
    assert any(e.threshold == "cgroup_mem_events" and e.met for e in v.evidence)

"""The fault injectors themselves: each makes its fault real, measures it, and cleans up
on every path (stop, a failed start, the harness killed, its own time limit).

Fast (a few seconds each); root is needed for the cgroup and process_madvise ones,
which skip with the reason elsewhere.
"""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from strata_plugin.load import own_quota
from strata_plugin.testing import faults
from tests.test_robustness_support import alive, wait_for

ROOT = Path(__file__).resolve().parents[1]


def _helpers() -> list[int]:
    """Live helper processes of this test process (python -m strata_plugin.testing.faults)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            mine = f"--parent\0{os.getpid()}\0".encode()
            if b"strata_plugin.testing.faults" in cmd and mine in cmd:
                if alive(int(entry)):
                    out.append(int(entry))
    return out


def test_cpu_hogs_are_pinned_measured_and_gone_after_stop():
    cores = tuple(sorted(os.sched_getaffinity(0)))
    hogs = faults.CpuHogs(cores[:1], per_core=2, max_s=30)
    with hogs:
        pids = [p.pid for _, p in hogs.procs]
        assert all(os.sched_getaffinity(p) == {cores[0]} for p in pids)
        main_nice = os.getpriority(os.PRIO_PROCESS, threading_native_id())
        assert main_nice == faults.SHIELD_NICE  # the harness stays ahead of its own hogs
        time.sleep(0.5)
    facts = hogs.stop().as_dict()
    assert facts["hogs"] == 2 and facts["hog_cpu_s"] > 0.2, facts
    assert not any(alive(p) for p in pids)
    assert os.getpriority(os.PRIO_PROCESS, threading_native_id()) == 0
    assert hogs.stop() is hogs.stop()  # idempotent, same facts


def threading_native_id() -> int:
    import threading

    return threading.get_native_id()


def test_helpers_end_on_their_own_time_limit():
    hogs = faults.CpuHogs((sorted(os.sched_getaffinity(0))[0],), per_core=1, max_s=1,
                          shield=False)
    hogs.start()
    pid = hogs.procs[0][1].pid
    wait_for(lambda: hogs.procs[0][1].poll() is not None, 10, what="the hog's own deadline")
    assert not alive(pid)
    hogs.stop()


def test_helpers_die_with_a_killed_harness(tmp_path):
    """The harness SIGKILLed mid-fault (no cleanup code runs): its helpers go too."""
    script = textwrap.dedent("""
        import os, sys, time
        from strata_plugin.testing import faults
        h = faults.CpuHogs((sorted(os.sched_getaffinity(0))[0],), per_core=2, max_s=120,
                           shield=False)
        h.start()
        print(" ".join(str(p.pid) for _, p in h.procs), flush=True)
        time.sleep(120)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.stdout is not None
    pids = [int(x) for x in p.stdout.readline().split()]
    assert len(pids) == 2 and all(alive(x) for x in pids)
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    wait_for(lambda: not any(alive(x) for x in pids), 10, what="helpers to die with the parent")


def test_memory_hog_allocates_holds_and_frees():
    total = faults.meminfo()["MemTotal"]
    hog = faults.MemoryHog(max_frac=256 * 2**20 / total, max_s=30)  # 256 MB, a small one
    with hog:
        assert hog.proc is not None
        rss = int(Path(f"/proc/{hog.proc.pid}/statm").read_text().split()[1]) * 4096
        assert hog.ready["allocated_bytes"] >= 200 * 2**20, hog.ready
        assert rss >= hog.ready["allocated_bytes"], rss  # touched, not just reserved
        score = Path(f"/proc/{hog.proc.pid}/oom_score_adj").read_text().strip()
        assert score == "1000"  # the OOM killer takes the hog first
    facts = hog.stop().as_dict()
    assert facts["allocated_bytes"] == hog.ready["allocated_bytes"]
    assert hog.proc.poll() is not None and not _helpers()


GIB = 2**30


@pytest.mark.parametrize(("total", "tol"), [
    (24 * GIB, int(24 * GIB * 0.05)),  # 5% of MemTotal: 1.2 GiB
    (4 * GIB, faults.MEM_HOG_CHUNK),  # a small host: one helper chunk (5% would be 205 MiB)
])
def test_the_hog_counts_as_injected_only_near_its_floor(total, tol):
    assert faults.mem_floor_tolerance(total) == tol
    floor, step = int(total * 0.06), 2**20
    figures = {"before": total // 2, "held": total // 2 - floor, "floor": floor, "total": total}
    assert faults.mem_floor_missed(available=floor + tol - step, **figures) == ""
    assert faults.mem_floor_missed(available=floor + tol, **figures) == ""
    why = faults.mem_floor_missed(available=floor + tol + step, **figures)
    assert "was not injected" in why
    for figure in (total // 2, total // 2 - floor, floor, total, floor + tol + step):
        assert faults._gib(figure) in why, why


def test_a_hog_stopped_before_its_floor_is_unavailable_not_injected():
    """The real helper, given no time to allocate (as a slow host or a cgroup limit would
    stop it): MemAvailable stays where it was, so the start fails with the figures, and
    the helper is gone."""
    hog = faults.MemoryHog(alloc_s=0.0, max_s=30)
    before = faults.meminfo()
    with pytest.raises(faults.FaultUnavailable, match="was not injected") as exc:
        hog.start()
    assert f"MemTotal {faults._gib(before['MemTotal'])}" in str(exc.value)
    assert hog.ready["allocated_bytes"] == 0
    assert hog.proc is not None and hog.proc.poll() is not None and not _helpers()


def _mapper(path: Path) -> subprocess.Popen:
    """A process that maps ``path`` shared and touches every page, like llama.cpp's mmap."""
    code = textwrap.dedent(f"""
        import mmap, sys, time
        f = open({str(path)!r}, "rb")
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        s = sum(m[i] for i in range(0, len(m), 4096))
        print("ready", flush=True)
        while True:
            s += sum(m[i] for i in range(0, len(m), 4096))
            time.sleep(0.05)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    return p


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(16 * 2**20))
    with path.open("rb+") as fh:
        os.fsync(fh.fileno())
    return path


@pytest.mark.root
def test_pageout_makes_the_mapping_fault_and_read_again(model_file):
    if os.geteuid() != 0:
        pytest.skip("process_madvise(MADV_PAGEOUT) on another process needs CAP_SYS_NICE")
    p = _mapper(model_file)
    try:
        from strata_plugin.agent.procfs import read_process_counters

        c0 = read_process_counters([p.pid])
        inj = faults.PageOut(p.pid, str(model_file), period_s=0.1, max_s=30)
        with inj:
            assert inj.ready["evicted_bytes"] > 8 * 2**20, inj.ready
            time.sleep(1.0)
        c1 = read_process_counters([p.pid])
        facts = inj.stop().as_dict()
        assert facts["calls"] >= 5 and facts["reloaded_bytes"] == 16 * 2**20, facts
        # Readahead makes each major fault read a large window: few faults, many bytes.
        assert c1.major_faults - c0.major_faults >= 1, (c0, c1)
        assert c1.read_bytes - c0.read_bytes > 16 * 2**20, (c0, c1)
        assert not _helpers()
    finally:
        p.kill()
        p.wait()


def test_pageout_refuses_shared_pages_and_leaves_nothing(model_file):
    a, b = _mapper(model_file), _mapper(model_file)
    try:
        inj = faults.PageOut(a.pid, str(model_file))
        with pytest.raises(faults.FaultUnavailable, match="also mapped by"):
            inj.start()
        assert not inj.active and not _helpers()
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_client_throttle_caps_this_process_and_undoes_itself():
    t = faults.ClientThrottle(quota=0.1)
    tid = threading.get_native_id()
    quota0 = own_quota.read(tid)
    try:
        t.start()
    except faults.FaultUnavailable as exc:
        pytest.skip(str(exc))
    watch = faults.GroundTruth(None, period_s=0.1).start()
    try:
        w0, c0 = time.monotonic(), time.process_time()
        x = 0
        while time.monotonic() - w0 < 1.0:
            x += 1
        share = (time.process_time() - c0) / (time.monotonic() - w0)
        m0, m1 = int(w0 * 1e9), time.monotonic_ns()
        # what the load generator's self-check reads for its loop thread
        seen = own_quota.over(quota0, own_quota.read(tid))
    finally:
        facts = t.stop().as_dict()
        watch.stop()
    assert share < 0.3, share
    assert seen is not None and quota0 is not None and seen.where != quota0.where
    assert seen.periods >= 8 and seen.frac > 0.5, seen  # ~10 periods of 100 ms, most throttled
    # the kernel saw the harness wait for a CPU most of the time (the ground truth the
    # fault suite uses for client_bound, apart from the load generator's self-check)
    assert watch.window(m0, m1)["harness_wait_per_s"] > 0.5, watch.window(m0, m1)
    assert facts["nr_throttled"] > 0 and facts["throttled_s"] > 0.3, facts
    assert t.dir is not None and not t.dir.exists()
    w0, c0 = time.monotonic(), time.process_time()
    while time.monotonic() - w0 < 0.5:
        x += 1
    assert (time.process_time() - c0) / (time.monotonic() - w0) > 0.5  # free again


def test_ground_truth_tells_own_load_from_foreign_load():
    hogs = faults.CpuHogs((sorted(os.sched_getaffinity(0))[0],), per_core=1, max_s=30,
                          shield=False)
    g = faults.GroundTruth(None, period_s=0.1).start()
    with hogs:
        time.sleep(1.0)
        facts = g.stop().as_dict()
    assert facts["harness_cores"] > 0.6, facts  # the hog is ours
    assert facts["window_s"] > 0.9 and 0 <= facts["min_mem_available_frac"] <= 1
    mid = g.series[len(g.series) // 2][0]
    part = g.window(mid, g.series[-1][0])
    assert 0 < part["window_s"] < facts["window_s"]


def test_anonymous_mapping_is_not_a_model():
    """mapped_files lists file mappings only (what PageOut would act on)."""
    m = mmap.mmap(-1, 4096)
    try:
        files = faults.mapped_files(os.getpid(), ".bin")
        assert all(f.endswith(".bin") for f in files)
    finally:
        m.close()

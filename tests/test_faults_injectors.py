"""The fault injectors themselves: each makes its fault real, measures it, and cleans up
on every path (stop, a failed start, the harness killed, its own time limit).

Fast (a few seconds each); root is needed for the cgroup and process_madvise ones,
which skip with the reason elsewhere.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from strata_plugin.load import own_quota
from strata_plugin.testing import faults, memcg, pauses, relay
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
    before = os.getpriority(os.PRIO_PROCESS, threading_native_id())
    hogs = faults.CpuHogs(cores[:1], per_core=2, max_s=30)
    with hogs:
        pids = [p.pid for _, p in hogs.procs]
        assert all(os.sched_getaffinity(p) == {cores[0]} for p in pids)
        main_nice = os.getpriority(os.PRIO_PROCESS, threading_native_id())
        assert main_nice == faults.SHIELD_NICE  # the harness stays ahead of its own hogs

        def used() -> float:  # the hogs' CPU seconds, as the kernel counts them
            ticks = 0
            for p in pids:
                stat = Path(f"/proc/{p}/stat").read_text()
                f = stat[stat.rfind(")") + 2:].split()
                ticks += int(f[11]) + int(f[12])
            return ticks / os.sysconf("SC_CLK_TCK")

        deadline = time.monotonic() + 20
        while (ran := used()) < 0.2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ran >= 0.2, ran  # the hogs spin
    facts = hogs.stop().as_dict()
    assert facts["hogs"] == 2 and facts["hog_cpu_s"] >= ran, (facts, ran)
    assert not any(alive(p) for p in pids)
    # restored to what it was (0 in a plain run; CI may run the suite under nice)
    assert os.getpriority(os.PRIO_PROCESS, threading_native_id()) == before
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
    back = own_quota.read(tid)
    assert back is not None and back.where == quota0.where  # back in its own cgroup
    # free again: 0.3 s of CPU within 2 s of wall time, which the 0.1 cap would stretch to
    # 3 s; a loaded host (a sixth of a core left) still passes
    w0, c0 = time.monotonic(), time.process_time()
    while time.process_time() - c0 < 0.3 and time.monotonic() - w0 < 5.0:
        x += 1
    assert time.monotonic() - w0 < 2.0, (time.monotonic() - w0, time.process_time() - c0)


def test_ground_truth_tells_own_load_from_foreign_load():
    """The hog is this process's child: its CPU is the harness's, not foreign. The control
    is the hog's own CPU time, read by its injector right after the window (the window
    holds all of it but the few ms between the two reads), so a core shared with other
    work changes both sides alike."""
    hogs = faults.CpuHogs((sorted(os.sched_getaffinity(0))[0],), per_core=1, max_s=30,
                          shield=False)
    g = faults.GroundTruth(None, period_s=0.1).start()
    hogs.start()
    try:
        time.sleep(1.0)
        facts = g.stop().as_dict()
    finally:
        hog = hogs.stop().as_dict()
    assert hog["hog_cpu_s"] > 0.1, hog  # the hog ran
    own_s = facts["harness_cores"] * facts["window_s"]
    assert own_s >= hog["hog_cpu_s"] - 0.05, (facts, hog)  # the hog is ours
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


# --- the set-aside faults (issue 23): freezer, SIGSTOP, relay, memory cgroup ---------------


def _spinner() -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", "print('up', flush=True)\nwhile True: pass"],
                         stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().strip() == b"up"
    return p


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _cgroup_line(pid: int, controller: str) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(",") or (controller == "" and ctrls == ""):
            return path
    return ""


@pytest.mark.integration  # 3.3 s of real waiting on the quiet VM
def test_freezer_pause_freezes_for_its_share_and_leaves_nothing():
    """While the freezer reads FROZEN the server's CPU time does not move; over 3 s it is
    frozen 200 ms in every 600 (the pauses measured by the helper, their rhythm seen from
    outside); afterwards it runs in its old cgroup and the freezer cgroup is gone."""
    if os.geteuid() != 0:
        pytest.skip("moving a process into a freezer cgroup needs root here")
    p = _spinner()
    try:
        try:
            _root, version = pauses.freezer_root()
        except faults.FaultUnavailable as exc:
            pytest.skip(str(exc))
        home = _cgroup_line(p.pid, "freezer" if version == "v1" else "")
        inj = pauses.FreezerPause(p.pid, pause_ms=200, period_ms=600, max_s=30)
        inj.start()
        assert inj.dir is not None and inj.dir.exists()
        frozen_reads, still, onsets, was = 0, [], [], False
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.0:
            was = _onset(pauses.read_state(inj.dir, version) == "FROZEN", was, onsets)
            if was:
                frozen_reads += 1
                c0 = faults._cpu_s(p.pid)
                time.sleep(0.05)
                was = pauses.read_state(inj.dir, version) == "FROZEN"
                if was:
                    still.append(faults._cpu_s(p.pid) - c0)
            time.sleep(0.01)
        facts = inj.stop().as_dict()
        assert frozen_reads > 0 and still and max(still) == 0.0, still
        assert _a_third_as_asked(facts, onsets) and facts["removed"], (facts, onsets)
        assert not inj.dir.exists() and _cgroup_line(p.pid, "freezer" if version == "v1"
                                                     else "") == home
        assert _state(p.pid) in ("R", "S")
        c0 = faults._cpu_s(p.pid)  # runs again (a frozen spinner never moves)
        wait_for(lambda: faults._cpu_s(p.pid) - c0 > 0.05, 5, what="the spinner running")
        assert not _helpers() and not pauses_helpers()
    finally:
        p.kill()
        p.wait()


def pauses_helpers() -> list[int]:
    """Live helpers of the set-aside modules started by this test process."""
    out = []
    mine = f"--parent\0{os.getpid()}\0".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if mine in cmd and any(m in cmd for m in (b"testing.pauses", b"testing.relay",
                                                       b"testing.memcg")) and alive(int(entry)):
                out.append(int(entry))
    return out


def test_freezer_helper_thaws_when_the_harness_is_killed(tmp_path):
    """The harness SIGKILLed while the server is frozen: the helper (parent-death signal
    SIGTERM) thaws it, moves it back and removes the cgroup."""
    if os.geteuid() != 0:
        pytest.skip("moving a process into a freezer cgroup needs root here")
    p = _spinner()
    script = textwrap.dedent(f"""
        import time
        from strata_plugin.testing import pauses
        inj = pauses.FreezerPause({p.pid}, pause_ms=900, period_ms=1000, max_s=60)
        inj.start()
        print(inj.dir, inj.version, flush=True)
        time.sleep(60)
    """)
    h = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert h.stdout is not None
        d, version = h.stdout.readline().decode().split()
        wait_for(lambda: pauses.read_state(Path(d), version) == "FROZEN", 5, what="FROZEN")
        h.kill()
        h.wait(10)
        wait_for(lambda: not Path(d).exists(), 10, what="the freezer cgroup removed")
        c0 = faults._cpu_s(p.pid)  # thawed (a frozen spinner never moves)
        wait_for(lambda: faults._cpu_s(p.pid) - c0 > 0.05, 5, what="the spinner thawed")
    finally:
        p.kill()
        p.wait()


@pytest.mark.integration  # 3.1 s of real waiting on the quiet VM
def test_sigstop_pause_stops_for_its_share_and_always_continues():
    p = _spinner()
    try:
        inj = pauses.SigStopPause(p.pid, pause_ms=200, period_ms=600, max_s=30)
        inj.start()
        stopped, onsets, was = [], [], False
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.0:
            was = _onset(_state(p.pid) == "T", was, onsets)
            if was:
                c0 = faults._cpu_s(p.pid)
                time.sleep(0.05)
                was = _state(p.pid) == "T"
                if was:
                    stopped.append(faults._cpu_s(p.pid) - c0)
            time.sleep(0.01)
        facts = inj.stop().as_dict()
        assert stopped and max(stopped) == 0.0, stopped
        assert _a_third_as_asked(facts, onsets), (facts, onsets)
        assert _state(p.pid) in ("R", "S") and not pauses_helpers()
    finally:
        p.kill()
        p.wait()


def _onset(paused: bool, was: bool, onsets: list[float]) -> bool:
    """Note when a pause was first seen from outside (polled every ~10 ms)."""
    if paused and not was:
        onsets.append(time.monotonic())
    return paused


def _a_third_as_asked(facts: dict, onsets: list[float]) -> bool:
    """200 ms paused of every 600. The rhythm, from outside: the median time between two
    pauses' onsets is 0.6 s within 0.09 (a 0.5 or 0.7 s period is outside; the median
    takes one pause seen late, or missed while the poller was not scheduled). The length,
    from the helper: each finished cycle's confirmed pause 0.15-0.25 s on average (a pause
    confirmed late costs its cycle part of its 0.2 s, a last one cut short a whole cycle's;
    a 100 or 400 ms pause is outside). Not as a share of the helper's wall time: a loaded
    host lengthens a pause (a late resume) and delays its confirmation, and the share
    moved with that past a fixed band."""
    c, confirmed = facts["cycles"], facts["confirmed_paused_s"]
    gaps = sorted(b - a for a, b in itertools.pairwise(onsets))
    return (c >= 4 and len(gaps) >= 3 and abs(gaps[len(gaps) // 2] - 0.6) <= 0.09
            and 0.15 * c <= confirmed <= 0.25 * (c + 1))


def _echo_server() -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return

            def echo(c=c) -> None:
                with c:
                    while data := c.recv(65536):
                        c.sendall(data)

            threading.Thread(target=echo, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


@pytest.mark.parametrize("delay_ms", [10.0, 50.0, pytest.param(
    200.0, marks=pytest.mark.integration)])  # 200 ms each way: seconds in all
def test_latency_proxy_adds_its_delay_each_way(delay_ms):
    """A round trip through the relay takes two one-way delays more than without it
    (measured: every one at least 2 x delay, the fastest not 15 ms more and the median
    not 40 ms more: a loaded host only adds to a round trip, a relay that held the bytes
    too long adds to every one, or to most),
    every byte is relayed, and the port is closed and the helper gone after stop."""
    srv, port = _echo_server()
    try:
        px = relay.LatencyProxy(f"http://127.0.0.1:{port}", delay_ms=delay_ms, max_s=30)
        px.start()
        assert px.url == f"http://127.0.0.1:{px.port}"
        rtts = []
        with socket.create_connection(("127.0.0.1", px.port)) as s:
            for _ in range(5):
                t0 = time.monotonic()
                s.sendall(b"x" * 1000)
                got = b""
                while len(got) < 1000:
                    got += s.recv(65536)
                rtts.append(time.monotonic() - t0)
        facts = px.stop().as_dict()
        assert 2 * delay_ms <= min(rtts) * 1e3 < 2 * delay_ms + 15, rtts
        assert sorted(rtts)[2] * 1e3 < 2 * delay_ms + 40, rtts  # and most trips near it
        assert facts["bytes_up"] == 5000 and facts["connections"] == 1, facts
        wait_for(lambda: facts["bytes_down"] == 5000, 5, what="bytes down")
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", px.port), timeout=1).close()
        assert not pauses_helpers()
    finally:
        srv.close()


def _trickle_server(n: int, every_s: float) -> tuple[socket.socket, int]:
    """A server that answers any request with ``n`` single bytes ``every_s`` apart (a
    stream at its pace), then closes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        with contextlib.suppress(OSError):
            c, _ = srv.accept()
            with c:
                c.recv(65536)
                t0 = time.monotonic()
                for i in range(n):
                    time.sleep(max(0.0, t0 + i * every_s - time.monotonic()))
                    c.sendall(b"t")

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


@pytest.mark.parametrize("flush_ms", [0.0, 100.0])
def test_buffering_proxy_holds_the_stream_and_flushes_it_in_bursts(flush_ms):
    """The server sends a byte every 10 ms for 0.6 s. Through the buffering relay the
    client reads them in bursts, one every ``flush_ms`` (the median gap between reads
    is the period, within 15 ms), each of about period / 10 ms bytes, and no byte is
    lost; with no buffering the reads follow the server's pace."""
    srv, port = _trickle_server(60, 0.01)
    try:
        px = relay.LatencyProxy(f"http://127.0.0.1:{port}", delay_ms=0.0, max_s=30,
                                buffer_flush_ms=flush_ms)
        px.start()
        reads: list[tuple[float, int]] = []
        with socket.create_connection(("127.0.0.1", px.port)) as s:
            s.sendall(b"GO")
            while data := s.recv(65536):
                reads.append((time.monotonic(), len(data)))
        facts = px.stop().as_dict()
    finally:
        srv.close()
    assert sum(n for _, n in reads) == 60
    gaps = sorted(b[0] - a[0] for a, b in itertools.pairwise(reads))
    med_ms = gaps[len(gaps) // 2] * 1e3
    if flush_ms:
        assert flush_ms - 15 <= med_ms <= flush_ms + 15, gaps
        assert 5 <= len(reads) <= 8, reads  # 0.6 s in bursts of ~10 bytes
        assert facts["flushes"] == len(reads) and facts["buffer_flush_ms"] == flush_ms, facts
        assert 7 <= facts["bytes_per_flush"] <= 12, facts
    else:
        assert 5 <= med_ms <= 15, gaps  # the server's pace, read by read
        assert facts["flushes"] == 0, facts
    assert not pauses_helpers()


def test_buffering_proxy_refuses_a_bad_period():
    with pytest.raises(ValueError, match="buffer_flush_ms"):
        relay.LatencyProxy("http://127.0.0.1:1", buffer_flush_ms=-5)


def test_latency_proxy_refuses_a_non_loopback_upstream():
    with pytest.raises(ValueError, match="loopback"):
        relay.LatencyProxy("http://10.0.0.1:8080")
    with pytest.raises(ValueError, match="pace_up_bps"):
        relay.PacedUpload("http://127.0.0.1:8080", pace_up_bps=50)


@pytest.mark.parametrize("bps", [4000.0, 16000.0])
def test_paced_upload_sends_the_request_at_its_rate(bps):
    """2000 bytes up through a relay pacing at ``bps``: the server (an echo) has the last
    byte no sooner than the pace allows (its last fiftieth-of-a-second piece leaves at
    (2000 - piece) / bps), and not 60 ms later; the answer comes back unpaced (the echo
    of the first piece is back within 60 ms); every byte relayed, the helper gone."""
    srv, port = _echo_server()
    try:
        px = relay.PacedUpload(f"http://127.0.0.1:{port}", pace_up_bps=bps, max_s=30)
        px.start()
        piece = int(bps / 50)
        with socket.create_connection(("127.0.0.1", px.port)) as s:
            t0 = time.monotonic()
            s.sendall(b"x" * 2000)
            got = s.recv(65536)
            first = time.monotonic() - t0
            while len(got) < 2000:
                got += s.recv(65536)
            last = time.monotonic() - t0
        facts = px.stop().as_dict()
        paced = (2000 - piece) / bps
        assert paced <= last < paced + 0.06, (last, paced)
        assert first < 0.06 and len(got) == 2000, (first, len(got))
        assert facts["name"] == "upload_pacing" and facts["pace_up_bps"] == bps, facts
        assert facts["bytes_up"] == 2000 and paced <= facts["pace_wait_s"] <= paced + 0.03
        assert not pauses_helpers()
    finally:
        srv.close()


def test_a_relay_chain_is_one_process_per_hop_and_adds_every_delay():
    """relay (20 ms) -> relay (30 ms) -> echo: a round trip gains both hops' delays each
    way (100 ms, and not 25 ms more), each hop is its own process whose listener the next
    hop's connection reaches, and stop ends them all."""
    srv, port = _echo_server()
    try:
        chain = relay.RelayChain(f"http://127.0.0.1:{port}",
                                 [{"delay_ms": 20.0}, {"delay_ms": 30.0}], max_s=30)
        chain.start()
        first, second = chain.relays
        assert first.upstream == ("127.0.0.1", second.port) and chain.url == first.url
        assert len(set(chain.pids)) == 2 and all(alive(p) for p in chain.pids)
        with socket.create_connection(("127.0.0.1", first.port)) as s:
            rtts = []
            for _ in range(5):
                t0 = time.monotonic()
                s.sendall(b"y" * 100)
                got = b""
                while len(got) < 100:
                    got += s.recv(65536)
                rtts.append(time.monotonic() - t0)
        pids = chain.pids
        facts = chain.stop().as_dict()
        # each hop's delay both ways: never less; a loaded host only adds to a trip, so
        # the fastest of five is near it (a missing hop is 0.06 s, a doubled delay 0.2 s)
        assert 0.1 <= min(rtts) < 0.1 + 0.015, rtts
        assert [h["delay_ms"] for h in facts["hops"]] == [20.0, 30.0]
        assert [h["bytes_up"] for h in facts["hops"]] == [500, 500], facts
        assert not any(alive(p) for p in pids)
    finally:
        srv.close()


def test_memcg_evict_evicts_the_model_pages_without_an_oom_kill(model_file):
    """A process mapping 16 MiB and reading it every 50 ms, in a memory cgroup with room
    for half of it: its mapping loses pages, it faults them back from disk, nobody is
    OOM-killed, and afterwards it is back in its cgroup and the limited one is gone."""
    if os.geteuid() != 0:
        pytest.skip("memory cgroups and process_madvise on another process need root")
    p = _mapper(model_file)
    try:
        from strata_plugin.agent.procfs import read_process_counters

        try:
            _root, version = memcg.memory_root()
        except faults.FaultUnavailable as exc:
            pytest.skip(str(exc))
        home = _cgroup_line(p.pid, "memory" if version == "v1" else "")
        c0 = read_process_counters([p.pid])
        inj = memcg.MemcgEvict(p.pid, str(model_file), keep_frac=0.5,
                               headroom_bytes=4 * 2**20, max_s=30)
        inj.start()
        assert inj.limit_bytes == 4 * 2**20 + 8 * 2**20
        time.sleep(1.5)
        c1 = read_process_counters([p.pid])
        facts = inj.stop().as_dict()
        assert facts["oom_kills"] == 0 and p.poll() is None, facts  # evicted, not killed
        assert facts["model_rss_min"] <= 12 * 2**20, facts  # file pages dropped
        assert facts["evicted_bytes"] > 16 * 2**20 and facts["limit_hits"] > 0, facts
        assert c1.major_faults - c0.major_faults >= 5, (c0, c1)  # read back, again and again
        assert c1.read_bytes - c0.read_bytes > 16 * 2**20, (c0, c1)
        assert facts["removed"] and inj.dir is not None and not inj.dir.exists()
        assert _cgroup_line(p.pid, "memory" if version == "v1" else "") == home
        assert not pauses_helpers()
    finally:
        p.kill()
        p.wait()


def test_memcg_limit_leaves_the_room_above_what_cannot_be_reclaimed():
    """The limit is the room plus the group's memory that is not file pages, to the byte;
    file pages beyond the usage (figures read at different moments) never lower it."""
    room = 12 * 2**20
    assert memcg.limit_for({"usage_bytes": 5 * 2**20, "file_bytes": 5 * 2**20}, room) == room
    assert memcg.limit_for({"usage_bytes": 5 * 2**20 + 1, "file_bytes": 5 * 2**20},
                           room) == room + 1
    assert memcg.limit_for({"usage_bytes": 5 * 2**20, "file_bytes": 5 * 2**20 + 1},
                           room) == room
    assert memcg.limit_for({"usage_bytes": 30 * 2**20, "file_bytes": 6 * 2**20},
                           room) == room + 24 * 2**20


def _growing_mapper(path: Path, grow_mib: int, every_s: float) -> subprocess.Popen:
    """:func:`_mapper` that, once told to (a line on stdin, after the move), also writes
    1 MiB of new anonymous memory every ``every_s`` up to ``grow_mib`` MiB: a server
    touching pages first after the move (llama.cpp's KV cells, as requests fill them)."""
    code = textwrap.dedent(f"""
        import mmap, sys, time
        f = open({str(path)!r}, "rb")
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        s = sum(m[i] for i in range(0, len(m), 4096))
        print("ready", flush=True)
        sys.stdin.readline()
        kept, next_at = [], time.monotonic()
        while True:
            s += sum(m[i] for i in range(0, len(m), 4096))
            if len(kept) < {grow_mib} and time.monotonic() >= next_at:
                kept.append(b"x" * 2**20)
                next_at += {every_s}
                if len(kept) == {grow_mib}:
                    print("grown", flush=True)
            time.sleep(0.05)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    return p


@pytest.mark.integration  # 6.5 s of real waiting on the quiet VM
@pytest.mark.root
def test_memcg_evict_raises_its_limit_as_the_servers_own_memory_grows(model_file):
    """A server that writes new anonymous memory after the move (24 MiB, twice the group's
    whole limit of 4 MiB headroom + half of 16 MiB): under a fixed limit the kernel
    OOM-kills it once that memory fills the limit; the limit follows it instead, so the
    process lives and its model pages are still evicted and read back."""
    if os.geteuid() != 0:
        pytest.skip("memory cgroups and process_madvise on another process need root")
    try:
        memcg.memory_root()
    except faults.FaultUnavailable as exc:
        pytest.skip(str(exc))
    # 1 MiB each 0.25 s: the 4 MiB headroom lasts a second, ten of the helper's reads
    p = _growing_mapper(model_file, grow_mib=24, every_s=0.25)
    try:
        inj = memcg.MemcgEvict(p.pid, str(model_file), keep_frac=0.5,
                               headroom_bytes=4 * 2**20, max_s=60)
        inj.start()
        assert inj.limit_bytes == 12 * 2**20
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(b"go\n")
        p.stdin.flush()
        said = p.stdout.readline().strip()  # 6 s, under the limit the whole time
        time.sleep(0.5)
        facts = inj.stop().as_dict()
        # alive (no end of output, no OOM kill): the limit followed its memory
        assert said == b"grown" and facts["oom_kills"] == 0 and p.poll() is None, facts
        assert facts["pinned_bytes_max"] >= 24 * 2**20, facts
        assert facts["limit_bytes_at_end"] >= 12 * 2**20 + 24 * 2**20, facts
        assert facts["model_rss_min"] <= 12 * 2**20, facts  # file pages still squeezed
        assert facts["limit_hits"] > 0 and facts["evicted_bytes"] > 16 * 2**20, facts
        assert facts["removed"] and not pauses_helpers()
    finally:
        p.kill()
        p.wait()


def test_memcg_evict_refuses_pages_another_process_maps(model_file):
    a, b = _mapper(model_file), _mapper(model_file)
    try:
        inj = memcg.MemcgEvict(a.pid, str(model_file))
        with pytest.raises(faults.FaultUnavailable, match="also mapped by"):
            inj.start()
        assert not inj.active and not pauses_helpers()
    finally:
        for p in (a, b):
            p.kill()
            p.wait()

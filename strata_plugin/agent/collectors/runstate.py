"""The server's run state, sampled finely: on a CPU, runnable, blocked, stopped, frozen.

Why a collector of its own: the main grid (0.5 s) is far coarser than a decode gap
(tens of ms), and a server that did not run at all for 100 ms looks, at 0.5 s, like one
that ran a little slower. This collector samples the server's threads on a grid of its
own (``interval_s``, default 20 ms) in a thread of its own, buffers the values, and hands
them to the agent's main tick, which writes them like any other source's.

Emits, for the whole server tree (device ``""``), summed over every thread (threads and
processes that exit are kept in a base, so the counters stay monotonic):

* counters: ``run_s`` (schedstat field 1: time on a CPU), ``wait_s`` (schedstat field 2:
  runnable, waiting for a CPU, as the kernel books it), ``queued_s`` (the same wait
  counted as it happens: see below), ``ctx_voluntary``, ``ctx_involuntary``, ``throttled_s``
  (the server cgroup's CFS throttled time, only while that cgroup has a CPU quota;
  marked unavailable otherwise), ``overruns`` (grid points this sampler skipped because
  a sample took too long or the thread was not scheduled);
* gauges at the sample instant: ``threads``, ``state_R``, ``state_S`` (S and I),
  ``state_D``, ``state_T`` (T and t), ``state_other``, ``state_R_run`` and
  ``state_R_wait`` (the threads in R split by the interval just ended: ``state_R_wait``
  those whose ``queued_s`` grew more than their ``run_s``, runnable but kept from a CPU;
  the two sum to ``state_R``), and ``frozen`` (1 while the
  server's cgroup freezer says FROZEN or FREEZING, v1, or ``cgroup.freeze`` 1 /
  ``cgroup.events`` frozen 1, v2; omitted and marked unavailable without a freezer).

Why ``queued_s``: the state letter reads R both on a CPU and in the run queue, and the
kernel books a thread's run-queue wait (schedstat's run_delay) only when the wait ends,
when the thread reaches a CPU (kernel/sched/stats.h, ``sched_info_arrive``): a thread
kept from its CPU for 150 ms by a real-time task shows, on a 20 ms grid, seven intervals
with neither run time nor wait, then 150 ms of wait at once. What shows the wait while it
lasts is that a thread in R whose schedstat (run time, wait, timeslices) has not moved
did not run: a thread leaves the run queue (to sleep, to stop, to freeze) only by
running, so R at two samples with no timeslice between means queued all along. So
``queued_s`` is, per thread, the largest of what it counted before and the kernel's
run_delay plus the time since the thread was last seen either move or leave R, once that
is at least ``STILL_MIN_S`` (longer than the scheduler tick, 10 ms at HZ=100: a thread
on a CPU has its run time brought up to date at each tick, so one that stood still
longer did not run). When the wait ends the kernel's booking catches up and only the
part not yet counted is added: the wait lands at most about one interval late, whatever
took the CPU (a real-time task, a CFS neighbour, the server's own threads). On a
``nohz_full`` CPU a lone running task gets no tick and its run time stands still, so a
thread last seen on one of those is never counted this way (its wait comes as booked).

Cost: two ``pread`` calls per thread per sample on descriptors kept open (stat for the
state, schedstat), and a third (sched, or else status, for the switch counts) only for
a thread whose schedstat moved since the last sample (one that did not run cannot have
switched); one per process
(stat, whose thread count tells when to list the threads again) and one or two cgroup
files; the cgroup itself is looked up again every ``cgroup_rescan_s``. The agent's
cost at 10, 20 and 50 ms is measured in benchmarks/test_agent_cost.py and stated in
docs/agent.md.

The grid stretches with the thread count: the cost is per thread (10-16 us a thread
and sample here, the kernel's part included, plus about 0.2 ms a sample), so a GPU
server's hundreds of threads at 20 ms would add 4-6% of a core at 100 threads and
18-20% at 500 (benchmarks/test_agent_cost.py, "at scale"). Up to ``adapt_above`` threads (16: the
local llama-server's 15 keep the 20 ms grid) the interval is ``interval_s``; above, each
thread gets ``THREAD_SLOT_S`` (2 ms) of it: ``threads * 2 ms``, 34 ms at 17 threads,
200 ms at 100, up to ``MAX_ADAPTED_S`` (the main grid's default) from 250. The ledger
reads the samples' timestamps, so a coarser grid only spreads each state evenly over a
longer interval (coarser resolution, the same totals); the gauge ``interval_s`` says the
grid in use.

Hot mode (``hot``, off by default) stretches the grid with the *hot* threads' count
instead: those runnable at the last read of every thread or on a CPU ``HOT_MIN_SHARE`` of
the time since. A sample reads the process's stat and the hot threads only; every thread
is read on the grid the whole count gives, and at the next sample when the process's CPU
(its stat: the kernel's sum over its threads) outgrew its hot threads' by
``_PROMOTE_NS``, or a hot thread reads T or D. The others count as last read, so the
counters stay exact over a span and lag the kernel by at most about 30 ms of CPU.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING

from .. import procfs
from ..cgroups import (
    FreezerFiles,
    cgroup_dirs,
    cpu_quota_cores,
    cpu_stat_files,
    freezer_files,
    parse_cpulist,
)
from ..cgroups import is_frozen as _is_frozen
from ..procfs import PreadFile, parse_ctx_switches, parse_schedstat
from ..targets import ProcessTargets
from .base import Collector, Emit, Unavailable

if TYPE_CHECKING:
    import argparse

COUNTERS = ("run_s", "wait_s", "queued_s", "ctx_voluntary", "ctx_involuntary")
STATES = ("state_R", "state_S", "state_D", "state_T", "state_other")
#: The threads in R split by the interval just ended (the module's docstring).
RUNNABLE_SPLIT = ("state_R_run", "state_R_wait")
#: A thread in R whose schedstat stood still this long did not run (module docstring):
#: longer than the scheduler tick at its slowest (HZ=100: 10 ms), which brings a running
#: thread's run time up to date.
STILL_MIN_S = 0.015
_STATE_OF = {
    ord("R"): 0,
    ord("S"): 1,
    ord("I"): 1,
    ord("D"): 2,
    ord("T"): 3,
    ord("t"): 3,
}
#: No finer grid than this: a sample of a 40-thread server takes about a millisecond.
MIN_INTERVAL_S = 0.005
#: Up to this many server threads the grid is ``interval_s``; above, it stretches with
#: the thread count (see the module's docstring). 0 keeps the grid fixed.
ADAPT_ABOVE_THREADS = 16
#: Above ADAPT_ABOVE_THREADS, the grid's length per thread: the agent's added cost then
#: stays under 1% of a core at 100 threads (+0.59% measured, against +4.08% on a fixed
#: 20 ms grid: docs/agent.md, "The runstate collector at scale").
THREAD_SLOT_S = 0.002
#: The stretched grid is never coarser than this (the agent's main grid by default).
MAX_ADAPTED_S = 0.5
#: Most buffered emits kept between two main ticks (a stalled main loop must not grow
#: the agent without bound): about 60 s of samples at 20 ms.
MAX_BUFFER = 3000 * 17


_HAS_SCHED = os.path.exists(f"{procfs.PROC}/self/sched")
_R = ord("R")
_NS_PER_TICK = 1_000_000_000 // procfs.CLK_TCK
#: Hot mode: CPU of the process beyond its hot threads' (since every thread was read)
#: that calls for reading every thread again: two of /proc/PID/stat's clock ticks, the
#: resolution of its utime and stime.
_PROMOTE_NS = 2 * _NS_PER_TICK
#: Hot mode: a thread that ran at least this share of the time since the last read of
#: every thread is read on every sample (the engine's busy loops; not its idle pollers).
HOT_MIN_SHARE = 0.01


def _nohz_full() -> frozenset[int]:
    """The CPUs whose tick stops under a lone task (``nohz_full=``); none when unset."""
    return parse_cpulist(procfs.read_bytes("/sys/devices/system/cpu/nohz_full", 4096)
                         ) or frozenset()


def _last_cpu(stat: bytes) -> int:
    """The CPU a thread last ran on (/proc/.../stat field 39)."""
    return int(stat[stat.rfind(b")") + 2 :].split(None, 37)[36])


def _sched_switches(data: bytes) -> tuple[int, int]:
    """(voluntary, involuntary) switches from a /proc/.../sched text."""
    i = data.find(b"nr_voluntary_switches")
    j = data.find(b"nr_involuntary_switches", i)
    if i < 0 or j < 0:
        return 0, 0
    a = data.index(b":", i) + 1
    b = data.index(b":", j) + 1
    return int(data[a : data.index(b"\n", a)]), int(data[b : data.index(b"\n", b)])


class _Thread:
    __slots__ = ("full_run", "full_sched", "invol", "last_sched", "queued_ns", "run_ns", "sched",
                 "stat", "status", "still_since", "vol", "wait_ns", "was_r")

    def __init__(self, base: str) -> None:
        self.stat = PreadFile(base + "/stat", 1024)
        self.sched = PreadFile(base + "/schedstat", 128)
        # The switch counts: /proc/.../sched (CONFIG_SCHED_DEBUG) costs about 60% of
        # /proc/.../status to generate (9 against 15 us here); status where it is absent.
        self.status = PreadFile(base + "/sched", 4096) if _HAS_SCHED else PreadFile(
            base + "/status", 4096)
        self.run_ns = self.wait_ns = self.vol = self.invol = 0
        self.last_sched = b""
        # queued_s (module docstring): what this thread has counted, since when (monotonic
        # ns, read just after a schedstat read) it stood still in R, R at the last sample
        self.queued_ns = 0
        self.still_since = 0
        self.was_r = False
        # hot mode (the module's docstring): its schedstat and run time at the last sample
        # that read every thread
        self.full_sched = b""
        self.full_run = 0

    def close(self) -> None:
        self.stat.close()
        self.sched.close()
        self.status.close()


class _Proc:
    __slots__ = ("base", "cold", "cold_counts", "cpu_full", "hot", "hot_run_full", "nthreads",
                 "pid", "stat", "threads")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stat = PreadFile(f"{procfs.PROC}/{pid}/stat", 1024)
        self.threads: dict[int, _Thread] = {}
        self.nthreads = -1
        # counters of this process's threads that have exited: run ns, wait ns, queued ns,
        # vol, invol
        self.base = [0, 0, 0, 0, 0]
        # hot mode: the threads read on every sample, the counters and states of the
        # others as last read, the process's CPU (ns, from its stat) and the hot threads'
        # run time at that read
        self.hot: list[int] = []
        self.cold = [0, 0, 0, 0, 0]
        self.cold_counts = [0, 0, 0, 0, 0]
        self.cpu_full = 0
        self.hot_run_full = 0

    def rescan(self) -> None:
        try:
            tids = {int(t) for t in os.listdir(f"{procfs.PROC}/{self.pid}/task")}
        except OSError:
            return
        for tid in list(self.threads):
            if tid not in tids:
                self.retire(tid)
        for tid in tids - self.threads.keys():
            self.threads[tid] = _Thread(f"{procfs.PROC}/{self.pid}/task/{tid}")

    def retire(self, tid: int) -> None:
        t = self.threads.pop(tid)
        b = self.base
        b[0] += t.run_ns
        b[1] += t.wait_ns
        b[2] += max(t.queued_ns, t.wait_ns)
        b[3] += t.vol
        b[4] += t.invol
        t.close()

    def close(self) -> None:
        self.stat.close()
        for t in self.threads.values():
            t.close()
        self.threads.clear()


class RunstateCollector(Collector):
    """The server tree's scheduler state every ``interval_s``, from a thread of its own."""

    source = "runstate"
    follows_targets = True

    def __init__(
        self,
        targets: ProcessTargets,
        interval_s: float = 0.02,
        cgroup_rescan_s: float = 0.25,
        cgroup_root: str | None = None,
        adapt_above: int = ADAPT_ABOVE_THREADS,
        hot: bool = False,
    ) -> None:
        super().__init__()
        if interval_s < MIN_INTERVAL_S:
            raise ValueError(f"the runstate interval must be >= {MIN_INTERVAL_S} s")
        if adapt_above < 0:
            raise ValueError("adapt_above is a thread count >= 0 (0: a fixed grid)")
        self.targets = targets
        self.interval_s = interval_s
        self.adapt_above = adapt_above
        self.grid_s = interval_s  # the grid in use: interval_s stretched by the thread count
        #: hot mode (module docstring): the grid stretches with the threads that ran, and
        #: every thread is read on the grid the whole tree's count gives, from _next_full
        self.hot = hot
        self._next_full = 0
        self._last_full = 0
        self.cgroup_rescan_s = cgroup_rescan_s
        self.cgroup_root = cgroup_root
        self._procs: dict[int, _Proc] = {}
        self._tree: tuple[int, ...] = ()
        self._exited = [0, 0, 0, 0, 0]  # processes that left the tree
        self._last = [0, 0, 0, 0, 0]  # never step a tree counter back
        self._nohz = _nohz_full()
        self._buf: list[Emit] = []
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0
        self.overruns = 0
        # cgroup state, looked up again every cgroup_rescan_s
        self._next_cgroup = 0.0
        self._cg_pid = 0
        self._cg_file: PreadFile | None = None
        self._cg_text = b""
        self._freezer = FreezerFiles()
        self._fz: list[PreadFile] = []
        self._cpu_stat: PreadFile | None = None
        self._cpu_stat_path = ""
        self._throttle_base = 0.0
        self._throttle_last = 0.0
        self._schedstat_ok = True
        self._said: set[str] = set()
        self._notes: list[tuple[str, str]] = []  # from the sampling thread, under _lock

    # -- the agent's side (main thread) --------------------------------------------------
    def probe(self) -> None:
        try:
            self.targets.probe()
        except ValueError as e:
            raise Unavailable(str(e)) from None
        self.targets.commands.clear()  # the proc collector records them
        if not os.path.exists(f"{procfs.PROC}/self/schedstat"):
            raise Unavailable("no /proc/<pid>/schedstat (kernel without CONFIG_SCHED_INFO)")
        self.info(kind="runstate", source=self.source, interval_s=self.interval_s,
                  adapt_above_threads=self.adapt_above, max_adapted_s=MAX_ADAPTED_S,
                  hot=self.hot)
        self._thread = threading.Thread(target=self._loop, name="runstate", daemon=True)
        self._thread.start()

    def set_pids(self, pids: list[int]) -> None:
        self.targets.set_pids(pids)

    def sample(self, wall_ns: int) -> list[Emit]:
        # The tree is re-resolved on the main thread only (the proc collector shares
        # these targets); the sampling thread reads the tuple it publishes.
        self.targets.refresh()
        with self._lock:
            out, self._buf = self._buf, []
            notes, self._notes = self._notes, []
        for key, reason in notes:
            self.mark_unavailable(key, reason)
        return out

    def close(self) -> None:
        self._halt.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)
        for p in self._procs.values():
            p.close()
        self._procs.clear()
        for f in (*self._fz, self._cg_file, self._cpu_stat):
            if f is not None:
                f.close()
        self._fz, self._cg_file, self._cpu_stat = [], None, None

    # -- the sampling thread ---------------------------------------------------------------
    def grid_for(self, threads: int) -> float:
        """The interval for a tree of ``threads`` threads (the module's docstring)."""
        if not self.adapt_above or threads <= self.adapt_above:
            return self.interval_s
        return max(self.interval_s, min(MAX_ADAPTED_S, threads * THREAD_SLOT_S))

    def _loop(self) -> None:
        next_t = time.monotonic()
        while not self._halt.is_set():
            try:
                emits = self.sample_now()
            except Exception as e:  # a bug here must not kill the thread silently
                self._say_once("sample_error", f"sampling thread: {type(e).__name__}: {e}")
                emits = []
            if emits:
                with self._lock:
                    if len(self._buf) < MAX_BUFFER:
                        self._buf.extend(emits)
            interval = self.grid_s
            now = time.monotonic()
            next_t += interval
            if next_t <= now:
                skipped = int((now - next_t) // interval) + 1
                self.overruns += skipped
                next_t += skipped * interval
            self._halt.wait(next_t - now)

    def _sync(self, tree: tuple[int, ...]) -> None:
        want = set(tree)
        for pid in list(self._procs):
            if pid not in want:
                self._retire(self._procs.pop(pid))
        for pid in tree:
            if pid not in self._procs:
                self._procs[pid] = _Proc(pid)
        self._tree = tree

    def _retire(self, proc: _Proc) -> None:
        for tid in list(proc.threads):
            proc.retire(tid)
        for i in range(5):
            self._exited[i] += proc.base[i]
        proc.close()

    def sample_now(self) -> list[Emit]:
        """One sample of the tree (the sampling thread calls it; tests call it directly)."""
        tree = self.targets.tree
        if tree != self._tree:
            self._sync(tree)
        if not self._procs and not any(self._exited):
            return []  # no fake zeros before the server exists
        wall = time.time_ns()
        clock = time.monotonic_ns
        mono = clock()
        full = not self.hot or mono >= self._next_full
        # hot mode: a thread that ran this much since the last read of every thread is hot
        hot_min = int(HOT_MIN_SHARE * (mono - self._last_full)) if self._last_full else 0
        still_min = int(STILL_MIN_S * 1e9)
        nohz = self._nohz
        counts = [0, 0, 0, 0, 0]
        r_run = r_wait = 0
        tot = list(self._exited)
        nthreads = nhot = 0
        state_of = _STATE_OF
        switches = _sched_switches if _HAS_SCHED else parse_ctx_switches
        gone = []
        for pid, proc in self._procs.items():
            data = proc.stat.read()
            if data is None:
                gone.append(pid)
                continue
            rpar = data.rfind(b")")
            if data[rpar + 2] in (90, 88):  # Z, X: a zombie's counters read as zero
                gone.append(pid)
                continue
            f = data[rpar + 2 :].split(None, 18)
            n = int(f[17])
            every = full
            if n != proc.nthreads or n != len(proc.threads):
                proc.nthreads = n
                proc.rescan()
                every = True  # threads came or went: read them all
            b = proc.base
            run, wait, queued, vol, invol = b[0], b[1], b[2], b[3], b[4]
            if not every:  # hot mode: the others as last read
                c = proc.cold
                run += c[0]
                wait += c[1]
                queued += c[2]
                vol += c[3]
                invol += c[4]
                for i, k in enumerate(proc.cold_counts):
                    counts[i] += k
            threads = proc.threads
            dead = []
            hot = []
            cold = [0, 0, 0, 0, 0]
            cold_counts = [0, 0, 0, 0, 0]
            hot_run = 0
            for tid in (threads if every else proc.hot):
                t = threads.get(tid)
                st = t.stat.read() if t is not None else None
                if t is None or st is None:
                    dead.append(tid)
                    continue
                letter = st[st.rfind(b")") + 2]
                idx = state_of.get(letter, 4)
                counts[idx] += 1
                is_r = letter == _R
                # a thread in R: the clock on both sides of its schedstat read, so that
                # a sampler held up mid-sample never stretches the still span it measures
                before = clock() if is_r else 0
                sched = t.sched.read()
                after = clock() if is_r else 0
                run0, queued0 = t.run_ns, t.queued_ns
                # A thread whose schedstat (run time, wait, timeslices) has not moved was
                # never on a CPU since the last sample, so it cannot have switched: its
                # switch counts are read only when it ran (most server threads sleep).
                if sched and sched != t.last_sched:
                    first = not t.last_sched
                    t.last_sched = sched
                    t.run_ns, t.wait_ns, _ = parse_schedstat(sched)
                    status = t.status.read()
                    if status:
                        t.vol, t.invol = switches(status)
                    if first:  # no interval yet: nothing of this one to split
                        run0, queued0 = t.run_ns, max(t.queued_ns, t.wait_ns)
                    t.still_since = after
                elif not is_r or not t.was_r:
                    t.still_since = after
                # queued_s (module docstring): in R and not on a CPU since still_since
                pending = 0
                if is_r and t.was_r and before - t.still_since >= still_min and not (
                        nohz and _last_cpu(st) in nohz):
                    pending = before - t.still_since
                q = t.wait_ns + pending
                if q > t.queued_ns:
                    t.queued_ns = q
                t.was_r = is_r
                if is_r:
                    if t.queued_ns - queued0 > t.run_ns - run0:
                        r_wait += 1
                    else:
                        r_run += 1
                if self.hot and every:
                    # hot: runnable now, or ran HOT_MIN_SHARE of the time since the last
                    # read of every thread (a poller that wakes once a second is not)
                    if is_r or (t.full_sched and t.run_ns - t.full_run >= hot_min):
                        hot.append(tid)
                        hot_run += t.run_ns
                    else:
                        cold[0] += t.run_ns
                        cold[1] += t.wait_ns
                        cold[2] += t.queued_ns
                        cold[3] += t.vol
                        cold[4] += t.invol
                        cold_counts[idx] += 1
                    t.full_sched = sched or b""
                    t.full_run = t.run_ns
                elif self.hot:
                    hot_run += t.run_ns
                    if idx in (2, 3):  # stopped or in D: are the others too? Read them all
                        self._next_full = 0
                run += t.run_ns
                wait += t.wait_ns
                queued += t.queued_ns
                vol += t.vol
                invol += t.invol
            for tid in dead:
                if tid in threads:
                    proc.retire(tid)
            if self.hot:
                cpu = (int(f[11]) + int(f[12])) * _NS_PER_TICK
                if every:
                    proc.hot, proc.cold, proc.cold_counts = hot, cold, cold_counts
                    proc.cpu_full, proc.hot_run_full = cpu, hot_run
                else:
                    if dead:
                        proc.hot = [x for x in proc.hot if x not in dead]
                    # a thread outside the hot set ran: the process's CPU (its stat, every
                    # thread's run time summed by the kernel) grew by more than the hot
                    # threads' did since every thread was read. Read them all next time.
                    if (cpu - proc.cpu_full) - (hot_run - proc.hot_run_full) > _PROMOTE_NS:
                        self._next_full = 0
                nhot += len(proc.hot)
            nthreads += len(proc.threads)
            tot[0] += run
            tot[1] += wait
            tot[2] += queued
            tot[3] += vol
            tot[4] += invol
        if self.hot and full:
            self._next_full = mono + int(self.grid_for(nthreads) * 1e9)
            self._last_full = mono
        for pid in gone:
            self._retire(self._procs.pop(pid))
        last = self._last
        for i in range(5):
            if tot[i] < last[i]:
                tot[i] = last[i]
        self._last = tot
        self.samples += 1
        self.grid_s = self.grid_for(nhot if self.hot else nthreads)
        out: list[Emit] = [
            (wall, "", "run_s", tot[0] / 1e9, "counter"),
            (wall, "", "wait_s", tot[1] / 1e9, "counter"),
            (wall, "", "queued_s", tot[2] / 1e9, "counter"),
            (wall, "", "ctx_voluntary", tot[3], "counter"),
            (wall, "", "ctx_involuntary", tot[4], "counter"),
            (wall, "", "overruns", self.overruns, "counter"),
            (wall, "", "threads", nthreads, "gauge"),
            (wall, "", "interval_s", self.grid_s, "gauge"),
        ]
        for name, n in zip(STATES, counts):
            out.append((wall, "", name, n, "gauge"))
        for name, n in zip(RUNNABLE_SPLIT, (r_run, r_wait)):
            out.append((wall, "", name, n, "gauge"))
        self._cgroup(wall, out)
        return out

    # -- the server's cgroup: freezer and CPU throttling --------------------------------------
    def _cgroup(self, wall: int, out: list[Emit]) -> None:
        now = time.monotonic()
        if now >= self._next_cgroup:
            self._next_cgroup = now + self.cgroup_rescan_s
            self._resolve_cgroup()
        fr = self._freezer
        if fr.available:
            v1 = self._fz[0].read() if fr.v1_state else None
            ev = self._fz[-2].read() if fr.v2_events else None
            fz = self._fz[-1].read() if fr.v2_freeze else None
            out.append((wall, "", "frozen", 1 if _is_frozen(v1, ev, fz) else 0, "gauge"))
        if self._cpu_stat is not None:
            data = self._cpu_stat.read()
            if data:
                kv = procfs.parse_kv(data)
                if "throttled_usec" in kv:
                    v = kv["throttled_usec"] / 1e6
                else:
                    v = kv.get("throttled_time", 0) / 1e9  # v1: ns
                self._throttle_last = v
                out.append((wall, "", "throttled_s", self._throttle_base + v, "counter"))

    def _say_once(self, key: str, reason: str) -> None:
        """Queue an unavailable reason for the main thread (it owns the bookkeeping)."""
        if key not in self._said:
            self._said.add(key)
            with self._lock:
                self._notes.append((key, reason))

    def _resolve_cgroup(self) -> None:
        """Follow the server's (first tracked process's) cgroup, which may change mid-run
        (a container, a slice, the fault suite's freezer or quota group)."""
        pid = self._tree[0] if self._tree else 0
        if pid != self._cg_pid:
            if self._cg_file is not None:
                self._cg_file.close()
            self._cg_pid = pid
            self._cg_file = PreadFile(f"{procfs.PROC}/{pid}/cgroup", 4096) if pid else None
        text = self._cg_file.read() if self._cg_file is not None else None
        if text is None or text == self._cg_text:
            return
        self._cg_text = text
        root = self.cgroup_root
        fr = freezer_files(text, root) if root else freezer_files(text)
        if fr != self._freezer:
            for f in self._fz:
                f.close()
            self._freezer = fr
            self._fz = [PreadFile(p, 64) for p in (fr.v1_state, fr.v2_events, fr.v2_freeze)
                        if p]
            if not fr.available:
                self._say_once("frozen", "no cgroup freezer (neither the v1 freezer "
                                         "hierarchy nor the v2 cgroup.freeze) on this node")
        dirs = cgroup_dirs(pid, root) if root else cgroup_dirs(pid)
        quota = cpu_quota_cores(dirs)
        files = cpu_stat_files(dirs) if quota is not None else []
        path = files[0] if files else ""
        if path != self._cpu_stat_path:
            if self._cpu_stat is not None:
                self._cpu_stat.close()
                self._throttle_base += self._throttle_last  # stays monotonic across groups
                self._throttle_last = 0.0
            self._cpu_stat_path = path
            self._cpu_stat = PreadFile(path, 1024) if path else None
        if not path:
            self._say_once("throttled_s", "the server's cgroup has no CPU quota "
                                          "(nothing to throttle it)")


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory (``registry.py``): the agent's options -> this collector."""
    return RunstateCollector(targets, interval_s=args.runstate_interval,
                             adapt_above=ADAPT_ABOVE_THREADS
                             if args.runstate_adapt_above is None
                             else args.runstate_adapt_above,
                             hot=bool(getattr(args, "runstate_hot", False)))

"""The server's run state, sampled finely: on a CPU, runnable, blocked, stopped, frozen.

Why a collector of its own: the main grid (0.5 s) is far coarser than a decode gap
(tens of ms), and a server that did not run at all for 100 ms looks, at 0.5 s, like one
that ran a little slower. This collector samples the server's threads on a grid of its
own (``interval_s``, default 20 ms) in a thread of its own, buffers the values, and hands
them to the agent's main tick, which writes them like any other source's.

Emits, for the whole server tree (device ``""``), summed over every thread (threads and
processes that exit are kept in a base, so the counters stay monotonic):

* counters: ``run_s`` (schedstat field 1: time on a CPU), ``wait_s`` (schedstat field 2:
  runnable, waiting for a CPU), ``ctx_voluntary``, ``ctx_involuntary``, ``throttled_s``
  (the server cgroup's CFS throttled time, only while that cgroup has a CPU quota;
  marked unavailable otherwise), ``overruns`` (grid points this sampler skipped because
  a sample took too long or the thread was not scheduled);
* gauges at the sample instant: ``threads``, ``state_R``, ``state_S`` (S and I),
  ``state_D``, ``state_T`` (T and t), ``state_other``, and ``frozen`` (1 while the
  server's cgroup freezer says FROZEN or FREEZING, v1, or ``cgroup.freeze`` 1 /
  ``cgroup.events`` frozen 1, v2; omitted and marked unavailable without a freezer).

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
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING

from .. import procfs
from ..cgroups import FreezerFiles, cgroup_dirs, cpu_quota_cores, cpu_stat_files, freezer_files
from ..cgroups import is_frozen as _is_frozen
from ..procfs import PreadFile, parse_ctx_switches, parse_schedstat
from ..targets import ProcessTargets
from .base import Collector, Emit, Unavailable

if TYPE_CHECKING:
    import argparse

COUNTERS = ("run_s", "wait_s", "ctx_voluntary", "ctx_involuntary")
STATES = ("state_R", "state_S", "state_D", "state_T", "state_other")
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
MAX_BUFFER = 3000 * 14


_HAS_SCHED = os.path.exists(f"{procfs.PROC}/self/sched")


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
    __slots__ = ("invol", "last_sched", "run_ns", "sched", "stat", "status", "vol", "wait_ns")

    def __init__(self, base: str) -> None:
        self.stat = PreadFile(base + "/stat", 1024)
        self.sched = PreadFile(base + "/schedstat", 128)
        # The switch counts: /proc/.../sched (CONFIG_SCHED_DEBUG) costs about 60% of
        # /proc/.../status to generate (9 against 15 us here); status where it is absent.
        self.status = PreadFile(base + "/sched", 4096) if _HAS_SCHED else PreadFile(
            base + "/status", 4096)
        self.run_ns = self.wait_ns = self.vol = self.invol = 0
        self.last_sched = b""

    def close(self) -> None:
        self.stat.close()
        self.sched.close()
        self.status.close()


class _Proc:
    __slots__ = ("base", "nthreads", "pid", "stat", "threads")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stat = PreadFile(f"{procfs.PROC}/{pid}/stat", 1024)
        self.threads: dict[int, _Thread] = {}
        self.nthreads = -1
        # counters of this process's threads that have exited: run ns, wait ns, vol, invol
        self.base = [0, 0, 0, 0]

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
        b[2] += t.vol
        b[3] += t.invol
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
        self.cgroup_rescan_s = cgroup_rescan_s
        self.cgroup_root = cgroup_root
        self._procs: dict[int, _Proc] = {}
        self._tree: tuple[int, ...] = ()
        self._exited = [0, 0, 0, 0]  # processes that left the tree
        self._last = [0, 0, 0, 0]  # never step a tree counter back
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
                  adapt_above_threads=self.adapt_above, max_adapted_s=MAX_ADAPTED_S)
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
        for i in range(4):
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
        counts = [0, 0, 0, 0, 0]
        tot = list(self._exited)
        nthreads = 0
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
            n = int(data[rpar + 2 :].split(None, 18)[17])
            if n != proc.nthreads or n != len(proc.threads):
                proc.nthreads = n
                proc.rescan()
            b = proc.base
            run, wait, vol, invol = b[0], b[1], b[2], b[3]
            dead = []
            for tid, t in proc.threads.items():
                st = t.stat.read()
                if st is None:
                    dead.append(tid)
                    continue
                counts[state_of.get(st[st.rfind(b")") + 2], 4)] += 1
                sched = t.sched.read()
                # A thread whose schedstat (run time, wait, timeslices) has not moved was
                # never on a CPU since the last sample, so it cannot have switched: its
                # switch counts are read only when it ran (most server threads sleep).
                if sched and sched != t.last_sched:
                    t.last_sched = sched
                    t.run_ns, t.wait_ns, _ = parse_schedstat(sched)
                    status = t.status.read()
                    if status:
                        t.vol, t.invol = switches(status)
                run += t.run_ns
                wait += t.wait_ns
                vol += t.vol
                invol += t.invol
            for tid in dead:
                proc.retire(tid)
            nthreads += len(proc.threads)
            tot[0] += run
            tot[1] += wait
            tot[2] += vol
            tot[3] += invol
        for pid in gone:
            self._retire(self._procs.pop(pid))
        last = self._last
        for i in range(4):
            if tot[i] < last[i]:
                tot[i] = last[i]
        self._last = tot
        self.samples += 1
        self.grid_s = self.grid_for(nthreads)
        out: list[Emit] = [
            (wall, "", "run_s", tot[0] / 1e9, "counter"),
            (wall, "", "wait_s", tot[1] / 1e9, "counter"),
            (wall, "", "ctx_voluntary", tot[2], "counter"),
            (wall, "", "ctx_involuntary", tot[3], "counter"),
            (wall, "", "overruns", self.overruns, "counter"),
            (wall, "", "threads", nthreads, "gauge"),
            (wall, "", "interval_s", self.grid_s, "gauge"),
        ]
        for name, n in zip(STATES, counts):
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
                             else args.runstate_adapt_above)

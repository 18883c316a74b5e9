"""Scheduling trace -> per-thread run / runnable-wait / sleep time and who ran meanwhile.

Why: per-process counters see a server's CPU seconds and its run-queue delay, but not
whose work kept it waiting. A saturated server (its own threads queue for its own cores:
``cpu_compute``) and a crowded node (other processes hold the cores: ``cpu_contention``)
look alike in them. ``sched_switch`` / ``sched_wakeup`` show, for every moment a server
thread was runnable but not running, which task held each of the server's CPUs.

Reads ``sched_switch``, ``sched_wakeup`` and ``sched_wakeup_new`` text from a tracefs
instance (``run/tracing.py``) and the capture's ``meta.json`` (``run/trace_targets.py``):
the server's and harness's PIDs and threads, and the server's CPUs. Thread states follow
the kernel's ``prev_state``: ``R``/``R+`` preempted (runnable), ``D`` uninterruptible
(blocked, usually on I/O or a page fault), ``S`` and the rest sleeping.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from strata_plugin.analysis.traces.ftrace_text import TraceEvent, parse

NEEDS = ("root (tracefs instance)", "tracefs", "events sched/sched_switch, sched/sched_wakeup")
EVENTS = ("sched_switch", "sched_wakeup", "sched_wakeup_new")

_SWITCH = re.compile(
    r"prev_comm=(?P<pc>.*?) prev_pid=(?P<pp>\d+) prev_prio=-?\d+ prev_state=(?P<ps>\S+) "
    r"==> next_comm=(?P<nc>.*?) next_pid=(?P<np>\d+) next_prio=-?\d+"
)
_WAKE = re.compile(r"comm=(?P<c>.*?) pid=(?P<p>\d+) prio=-?\d+")
#: Kernel threads by name (their TGID is their PID and they have no command line).
_KERNEL = re.compile(r"^(kworker|ksoftirqd|rcu_|migration|kcompactd|kswapd|khugepaged|"
                     r"jbd2|kthreadd|watchdog|cpuhp|irq/|kblockd|writeback|oom_reaper|idle_inject)")

CATEGORIES = ("server", "harness", "other", "kernel", "idle")


@dataclass(frozen=True)
class ThreadSched:
    tid: int
    comm: str
    run_s: float
    wait_s: float  # runnable (preempted, or woken) but not on a CPU
    sleep_s: float  # interruptible sleep (waiting for work, a lock, a socket)
    blocked_s: float  # uninterruptible (D): disk I/O, page faults
    switches_in: int
    preempted: int  # switched out while still runnable (involuntary)


@dataclass(frozen=True)
class SchedReport:
    """One window's scheduling, for the server's threads and its CPUs."""

    window_s: float
    cpus: tuple[int, ...]
    threads: tuple[ThreadSched, ...]  # the server's threads, busiest first
    #: who held the server's CPUs while a server thread was runnable (s, weighted by
    #: the number of waiting threads over the CPUs, so the values sum to the wait)
    displaced_by: tuple[tuple[str, float], ...]  # (category, s)
    displaced_top: tuple[tuple[str, float], ...]  # ("comm (pid)", s), largest first
    cpu_by_category: tuple[tuple[str, float], ...]  # CPU-s on the server's CPUs
    events: int
    notes: tuple[str, ...] = ()

    @property
    def run_s(self) -> float:
        return sum(t.run_s for t in self.threads)

    @property
    def wait_s(self) -> float:
        return sum(t.wait_s for t in self.threads)

    @property
    def blocked_s(self) -> float:
        return sum(t.blocked_s for t in self.threads)

    @property
    def wait_per_run(self) -> float:
        """Seconds runnable-but-waiting per second on a CPU (schedstat's run_delay ratio)."""
        return self.wait_s / self.run_s if self.run_s > 0 else 0.0

    @property
    def server_cores(self) -> float:
        return self.run_s / self.window_s if self.window_s > 0 else 0.0

    def displaced_share(self, *cats: str) -> float:
        total = sum(s for _, s in self.displaced_by)
        return sum(s for c, s in self.displaced_by if c in cats) / total if total > 0 else 0.0

    @property
    def busiest_thread_cores(self) -> float:
        return max((t.run_s for t in self.threads), default=0.0) / self.window_s \
            if self.window_s > 0 else 0.0

    def table(self, n: int = 8) -> list[dict[str, Any]]:
        """The per-thread wait breakdown, busiest threads first (report rows)."""
        return [{"tid": t.tid, "comm": t.comm, "run_s": round(t.run_s, 4),
                 "runnable_wait_s": round(t.wait_s, 4), "blocked_io_s": round(t.blocked_s, 4),
                 "sleep_s": round(t.sleep_s, 4), "preempted": t.preempted}
                for t in self.threads[:n]]

    def as_dict(self) -> dict[str, Any]:
        return {
            "window_s": round(self.window_s, 6), "cpus": list(self.cpus),
            "server_run_s": round(self.run_s, 6), "server_wait_s": round(self.wait_s, 6),
            "server_blocked_s": round(self.blocked_s, 6),
            "wait_per_run": round(self.wait_per_run, 4),
            "server_cores": round(self.server_cores, 4),
            "displaced_by": {c: round(s, 6) for c, s in self.displaced_by},
            "displaced_top": [[k, round(s, 6)] for k, s in self.displaced_top],
            "cpu_by_category": {c: round(s, 6) for c, s in self.cpu_by_category},
            "threads": self.table(64), "events": self.events, "notes": list(self.notes),
        }


def _state(prev_state: str) -> str:
    if prev_state.startswith("R"):
        return "wait"
    if "D" in prev_state:
        return "blocked"
    return "sleep"


def read(lines: Iterable[str], meta: dict[str, Any], window_ns: tuple[int, int]) -> SchedReport:
    """The scheduling of the server's threads over ``window_ns`` (monotonic ns)."""
    server_pids = {int(p) for p in meta.get("server_pids") or [meta["server_pid"]]}
    harness_pid = int(meta.get("harness_pid") or -1)
    server_tids = {int(t) for t in meta.get("server_threads", {})}
    harness_tids = {int(t) for t in meta.get("harness_threads", {})}
    cpus = tuple(int(c) for c in meta.get("cpus") or ())
    w0, w1 = window_ns

    events: list[tuple[TraceEvent, re.Match]] = []
    tgid_of: dict[int, int] = {}
    comm_of: dict[int, str] = {int(k): v for k, v in meta.get("server_threads", {}).items()}
    for ev in parse(lines, EVENTS):
        if ev.tgid is not None:
            tgid_of.setdefault(ev.tid, ev.tgid)
        if ev.event == "sched_switch":
            m = _SWITCH.match(ev.body)
        elif ev.event in ("sched_wakeup", "sched_wakeup_new"):
            m = _WAKE.match(ev.body)
        else:
            continue
        if m is not None:
            events.append((ev, m))
    for tid, tg in tgid_of.items():
        if tg in server_pids:
            server_tids.add(tid)

    def is_server(tid: int) -> bool:
        return tid in server_tids or tgid_of.get(tid) in server_pids

    def category(tid: int, comm: str) -> str:
        if tid < 0:  # a CPU that switched no task in the whole trace
            return "unknown"
        if tid == 0:
            return "idle"
        if is_server(tid):
            return "server"
        if tid in harness_tids or tgid_of.get(tid) == harness_pid:
            return "harness"
        if _KERNEL.match(comm):
            return "kernel"
        return "other"

    if not cpus:
        cpus = tuple(sorted({ev.cpu for ev, _ in events}))
    notes: list[str] = []
    if not events:
        return SchedReport((w1 - w0) / 1e9, cpus, (), (), (), (), 0,
                           ("no scheduling events in the window",))

    # Initial state: each CPU's first switch names who held it since the trace began;
    # each server thread's first event says whether it was running, runnable or asleep.
    occupant: dict[int, int] = {}
    first: dict[int, str] = {}
    for ev, m in events:
        if ev.event == "sched_switch":
            occupant.setdefault(ev.cpu, int(m["pp"]))
            comm_of.setdefault(int(m["pp"]), m["pc"])
            comm_of.setdefault(int(m["np"]), m["nc"])
            for tid, st in ((int(m["pp"]), "run"), (int(m["np"]), "wait")):
                if is_server(tid):
                    first.setdefault(tid, st)
        else:
            tid = int(m["p"])
            comm_of.setdefault(tid, m["c"])
            if is_server(tid):
                first.setdefault(tid, "sleep")
    t_start = min(int(meta.get("start_mono_ns") or events[0][0].t_ns), events[0][0].t_ns)
    state: dict[int, str] = dict(first)
    since: dict[int, int] = dict.fromkeys(first, t_start)
    acc: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    switches_in: dict[int, int] = defaultdict(int)
    preempted: dict[int, int] = defaultdict(int)
    waiting = sum(1 for s in state.values() if s == "wait")
    cpu_time: dict[int, float] = defaultdict(float)  # occupant tid -> CPU-s (server CPUs)
    displaced: dict[int, float] = defaultdict(float)
    cpuset = set(cpus)
    t_prev = t_start

    def clip(a: int, b: int) -> float:
        return max(0, min(b, w1) - max(a, w0)) / 1e9

    def advance(t: int) -> None:
        nonlocal t_prev
        dt = clip(t_prev, t)
        if dt > 0:
            for c in cpus:
                occ = occupant.get(c, -1)
                cpu_time[occ] += dt
                if waiting:
                    displaced[occ] += dt * waiting / len(cpus)
        t_prev = t

    def move(tid: int, new: str, t: int) -> None:
        nonlocal waiting
        old = state.get(tid)
        if old is not None:
            acc[tid][old] += clip(since[tid], t)
        waiting += (new == "wait") - (old == "wait")
        state[tid], since[tid] = new, t

    for ev, m in events:
        t = ev.t_ns
        if t > w1 and t_prev >= w1:
            break
        advance(t)
        if ev.event == "sched_switch":
            prev, nxt = int(m["pp"]), int(m["np"])
            if ev.cpu in cpuset:
                occupant[ev.cpu] = nxt
            if is_server(prev):
                new = _state(m["ps"])
                move(prev, new, t)
                if new == "wait" and w0 <= t <= w1:
                    preempted[prev] += 1
            if is_server(nxt):
                move(nxt, "run", t)
                if w0 <= t <= w1:
                    switches_in[nxt] += 1
        else:
            tid = int(m["p"])
            if is_server(tid) and state.get(tid) in (None, "sleep", "blocked"):
                move(tid, "wait", t)
    # The capture's own end (meta) when known: a quiet CPU writes no event near the end.
    t_end = max(int(meta.get("end_mono_ns") or 0), events[-1][0].t_ns, t_prev)
    advance(t_end)
    for tid in list(state):
        move(tid, state[tid], t_end)
    if t_end < w1:
        notes.append(f"trace ends {(w1 - t_end) / 1e9:.3f} s before the window does")
    if meta.get("overruns"):
        notes.append(f"{meta['overruns']} events were lost to a full trace buffer: the "
                     "per-thread times are incomplete")
    silent = sorted(t for t in server_tids if t not in first)
    if silent:
        notes.append(f"{len(silent)} server threads had no scheduling event in the trace "
                     "(asleep throughout)")

    threads = [ThreadSched(tid, comm_of.get(tid, "?"), a["run"], a["wait"], a["sleep"],
                           a["blocked"], switches_in[tid], preempted[tid])
               for tid, a in acc.items()]
    threads.sort(key=lambda x: (-x.run_s, x.tid))
    by_cat: dict[str, float] = defaultdict(float)
    cpu_cat: dict[str, float] = defaultdict(float)
    top: dict[str, float] = defaultdict(float)
    for tid, s in displaced.items():
        cat = category(tid, comm_of.get(tid, ""))
        by_cat[cat] += s
        if cat not in ("idle", "unknown"):
            top[f"{comm_of.get(tid, '?')} ({tgid_of.get(tid, tid)})" if cat != "server"
                else "server threads"] += s
    for tid, s in cpu_time.items():
        cpu_cat[category(tid, comm_of.get(tid, ""))] += s
    order = {c: i for i, c in enumerate(CATEGORIES)}
    return SchedReport(
        window_s=(w1 - w0) / 1e9, cpus=cpus, threads=tuple(threads),
        displaced_by=tuple(sorted(by_cat.items(), key=lambda kv: order.get(kv[0], 9))),
        displaced_top=tuple(sorted(top.items(), key=lambda kv: -kv[1])[:8]),
        cpu_by_category=tuple(sorted(cpu_cat.items(), key=lambda kv: order.get(kv[0], 9))),
        events=len(events), notes=tuple(notes))

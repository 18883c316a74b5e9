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


@dataclass
class _Tasks:
    """Who is who in the trace: the server's and the harness's processes and threads, and
    each thread's process and name as the trace and the capture's meta name them."""

    server_pids: set[int]
    harness_pid: int
    server_tids: set[int]
    harness_tids: set[int]
    tgid_of: dict[int, int]
    comm_of: dict[int, str]

    @classmethod
    def of(cls, meta: dict[str, Any]) -> _Tasks:
        return cls(
            server_pids={int(p) for p in meta.get("server_pids") or [meta["server_pid"]]},
            harness_pid=int(meta.get("harness_pid") or -1),
            server_tids={int(t) for t in meta.get("server_threads", {})},
            harness_tids={int(t) for t in meta.get("harness_threads", {})},
            tgid_of={},
            comm_of={int(k): v for k, v in meta.get("server_threads", {}).items()})

    def is_server(self, tid: int) -> bool:
        return tid in self.server_tids or self.tgid_of.get(tid) in self.server_pids

    def category(self, tid: int, comm: str) -> str:
        if tid < 0:  # a CPU that switched no task in the whole trace
            return "unknown"
        if tid == 0:
            return "idle"
        if self.is_server(tid):
            return "server"
        if tid in self.harness_tids or self.tgid_of.get(tid) == self.harness_pid:
            return "harness"
        if _KERNEL.match(comm):
            return "kernel"
        return "other"


def _events(lines: Iterable[str], tasks: _Tasks) -> list[tuple[TraceEvent, re.Match]]:
    """The scheduling events that parse, in order; each thread's process learned on the
    way (a thread of a server process is a server thread)."""
    events: list[tuple[TraceEvent, re.Match]] = []
    for ev in parse(lines, EVENTS):
        if ev.tgid is not None:
            tasks.tgid_of.setdefault(ev.tid, ev.tgid)
        if ev.event == "sched_switch":
            m = _SWITCH.match(ev.body)
        elif ev.event in ("sched_wakeup", "sched_wakeup_new"):
            m = _WAKE.match(ev.body)
        else:
            continue
        if m is not None:
            events.append((ev, m))
    for tid, tg in tasks.tgid_of.items():
        if tg in tasks.server_pids:
            tasks.server_tids.add(tid)
    return events


def _initial(events: list[tuple[TraceEvent, re.Match]], tasks: _Tasks
             ) -> tuple[dict[int, int], dict[int, str]]:
    """Each CPU's first switch names who held it since the trace began; each server
    thread's first event says whether it was running, runnable or asleep."""
    occupant: dict[int, int] = {}
    first: dict[int, str] = {}
    for ev, m in events:
        if ev.event == "sched_switch":
            occupant.setdefault(ev.cpu, int(m["pp"]))
            tasks.comm_of.setdefault(int(m["pp"]), m["pc"])
            tasks.comm_of.setdefault(int(m["np"]), m["nc"])
            for tid, st in ((int(m["pp"]), "run"), (int(m["np"]), "wait")):
                if tasks.is_server(tid):
                    first.setdefault(tid, st)
        else:
            tid = int(m["p"])
            tasks.comm_of.setdefault(tid, m["c"])
            if tasks.is_server(tid):
                first.setdefault(tid, "sleep")
    return occupant, first


class _Replay:
    """The trace replayed in time order: each server thread's state and the time it spent
    in each, clipped to the window, and who held the server's CPUs meanwhile."""

    def __init__(self, tasks: _Tasks, cpus: tuple[int, ...], window_ns: tuple[int, int],
                 occupant: dict[int, int], first: dict[int, str], t_start: int) -> None:
        self.tasks, self.cpus, self.cpuset = tasks, cpus, set(cpus)
        self.w0, self.w1 = window_ns
        self.occupant = occupant
        self.state: dict[int, str] = dict(first)
        self.since: dict[int, int] = dict.fromkeys(first, t_start)
        self.acc: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.switches_in: dict[int, int] = defaultdict(int)
        self.preempted: dict[int, int] = defaultdict(int)
        self.waiting = sum(1 for s in self.state.values() if s == "wait")
        self.cpu_time: dict[int, float] = defaultdict(float)  # occupant -> CPU-s (server CPUs)
        self.displaced: dict[int, float] = defaultdict(float)
        self.t_prev = t_start

    def clip(self, a: int, b: int) -> float:
        return max(0, min(b, self.w1) - max(a, self.w0)) / 1e9

    def advance(self, t: int) -> None:
        dt = self.clip(self.t_prev, t)
        if dt > 0:
            for c in self.cpus:
                occ = self.occupant.get(c, -1)
                self.cpu_time[occ] += dt
                if self.waiting:
                    self.displaced[occ] += dt * self.waiting / len(self.cpus)
        self.t_prev = t

    def move(self, tid: int, new: str, t: int) -> None:
        old = self.state.get(tid)
        if old is not None:
            self.acc[tid][old] += self.clip(self.since[tid], t)
        self.waiting += (new == "wait") - (old == "wait")
        self.state[tid], self.since[tid] = new, t

    def run(self, events: list[tuple[TraceEvent, re.Match]]) -> None:
        is_server, w0, w1 = self.tasks.is_server, self.w0, self.w1
        for ev, m in events:
            t = ev.t_ns
            if t > w1 and self.t_prev >= w1:
                break
            self.advance(t)
            if ev.event == "sched_switch":
                prev, nxt = int(m["pp"]), int(m["np"])
                if ev.cpu in self.cpuset:
                    self.occupant[ev.cpu] = nxt
                if is_server(prev):
                    new = _state(m["ps"])
                    self.move(prev, new, t)
                    if new == "wait" and w0 <= t <= w1:
                        self.preempted[prev] += 1
                if is_server(nxt):
                    self.move(nxt, "run", t)
                    if w0 <= t <= w1:
                        self.switches_in[nxt] += 1
            else:
                tid = int(m["p"])
                if is_server(tid) and self.state.get(tid) in (None, "sleep", "blocked"):
                    self.move(tid, "wait", t)

    def end(self, t_end: int) -> None:
        """Every thread's last state counted up to the capture's end."""
        self.advance(t_end)
        for tid in list(self.state):
            self.move(tid, self.state[tid], t_end)


def _notes(meta: dict[str, Any], t_end: int, w1: int, silent: list[int]) -> list[str]:
    notes: list[str] = []
    if t_end < w1:
        notes.append(f"trace ends {(w1 - t_end) / 1e9:.3f} s before the window does")
    if meta.get("overruns"):
        notes.append(f"{meta['overruns']} events were lost to a full trace buffer: the "
                     "per-thread times are incomplete")
    if silent:
        notes.append(f"{len(silent)} server threads had no scheduling event in the trace "
                     "(asleep throughout)")
    return notes


def _report(r: _Replay, window_ns: tuple[int, int], cpus: tuple[int, ...], n_events: int,
            notes: list[str]) -> SchedReport:
    """The replay's sums: per thread, and the displacing and CPU time by category."""
    tasks, (w0, w1) = r.tasks, window_ns
    comm_of, tgid_of = tasks.comm_of, tasks.tgid_of
    threads = [ThreadSched(tid, comm_of.get(tid, "?"), a["run"], a["wait"], a["sleep"],
                           a["blocked"], r.switches_in[tid], r.preempted[tid])
               for tid, a in r.acc.items()]
    threads.sort(key=lambda x: (-x.run_s, x.tid))
    by_cat: dict[str, float] = defaultdict(float)
    cpu_cat: dict[str, float] = defaultdict(float)
    top: dict[str, float] = defaultdict(float)
    for tid, s in r.displaced.items():
        cat = tasks.category(tid, comm_of.get(tid, ""))
        by_cat[cat] += s
        if cat not in ("idle", "unknown"):
            top[f"{comm_of.get(tid, '?')} ({tgid_of.get(tid, tid)})" if cat != "server"
                else "server threads"] += s
    for tid, s in r.cpu_time.items():
        cpu_cat[tasks.category(tid, comm_of.get(tid, ""))] += s
    order = {c: i for i, c in enumerate(CATEGORIES)}
    return SchedReport(
        window_s=(w1 - w0) / 1e9, cpus=cpus, threads=tuple(threads),
        displaced_by=tuple(sorted(by_cat.items(), key=lambda kv: order.get(kv[0], 9))),
        displaced_top=tuple(sorted(top.items(), key=lambda kv: -kv[1])[:8]),
        cpu_by_category=tuple(sorted(cpu_cat.items(), key=lambda kv: order.get(kv[0], 9))),
        events=n_events, notes=tuple(notes))


def read(lines: Iterable[str], meta: dict[str, Any], window_ns: tuple[int, int]) -> SchedReport:
    """The scheduling of the server's threads over ``window_ns`` (monotonic ns)."""
    tasks = _Tasks.of(meta)
    cpus = tuple(int(c) for c in meta.get("cpus") or ())
    w0, w1 = window_ns
    events = _events(lines, tasks)
    if not cpus:
        cpus = tuple(sorted({ev.cpu for ev, _ in events}))
    if not events:
        return SchedReport((w1 - w0) / 1e9, cpus, (), (), (), (), 0,
                           ("no scheduling events in the window",))
    occupant, first = _initial(events, tasks)
    t_start = min(int(meta.get("start_mono_ns") or events[0][0].t_ns), events[0][0].t_ns)
    replay = _Replay(tasks, cpus, window_ns, occupant, first, t_start)
    replay.run(events)
    # The capture's own end (meta) when known: a quiet CPU writes no event near the end.
    t_end = max(int(meta.get("end_mono_ns") or 0), events[-1][0].t_ns, replay.t_prev)
    replay.end(t_end)
    silent = sorted(t for t in tasks.server_tids if t not in first)
    return _report(replay, window_ns, cpus, len(events), _notes(meta, t_end, w1, silent))

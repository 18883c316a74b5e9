"""The server's process tree: CPU, threads, faults, I/O, RSS, context switches, run delay.

Emits, per tracked PID (device ``pid<N>``, at most ``max_pids``) and summed over
the tree (device ``""``):

* counters: ``cpu_user_s``, ``cpu_system_s``, ``minor_faults``, ``major_faults``,
  ``read_bytes``, ``write_bytes``, ``rchar``, ``wchar``, ``ctx_voluntary``,
  ``ctx_involuntary``, ``run_delay_s`` (time runnable but waiting for a CPU);
* gauges: ``rss_bytes``, ``num_threads`` and, for the tree, ``nprocs``,
  ``top_thread_cpu_frac`` (busiest thread's share of one core since the last
  tick: one saturated scheduler thread shows as ~1.0 while the process total
  looks modest) and ``top_thread_tid``.

Per thread (device ``tid<N>``), only the ``top_threads`` busiest of each tick:
counters ``cpu_s``, ``run_delay_s`` and gauge ``cpu_frac``.

Tree sums stay monotonic: the last values of a process or thread that exits
are kept in a base that is added to later sums. Context switches and run delay
are summed over threads because /proc/PID/status and /proc/PID/schedstat only
describe the main thread.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .. import procfs
from ..procfs import PreadFile, parse_ctx_switches, parse_kv, parse_schedstat, parse_stat
from ..redact import redact
from ..targets import ProcessTargets
from .base import Collector, Emit, Unavailable

if TYPE_CHECKING:
    import argparse

_TICK = float(procfs.CLK_TCK)
COUNTERS = (
    "cpu_user_s",
    "cpu_system_s",
    "minor_faults",
    "major_faults",
    "read_bytes",
    "write_bytes",
    "rchar",
    "wchar",
    "ctx_voluntary",
    "ctx_involuntary",
    "run_delay_s",
)
_IO_KEYS = ("read_bytes", "write_bytes", "rchar", "wchar")


class _Task:
    __slots__ = (
        "announced",
        "comm",
        "cpu_s",
        "invol",
        "prev_cpu_s",
        "run_delay_s",
        "sched",
        "stat",
        "status",
        "tid",
        "vol",
    )

    def __init__(self, pid: int, tid: int) -> None:
        base = f"{procfs.PROC}/{pid}/task/{tid}"
        self.tid = tid
        self.stat = PreadFile(base + "/stat", 4096)
        self.sched = PreadFile(base + "/schedstat", 256)
        self.status = PreadFile(base + "/status", 8192)
        self.comm = ""
        self.cpu_s = self.prev_cpu_s = -1.0
        self.run_delay_s = 0.0
        self.vol = self.invol = 0
        self.announced = False

    def read(self) -> bool:
        data = self.stat.read()
        if data is None:
            return False
        # Per-thread hot path: only utime+stime (fields 14, 15) and the name.
        rpar = data.rfind(b")")
        f = data[rpar + 2 :].split(None, 13)
        if not self.comm:
            self.comm = data[data.find(b"(") + 1 : rpar].decode(errors="replace")
        self.prev_cpu_s = self.cpu_s
        self.cpu_s = (int(f[11]) + int(f[12])) / _TICK
        sched = self.sched.read()
        if sched:
            self.run_delay_s = parse_schedstat(sched)[1] / 1e9
        status = self.status.read()
        if status:
            self.vol, self.invol = parse_ctx_switches(status)
        return True

    def close(self) -> None:
        self.stat.close()
        self.sched.close()
        self.status.close()


class _Proc:
    __slots__ = ("announced", "io", "io_denied", "last", "pid", "stat", "tasks", "thread_base")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stat = PreadFile(f"{procfs.PROC}/{pid}/stat", 4096)
        self.io = PreadFile(f"{procfs.PROC}/{pid}/io", 1024)
        self.io_denied = False
        self.tasks: dict[int, _Task] = {}
        # run delay and context switches of threads that have exited
        self.thread_base = {"run_delay_s": 0.0, "ctx_voluntary": 0, "ctx_involuntary": 0}
        self.last: dict[str, float] = {}
        self.announced = False

    def rescan_tasks(self) -> None:
        try:
            tids = {int(t) for t in _listdir(f"{procfs.PROC}/{self.pid}/task")}
        except OSError:
            return
        for tid in list(self.tasks):
            if tid not in tids:
                self._retire(self.tasks.pop(tid))
        for tid in tids - self.tasks.keys():
            self.tasks[tid] = _Task(self.pid, tid)

    def _retire(self, task: _Task) -> None:
        self.thread_base["run_delay_s"] += task.run_delay_s
        self.thread_base["ctx_voluntary"] += task.vol
        self.thread_base["ctx_involuntary"] += task.invol
        task.close()

    def close(self) -> None:
        self.stat.close()
        self.io.close()
        for t in self.tasks.values():
            t.close()
        self.tasks.clear()


def _listdir(path: str) -> list[str]:
    import os

    return os.listdir(path)


class ProcCollector(Collector):
    source = "proc"
    follows_targets = True

    def __init__(
        self,
        targets: ProcessTargets,
        top_threads: int = 8,
        max_pids: int = 64,
        threads: bool = True,
    ) -> None:
        super().__init__()
        self.targets = targets
        self.top_threads = top_threads
        self.max_pids = max_pids
        self.threads = threads
        self._procs: dict[int, _Proc] = {}
        self._exited: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self._generation = -1
        self._last_mono: float | None = None
        self._next_task_scan = 0.0

    def probe(self) -> None:
        try:
            self.targets.probe()
        except ValueError as e:
            raise Unavailable(str(e)) from None
        for name, argv in self.targets.commands:
            self.record_command(name, argv)
        self.targets.commands.clear()
        if not self.targets.tree:
            self.info(
                kind="waiting",
                source=self.source,
                detail=f"no process matches {self.targets.describe()} yet",
            )

    def set_pids(self, pids: list[int]) -> None:
        self.targets.set_pids(pids)

    def _sync(self) -> None:
        want = set(self.targets.tree)
        for pid in list(self._procs):
            if pid not in want:
                self._retire(self._procs.pop(pid))
        for pid in self.targets.tree:
            if pid not in self._procs:
                proc = _Proc(pid)
                if self.threads:
                    proc.rescan_tasks()
                self._procs[pid] = proc
        self._generation = self.targets.generation

    def _retire(self, proc: _Proc) -> None:
        for k, v in proc.last.items():
            self._exited[k] += v
        proc.close()

    def close(self) -> None:
        for p in self._procs.values():
            p.close()
        self._procs.clear()

    def sample(self, wall_ns: int) -> list[Emit]:
        now = time.monotonic()
        dt = (now - self._last_mono) if self._last_mono is not None else 0.0
        self._last_mono = now
        changed = self.targets.refresh(now)
        if changed or self._generation != self.targets.generation:
            self._sync()
        elif self.threads and now >= self._next_task_scan:
            self._next_task_scan = now + self.targets.rescan_s
            for proc in self._procs.values():
                proc.rescan_tasks()
        if self.targets.last_error:
            self.mark_unavailable("targets", self.targets.last_error)

        out: list[Emit] = []
        total = dict(self._exited)
        rss = 0
        nthreads = 0
        busiest: list[tuple[float, _Task, int]] = []
        gone: list[int] = []
        emitted_pids = 0
        for pid, proc in self._procs.items():
            data = proc.stat.read()
            st = parse_stat(data) if data is not None else None
            if st is None or st.state in ("Z", "X"):
                # gone, or a zombie whose counters already read as zero: keep its
                # last values in the sums from this tick on
                gone.append(pid)
                continue
            c = {
                "cpu_user_s": st.utime_s,
                "cpu_system_s": st.stime_s,
                "minor_faults": st.minflt,
                "major_faults": st.majflt,
            }
            if not proc.io_denied:
                io = proc.io.read()
                if io is None:
                    proc.io_denied = True
                    self.mark_unavailable(
                        f"pid{pid}/read_bytes", f"/proc/{pid}/io: {proc.io.error}"
                    )
                else:
                    kv = parse_kv(io)
                    for name in _IO_KEYS:
                        c[name] = kv.get(name, 0)
            if self.threads:
                rd = proc.thread_base["run_delay_s"]
                vol = proc.thread_base["ctx_voluntary"]
                invol = proc.thread_base["ctx_involuntary"]
                dead = []
                for tid, task in proc.tasks.items():
                    if not task.read():
                        dead.append(tid)
                        continue
                    rd += task.run_delay_s
                    vol += task.vol
                    invol += task.invol
                    if dt > 0 and task.prev_cpu_s >= 0:
                        d = task.cpu_s - task.prev_cpu_s
                        if d > 0:
                            busiest.append((d, task, pid))
                for tid in dead:
                    proc._retire(proc.tasks.pop(tid))
                c["run_delay_s"] = rd
                c["ctx_voluntary"] = vol
                c["ctx_involuntary"] = invol
            for k, v in proc.last.items():  # never step a counter back (a racing read)
                if c.get(k, v) < v:
                    c[k] = v
            proc.last = c
            for k, v in c.items():
                total[k] += v
            rss += st.rss_bytes
            nthreads += st.num_threads
            if emitted_pids < self.max_pids:
                emitted_pids += 1
                dev = f"pid{pid}"
                if not proc.announced:
                    proc.announced = True
                    self.info(
                        kind="device",
                        source=self.source,
                        device=dev,
                        comm=st.comm,
                        ppid=st.ppid,
                        cmdline=redact(procfs.cmdline(pid) or "")[:2000],
                    )
                for k, v in c.items():
                    out.append((wall_ns, dev, k, v, "counter"))
                out.append((wall_ns, dev, "rss_bytes", st.rss_bytes, "gauge"))
                out.append((wall_ns, dev, "num_threads", st.num_threads, "gauge"))
        for pid in gone:
            proc = self._procs.pop(pid)
            for k, v in proc.last.items():
                total[k] += v
            self._retire(proc)

        if self._procs or any(self._exited.values()):  # no fake zeros before the server exists
            for k in COUNTERS:
                if k in ("run_delay_s", "ctx_voluntary", "ctx_involuntary") and not self.threads:
                    continue
                out.append((wall_ns, "", k, total[k], "counter"))
            out.append((wall_ns, "", "rss_bytes", rss, "gauge"))
            out.append((wall_ns, "", "num_threads", nthreads, "gauge"))
            out.append((wall_ns, "", "nprocs", len(self._procs), "gauge"))
            if self.threads and dt > 0:
                busiest.sort(key=lambda x: x[0], reverse=True)
                top = busiest[0] if busiest else None
                out.append(
                    (wall_ns, "", "top_thread_cpu_frac", top[0] / dt if top else 0.0, "gauge")
                )
                out.append((wall_ns, "", "top_thread_tid", top[1].tid if top else 0, "gauge"))
                for d, task, pid in busiest[: self.top_threads]:
                    dev = f"tid{task.tid}"
                    if not task.announced:
                        task.announced = True
                        self.info(
                            kind="device", source=self.source, device=dev, pid=pid, comm=task.comm
                        )
                    out.append((wall_ns, dev, "cpu_s", task.cpu_s, "counter"))
                    out.append((wall_ns, dev, "run_delay_s", task.run_delay_s, "counter"))
                    out.append((wall_ns, dev, "cpu_frac", d / dt, "gauge"))
        return out


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory (``registry.py``): the agent's options -> this collector."""
    return ProcCollector(targets, top_threads=args.top_threads, threads=not args.no_threads)

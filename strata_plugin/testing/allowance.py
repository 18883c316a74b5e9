"""Faults on the server's CPU allowance: fewer CPUs than busy threads, and a foreign busy
process on the only CPU it may use (issue 30).

Why: a server whose threads may run on fewer CPUs than it keeps busy (a pod whose cpuset
is smaller than the engine's thread count, a ``taskset`` pin) spends its time runnable
and waiting for its own other threads, on a host that may be idle; the host-wide CPU
rules cannot see it. Each injector here makes one such allowance real:

* :class:`ServerAffinity` - ``sched_setaffinity`` on every thread of the server's process
  tree (what ``taskset -a -p`` does), each thread's own mask restored on ``stop()``;
* :class:`ServerCpuset` - a cgroup v1 cpuset of its own (``cpuset.cpus``,
  ``cpuset.mems`` copied from the server's), the server's processes moved in (the kernel
  then sets every task's mask to the set: Linux admin-guide/cgroup-v1/cpusets.rst, 1.4
  "each task's cpus_allowed is ... restricted to the CPUs in its cpuset") and back on
  ``stop()``, then each thread's own mask restored (moving back gives them the parent
  set's CPUs, not the mask they had) and the cgroup removed;
* :class:`PinnedHog` - the server cut to one CPU by either of the above, and busy
  processes (``faults.CpuHogs``) pinned to that same CPU: a foreign process on the
  server's only allowed CPU (``cpu_contention``; the allowance is part of it).

Either allowance is set in ``start()`` (before a case) or, with ``at_s``, ``start()`` arms
a timer and returns, and the allowance changes ``at_s`` later, during the case; the
facts say when (``switched_at_ns``, CLOCK_MONOTONIC, the clock of a case's window).

Facts (ground truth, measured apart from the agent): the CPUs of the allowance, the
server's thread count when it was set, the masks its threads really had just before it
was undone (``masks_seen``: the allowance held), whether every thread got its own mask
back (``restored``), and from the kernel's per-thread schedstat over the time the
allowance held: the server's CPU use (``run_cores``), its threads' run-queue wait per
second (``wait_per_s``) and their sum, the mean number of runnable threads
(``runnable_threads``: running or waiting for a CPU), against ``len(cpus)`` CPUs.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

from strata_plugin.testing.faults import (
    CpuHogs,
    FaultUnavailable,
    Injector,
    _rmdir_cgroup,
    sched_s,
    sweep_cgroups,
    tree_threads,
)

CPUSET_PREFIX = "strata-cpuset-"


def _tids(pid: int) -> list[int]:
    return [t for ts in tree_threads(pid).values() for t in ts]


def masks(pid: int) -> dict[int, frozenset[int]]:
    """Every thread's CPU affinity mask in the server's tree."""
    out = {}
    for tid in _tids(pid):
        with contextlib.suppress(OSError):
            out[tid] = frozenset(os.sched_getaffinity(tid))
    return out


def _cpulist(cpus: frozenset[int] | set[int] | tuple[int, ...]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


class _Allowance(Injector):
    """Shared bookkeeping: the saved masks, the switch (now or at ``at_s``), the facts."""

    expected_class = "cpu_limited"
    mechanism = ""

    def __init__(self, pid: int, cpus: tuple[int, ...], at_s: float = 0.0) -> None:
        super().__init__()
        if not cpus:
            raise ValueError("an allowance needs at least one CPU")
        if at_s < 0:
            raise ValueError("at_s is an offset in seconds >= 0")
        self.pid, self.cpus, self.at_s = pid, tuple(sorted(set(cpus))), at_s
        self.saved: dict[int, frozenset[int]] = {}
        self._timer: threading.Timer | None = None
        self._switch_lock = threading.Lock()
        self._switched_ns: int | None = None
        self._closed = False  # stop() has begun: a late timer must not switch
        self._threads_at_switch = 0
        self._sched0: tuple[float, float] = (0.0, 0.0)
        self.switch_error = ""

    def _start(self) -> None:
        try:
            allowed = frozenset(os.sched_getaffinity(self.pid))
        except OSError as exc:
            raise FaultUnavailable(f"cannot read the server's affinity: {exc}") from None
        if not set(self.cpus) < allowed:
            raise FaultUnavailable(f"the allowance {_cpulist(self.cpus)} is not a strict "
                                   f"subset of the server's CPUs {_cpulist(allowed)}")
        self._prepare()
        if self.at_s == 0:
            self._switch()
            if self.switch_error:
                raise FaultUnavailable(self.switch_error)
        else:
            self._timer = threading.Timer(self.at_s, self._switch)
            self._timer.daemon = True
            self._timer.start()

    def _switch(self) -> None:
        with self._switch_lock:
            if self._switched_ns is not None or self._closed:
                return
            self.saved = masks(self.pid)
            self._sched0 = sched_s(self.pid)
            try:
                self._apply()
            except (OSError, FaultUnavailable) as exc:
                self.switch_error = f"{type(exc).__name__}: {exc}"
                return
            self._switched_ns = time.monotonic_ns()
            self._threads_at_switch = len(self.saved)

    def _stop(self) -> dict[str, Any]:
        if self._timer is not None:
            self._timer.cancel()
        with self._switch_lock:
            self._closed = True
            out: dict[str, Any] = {"mechanism": self.mechanism, "cpus": list(self.cpus),
                                   "allowed_cpus": len(self.cpus), "at_s": self.at_s,
                                   "switched_at_ns": self._switched_ns,
                                   "threads": self._threads_at_switch}
            if self.switch_error:
                out["switch_error"] = self.switch_error
            if self._switched_ns is not None:
                held_s = (time.monotonic_ns() - self._switched_ns) / 1e9
                seen = masks(self.pid)
                run1, wait1 = sched_s(self.pid)
                run, wait = run1 - self._sched0[0], wait1 - self._sched0[1]
                out.update({
                    "held_s": round(held_s, 3),
                    "masks_seen": sorted({_cpulist(m) for m in seen.values()}),
                    "run_cores": round(run / max(held_s, 1e-9), 3),
                    "wait_per_s": round(wait / max(held_s, 1e-9), 3),
                    "runnable_threads": round((run + wait) / max(held_s, 1e-9), 3),
                })
            out.update(self._undo())
            if self._switched_ns is not None:
                out["restored"] = self._restore_masks()
            return out

    def _restore_masks(self) -> bool:
        """Every thread back to the mask it had (threads born since: their process's
        main thread's); True when each one reads back as saved."""
        ok = True
        procs = tree_threads(self.pid)
        fallback = frozenset().union(*self.saved.values()) if self.saved else frozenset()
        for p, tids in procs.items():
            for tid in tids:
                want = self.saved.get(tid, self.saved.get(p, fallback))
                if not want:
                    continue
                try:
                    os.sched_setaffinity(tid, want)
                    ok &= frozenset(os.sched_getaffinity(tid)) == want
                except OSError:
                    continue  # a thread that just ended
        return ok

    # subclasses
    def _prepare(self) -> None:
        pass

    def _apply(self) -> None:
        raise NotImplementedError

    def _undo(self) -> dict[str, Any]:
        return {}


class ServerAffinity(_Allowance):
    """Every thread of the server's tree pinned to ``cpus`` (sched_setaffinity)."""

    name = "server_affinity"
    mechanism = "affinity"

    def _apply(self) -> None:
        want = set(self.cpus)
        done: set[int] = set()
        for _ in range(3):  # threads born while we set: they inherit their creator's mask
            todo = [t for t in _tids(self.pid) if t not in done]
            if not todo:
                break
            for tid in todo:
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(tid, want)
                done.add(tid)


def cpuset_root() -> Path:
    """The cgroup v1 cpuset hierarchy's mount point, or FaultUnavailable."""
    for line in Path("/proc/mounts").read_text().splitlines():
        _dev, mnt, fstype, opts = line.split()[:4]
        if fstype == "cgroup" and "cpuset" in opts.split(","):
            return Path(mnt)
    raise FaultUnavailable("no cgroup v1 cpuset hierarchy mounted (a cgroup2-only host "
                           "would need +cpuset in the parent's subtree_control)")


def cpuset_home(pid: int, root: Path) -> Path:
    """The cpuset cgroup directory ``pid`` is in now."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if "cpuset" in ctrls.split(","):
            return root / path.lstrip("/")
    return root


class ServerCpuset(_Allowance):
    """The server's processes moved into a v1 cpuset of ``cpus`` of their own, and back."""

    name = "server_cpuset"
    mechanism = "cpuset"

    def __init__(self, pid: int, cpus: tuple[int, ...], at_s: float = 0.0) -> None:
        super().__init__(pid, cpus, at_s)
        self.dir: Path | None = None
        self.home: Path | None = None
        self.moved: list[int] = []

    def _prepare(self) -> None:
        root = cpuset_root()
        self.home = home = cpuset_home(self.pid, root)
        sweep_cgroups(home, CPUSET_PREFIX)
        d = home / f"{CPUSET_PREFIX}{os.getpid()}"
        try:
            d.mkdir(exist_ok=True)
            self.dir = d
            mems = (home / "cpuset.mems").read_text().strip() or \
                (home / "cpuset.effective_mems").read_text().strip()
            (d / "cpuset.mems").write_text(mems)
            (d / "cpuset.cpus").write_text(_cpulist(self.cpus))
        except OSError as exc:
            raise FaultUnavailable(f"cannot make a cpuset of CPUs {_cpulist(self.cpus)} "
                                   f"under {home}: {exc}") from None

    def _apply(self) -> None:
        assert self.dir is not None
        self.moved = list(tree_threads(self.pid))
        for p in self.moved:
            try:
                (self.dir / "cgroup.procs").write_text(str(p))
            except ProcessLookupError:
                continue
            except OSError as exc:
                raise FaultUnavailable(f"cannot move the server into {self.dir}: {exc}"
                                       ) from None

    def _members(self) -> list[int]:
        assert self.dir is not None
        with contextlib.suppress(OSError):
            return [int(x) for x in (self.dir / "cgroup.procs").read_text().split()]
        return []

    def _move_back(self) -> None:
        assert self.home is not None
        for p in self._members():
            with contextlib.suppress(OSError):  # a process that just ended
                (self.home / "cgroup.procs").write_text(str(p))

    def _undo(self) -> dict[str, Any]:
        if self.dir is None or self.home is None:
            return {}
        out: dict[str, Any] = {"cgroup": str(self.dir)}
        with contextlib.suppress(OSError):
            out["effective_cpus"] = (self.dir / "cpuset.effective_cpus").read_text().strip()
        out["members_at_stop"] = len(self._members())
        self._move_back()
        _rmdir_cgroup(self.dir, self._move_back)
        return out


class PinnedHog(Injector):
    """The server cut to one CPU (``mechanism`` "affinity" or "cpuset") and ``hogs`` busy
    processes pinned to that same CPU, all before the case."""

    name = "pinned_hog"
    expected_class = "cpu_contention"

    def __init__(self, pid: int, cpu: int, hogs: int = 1, mechanism: str = "affinity",
                 max_s: float = 300.0) -> None:
        super().__init__()
        kinds = {"affinity": ServerAffinity, "cpuset": ServerCpuset}
        if mechanism not in kinds:
            raise ValueError(f"mechanism is one of {sorted(kinds)}")
        self.pin: _Allowance = kinds[mechanism](pid, (cpu,))
        self.hog = CpuHogs((cpu,), per_core=hogs, max_s=max_s)

    def _start(self) -> None:
        self.pin.start()
        self.hog.start()

    def _stop(self) -> dict[str, Any]:
        hog = self.hog.stop().as_dict()  # each is idempotent, started or not
        pin = self.pin.stop().as_dict()
        return {**{f"hog_{k}" if not k.startswith("hog") else k: v for k, v in hog.items()
                   if k not in ("name", "expected_class")},
                **{f"pin_{k}": v for k, v in pin.items() if k not in ("name", "expected_class")}}

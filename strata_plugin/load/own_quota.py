"""Is the load generator throttled by its own cgroup's CPU quota?

A load generator in a container, a pod or a CPU-limited slice is held off the CPU by
its own quota, on a host that may be idle: the loop then runs late in bursts (up to
a quota period, 100 ms by default) while its own CPU time stays small, so neither
its own-work lag nor other tenants explain it. The kernel counts it directly: the
periods of the cgroup's CFS bandwidth control and how many of them throttled the
group (``nr_periods`` / ``nr_throttled`` in ``cpu.stat``; kernel docs,
scheduler/sched-bwc.rst, "Statistics"). Read for the loop thread's own cgroup (a
thread may sit in a threaded cgroup of its own) before and after a run, with the
same cgroup readers as the agent (:mod:`strata_plugin.agent.cgroups`).
"""

from __future__ import annotations

from dataclasses import dataclass

from strata_plugin.agent import cgroups, procfs


@dataclass(frozen=True)
class QuotaCounts:
    where: str  # the cpu.stat read
    periods: int
    throttled: int


@dataclass(frozen=True)
class Throttling:
    """Over one run: CFS periods, and how many throttled the loop's cgroup."""

    where: str
    periods: int
    throttled: int

    @property
    def frac(self) -> float:
        return self.throttled / self.periods if self.periods else 0.0


def read(tid: int | None) -> QuotaCounts | None:
    """The CFS counters of thread ``tid``'s cgroup (None: no thread, no quota files)."""
    if tid is None:
        return None
    files = cgroups.cpu_stat_files(cgroups.cgroup_dirs(f"self/task/{tid}"))
    if not files:
        return None
    kv = procfs.parse_kv(procfs.read_bytes(files[0]) or b"")
    if "nr_periods" not in kv or "nr_throttled" not in kv:
        return None
    return QuotaCounts(files[0], kv["nr_periods"], kv["nr_throttled"])


def over(before: QuotaCounts | None, after: QuotaCounts | None) -> Throttling | None:
    """What the run saw. If the thread moved to another cgroup meanwhile, that
    cgroup's counts since it was made (a quota applied mid-run is usually new)."""
    if after is None:
        return None
    if before is None or before.where != after.where:
        return Throttling(after.where, after.periods, after.throttled)
    return Throttling(after.where, after.periods - before.periods,
                      after.throttled - before.throttled)

"""Each engine's own line over a case's window, where the server is several engines.

Behind a router over replicas, the request's path ends at several engines
(``formats/request_path.Engine``), and the agent follows all of them as the server: its
whole-server figures are their sum, and the server's cgroup rows are the first engine's
cgroup only. A quota on one replica then hides in the sum, or reads as the whole
server's. This module puts each engine's own evidence side by side, from the agent's
per-engine rows in the window: its root process's CPU and run-queue wait (``proc``,
device ``pid<N>``) and its own cgroup's CFS quota and throttled periods (``allowance``,
``engine_*`` under ``pid<N>``), and names the engines held by their own quota.

An engine is keyed by its identity (node and root PID, where it listens), never by a
position in a list, so the same lines serve replicas behind a router and the head and
workers of one multi-node deployment.

Which requests each engine served, and so each one's share of the work and its pace, is
``analysis/engine_requests.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from strata_plugin.analysis import thresholds
from strata_plugin.analysis.timeline import HwStat
from strata_plugin.formats.request_path import Engine


@dataclass(frozen=True)
class EngineLine:
    """One engine over one window: its identity, then its own evidence (None: not
    sampled in the window)."""

    key: str  # "<node>/pid<N>": the engine's identity
    node: str
    pid: int
    address: str
    name: str
    container: str
    cpu_cores: float | None  # its root process's CPU (user + system) over the window
    run_wait: float | None  # its root process's threads' run-queue wait per second
    quota_cores: float | None  # its own cgroup's CFS quota (the tightest up its hierarchy)
    throttled_share: float | None  # its cgroup's throttled periods over its periods

    @property
    def held_by_quota(self) -> bool:
        """Throttled in more of its enforcement periods than ``cgroup_throttled_frac``."""
        return (self.throttled_share is not None
                and self.throttled_share > thresholds.value("cgroup_throttled_frac"))

    def evidence(self) -> str:
        """``PID 123 `llama-server` at 127.0.0.1:8081: CFS quota 0.25 core, throttled in
        97% of its periods; 0.25 core of CPU, 0.71 s/s waiting for a CPU``."""
        own = []
        if self.quota_cores is not None:
            own.append(f"CFS quota {self.quota_cores:g} core")
        if self.throttled_share is not None:
            own.append(f"throttled in {self.throttled_share:.0%} of its periods")
        if self.cpu_cores is not None:
            own.append(f"{self.cpu_cores:.2f} core of CPU")
        if self.run_wait is not None:
            own.append(f"{self.run_wait:.2f} s/s waiting for a CPU")
        inside = f" in container {self.container}" if self.container else ""
        what = ", ".join(own) or "no samples of its own in this window"
        return f"PID {self.pid} `{self.name or '?'}` at {self.address}{inside}: {what}"


def _one(rows: dict[tuple[str, str, str], HwStat], source: str, dev: str, metric: str
         ) -> HwStat | None:
    return rows.get((source, dev, metric))


def _line(node: str, engine: Engine, rows: dict[tuple[str, str, str], HwStat]) -> EngineLine:
    dev = f"pid{engine.pid}"
    user = _one(rows, "proc", dev, "cpu_user_s")
    system = _one(rows, "proc", dev, "cpu_system_s")
    cpu = None
    if user is not None and user.rate is not None:
        cpu = user.rate + ((system.rate or 0.0) if system is not None else 0.0)
    wait = _one(rows, "proc", dev, "runqueue_delay_ns")  # the agent's run_delay_s, in ns
    quota = _one(rows, "allowance", dev, "engine_quota_cores")
    periods = _one(rows, "allowance", dev, "engine_nr_periods")
    throttled = _one(rows, "allowance", dev, "engine_nr_throttled")
    share = None
    if periods is not None and throttled is not None and periods.delta and \
            throttled.delta is not None:
        share = min(1.0, max(0.0, throttled.delta / periods.delta))
    elif periods is not None and periods.delta == 0:
        share = 0.0  # no period elapsed: it did not run into a quota
    return EngineLine(
        key=f"{node}/{dev}", node=node, pid=engine.pid, address=engine.address,
        name=engine.name, container=engine.container.text() if engine.container else "",
        cpu_cores=cpu,
        run_wait=wait.rate / 1e9 if wait is not None and wait.rate is not None else None,
        quota_cores=quota.min if quota is not None else None, throttled_share=share)


def engine_lines(hw: Iterable[HwStat], engines: Sequence[Engine]) -> tuple[EngineLine, ...]:
    """Each engine's line over the window of ``hw``, for every engine that has rows of
    its own there (the node whose agent followed it); () for fewer than two engines (one
    engine's evidence is the server's own)."""
    if len(engines) < 2:
        return ()
    by_node: dict[str, dict[tuple[str, str, str], HwStat]] = {}
    for r in hw:
        if r.source in ("proc", "allowance") and r.device.startswith("pid"):
            by_node.setdefault(r.node, {})[(r.source, r.device, r.metric)] = r
    out = []
    for e in engines:
        dev = f"pid{e.pid}"
        node = next((n for n, rows in sorted(by_node.items())
                     if any(k[1] == dev for k in rows)), None)
        if node is not None:
            out.append(_line(node, e, by_node[node]))
    return tuple(out)


def held_by_quota(lines: Sequence[EngineLine]) -> str:
    """The finding: which engines their own quota holds, with the quota, or ""."""
    held = [x for x in lines if x.held_by_quota]
    if not held or len(held) == len(lines):
        return ""  # none, or all alike: the server's own rows say it
    names = "; ".join(x.evidence() for x in held)
    free = len(lines) - len(held)
    return (f"Held by its own CPU quota (throttled in over "
            f"{thresholds.value('cgroup_throttled_frac'):.0%} of its periods): {names}. "
            f"The other {free} engine{'s are' if free > 1 else ' is'} not.")

"""A case's engines, where the request's path ends at several: each engine's line, the
requests it served and their pace, and the classifier's per-engine input.

Behind a router over replicas (or across the head and workers of one deployment) the
agent follows every engine as the server, but its cgroup rows (``cpu:cgroup_*``,
``mem:cgroup_*``, the allowance's ``quota_cores`` and the ``allowed_cpus`` that quota
caps) read the first engine's cgroup alone. A quota on that engine, or its absence, is not
the whole server's, so those rows are left out of the server's signals
(:func:`server_rows`) and each engine's own are given to the rules instead
(:meth:`EngineCase.facts`, ``rules/window.EngineFacts``). Engines are keyed by their
identity (node and root PID), never by their place in the path's list.

The lines are ``analysis/engine_lines.py``'s, the attribution, shares and pace
``analysis/engine_requests.py``'s; this module puts them together for one case.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strata_plugin.analysis.engine_lines import EngineLine, engine_lines
from strata_plugin.analysis.engine_requests import (
    Attribution,
    EnginePace,
    Imbalance,
    Span,
    attribute,
    connections,
    imbalance,
    paces,
)
from strata_plugin.analysis.ledger import CaseLedger
from strata_plugin.analysis.rules.window import EngineFacts
from strata_plugin.analysis.run_folder import RunBundle
from strata_plugin.analysis.timeline import HwStat, SampleStore
from strata_plugin.formats.request_path import Engine, paths_in

#: The server-wide rows that read the first engine's cgroup alone (agent/collectors:
#: cpu's and mem's ``cgroup_*``; the allowance's quota), by source and metric prefix.
FIRST_ENGINE_ROWS = (("cpu", "cgroup_"), ("mem", "cgroup_"), ("allowance", "quota_cores"))


def case_engines(manifest: Mapping[str, object], config_id: str) -> tuple[Engine, ...]:
    """The engines the case's path ends at: its server block's path, or, where the run
    recorded one path under another name, that one; () where none was recorded."""
    paths = paths_in(manifest)
    path = paths.get(config_id) or (next(iter(paths.values())) if len(paths) == 1 else None)
    return path.engines if path is not None else ()


def server_rows(hw: Sequence[HwStat], engines: Sequence[Engine]) -> list[HwStat]:
    """``hw`` without the rows of the first engine's cgroup, where there are several
    engines (module docstring); unchanged for one, or for several that share one cgroup
    (processes on one port with SO_REUSEPORT in one container: its rows are all of
    theirs). ``allowed_cpus`` goes with the quota where one was read: the agent caps it
    by that quota."""
    groups = {e.cgroup for e in engines}
    if len(engines) < 2 or (len(groups) == 1 and "" not in groups):
        return list(hw)

    def first_engines(r: HwStat) -> bool:
        return r.device == "" and any(r.source == src and r.metric.startswith(prefix)
                                      for src, prefix in FIRST_ENGINE_ROWS)

    quota = any(first_engines(r) and r.source == "allowance" for r in hw)
    return [r for r in hw if not first_engines(r) and not (
        quota and r.source == "allowance" and r.metric == "allowed_cpus" and r.device == "")]


@dataclass(frozen=True)
class EngineCase:
    """One case's engines: each one's line over the window, which engine served each
    measured request (or why not known), each engine's share and pace, the slow one."""

    lines: tuple[EngineLine, ...]
    attribution: Attribution
    paces: tuple[EnginePace, ...]
    slow: Imbalance | None

    def pace(self, pid: int) -> EnginePace | None:
        return next((p for p in self.paces if p.pid == pid), None)

    def words(self, line: EngineLine) -> str:
        """Its own evidence, then its share of the requests and their pace where known:
        ``PID 2 ...: CFS quota 0.25 core, ...; served 6 of 12 requests (50%), median
        TPOT 41 ms, 4.02x the fastest engine's (PID 1)``."""
        p = self.pace(line.pid)
        out = line.evidence()
        if p is not None and p.share is not None:
            out += f"; served {p.served} of {p.of} requests ({p.share:.0%})"
            if p.tpot_ms is not None:
                out += f", median TPOT {p.tpot_ms:.3g} ms"
        if self.slow is not None and self.slow.slow.pid == line.pid:
            out += (f", {self.slow.ratio:.2f}x the fastest engine's (PID "
                    f"{self.slow.fastest.pid})")
        return out

    def ledgers(self, ledger: CaseLedger) -> tuple[tuple[int, str, CaseLedger], ...]:
        """Each engine's part of the case's time ledger: (PID, its short name, the
        ledger of the requests it served), in the path's order of engines."""
        names = {x.pid: x.name for x in self.lines}
        return tuple((p.pid, names.get(p.pid, ""), ledger.of_requests(
            {r for r, pid in self.attribution.engine_of.items() if pid == p.pid}))
            for p in self.paces)

    def facts(self) -> tuple[EngineFacts, ...]:
        """The classifier's per-engine input (``WindowSignals.engines``)."""
        return tuple(EngineFacts(
            node=x.node, pid=x.pid, words=self.words(x), quota_cores=x.quota_cores,
            throttled_frac=x.throttled_share,
            slower=(self.slow.ratio if self.slow is not None and self.slow.slow.pid == x.pid
                    else None)) for x in self.lines)


def engine_case(bundle: RunBundle, store: SampleStore | None, case_id: str,
                hw: Sequence[HwStat], engines: Sequence[Engine]) -> EngineCase | None:
    """The case's engines over its window's rows ``hw``; None for fewer than two."""
    if len(engines) < 2:
        return None
    pids = [e.pid for e in engines]
    recs = [r for r in bundle.records.get(case_id, ()) if r.phase == "measured"]
    spans = [Span(r.request_id, bundle.request_wall(r.dispatched_ns),
                  bundle.request_wall(r.done_ns) if r.done_ns is not None else None)
             for r in recs]
    att = attribute(spans, connections(store, pids) if store is not None else {})
    metrics = {r.request_id: bundle.metrics_of(r) for r in recs}
    tpot = {k: m.tpot_ms if m.ok else None for k, m in metrics.items()}
    e2e = {k: m.e2e_ms if m.ok else None for k, m in metrics.items()}
    paced = paces(att, pids, tpot, e2e)
    return EngineCase(engine_lines(hw, engines), att, paced, imbalance(paced))

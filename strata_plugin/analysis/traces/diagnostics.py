"""A run's diagnostic rounds, read back from the run folder: before/after and overhead.

A traced repetition is a case of its own in ``cases.jsonl`` (``<case>~traced``, with
``diagnostic_of`` naming the timed case), so the timed case's metrics never include it.
Its trace lives in ``traces/<traced case>/`` (``trace.txt`` and ``meta.json``, written by
``run/diagnostic_round.py``). This module reads both back, runs the readers over the
traced case's measured window, and settles the timed case's verdict
(:mod:`strata_plugin.analysis.traces.settle`). The trace's overhead is the traced
repetition's output throughput against the timed one's (same workload, same server).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strata_plugin.analysis.traces import blockio, sched, settle, sockets

if TYPE_CHECKING:
    from strata_plugin.analysis.case_summary import CaseAnalysis

TRACED_SUFFIX = "~traced"
#: The headline figures shown side by side for the timed and the traced repetition.
COMPARED = ("output_tok_s", "ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms")


def trace_dir(run_dir: Path, traced_case_id: str) -> Path:
    """Where a traced case's trace and meta go (case ids may hold '/')."""
    return Path(run_dir) / "traces" / traced_case_id.replace("/", "__")


@dataclass(frozen=True)
class Diagnostic:
    case_id: str
    traced_case_id: str
    settlement: settle.Settlement
    timed: dict[str, float]
    traced: dict[str, float]
    sched: sched.SchedReport | None = None
    block: blockio.BlockReport | None = None
    net: sockets.SocketReport | None = None
    capture: dict[str, Any] = field(default_factory=dict)  # overruns, events, span

    @property
    def overhead(self) -> float | None:
        """Throughput lost to tracing: 1 - traced / timed output tokens per second."""
        a, b = self.timed.get("output_tok_s"), self.traced.get("output_tok_s")
        return 1.0 - b / a if a and b is not None else None


def _figures(a: CaseAnalysis) -> dict[str, float]:
    return {k: float(a.headline[k]) for k in COMPARED
            if isinstance(a.headline.get(k), (int, float))}


def read_traces(d: Path, meta: dict[str, Any], window: tuple[int, int]
                ) -> tuple[sched.SchedReport | None, blockio.BlockReport | None,
                           sockets.SocketReport | None, list[tuple[str, str]]]:
    """The readers over one trace file; (trace, why) for each that could not run."""
    unavailable = [(t, why) for t, why in (meta.get("unavailable") or {}).items()]
    captured = meta.get("captured") or []
    s = b = n = None
    path = d / "trace.txt"
    kernel = [t for t in captured if t != "net"]
    if kernel and not path.exists():
        unavailable += [(t, "trace file missing") for t in kernel]
        kernel = []
    if "sched" in kernel:
        with path.open(errors="replace") as fh:
            s = sched.read(fh, meta, window)
    if "block" in kernel:
        with path.open(errors="replace") as fh:
            b = blockio.read(fh, meta, window)
    if "net" in captured:
        if (d / "ss.txt").exists():
            with (d / "ss.txt").open(errors="replace") as fh:
                n = sockets.read(fh, window)
        else:
            unavailable.append(("net", "ss.txt missing"))
    return s, b, n, unavailable


def diagnose(run_dir: Path, analyses: Sequence[CaseAnalysis]) -> list[Diagnostic]:
    """Every diagnostic round of the run, in run order."""
    by_id = {a.case_id: a for a in analyses}
    out = []
    for a in analyses:
        of = a.info.diagnostic_of
        if not of or of not in by_id:
            continue
        timed = by_id[of]
        d = trace_dir(run_dir, a.case_id)
        try:
            meta = json.loads((d / "meta.json").read_text())
        except (OSError, ValueError) as exc:
            meta = {"unavailable": {"trace": f"no readable meta.json ({exc})"}}
        window = a.info.window_mono_ns or (0, 0)
        s, b, n, unavailable = read_traces(d, meta, window)
        decisions = tuple(x for x in (settle.decide_sched(s) if s else None,
                                      settle.decide_block(b) if b else None,
                                      settle.decide_net(n) if n else None) if x)
        tables: dict[str, Any] = {}
        if s is not None:
            tables["sched"] = s.table()
        if b is not None:
            tables["block"] = b.table()
        if n is not None:
            tables["net"] = n.table()
        st = settle.settle(timed.verdict, decisions, case_id=of, traced_case_id=a.case_id,
                           unavailable=tuple(unavailable), tables=tables)
        capture = {k: meta.get(k) for k in ("overruns", "entries", "events", "captured",
                                            "start_mono_ns", "end_mono_ns") if k in meta}
        out.append(Diagnostic(of, a.case_id, st, _figures(timed), _figures(a), s, b, n,
                              capture))
    return out

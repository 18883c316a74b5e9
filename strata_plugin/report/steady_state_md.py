"""report.md's steady-state section: plateau figures beside the whole window, timeslices.

Rendering only; the plateau and the slices come from analysis/steady_state.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strata_plugin.analysis.case_summary import CaseAnalysis
from strata_plugin.analysis.metrics import CaseMetrics
from strata_plugin.analysis.run_folder import RunBundle
from strata_plugin.analysis.steady_state import (
    MIN_PLATEAU_REQUESTS,
    MIN_PLATEAU_SHARE,
    SpanFigures,
    SteadyState,
    steady_state,
    timeslices,
)
from strata_plugin.report.fmt import md_num
from strata_plugin.report.report_data import ReportData
from strata_plugin.report.tables import md_table

TITLE = "Steady state"


@dataclass(frozen=True)
class CaseSteady:
    metrics: CaseMetrics  # the whole measured window
    steady: SteadyState | None
    slices: tuple[SpanFigures, ...] = ()
    slice_s: float | None = None


def by_case(bundle: RunBundle, analyses: Sequence[CaseAnalysis]) -> dict[str, CaseSteady]:
    """Each case's plateau, and its timeslices when the case asked for them."""
    out = {}
    for a in analyses:
        recs = bundle.records.get(a.case_id, [])
        conc = a.params.get("concurrency")
        steady = steady_state(
            recs,
            concurrency=conc if isinstance(conc, int) else None,
            arrival=str(a.params.get("arrival", "closed")),
            metrics_of=bundle.metrics_of,
        )
        slice_s = a.line.timeslice_s if a.line else None
        slices: tuple = ()
        step: float | None = None
        if isinstance(slice_s, (int, float)) and slice_s > 0:
            step = float(slice_s)
            slices = tuple(timeslices(recs, step, bundle.metrics_of))
        out[a.case_id] = CaseSteady(a.metrics, steady, slices, step if slices else None)
    return out


def _pair(whole: float | None, plateau: float | None) -> str:
    return f"{md_num(whole)} / {md_num(plateau)}"


def section(by_case: Mapping[str, CaseSteady]) -> str:
    out = [f"\n## {TITLE}\n\n",
           "The plateau is where the offered load is held: from the first moment the "
           "number of requests in flight reaches the level (the workload's concurrency in "
           "a closed loop; the time-weighted median in-flight count in an open loop) to "
           "the last moment it is there, so the ramp-up and the drain are left out. "
           "Latency over the requests that started and ended inside it; output tok/s "
           "from the token events inside it. Each cell is *whole window / plateau*. No "
           f"plateau when it covers under {100 * MIN_PLATEAU_SHARE:.0f}% of the window or "
           f"holds fewer than {MIN_PLATEAU_REQUESTS} requests.\n\n"]
    rows: list[tuple[str | int, ...]] = []
    for cid, c in by_case.items():
        s = c.steady
        if s is None:
            continue
        cm, p = c.metrics, s.plateau
        if p is None:
            rows.append((f"`{cid}`", s.level, f"none: {s.reason}", "-", "-", "-", "-", "-",
                         "-"))
            continue
        rows.append((
            f"`{cid}`", s.level,
            f"{md_num((p.start_ns - s.window_start_ns) / 1e9)} .. "
            f"{md_num((p.end_ns - s.window_start_ns) / 1e9)} s",
            f"{md_num(100 * (s.share or 0.0))}%", p.n_inside,
            _pair(cm.ttft.p50, p.ttft_p50_ms), _pair(cm.tpot.p50, p.tpot_p50_ms),
            _pair(cm.tpot.p99, p.tpot_p99_ms), _pair(cm.output_tok_s, p.output_tok_s)))
    if rows:
        out.append(md_table(("case", "level", "plateau", "of window", "requests inside",
                             "ttft p50 ms", "tpot p50 ms", "tpot p99 ms", "output tok/s"),
                            rows))
    else:
        out.append("No measured requests.\n")
    for cid, c in by_case.items():
        if not c.slices:
            continue
        out.append(f"\n### Timeslices of `{cid}` ({md_num(c.slice_s)} s each)\n\n")
        start = c.slices[0].start_ns
        out.append(md_table(
            ("from s", "length s", "mean in flight", "completed", "output tok/s",
             "ttft p50 ms", "tpot p50 ms", "tpot p99 ms"),
            [(md_num((x.start_ns - start) / 1e9), md_num(x.duration_s),
              md_num(x.mean_in_flight), x.n_completed, md_num(x.output_tok_s),
              md_num(x.ttft_p50_ms), md_num(x.tpot_p50_ms), md_num(x.tpot_p99_ms))
             for x in c.slices]))
    return "".join(out)


def report_section(d: ReportData) -> str:
    return section(by_case(d.bundle, d.analyses))

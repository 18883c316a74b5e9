"""write_report: every derived file of a run, rebuilt from its raw files alone.

Called by the plugin at session end and by ``python -m strata_plugin report DIR``.
It reads only raw files (manifest, markers, cases, requests, samples) and rewrites
case_summary.csv, case_hw_summary.csv, summary.json, benchmark.json, the CI files
(report/ci_outputs.py), report.md, thresholds.md, plots/*.png and timeline/*.json.
Nothing written depends on the time of writing, dict order or the machine's matplotlib
settings, so the same raw files give the same bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata_plugin.analysis.ab_groups import (
    Arm,
    ab_groups,
    arm_deltas,
    group_effects,
    group_expectations,
    repetition_values,
    same_output_pairs,
)
from strata_plugin.analysis.case_summary import (
    CaseAnalysis,
    RunAnalysis,
    RunContext,
    analyze_run,
    request_intervals,
)
from strata_plugin.analysis.clocks import clock_warnings
from strata_plugin.analysis.request_values import values
from strata_plugin.analysis.run_folder import RunBundle
from strata_plugin.analysis.static_diff import run_static
from strata_plugin.analysis.sufficiency import SUFFICIENCY_METRICS, PercentileSupport, support
from strata_plugin.analysis.thresholds import all_thresholds
from strata_plugin.analysis.timeline import HW_COLUMNS, SampleStore, Window
from strata_plugin.errors import failure_words
from strata_plugin.formats.atomic import atomic_write_text
from strata_plugin.formats.outcome import RunOutcome
from strata_plugin.formats.telemetry import TelemetryFacts
from strata_plugin.report import ab_plots, plots, sections, sufficiency_md, trace_events
from strata_plugin.report.benchjson import benchmark_json
from strata_plugin.report.ci_outputs import CiCase, ci_files
from strata_plugin.report.fmt import json_text
from strata_plugin.report.markdown import RUN_PLOT_ONE_CASE, THRESHOLDS_FILE, thresholds_md
from strata_plugin.report.report_data import AbGroup, ReportData
from strata_plugin.report.tables import case_summary_rows, csv_text, hw_rows

#: Collectors every node is expected to run; absent without a reason is a limit too.
EXPECTED_SOURCES = ("proc", "cpu", "mem", "disk", "net")


def run_limits(
    bundle: RunBundle, store: SampleStore, ctx: RunContext, analyses: list[CaseAnalysis]
) -> list[str]:
    """What this run could not see, said plainly."""
    out = []
    m = bundle.manifest
    if bundle.outcome is not None and not bundle.outcome.complete:
        out.append(f"run incomplete: {bundle.outcome.words}")
    for cid, info in sorted(bundle.cases.items()):  # cached tokens the server did not report
        cold = info.line.cold_prefix or ""
        if cold.startswith(("cold prefix not verifi", "NOT cold")):
            out.append(f"case {cid}: {cold}")
        if info.line.isl_exact is False:  # chat without a tokenizer endpoint, or texts
            out.append(f"case {cid}: {info.line.isl_note or 'ISL not exact'}")
    if not ctx.gpu_present:
        why = "; ".join(
            f"{n}: {r}"
            for n, cols in sorted(store.unavailable.items())
            for c, r in sorted(cols.items())
            if c in ("nvml", "dcgm")
        )
        lead = "GPU expected but no GPU telemetry" if ctx.gpu_expected else "no GPU telemetry"
        out.append(f"{lead}: GPU classes not assessed" + (f" ({why})" if why else ""))
    elif not any(k.metric == "gpm_sm_activity_pct" for k in store.keys):
        out.append(
            "no SM/DRAM/tensor activity (GPM or DCGM): GPU busy is split only by NVML "
            "utilization, which counts any kernel as busy"
        )
    for node in store.nodes():
        for col, why in sorted(store.unavailable.get(node, {}).items()):
            out.append(f"{node}: {col} unavailable: {why}")
        have = {s for n, s in store.sources() if n == node}
        for src in EXPECTED_SOURCES:
            if src not in have and src not in store.unavailable.get(node, {}):
                out.append(f"{node}: no {src} samples, and no reason recorded")
    nodes_m = m.get("nodes") or {}
    if ctx.multi_node:
        for node in store.nodes():
            n = nodes_m.get(node) or {}
            if n.get("offset_start_ns", n.get("clock_offset_ns")) is None:
                out.append(f"{node}: clock offset not measured; its samples are taken as aligned")
            elif n.get("offset_end_ns") is None:
                out.append(f"{node}: clock offset measured only at start; drift not corrected")
    out.extend(clock_warnings(m, TelemetryFacts.from_manifest(m).interval_s))
    if bundle.anchor is None:
        out.append("no clock_anchor in manifest.json: request windows come from markers.csv")
    for a in analyses:
        if a.window is None:
            out.append(f"case {a.case_id}: no measured window marked; no hardware summary")
        if a.line is None:
            out.append(f"case {a.case_id}: no cases.jsonl line (workload parameters unknown)")
    if any(r.proc is not None and r.proc.shared for recs in bundle.records.values() for r in recs):
        out.append(
            "per-request process deltas (CPU s, faults, reads) of requests that overlapped "
            "others include the others' work"
        )
    return out


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80] or "case"


def _case_plot(
    store: SampleStore, bundle: RunBundle, a: CaseAnalysis, out_dir: Path, name: str
) -> tuple[str, list[str]]:
    w = a.window
    assert w is not None
    margin = max(int((w.end_ns - w.start_ns) * 0.1), 1_000_000_000)
    start, end = w.start_ns - margin, w.end_ns + margin
    panels, omitted = plots.build_panels(store, start, end, w.start_ns)
    if not panels:
        return "", omitted
    spans = plots.request_spans(request_intervals(bundle, a.case_id), w.start_ns, start, end)
    anchor = bundle.anchor
    req = (
        plots.request_panel(bundle.records.get(a.case_id, []), w.start_ns, anchor.to_wall_ns)
        if anchor is not None
        else None
    )
    if req is not None:
        panels = [req, *panels]
    marks = [
        plots.Span((m.start_wall_ns - w.start_ns) / 1e9, (m.end_wall_ns - w.start_ns) / 1e9,
                   m.name if m.kind == "event" else "warmup")
        for m in bundle.markers
        if m.case_id == a.case_id
        and (m.kind == "warmup" or (m.kind == "event" and m.name.startswith("inject")))
    ]
    plots.render(
        out_dir / name,
        panels,
        f"{a.name} ({a.case_id})",
        ((start - w.start_ns) / 1e9, (end - w.start_ns) / 1e9),
        shaded=[plots.Span(0.0, w.duration_s)],
        requests=spans,
        marks=marks,
    )
    return name, omitted


def _ab_plot(
    bundle: RunBundle, analyses: list[CaseAnalysis], group: str, arms: list[Arm], out_dir: Path
) -> str:
    """The group's timeline, ECDF and per-repetition picture; its file name, or ""."""
    by_id = {a.case_id: a for a in analyses}
    reps = [
        ab_plots.Repetition(
            arm,
            cid,
            tuple(r for r in bundle.records.get(cid, []) if r.phase in ("measured", "injected")),
            repetition_values(by_id[cid].metrics) if cid in by_id else {},
        )
        for arm, cases in arms
        for cid in cases
    ]
    name = f"ab-{_safe(group)}.png"
    return name if arms and ab_plots.render_group(out_dir / name, group, reps, arms[0][0]) else ""


def _run_plot(
    store: SampleStore, bundle: RunBundle, analyses: list[CaseAnalysis], out_dir: Path
) -> tuple[str, list[str]] | None:
    runs = [w for w in bundle.windows() if w.kind == "run"]
    if not runs:
        return None
    if len([a for a in analyses if a.window is not None]) == 1:
        # One case: its own timeline (with the requests panel) already shows the run, but
        # for the idle baseline and cooldown seconds; drawing it twice cost a second figure.
        return "", [RUN_PLOT_ONE_CASE]
    run = runs[0]
    panels, omitted = plots.build_panels(store, run.start_ns, run.end_ns, run.start_ns)
    if not panels:
        return "", omitted
    shaded = [
        plots.Span(
            (a.window.start_ns - run.start_ns) / 1e9, (a.window.end_ns - run.start_ns) / 1e9, a.name
        )
        for a in analyses
        if a.window is not None
    ]
    intervals = [iv for a in analyses for iv in request_intervals(bundle, a.case_id)]
    spans = plots.request_spans(intervals, run.start_ns, run.start_ns, run.end_ns)
    plots.render(
        out_dir / "run.png",
        panels,
        f"run {bundle.run_id}",
        (0.0, run.duration_s),
        shaded=shaded,
        requests=spans,
    )
    return "run.png", omitted


def _sufficiency(
    bundle: RunBundle, analyses: list[CaseAnalysis]
) -> dict[str, tuple[PercentileSupport, ...]]:
    """Each case's reported percentiles with the counts they rest on."""
    out = {}
    for a in analyses:
        recs = bundle.records.get(a.case_id, [])
        out[a.case_id] = tuple(
            s for m in SUFFICIENCY_METRICS for s in support(m, values(recs, m, bundle.metrics_of))
        )
    return out


def _ci_bounds(
    a: CaseAnalysis, supports: tuple[PercentileSupport, ...]
) -> dict[str, tuple[float, float]]:
    """Order-statistic bounds of the headline percentiles that have both."""
    out = {}
    for s in supports:
        key = f"{s.metric.removesuffix('_ms')}_{s.label()}_ms"
        v = a.headline.get(key)
        if s.lower is None or s.upper is None or not isinstance(v, (int, float)):
            continue
        if s.lower <= v <= s.upper:
            out[key] = (s.lower, s.upper)
    return out


def _summary_json(data: ReportData, windows: list[Window]) -> dict[str, Any]:
    m = data.bundle.manifest
    cases = []
    for a in data.analyses:
        v = a.verdict
        cases.append(
            {
                "case_id": a.case_id,
                "name": a.name,
                "config_id": a.config_id,
                "params": a.params,
                "outcome": (a.line.outcome if a.line else None) or "",
                "partial": a.partial or None,
                "ab_group": (a.line.ab_group if a.line else None) or "",
                "ab_arm": (a.line.ab_arm if a.line else None) or "",
                "window": None
                if a.window is None
                else {
                    "start_wall_ns": a.window.start_ns,
                    "end_wall_ns": a.window.end_ns,
                    "duration_s": a.window.duration_s,
                },
                "metrics": a.headline,
                "sufficiency": [dataclasses.asdict(s) for s in data.sufficiency.get(a.case_id, ())],
                "energy": None if a.energy is None else dataclasses.asdict(a.energy),
                "verdict": {
                    **dataclasses.asdict(v),
                    "summary": v.summary(),
                    "confidence_label": v.confidence_label,
                },
                # the headline phase's share of its roof, beside the verdict it informs
                "roofline": None if a.roofline is None else a.roofline.to_json(),
                "signals": dataclasses.asdict(a.signals),
                "rails_findings": []
                if a.rails is None
                else [dataclasses.asdict(f) for f in a.rails.findings],
            }
        )
    return {
        "run": {
            "run_id": data.bundle.run_id,
            "profile": m.get("profile"),
            "started_utc": m.get("started_utc"),
            "git_sha": m.get("git_sha"),
            "gpu_present": data.ctx.gpu_present,
            "gpu_expected": data.ctx.gpu_expected,
            "nodes": {
                n: {
                    "sources": sorted(s for nn, s in data.store.sources() if nn == n),
                    "unavailable": data.store.unavailable.get(n, {}),
                }
                for n in data.store.nodes()
            },
        },
        "outcome": (data.bundle.outcome or RunOutcome()).to_json(),
        "limits": data.limits,
        "windows": [dataclasses.asdict(w) for w in windows],
        "cases": cases,
        "ab": [
            {
                "group": g.group,
                "arms": [{"arm": arm, "cases": list(cases)} for arm, cases in g.arms],
                "effects": [dataclasses.asdict(x) for x in g.effects],
                "deltas": [dataclasses.asdict(x) for x in g.deltas],
                "same_output": [dataclasses.asdict(x) for x in g.pairs],
                "expectations": [x.to_json() for x in g.expectations],
            }
            for g in data.ab
        ],
        "thresholds": [dataclasses.asdict(t) for t in all_thresholds()],
    }


@dataclass(frozen=True)
class Analysed:
    """What every output is made from: the run folder, the run read and analysed, and
    the report's data (plots drawn, sections prepared)."""

    run_dir: Path
    run: RunAnalysis
    data: ReportData


@dataclass(frozen=True)
class Output:
    """One derived output of the report: its name (a file, or a family of files) and
    its files' names and texts, made from the analysed run alone."""

    name: str
    texts: Callable[[Analysed], dict[str, str]]


def _ledger(a: Analysed) -> dict[str, str]:
    return {"ledger.jsonl": "".join(r.to_json() + "\n" for c in a.data.analyses
                                    if c.ledger is not None for r in c.ledger.requests)}


def _case_summary(a: Analysed) -> dict[str, str]:
    header, rows = case_summary_rows(a.data.analyses)
    return {"case_summary.csv": csv_text(header, rows)}


def _case_hw_summary(a: Analysed) -> dict[str, str]:
    windows, hw_by_window = a.run.windows, a.run.hw_by_window
    window_order = {w.name: i for i, w in enumerate(windows)}
    all_hw = [
        s
        for name in sorted(hw_by_window, key=lambda n: (window_order.get(n, 1 << 30), n))
        for s in hw_by_window[name]
    ]
    return {"case_hw_summary.csv": csv_text(HW_COLUMNS, hw_rows(all_hw))}


def _benchmark(a: Analysed) -> dict[str, str]:
    analyses = a.data.analyses
    extra = {
        c.case_id: {
            "verdict": c.verdict.summary(),
            "confidence": c.verdict.confidence,
            **(
                {"output_tok_s": c.metrics.output_tok_s}
                if c.metrics.output_tok_s is not None
                else {}
            ),
        }
        for c in analyses
    }
    return {"benchmark.json": json_text(benchmark_json(
        a.data.bundle, [c.case_id for c in analyses if not c.partial], extra))}


def _ci(a: Analysed) -> dict[str, str]:
    ci_cases = [
        CiCase(c.case_id, c.config_id, c.headline, _ci_bounds(c, a.data.sufficiency[c.case_id]))
        for c in a.data.analyses
        if not c.partial  # a partial case is never a number on a dashboard
    ]
    return ci_files(ci_cases)


SUMMARY, REPORT = "summary.json", "report.md"
#: Every output, in the order written; report.md last (once it is there, the rest is).
OUTPUTS: tuple[Output, ...] = (
    Output("ledger.jsonl", _ledger),
    Output("case_summary.csv", _case_summary),
    Output("case_hw_summary.csv", _case_hw_summary),
    Output(SUMMARY, lambda a: {SUMMARY: json_text(_summary_json(a.data, a.run.windows))}),
    Output("benchmark.json", _benchmark),
    Output("CI files (report/ci_outputs.py)", _ci),
    Output(THRESHOLDS_FILE, lambda a: {THRESHOLDS_FILE: thresholds_md()}),
    Output(REPORT, lambda a: {REPORT: sections.render(a.data)}),
)


def _case_plots(ra: RunAnalysis, plot_dir: Path, failed: dict[str, str]
                ) -> dict[str, tuple[str, list[str]]]:
    """Each case's timeline, under a file name of its own; (its name, panels omitted).
    A case whose plot failed has none, and ``failed`` says why (``case:<id>``)."""
    used: set[str] = set()
    case_plots: dict[str, tuple[str, list[str]]] = {}
    for a in ra.analyses:
        if a.window is None:
            continue
        name = f"case-{_safe(a.case_id)}.png"
        k = 2
        while name in used:
            name = f"case-{_safe(a.case_id)}-{k}.png"
            k += 1
        used.add(name)
        try:
            case_plots[a.case_id] = _case_plot(ra.store, ra.bundle, a, plot_dir, name)
        except Exception as e:  # this picture only: the report and the other cases stand
            failed[f"case:{a.case_id}"] = failure_words(e)
    return case_plots


def _ab(ra: RunAnalysis, plot_dir: Path | None, failed: dict[str, str]) -> list[AbGroup]:
    """Each A/B group: its arms, deltas, same-output pairs, effects and picture (none
    where it failed: ``failed`` says why, ``ab:<group>``; none without ``plot_dir``)."""
    bundle, analyses = ra.bundle, ra.analyses

    def picture(group: str, arms: list[Arm]) -> str:
        if plot_dir is None:
            return ""
        try:
            return _ab_plot(bundle, analyses, group, arms, plot_dir)
        except Exception as e:  # this picture only
            failed[f"ab:{group}"] = failure_words(e)
            return ""

    case_metrics = {a.case_id: a.metrics for a in analyses}
    return [
        AbGroup(
            group,
            arms,
            arm_deltas(bundle, group, arms),
            same_output_pairs(bundle, group, arms),
            group_effects(
                group, arms, case_metrics, {a.case_id: a.interference for a in analyses}
            ),
            picture(group, arms),
            group_expectations(bundle, group, arms),
        )
        for group, arms in ab_groups(bundle).items()
    ]


def _analysed(run_dir: Path, outcome: RunOutcome | None, plot_dir: Path,
              plots: bool = True) -> Analysed:
    """The run read and analysed, its outcome settled, its plots drawn and its sections
    prepared: everything the outputs are made from."""
    ra = analyze_run(run_dir)
    bundle = ra.bundle
    if outcome is None:
        outcome = RunOutcome.from_manifest(bundle.manifest)
    for torn in bundle.torn:
        outcome.add("torn_line", torn)
    bundle.outcome = outcome
    sufficiency = _sufficiency(bundle, ra.analyses)
    case_notes: dict[str, list[str]] = {}
    for a in ra.analyses:
        line = sufficiency_md.case_line(sufficiency[a.case_id])
        if line:
            case_notes.setdefault(a.case_id, []).append(line)
    failed: dict[str, str] = {}  # plots not drawn, and why: each said in its place
    case_plots = _case_plots(ra, plot_dir, failed) if plots else {}
    try:
        run_plot = _run_plot(ra.store, bundle, ra.analyses, plot_dir) if plots else None
    except Exception as e:  # this picture only
        run_plot, failed["run"] = None, failure_words(e)
    ab = _ab(ra, plot_dir if plots else None, failed)
    timeline = trace_events.write_all(ra, run_dir)  # never raises: a failure is its line
    # The analysed run, once; then each section's own reading and drawing
    # (report/sections.py), so that rendering report.md reads nothing.
    data = sections.prepare(ReportData(
        bundle=bundle,
        store=ra.store,
        ctx=ra.ctx,
        analyses=ra.analyses,
        limits=run_limits(bundle, ra.store, ra.ctx, ra.analyses)
        + ([f"timeline not written: {timeline.problem}"] if timeline.problem else []),
        case_plots=case_plots,
        run_plot=run_plot,
        ab=ab,
        static=run_static(run_dir),
        sufficiency=sufficiency,
        case_notes=case_notes,
        case_traces={a.case_id: trace for a in ra.analyses
                     if (trace := timeline.case_line(a.case_id))},
        plot_failures=failed,
        plots=plots,
    ), plot_dir)
    return Analysed(run_dir, ra, data)


def write_report(run_dir: Path | str, *, outcome: RunOutcome | None = None,
                 plots: bool = True) -> Path:
    """(Re)generate every derived file of ``run_dir``; returns the path of report.md.

    ``plots=False``: every file but the PNGs (``report --no-plots``), each place a plot
    would be saying so; drawing is most of a report's CPU time.

    ``outcome``: the live run's own (it knows why it is incomplete; its manifest says
    ``complete: false`` until this report is written). Offline, the outcome is read
    from the manifest (``RunOutcome.from_manifest``: a run killed before its end is
    incomplete). Either way a raw file torn mid-line is added to it, so the caller sees
    it too, and so is an output that could not be made (``report_failed``, naming it:
    the others are written, report.md saying so first). Raises ``FormatError`` naming
    the file, line and key of a raw file that does not hold its format."""
    run_dir = Path(run_dir)
    plot_dir = run_dir / "plots"
    plot_dir.mkdir(exist_ok=True)
    # Plots of the last report that this one does not redraw go once it is written, so
    # a report that fails part way leaves the previous one whole, its plots included.
    earlier = {p: _file_id(p) for p in plot_dir.glob("*.png")}
    analysed = _analysed(run_dir, outcome, plot_dir, plots)
    failed: list[str] = []
    for output in OUTPUTS:  # each written as it is made: one output's text at a time
        if output.name == REPORT and failed:
            # the run's outcome says which failed, and so do summary.json and report.md
            assert analysed.data.bundle.outcome is not None  # set by _analysed
            analysed.data.bundle.outcome.add("report_failed", "; ".join(failed))
            _write(run_dir, analysed, next(o for o in OUTPUTS if o.name == SUMMARY), [])
        _write(run_dir, analysed, output, failed)
    for p, was in earlier.items():
        if _file_id(p) == was:  # not rewritten (an atomic write is a new inode)
            p.unlink(missing_ok=True)
    return run_dir / "report.md"


def _write(run_dir: Path, analysed: Analysed, output: Output, failed: list[str]) -> None:
    """One output's files; an output that cannot be made (a bug in it, an input no check
    foresaw) costs its own files only, and is added to ``failed`` with why. A file that
    cannot be written (a full disk) fails the report."""
    try:
        texts = output.texts(analysed)
    except Exception as e:
        failed.append(f"{output.name} not written ({failure_words(e)})")
        return
    for name, text in texts.items():
        atomic_write_text(run_dir / name, text)


def _file_id(p: Path) -> tuple[int, int, int] | None:
    try:
        st = p.stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns

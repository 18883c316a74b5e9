"""report.md's time-ledger section: where each case's time went, as a table and pictures.

Per case: the metric it is about (and why), the ledger's shares of it, whether the
ledger closes (residual under ``ledger_residual_max``), which parts are merged and why,
the clock error the identity holds to, a stacked bar of the shares and the request
timeline with its stalls coloured by the server's state (report/ledger_plots.py). A/B
arms with repetitions get each part's mean share with a t interval over repetitions.
The pictures are drawn by :func:`prepare`, which the writer calls before rendering
(``report/sections.py``); :func:`report_section` writes the text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from strata_plugin.analysis.case_summary import CaseAnalysis
from strata_plugin.analysis.engine_case import EngineCase
from strata_plugin.analysis.engine_requests import Attribution
from strata_plugin.analysis.ledger import METRIC_LABELS, METRICS, CaseLedger, cause_words
from strata_plugin.analysis.stats import mean_ci
from strata_plugin.analysis.thresholds import value
from strata_plugin.errors import failure_words
from strata_plugin.formats.printable import printable
from strata_plugin.report import ledger_plots
from strata_plugin.report.fmt import share_pct
from strata_plugin.report.report_data import ReportData
from strata_plugin.report.tables import md_table

TITLE = "Time ledger"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80] or "case"


def _top(led: CaseLedger, k: int = 4) -> str:
    sh = sorted(led.shares(led.metric), key=lambda kv: -abs(kv[1]))
    return ", ".join(f"{p} {s:.0%}" for p, s in sh[:k] if abs(s) >= 0.005) or "-"


def identity_error_ms(led: CaseLedger) -> float:
    """The largest |sum of parts - wall time| over the case's requests."""
    return max((abs(sum(v for _, v in r.parts) - r.wall_ms) for r in led.requests),
               default=0.0)


def _row(a: CaseAnalysis) -> tuple[str, ...]:
    led = a.ledger
    assert led is not None
    res = led.residual_frac()
    bound = value("ledger_residual_max")
    closes = "-" if res is None else ("closes" if res < bound else "**does not close**")
    ttft, tok, e2e = led.mean_ms("ttft"), led.ms_per_token(), led.mean_ms("e2e")
    return (
        f"`{a.case_id}`", f"{METRIC_LABELS[led.metric]} ({led.metric_why})", str(led.n),
        f"{ttft:.1f}" if ttft else "-", f"{tok:.2f}" if tok else "-",
        f"{e2e:.1f}" if e2e else "-", f"{share_pct(res, 1)} ({closes})", _top(led),
        f"{led.clock_error_ms():.2g} (max {identity_error_ms(led):.2g})",
    )


def engine_table(led: CaseLedger | None, ec: EngineCase | None) -> str:
    """Where the path ends at several engines (``ec``): the ledger of the requests each
    engine served, side by side (the metric's mean, then each part's share of it), and
    the requests whose engine is not known, counted with the reason; "" for one engine."""
    if led is None or ec is None:
        return ""
    per = [(pid, name, x) for pid, name, x in ec.ledgers(led)]
    if not any(x.n for _, _, x in per):
        head = "Which engine served each request is not known for any of them"
    else:
        metric = led.metric
        shares = [dict(x.shares(metric)) for _, _, x in per]
        parts = [p for p in METRICS[metric] if any(abs(s.get(p, 0.0)) >= 0.005 for s in shares)]

        def size(x: CaseLedger) -> str:
            v = x.ms_per_token() if metric == "itl" else x.mean_ms(metric)
            return "-" if v is None else f"{v:.3g}"

        unit = "ms/token" if metric == "itl" else "mean ms"
        rows = [(f"{METRIC_LABELS[metric]} ({unit})", *(size(x) for _, _, x in per))]
        rows += [(p, *(share_pct(s.get(p), 1) if x.n else "-" for s, (_, _, x) in zip(shares, per)))
                 for p in parts]
        cols = ("part", *(f"PID {pid}{f' `{name}`' if name else ''} ({x.n} requests)"
                          for pid, name, x in per))
        head = ("By engine, the ledger of the requests each one served (each part's share "
                f"of {METRIC_LABELS[metric]}; the run states that split the server's time "
                "are every engine's threads together):\n\n" + md_table(cols, rows).rstrip("\n"))
    att = ec.attribution
    mine = {q.request_id for q in led.requests}
    unknown = [r for r in att.not_known if r in mine]
    tail = (f"\n\nNot attributed to an engine: {len(unknown)} of {led.n} requests"
            + (f" ({printable(_reasons(att, unknown))})" if unknown else "") + ".\n")
    return "\n" + head + tail


def _reasons(att: Attribution, ids: Sequence[str]) -> str:
    return Attribution({}, {r: att.not_known[r] for r in ids}).reasons()


def repetition_rows(analyses: Sequence[CaseAnalysis]) -> list[tuple[str, ...]]:
    """Each part's mean share of its arm's metric over the arm's repetitions (cases of
    one A/B arm), with a 95% t interval; arms of one repetition are left out."""
    arms: dict[tuple[str, str], list[CaseLedger]] = {}
    for a in analyses:
        group, arm = a.info.ab_group, a.info.ab_arm
        if group and a.ledger is not None and a.ledger.n:
            arms.setdefault((str(group), str(arm or a.case_id)), []).append(a.ledger)
    rows: list[tuple[str, ...]] = []
    for (group, arm), leds in sorted(arms.items()):
        if len(leds) < 2:
            continue
        metric = leds[0].metric
        for part in METRICS[metric]:
            xs = [dict(led.shares(metric)).get(part, 0.0) for led in leds]
            if not any(abs(x) >= 0.005 for x in xs):
                continue
            m, lo, hi = mean_ci(xs)
            rows.append((group, arm, METRIC_LABELS[metric], part, str(len(xs)), f"{m:.1%}",
                         "-" if lo is None or hi is None else f"{lo:.1%} .. {hi:.1%}"))
    return rows


def _cases(analyses: Sequence[CaseAnalysis]) -> list[CaseAnalysis]:
    return [a for a in analyses if a.ledger is not None and a.ledger.n]


@dataclass(frozen=True)
class Drawn:
    """One case's pictures as :func:`prepare` left them."""

    stem: str  # the files' name under plots/, less ``.png`` / ``-timeline.png``
    bars: bool  # the stacked bars were drawn
    timeline: bool  # the stall timeline was drawn (False too: no request had tokens)
    why: str = ""  # why a picture failed, "" when none did


def prepare(d: ReportData, plot_dir: Path) -> dict[str, Drawn]:
    """Each case's pictures drawn into ``plot_dir``, by case id. A picture that fails
    costs itself only, said in its place: the table, the other pictures and the other
    cases stand."""
    anchor = d.bundle.anchor
    used: set[str] = set()
    out = {}
    for a in _cases(d.analyses):
        if not d.plots:
            out[a.case_id] = Drawn("", False, False, "the report was written with --no-plots")
            continue
        led = a.ledger
        assert led is not None
        base = f"ledger-{_safe(a.case_id)}"
        k = 2
        name = base
        while name in used:
            name, k = f"{base}-{k}", k + 1
        used.add(name)
        failed = []
        try:
            ledger_plots.bars(plot_dir / f"{name}.png", f"{a.name}: time ledger", led)
            bars = True
        except Exception as e:
            bars = False
            failed.append(f"the ledger's bars: unavailable ({failure_words(e)})")
        try:
            drew = ledger_plots.timeline(plot_dir / f"{name}-timeline.png",
                                         f"{a.name}: requests, stalls by server state",
                                         d.bundle.records.get(a.case_id, []), led, anchor)
        except Exception as e:
            drew = False
            failed.append(f"the stall timeline: unavailable ({failure_words(e)})")
        out[a.case_id] = Drawn(name, bars, drew, "; ".join(failed))
    return out


def section(analyses: Sequence[CaseAnalysis], drawn: Mapping[str, Drawn]) -> str:
    """``drawn``: what :func:`prepare` drew, by case id."""
    cases = _cases(analyses)
    if not cases:
        return ""
    out = [
        f"\n## {TITLE}\n\n",
        "Each request's time, dispatch to last byte, split into parts that sum to it "
        "(analysis/ledger.py; per request in `ledger.jsonl`): the client's send, the time "
        "before the server's clock starts, the server's queue and prefill (each request's "
        "own from the engine's clocks where its response carried them), decode at the "
        "server's pace, delivery (tokens the server made, held on the way: "
        "analysis/delivery.py), decode stalls by what the server did meanwhile (run "
        "state), the tail, and the residual no clock explains. A case's shares are of the "
        "metric "
        "it is about; the ledger closes when the residual is under "
        f"{value('ledger_residual_max'):.0%} of it. Clock error: the stated bound per "
        "request (ms), and the largest identity error seen.\n\n",
        md_table(("case", "metric", "requests", "TTFT ms", "ms/token", "e2e ms",
                  "residual", "largest shares", "clock error ms"), [_row(a) for a in cases]),
    ]
    reps = repetition_rows(cases)
    if reps:
        out.append("\nShares over repetitions (mean, 95% t interval):\n\n")
        out.append(md_table(("group", "arm", "metric", "part", "n", "mean", "interval"), reps))
    for a in cases:
        led = a.ledger
        assert led is not None
        pic = drawn[a.case_id]
        out.append(f"\n### {a.name} (`{a.case_id}`)\n\n")
        if pic.bars:
            out.append(f"![ledger](plots/{pic.stem}.png)\n")
        if pic.timeline:
            out.append(f"\n![stalls by server state](plots/{pic.stem}-timeline.png)\n")
        if pic.why:
            out.append(f"\nNot drawn: {printable(pic.why)}.\n")
        lv = [(k, x) for k, x in led.level1() if abs(x) >= 0.005]
        if lv:
            by = ("" if led.has_run_state else " (no run-state samples: the server's clocks "
                  "count as running)")
            out.append(f"\nBy cause, its share of {METRIC_LABELS[led.metric]}{by}: "
                       + ", ".join(f"{k} {x:.0%}" for k, x in lv) + "; largest causes: "
                       + ", ".join(f"{cause_words(c)} {x:.0%}"
                                   for c, x in led.cause_shares()[:3]) + ".\n")
        out.append(engine_table(led, a.engines))
        if a.verdict.lead:
            out.append(f"\nVerdict `{a.verdict.summary() or 'none'}`: {a.verdict.lead}.\n")
        w = [(k, x) for k, x in a.verdict.weights if abs(x) >= 0.005]
        if w:
            out.append(f"\nVerdict `{a.verdict.summary() or 'none'}`; each class's weight, "
                       f"its share of {METRIC_LABELS[led.metric]}: "
                       + ", ".join(f"{k} {x:.0%}" for k, x in w) + ".\n")
        if led.engine_sources:
            out.append("\nThe engine's own clocks per request: " + ", ".join(
                f"{src} in {n} of {led.n}" for src, n in led.engine_sources) + ".\n")
        if led.merged:
            out.append("\nMerged parts: " + "; ".join(led.merged) + ".\n")
        if led.delivery is not None and led.delivery.n_delayed:
            out.append("\n" + led.delivery.line() + ".\n")
        if led.has_run_state:
            out.append("\n" + led.stall_line() + ".\n")
    return "".join(out)


def report_section(d: ReportData) -> str:
    return section(d.analyses, d.prepared.get(TITLE, {}))

"""report.md's capacity section: each sweep's steps, knee, capacity at the SLO, plot.

The steps are ordinary cases tagged ``sweep`` in cases.jsonl; everything here is
recomputed from their requests (analysis/capacity.py), so the offline report draws
the same figure. :func:`prepare` figures each sweep and draws its plot (the writer calls
it before rendering, ``report/sections.py``); :func:`report_section` writes the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from strata_plugin.analysis.capacity import (
    FOLLOW_MIN,
    GOOD_FRACTION,
    SweepStep,
    capacity_at_slo,
    knee,
    parse_slo,
    step_figures,
)
from strata_plugin.analysis.case_summary import CaseAnalysis
from strata_plugin.analysis.metrics import Slo
from strata_plugin.analysis.run_folder import RunBundle
from strata_plugin.errors import failure_words
from strata_plugin.formats.atomic import atomic_open
from strata_plugin.formats.printable import printable
from strata_plugin.report.fmt import md_num
from strata_plugin.report.report_data import ReportData
from strata_plugin.report.tables import md_table

TITLE = "Capacity"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80] or "sweep"


def sweeps(bundle: RunBundle, analyses: Sequence[CaseAnalysis]
           ) -> dict[str, list[tuple[CaseAnalysis, SweepStep, Slo, float]]]:
    out: dict[str, list[tuple[CaseAnalysis, SweepStep, Slo, float]]] = {}
    for a in analyses:
        name = a.info.sweep
        rate = a.info.offered_rate
        if not name or not isinstance(rate, (int, float)):
            continue
        slo = parse_slo(str(a.info.slo or ""))
        gf = float(a.info.good_fraction or GOOD_FRACTION)
        step = step_figures(bundle.records.get(a.case_id, []), float(rate), slo)
        out.setdefault(str(name), []).append((a, step, slo, gf))
    return out


def plot(path: Path, name: str, steps: Sequence[SweepStep], slo: Slo,
         k: SweepStep | None, cap: SweepStep | None) -> None:
    """Latency against achieved throughput, the SLO as a line, knee and capacity marked."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    pts = sorted((s for s in steps if s.achieved_rate is not None), key=lambda s: s.offered_rate)
    with matplotlib.rc_context():
        matplotlib.rcdefaults()
        matplotlib.rcParams.update({"svg.hashsalt": "strata", "font.size": 7,
                                    "axes.formatter.useoffset": False})
        fig = Figure(figsize=(10.0, 3.6), dpi=110)
        FigureCanvasAgg(fig)
        axes = fig.subplots(1, 2)
        for ax, metric, limit in ((axes[0], "ttft", slo.ttft_ms), (axes[1], "tpot", slo.tpot_ms)):
            x = [s.achieved_rate for s in pts]
            for stat, style in (("p50", "o-"), ("p99", "s--")):
                y = [getattr(s, f"{metric}_{stat}_ms") for s in pts]
                ax.plot(x, [v if v is not None else float("nan") for v in y], style,
                        label=f"{metric} {stat}", ms=4)
            for s in pts:
                ax.annotate(f"{s.offered_rate:.3g}", (s.achieved_rate, getattr(s,
                    f"{metric}_p99_ms") or 0.0), fontsize=5, xytext=(2, 2),
                    textcoords="offset points")
            if limit is not None:
                ax.axhline(limit, color="tab:red", lw=1, label=f"SLO {metric} <= {limit:g} ms")
            if k is not None and k.achieved_rate is not None:
                ax.axvline(k.achieved_rate, color="tab:green", ls=":", lw=1.2,
                           label=f"knee (offered {k.offered_rate:.3g}/s)")
            if cap is not None and cap.achieved_rate is not None:
                ax.axvline(cap.achieved_rate, color="tab:purple", ls="-.", lw=1,
                           label=f"capacity at SLO (offered {cap.offered_rate:.3g}/s)")
            ax.set_xlabel("achieved requests/s")
            ax.set_ylabel(f"{metric} (ms)")
            ax.set_yscale("log")
            ax.legend(fontsize=5, loc="upper left")
            ax.grid(alpha=0.3)
        fig.suptitle(f"capacity sweep {name} (points labelled with the offered rate)",
                     fontsize=8)
        fig.subplots_adjust(left=0.07, right=0.99, bottom=0.14, top=0.88, wspace=0.2)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(path, "wb") as fh:
            fig.savefig(fh, format="png", dpi=110, metadata={"Software": None})


@dataclass(frozen=True)
class Sweep:
    """One sweep as the section shows it: its steps (each with its case, SLO and goodput
    target), knee, capacity at the SLO and the plot's file name under plots/."""

    name: str
    items: tuple[tuple[CaseAnalysis, SweepStep, Slo, float], ...]
    knee: SweepStep | None
    capacity: SweepStep | None
    png: str  # "" where the plot failed
    why: str = ""  # why it failed


def prepare(d: ReportData, plot_dir: Path) -> list[Sweep]:
    """Each sweep's figures, its plot drawn into ``plot_dir``."""
    out = []
    for name, items in sweeps(d.bundle, d.analyses).items():
        steps = [s for _, s, _, _ in items]
        slo, gf = items[0][2], items[0][3]
        k, cap = knee(steps), capacity_at_slo(steps, gf)
        png, why = f"capacity-{_safe(name)}.png", ""
        try:
            plot(plot_dir / png, name, steps, slo, k, cap)
        except Exception as e:  # the picture only: the sweep's table stands
            png, why = "", failure_words(e)
        out.append(Sweep(name, tuple(items), k, cap, png, why))
    return out


def section(groups: Sequence[Sweep]) -> str:
    if not groups:
        return ""
    out = [f"\n## {TITLE}\n\n",
           "Each sweep offers rising Poisson rates until the server stops following: a "
           f"step is saturated when requests complete at under {FOLLOW_MIN:g} of the rate "
           "they arrived at (`follow`: completions over the span from the first to the "
           "last, against arrivals over theirs), so the queue grows for as long as the "
           "step lasts (`ttft growth`: last third's median TTFT over the first third's, "
           "for reading, not deciding). The knee is the "
           "highest unsaturated rate below the first saturated one; capacity at the SLO is "
           "the highest offered rate whose goodput fraction (succeeded and met every SLO) "
           "reaches the target. The verdict column is each step's own bottleneck verdict, "
           "so it says what saturates first.\n"]
    for g in groups:
        name, items, k, cap = g.name, g.items, g.knee, g.capacity
        slo, gf = items[0][2], items[0][3]
        out.append(f"\n### Sweep `{name}`\n\n")
        out.append(f"SLO {slo.describe()}, goodput target {md_num(100 * gf)}% of requests. "
                   f"**Knee: {md_num(k.offered_rate) + ' req/s offered' if k else 'not found'}"
                   f"**; **capacity at the SLO: "
                   f"{md_num(cap.offered_rate) + ' req/s offered' if cap else 'none'}**"
                   + (f" (goodput {md_num(cap.goodput_req_s)} req/s)" if cap else "") + ".\n\n")
        rows = []
        for a, s, _, _ in sorted(items, key=lambda x: x[1].offered_rate):
            rows.append((md_num(s.offered_rate), md_num(s.achieved_rate), md_num(s.follow),
                         md_num(s.ttft_growth), f"{s.n_ok}/{s.n_requests}", md_num(s.ttft_p50_ms),
                         md_num(s.ttft_p99_ms), md_num(s.tpot_p50_ms), md_num(s.tpot_p99_ms),
                         md_num(None if s.goodput_fraction is None
                                else 100 * s.goodput_fraction) + "%",
                         "yes: " + s.reason if s.saturated else "no",
                         a.verdict.summary() or "none"))
        out.append(md_table(("offered req/s", "achieved req/s", "follow", "ttft growth", "ok",
                             "ttft p50 ms",
                             "ttft p99 ms", "tpot p50 ms", "tpot p99 ms", "good", "saturated",
                             "verdict"), rows))
        if g.png:
            out.append(f"\n![capacity {name}](plots/{g.png})\n")
        else:
            out.append(f"\nCapacity plot: unavailable ({printable(g.why)}).\n")
    return "".join(out)


def report_section(d: ReportData) -> str:
    return section(d.prepared.get(TITLE, ()))

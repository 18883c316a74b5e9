"""A/B pictures: what a reader would rather see than read.

Per A/B group, one PNG with:

* a request timeline of one control and one treatment repetition (the first of each):
  one row per request, its prefill (dispatch to first token) as a thin bar, every
  token-bearing event as a tick, the injected prefill as a red band across the rows;
* the inter-token time (per token, ms) of every control and treatment repetition as
  ECDFs on a log axis: the tail the medians hide;
* the per-repetition values of the headline metrics, each relative to the control's
  geometric mean, one dot per repetition.

Reproducible like ``plots.render``: matplotlib defaults restored, the Agg canvas used
directly, no "Software" text in the PNG.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from strata_plugin.analysis.interference import prefill_span
from strata_plugin.analysis.metrics import AB_HEADLINE, metric_label
from strata_plugin.formats.atomic import atomic_open
from strata_plugin.formats.records import RequestRecord

DPI = 80
MAX_TICKS = 20_000  # per timeline; more token events are thinned evenly


@dataclass(frozen=True)
class Repetition:
    arm: str
    case_id: str
    records: tuple[RequestRecord, ...]  # measured and injected
    values: dict[str, float]  # the headline metrics of this repetition


def _gaps_per_token(records: Sequence[RequestRecord]) -> list[float]:
    out = []
    for r in records:
        if r.phase != "measured" or not r.ok:
            continue
        toks = sorted((e.t_ns, e.n_tokens) for e in r.events if e.n_tokens > 0)
        out += [(b[0] - a[0]) / 1e6 / b[1] for a, b in pairwise(toks)]
    return out


def _timeline(ax, rep: Repetition) -> None:
    measured = sorted((r for r in rep.records if r.phase == "measured"),
                      key=lambda r: r.dispatched_ns)
    injected = [r for r in rep.records if r.phase == "injected"]
    if not measured:
        ax.set_title(f"{rep.arm}: {rep.case_id} (no requests)", loc="left")
        return
    t0 = measured[0].dispatched_ns
    xs, ys = [], []
    for row, r in enumerate(measured):
        span = prefill_span(r)
        if span is not None:
            ax.plot([(span[0] - t0) / 1e9, (span[1] - t0) / 1e9], [row, row],
                    color="tab:gray", lw=1.2, solid_capstyle="butt")
        for e in r.events:
            if e.n_tokens > 0:
                xs.append((e.t_ns - t0) / 1e9)
                ys.append(row)
    step = max(1, math.ceil(len(xs) / MAX_TICKS))
    ax.scatter(xs[::step], ys[::step], marker="|", s=9, lw=0.5, color="tab:blue")
    for r in injected:
        span = prefill_span(r)
        if span is not None:
            ax.axvspan((span[0] - t0) / 1e9, (span[1] - t0) / 1e9, color="tab:red",
                       alpha=0.18, lw=0, label="injected prefill (dispatch to first token)")
            ax.legend(loc="upper right", fontsize=6, frameon=False)
    ax.set_ylim(len(measured) - 0.5, -0.5)
    ax.set_ylabel("request")
    ax.set_xlabel("seconds from the first dispatch")
    ax.set_title(f"{rep.arm}: {rep.case_id} - grey: prefill in flight, ticks: tokens",
                 loc="left")
    ax.grid(True, axis="x", lw=0.3, alpha=0.5)


def _ecdf(ax, reps: Sequence[Repetition]) -> None:
    colors = {"control": "tab:blue"}
    for rep in reps:
        g = sorted(x for x in _gaps_per_token(rep.records) if x > 0)
        if not g:
            continue
        n = len(g)
        ax.step(g, [(i + 1) / n for i in range(n)], where="post", lw=0.8,
                color=colors.get(rep.arm, "tab:red"), alpha=0.8,
                label=f"{rep.arm} {rep.case_id}")
    ax.set_xscale("log")
    ax.set_xlabel("inter-token time per token (ms, log)")
    ax.set_ylabel("share of gaps <= x")
    ax.set_title("inter-token time, every repetition", loc="left")
    ax.grid(True, lw=0.3, alpha=0.5)
    if ax.get_lines():
        ax.legend(loc="lower right", fontsize=5, frameon=False)
    else:  # a prefill A/B: one output token per request, no gap to draw
        ax.text(0.5, 0.5, "no inter-token gaps (one output token per request)",
                ha="center", va="center", fontsize=7, transform=ax.transAxes)


def _per_repetition(ax, reps: Sequence[Repetition], control_arm: str) -> None:
    metrics = [m for m in AB_HEADLINE if any(m in r.values for r in reps)]
    for i, m in enumerate(metrics):
        ref = [r.values[m] for r in reps if r.arm == control_arm and r.values.get(m, 0) > 0]
        if not ref:
            continue
        g = math.exp(sum(math.log(x) for x in ref) / len(ref))
        for r in reps:
            v = r.values.get(m)
            if v is None or v <= 0:
                continue
            ax.scatter([v / g], [i], s=14, marker="o" if r.arm == control_arm else "x",
                       color="tab:blue" if r.arm == control_arm else "tab:red")
    ax.set_yticks(range(len(metrics)))
    ax.set_yticklabels([metric_label(m) for m in metrics], fontsize=6)
    ax.set_ylim(len(metrics) - 0.5, -0.5)
    ax.axvline(1.0, color="k", lw=0.5)
    ax.set_xscale("log")
    ax.set_xlabel(f"per repetition, / {control_arm}'s geometric mean (log): o {control_arm}, "
                  "x treatment")
    ax.set_title("headline metrics, each repetition", loc="left")
    ax.grid(True, axis="x", lw=0.3, alpha=0.5)


def render_group(path: Path, group: str, reps: Sequence[Repetition], control_arm: str) -> bool:
    """The group's PNG; False (nothing written) when no arm has requests."""
    if not any(r.records for r in reps):
        return False
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    control = next((r for r in reps if r.arm == control_arm and r.records), None)
    treated = next((r for r in reps if r.arm != control_arm and r.records), None)
    shown = [r for r in (control, treated) if r is not None]
    with matplotlib.rc_context():
        matplotlib.rcdefaults()
        matplotlib.rcParams.update({"svg.hashsalt": "strata", "font.size": 7,
                                    "axes.titlesize": 8, "path.simplify": True})
        rows = len(shown) + 1
        fig = Figure(figsize=(11.0, 2.6 * rows + 0.6), dpi=DPI)
        FigureCanvasAgg(fig)
        grid = fig.add_gridspec(rows, 2, width_ratios=(1.2, 1.0))
        first = None
        for i, rep in enumerate(shown):
            ax = fig.add_subplot(grid[i, :], sharex=first)
            first = first or ax
            _timeline(ax, rep)
        _ecdf(fig.add_subplot(grid[rows - 1, 0]), reps)
        _per_repetition(fig.add_subplot(grid[rows - 1, 1]), reps, control_arm)
        fig.suptitle(f"A/B group {group}", fontsize=9)
        fig.subplots_adjust(left=0.07, right=0.99, bottom=0.08, top=0.93, hspace=0.55,
                            wspace=0.35)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(path, "wb") as fh:
            fig.savefig(fh, format="png", dpi=DPI, metadata={"Software": None})
    return True

"""The time ledger as pictures: where each case's time went, and when the server stalled.

Two PNGs per case: a stacked bar of the ledger's shares (TTFT, TPOT/ITL, end-to-end),
and the case's requests on a timeline with their decode stalls coloured by what the
server did meanwhile (analysis/run_states.py). A reader sees where the time went
before reading a table. Byte-for-byte reproducible, as report/plots.py's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from strata_plugin.analysis.ledger import METRIC_LABELS, METRICS, CaseLedger, stall_spans
from strata_plugin.formats.atomic import atomic_open
from strata_plugin.formats.records import ClockAnchor, RequestRecord

if TYPE_CHECKING:
    from matplotlib.lines import Line2D

#: One colour per part, by what the part is: the client grey, outside the server blue
#: (on the way there dark, delivery on the way back light),
#: the server's queue purple, its compute greens, its stalls warm, what no clock
#: explains black.
COLOURS = {
    "client_send": "#9e9e9e",
    "before_server": "#1f77b4",
    "server_queue": "#9467bd",
    "prefill": "#2ca02c",
    "ttft_waiting": "#ff7f0e",
    "ttft_io": "#8c564b",
    "ttft_stalled": "#d62728",
    "ttft_delivery": "#aec7e8",
    "residual_ttft": "#000000",
    "decode_compute": "#98df8a",
    "stall_stalled": "#d62728",
    "stall_waiting": "#ff7f0e",
    "stall_throttled": "#ffbb78",
    "stall_io": "#8c564b",
    "stall_sleeping": "#17becf",
    "stall_running": "#bcbd22",
    "delivery": "#aec7e8",
    "residual_decode": "#000000",
    "tail": "#c7c7c7",
}
STATE_COLOURS = {
    "stalled": COLOURS["stall_stalled"],
    "waiting": COLOURS["stall_waiting"],
    "throttled": COLOURS["stall_throttled"],
    "io": COLOURS["stall_io"],
    "sleeping": COLOURS["stall_sleeping"],
    "running": COLOURS["stall_running"],
    "unknown": "#000000",
}
DPI = 110


def _figure(w: float, h: float):  # -> (Figure, FigureCanvasAgg)
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from strata_plugin.report.plots import use_strata_matplotlib_cache

    use_strata_matplotlib_cache()
    matplotlib.rcdefaults()
    matplotlib.rcParams.update({"svg.hashsalt": "strata", "font.size": 7,
                                "axes.titlesize": 8, "legend.fontsize": 6.5})
    fig = Figure(figsize=(w, h))
    FigureCanvasAgg(fig)
    return fig


def _num(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    # a label's width is the picture's: 1e300 ms written out is 301 digits wide
    return f"{x:.0f}" if 100 <= x < 1e7 else f"{x:.3g}"


def _share(x: float) -> str:
    """A part's share as its bar's label, the whole of it where the bar is cut."""
    return f"{x:.0%}" if x < 100 else f"{100 * x:.3g}%"


def bars(path: Path, title: str, led: CaseLedger) -> None:
    """Three stacked bars, one per metric, each 100%: the parts' shares, labelled where
    wide enough; the case's metric marked. The axis is 0-100% whatever the shares say:
    where the engine's clocks claim more time than the client saw (a negative residual,
    an engine reporting seconds as milliseconds) the parts pass 100%, and the bar is cut
    there and labelled so, rather than the picture growing to hold them."""
    import matplotlib

    rows = [seg for seg in ("ttft", "itl", "e2e") if led.shares(seg)]
    with matplotlib.rc_context():
        fig = _figure(7.5, 0.75 + 0.55 * len(rows))
        ax = fig.add_subplot(1, 1, 1)
        used: dict[str, object] = {}
        cut: set[str] = set()
        for y, seg in enumerate(reversed(rows)):
            left = 0.0
            for part, share in led.shares(seg):
                whole = w = abs(share) if math.isfinite(share) else 0.0
                if w > 1.0 - left + 1e-9:  # past 100%: cut at the axis's end
                    cut.add(seg)
                    w = max(0.0, 1.0 - left)
                if w <= 0:
                    continue
                bar = ax.barh(y, w * 100, left=left * 100, height=0.6,
                              color=COLOURS[part], edgecolor="white", linewidth=0.5)
                used.setdefault(part, bar)
                if w >= 0.06:
                    dark = part in ("residual_ttft", "residual_decode", "before_server",
                                    "server_queue", "ttft_stalled", "stall_stalled")
                    ax.text((left + w / 2) * 100, y, _share(whole), ha="center", va="center",
                            fontsize=6.5, color="white" if dark else "black", clip_on=True)
                left += w
        labels = []
        for seg in reversed(rows):
            mean = led.ms_per_token() if seg == "itl" else led.mean_ms(seg)
            unit = "ms/token" if seg == "itl" else "ms"
            mark = " *" if seg == led.metric else ""
            over = "\n(parts past 100%: cut)" if seg in cut else ""
            labels.append(f"{METRIC_LABELS[seg]}{mark}\n{_num(mean)} {unit}{over}" if mean
                          else seg + over)
        ax.set_yticks(range(len(rows)), labels)
        ax.set_xlim(0, 100)
        ax.set_xlabel("share of the metric's time (%); * the metric this case is about")
        ax.set_title(title)
        order = [p for p in METRICS["e2e"] if p in used]
        ax.legend([used[p] for p in order], order, ncol=5, loc="upper center",
                  bbox_to_anchor=(0.5, -0.45 - 0.05 * (3 - len(rows))), frameon=False)
        fig.subplots_adjust(left=0.17, right=0.98, top=0.82, bottom=0.45)
        with atomic_open(path, "wb") as fh:
            fig.savefig(fh, format="png", dpi=DPI, metadata={"Software": None},
                        bbox_inches="tight")


def timeline(path: Path, title: str, records: Sequence[RequestRecord],
             led: CaseLedger, anchor: ClockAnchor | None, max_requests: int = 64) -> bool:
    """Each measured request a row: TTFT light, decode grey, every decode stall coloured
    by the server's state during it (black: no run-state sample covered it), the stalls
    the case's ledger counted (its run states, its delivery split). False, and nothing
    drawn, when no measured request has tokens."""
    states = led.states
    deliveries = {r.request_id: r.delivery for r in led.requests}
    import matplotlib

    recs = sorted((r for r in records if r.phase == "measured" and r.ok and r.events),
                  key=lambda r: r.dispatched_ns)[:max_requests]
    if not recs:
        return False
    t0 = recs[0].dispatched_ns
    with matplotlib.rc_context():
        fig = _figure(7.5, 1.2 + 0.06 * len(recs))
        ax = fig.add_subplot(1, 1, 1)
        seen: dict[str, Line2D] = {}
        for y, r in enumerate(recs):
            toks = [e.t_ns for e in r.events if e.n_tokens > 0]
            if not toks:
                continue
            first, last = min(toks), max(toks)
            ax.plot([(r.dispatched_ns - t0) / 1e9, (first - t0) / 1e9], [y, y],
                    color=COLOURS["before_server"], linewidth=1.2, alpha=0.5,
                    solid_capstyle="butt")
            ax.plot([(first - t0) / 1e9, (last - t0) / 1e9], [y, y],
                    color=COLOURS["decode_compute"], linewidth=1.2, solid_capstyle="butt")
            for a, b, state in stall_spans(r, states, anchor,
                                           deliveries.get(r.request_id)):
                # within the request's own tokens: a span past them is a clock's error,
                # and would widen the axis for nothing
                a, b = min(max(a, first), last), min(max(b, first), last)
                if not (math.isfinite(a) and math.isfinite(b)) or b <= a:
                    continue
                (line,) = ax.plot([(a - t0) / 1e9, (b - t0) / 1e9], [y, y],
                                  color=STATE_COLOURS[state], linewidth=2.6,
                                  solid_capstyle="butt")
                seen.setdefault(state, line)
        ax.set_ylim(-1, len(recs))
        ax.invert_yaxis()
        ax.set_xlabel("seconds since the first measured dispatch")
        ax.set_ylabel("request")
        ax.set_title(title + (" (no run-state samples: stalls unclassified)"
                              if states is None else ""), pad=16)
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=COLOURS["before_server"], alpha=0.5, lw=1.2),
                   Line2D([], [], color=COLOURS["decode_compute"], lw=1.2)]
        names = ["dispatch -> first token", "decode"]
        for state in STATE_COLOURS:
            if state in seen:
                handles.append(seen[state])
                names.append(f"stall: {state}")
        ax.legend(handles, names, ncol=len(handles), loc="lower center",
                  bbox_to_anchor=(0.5, 1.0), frameon=False, fontsize=6, handlelength=1.5,
                  columnspacing=1.0)
        with atomic_open(path, "wb") as fh:
            fig.savefig(fh, format="png", dpi=DPI, metadata={"Software": None},
                        bbox_inches="tight")
    return True

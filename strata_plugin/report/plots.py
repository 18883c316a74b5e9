"""Timeline PNGs: GPU, CPU, disk, network, RDMA, memory and server panels.

One figure per case (its measured window with a margin) and one for the whole run,
with case windows shaded and request windows drawn as a band along the top of each
panel. A panel with no data is left out and named in the returned notes, never drawn
empty. The PNGs are byte-for-byte reproducible: matplotlib's defaults are restored
for every figure, the Agg canvas is used directly (no pyplot state), and the PNG
carries no "Software" text.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

from strata_plugin.analysis.timeline import SampleStore, merge_intervals
from strata_plugin.formats.atomic import atomic_open

if TYPE_CHECKING:
    import numpy as np

MAX_POINTS = 1500  # per line; longer series are averaged into this many bins
HEAT_BINS = 240
DPI = 80


@dataclass
class Panel:
    key: str
    title: str
    ylabel: str
    lines: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)
    heat: tuple[list[str], np.ndarray, np.ndarray] | None = None  # labels, x edges, values
    log_y: bool = False


@dataclass(frozen=True)
class Span:
    start_s: float
    end_s: float
    label: str = ""


def _slice(store: SampleStore, i: int, start: int, end: int, counter: bool):
    import numpy as np

    a, b = int(store.bounds[i]), int(store.bounds[i + 1])
    t = store.t[a:b]
    lo = int(np.searchsorted(t, start, "left"))
    hi = int(np.searchsorted(t, end, "right"))
    if counter:
        lo, hi = max(lo - 1, 0), min(hi + 1, len(t))
        return t[lo:hi], store.acc[a + lo : a + hi]
    return t[lo:hi], store.v[a + lo : a + hi]


def _bin(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(x)
    if n <= MAX_POINTS:
        return x, y
    k = math.ceil(n / MAX_POINTS)
    m = (n // k) * k
    return x[:m].reshape(-1, k).mean(axis=1), y[:m].reshape(-1, k).mean(axis=1)


def _series(
    store: SampleStore,
    source: str | tuple[str, ...],
    metric: str,
    start: int,
    end: int,
    t0: int,
    scale: float = 1.0,
    keep: Callable[[str], bool] = lambda d: True,
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    import numpy as np

    sources = (source,) if isinstance(source, str) else source
    multi_node = len({k.node for k in store.keys}) > 1
    out = []
    for i, k in enumerate(store.keys):
        if k.source not in sources or k.metric != metric or not keep(k.device):
            continue
        t, v = _slice(store, i, start, end, k.kind == "counter")
        if k.kind == "counter":
            if len(t) < 2:
                continue
            dt = np.diff(t) / 1e9
            ok = dt > 0
            y = (np.diff(v)[ok] / dt[ok]) * scale
            x = ((t[:-1] + t[1:]) // 2)[ok]
        else:
            if len(t) == 0:
                continue
            x, y = t, v * scale
        xs = (x - t0) / 1e9
        where = f"{k.node}/{k.device}" if k.device else k.node
        label = where if multi_node else (k.device or k.node)
        if metric not in label and len(sources) == 1 and source not in ("nvml",):
            label = f"{label} {metric}".strip()
        out.append((label, *_bin(xs.astype(np.float64), y.astype(np.float64))))
    return sorted(out, key=lambda s: s[0])


def _cpu_heat(store: SampleStore, start: int, end: int, t0: int):
    """Per-core busy fraction on a common grid: counters interpolated at bin edges."""
    import numpy as np

    rows, labels = [], []
    edges = np.linspace(start, end, HEAT_BINS + 1)
    multi_node = len({k.node for k in store.keys}) > 1
    cores = [
        (i, k)
        for i, k in enumerate(store.keys)
        if k.source == "cpu" and k.metric == "busy_s" and k.device.startswith("cpu")
    ]
    cores.sort(
        key=lambda ik: (
            ik[1].node,
            int(ik[1].device[3:] or 0) if ik[1].device[3:].isdigit() else 0,
            ik[1].device,
        )
    )
    for i, k in cores:
        t, acc = _slice(store, i, start, end, True)
        if len(t) < 2:
            continue
        tf = (t - start).astype(np.float64)
        c = np.interp(edges - start, tf, acc, left=np.nan, right=np.nan)
        rows.append(np.clip(np.diff(c) / (np.diff(edges) / 1e9), 0.0, 1.0))
        labels.append(f"{k.node}/{k.device}" if multi_node else k.device)
    if not rows:
        return None
    return labels, (edges - t0) / 1e9, np.vstack(rows)


#: (key, title, y label, builder); a builder returns lines (or a heatmap) or nothing.
def _panel_specs():
    gpu = ("nvml", "dcgm")
    no_lo = lambda d: d != "lo"  # noqa: E731 - a tiny filter reads best inline
    tree = lambda d: d == ""  # noqa: E731 - the process tree, not its pids or threads
    return (
        (
            "gpu_util",
            "GPU utilization (NVML)",
            "%",
            lambda s, a, b, t0: _series(s, gpu, "gpu_util_pct", a, b, t0),
        ),
        (
            "sm_active",
            "SM activity (GPM/DCGM)",
            "%",
            lambda s, a, b, t0: _series(s, gpu, "gpm_sm_activity_pct", a, b, t0),
        ),
        ("gpu_power", "GPU power", "W", lambda s, a, b, t0: _series(s, gpu, "power_w", a, b, t0)),
        (
            "sm_clock",
            "SM clock",
            "MHz",
            lambda s, a, b, t0: _series(s, gpu, "sm_clock_mhz", a, b, t0),
        ),
        ("cpu_cores", "CPU busy per core", "core", None),
        (
            "server_cpu",
            "CPU: server process and node",
            "cores",
            lambda s, a, b, t0: (
                _series(s, "proc", "cpu_user_s", a, b, t0, keep=tree)
                + _series(s, "proc", "cpu_system_s", a, b, t0, keep=tree)
                + _series(s, "cpu", "busy_s", a, b, t0, keep=lambda d: d == "")
            ),
        ),
        (
            "server_io",
            "Server faults and reads",
            "1/s | MB/s",
            lambda s, a, b, t0: (
                _series(s, "proc", "major_faults", a, b, t0, keep=tree)
                + _series(s, "proc", "read_bytes", a, b, t0, 1e-6, keep=tree)
            ),
        ),
        (
            "disk",
            "Disk",
            "MB/s",
            lambda s, a, b, t0: (
                _series(s, "disk", "read_bytes", a, b, t0, 1e-6)
                + _series(s, "disk", "write_bytes", a, b, t0, 1e-6)
            ),
        ),
        (
            "network",
            "Network (non-loopback)",
            "MB/s",
            lambda s, a, b, t0: (
                _series(s, "net", "rx_bytes", a, b, t0, 1e-6, keep=no_lo)
                + _series(s, "net", "tx_bytes", a, b, t0, 1e-6, keep=no_lo)
            ),
        ),
        (
            "rdma",
            "RDMA per rail",
            "GB/s",
            lambda s, a, b, t0: (
                _series(s, "rdma", "xmit_bytes", a, b, t0, 1e-9)
                + _series(s, "rdma", "rcv_bytes", a, b, t0, 1e-9)
            ),
        ),
        (
            "memory",
            "Memory",
            "GiB",
            lambda s, a, b, t0: (
                _series(s, "mem", "mem_available_bytes", a, b, t0, 2**-30)
                + _series(s, "proc", "rss_bytes", a, b, t0, 2**-30, keep=tree)
            ),
        ),
        (
            "server_queue",
            "Server scheduler (/metrics)",
            "requests",
            lambda s, a, b, t0: (
                _series(s, "prom", "running_requests", a, b, t0)
                + _series(s, "prom", "waiting_requests", a, b, t0)
            ),
        ),
    )


def build_panels(
    store: SampleStore, start: int, end: int, t0: int
) -> tuple[list[Panel], list[str]]:
    """Panels with data, and a note for each left out."""
    panels, omitted = [], []
    for key, title, ylabel, builder in _panel_specs():
        p = Panel(key, title, ylabel)
        if builder is None:
            p.heat = _cpu_heat(store, start, end, t0)
        else:
            p.lines = builder(store, start, end, t0)
        if p.heat is None and not p.lines:
            omitted.append(f"{title}: no samples in this window")
        elif p.heat is None and all_zero(p.lines):
            omitted.append(f"{title}: zero throughout this window")
        else:
            panels.append(p)
    return panels, omitted


def all_zero(lines: Sequence[tuple[str, np.ndarray, np.ndarray]]) -> bool:
    """Every finite value of every line is 0 (or none is finite): a panel that would
    say nothing but its axis (an idle network on a -0.05..0.05 axis)."""
    import numpy as np

    for _, _, y in lines:
        y = np.asarray(y, dtype=np.float64)
        finite = y[np.isfinite(y)]
        if finite.size and np.any(finite != 0.0):
            return False
    return True


def tick_decimals(locs: Sequence[float]) -> int:
    """Decimals that tell adjacent ticks apart: from the spacing of the ticks, not their
    size (22.9405 and 22.9410 GiB are both "22.94" at four significant digits)."""
    xs = sorted({float(x) for x in locs if math.isfinite(x)})
    steps = [b - a for a, b in pairwise(xs) if b > a]
    if not steps:
        return 0
    step = min(steps)
    return max(0, min(9, -math.floor(math.log10(step) + 1e-9)))


def tick_label(x: float, decimals: int) -> str:
    text = f"{x:.{decimals}f}"
    if len(text) > 10:  # a huge value: significant digits instead of a long integer
        text = f"{x:.6g}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text  # no "-0.0"


def flat_limits(lines: Sequence[tuple[str, np.ndarray, np.ndarray]]) -> tuple[float, float] | None:
    """Y limits for lines that vary by less than 0.1% of their level (memory that barely
    moves): +-1% of the level, so a flat line reads flat, not as noise blown up to fill
    the panel. None where the lines vary more, or sit at 0."""
    import numpy as np

    ys = [np.asarray(y, dtype=np.float64) for _, _, y in lines]
    finite = np.concatenate([y[np.isfinite(y)] for y in ys]) if ys else np.array([])
    if finite.size == 0:
        return None
    lo, hi = float(finite.min()), float(finite.max())
    level = max(abs(lo), abs(hi))
    if level == 0 or hi - lo >= 1e-3 * level:
        return None
    return lo - 0.01 * level, hi + 0.01 * level


def render(
    path: Path,
    panels: Sequence[Panel],
    title: str,
    x_range: tuple[float, float],
    shaded: Sequence[Span] = (),
    requests: Sequence[Span] = (),
    marks: Sequence[Span] = (),
) -> None:
    """Draw the panels into one PNG; same inputs, same bytes. ``marks``: warm-ups (grey)
    and injected prefills (red, label starting "inject") drawn across every panel."""
    use_strata_matplotlib_cache()
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with matplotlib.rc_context():
        matplotlib.rcdefaults()
        matplotlib.rcParams.update(
            {
                "svg.hashsalt": "strata",
                "font.size": 7,
                "axes.titlesize": 8,
                "path.simplify": True,
                "axes.formatter.useoffset": False,
            }
        )
        n = max(len(panels), 1)
        height = 0.9 + 1.7 * n
        fig = Figure(figsize=(11.0, height), dpi=DPI)
        FigureCanvasAgg(fig)
        axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
        for ax, p in zip(axes, panels, strict=False):
            _draw_panel(ax, p)
            for sp in shaded:
                ax.axvspan(sp.start_s, sp.end_s, color="tab:blue", alpha=0.07, lw=0)
            for sp in marks:
                red = sp.label.startswith("inject")
                ax.axvspan(sp.start_s, max(sp.end_s, sp.start_s + 1e-3),
                           color="tab:red" if red else "tab:gray", alpha=0.25 if red else 0.12,
                           lw=0)
            if requests:
                ax.broken_barh(
                    [(r.start_s, max(r.end_s - r.start_s, 1e-6)) for r in requests],
                    (0.96, 0.04),
                    transform=ax.get_xaxis_transform(),
                    color="tab:orange",
                    alpha=0.6,
                    lw=0,
                )
            ax.set_xlim(*x_range)
        if shaded and panels:
            top = axes[0]
            top.set_title(panels[0].title, loc="left", pad=16)  # room for the case labels
            for sp in shaded:
                if sp.label:
                    top.text(
                        sp.start_s,
                        1.02,
                        sp.label,
                        transform=top.get_xaxis_transform(),
                        fontsize=5,
                        rotation=20,
                        ha="left",
                        va="bottom",
                        clip_on=False,
                    )
        axes[-1].set_xlabel("seconds")
        fig.suptitle(title, fontsize=9, y=1 - 0.12 / height)
        # Fixed margins in inches: tight_layout would draw every figure twice.
        fig.subplots_adjust(  # right: room for the CPU heatmap's colour bar
            left=0.07, right=0.955, bottom=0.45 / height, top=1 - 0.55 / height, hspace=0.55
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(path, "wb") as fh:
            fig.savefig(fh, format="png", dpi=DPI, metadata={"Software": None})


def _draw_panel(ax, p: Panel) -> None:
    ax.set_title(p.title, loc="left")
    ax.set_ylabel(p.ylabel)
    ax.grid(True, lw=0.3, alpha=0.5)
    if p.heat is not None:
        labels, edges, values = p.heat
        mesh = ax.pcolormesh(
            edges,
            range(len(labels) + 1),
            values,
            vmin=0.0,
            vmax=1.0,
            cmap="viridis",
            shading="flat",
        )
        step = max(1, len(labels) // 8)
        ax.set_yticks([i + 0.5 for i in range(0, len(labels), step)])
        ax.set_yticklabels(labels[::step], fontsize=5)
        # The colour's scale beside the panel, outside it: the time axis stays shared.
        cax = ax.inset_axes([1.006, 0.0, 0.008, 1.0])
        bar = ax.figure.colorbar(mesh, cax=cax, ticks=[0.0, 0.5, 1.0])
        bar.ax.tick_params(labelsize=5)
        bar.set_label("busy fraction", fontsize=5)
        return
    from matplotlib.ticker import FuncFormatter

    for label, x, y in p.lines:
        ax.plot(x, y, lw=0.8, label=label, marker="o" if len(x) == 1 else None, ms=2)
    if p.log_y:
        ax.set_yscale("log")
    else:
        flat = flat_limits(p.lines)
        if flat is not None:
            ax.set_ylim(*flat)
        ax.yaxis.set_major_formatter(FuncFormatter(
            lambda v, _pos: tick_label(v, tick_decimals(ax.yaxis.get_majorticklocs()))))
    if len(p.lines) <= 12:
        ax.legend(loc="upper left", fontsize=5, ncol=min(4, len(p.lines)), frameon=False)


def request_panel(records, t0_wall: int, to_wall) -> Panel | None:
    """TTFT (at each request's dispatch) and chunk gaps (at each gap's end), in ms, on the
    hardware panels' time axis; ``to_wall`` maps a record's monotonic ns to wall ns."""
    import numpy as np

    ttft, gaps = [], []
    for r in records:
        if r.phase != "measured" or not r.ok:
            continue
        toks = sorted(e.t_ns for e in r.events if e.n_tokens > 0)
        if toks:
            ttft.append(((to_wall(r.dispatched_ns) - t0_wall) / 1e9,
                         (toks[0] - r.dispatched_ns) / 1e6))
        gaps += [((to_wall(b) - t0_wall) / 1e9, (b - a) / 1e6) for a, b in pairwise(toks)]
    if not ttft and not gaps:
        return None
    p = Panel("requests", "requests: TTFT at dispatch, chunk gaps at arrival", "ms (log)")
    for label, pts in (("chunk gap", gaps), ("TTFT", ttft)):
        if pts:
            pts.sort()
            x, y = _bin(np.array([a for a, _ in pts]), np.array([b for _, b in pts]))
            p.lines.append((label, x, y))
    p.log_y = True
    return p


def request_spans(
    intervals: Sequence[tuple[int, int]], t0: int, start: int, end: int, max_spans: int = 400
) -> list[Span]:
    """Request windows clipped to the view and merged so at most ``max_spans`` remain."""
    inside = [(max(a, start), min(b, end)) for a, b in intervals if b > start and a < end]
    gap = 0
    merged = merge_intervals(inside)
    while len(merged) > max_spans:
        gap = max(1, gap * 2) if gap else max(1, (end - start) // (max_spans * 4))
        merged = merge_intervals(inside, gap)
    return [Span((a - t0) / 1e9, (b - t0) / 1e9) for a, b in merged]


def use_strata_matplotlib_cache() -> None:
    """Matplotlib's font cache under Strata's cache (unless the user chose a place), so a run
    writes nothing outside the repository, its virtualenv and ``~/.cache/strata``."""
    import os

    if "MPLCONFIGDIR" not in os.environ:
        from strata_plugin.embedded.llama_setup import cache_root

        path = cache_root() / "matplotlib"
        path.mkdir(parents=True, exist_ok=True)
        os.environ["MPLCONFIGDIR"] = str(path)

"""Timeline panels that say something: distinct tick labels, a colour scale, no empty axes."""

from __future__ import annotations

import numpy as np

from strata_plugin.report import plots
from strata_plugin.report.plots import Panel, all_zero, flat_limits, tick_decimals, tick_label


def _drawn(panel: Panel):
    """The panel drawn on a real Agg figure, as render() draws it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 2), dpi=80)
    FigureCanvasAgg(fig)
    ax = fig.subplots(1, 1)
    plots._draw_panel(ax, panel)
    fig.canvas.draw()
    return fig, ax


def test_memory_that_barely_moves_gets_tick_labels_that_differ():
    """The report's memory axis read "22.94" on every tick (four significant digits of
    ticks 0.0005 GiB apart): the labels must tell the ticks apart."""
    x = np.linspace(0.0, 10.0, 21)
    y = 22.94 + 0.0004 * np.sin(x)  # GiB: a few hundred KiB of movement
    _fig, ax = _drawn(Panel("memory", "Memory", "GiB", lines=[("mem_available", x, y)]))
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
    lo, hi = ax.get_ylim()
    assert hi - lo >= 0.02 * 22.94 * 0.99  # drawn flat on a +-1% axis, not blown up


def test_tick_decimals_follow_the_spacing():
    assert tick_decimals([22.9405, 22.9410, 22.9415]) == 4
    assert tick_decimals([0.0, 0.5, 1.0]) == 1
    assert tick_decimals([0.0, 1.0, 2.0]) == 0
    assert tick_decimals([0, 200, 400]) == 0
    assert tick_decimals([1.0]) == 0  # one tick: nothing to tell apart
    assert [tick_label(v, 4) for v in (22.9405, 22.941)] == ["22.9405", "22.9410"]
    assert tick_label(-0.0, 2) == "0.00" and tick_label(3e12, 0) == "3e+12"


def test_flat_limits_only_for_lines_flatter_than_a_thousandth():
    x = np.arange(5.0)
    assert flat_limits([("m", x, np.full(5, 100.0))]) == (99.0, 101.0)
    just_flat = np.array([100.0, 100.0, 100.0999, 100.0, 100.0])
    assert flat_limits([("m", x, just_flat)]) is not None
    moving = np.array([100.0, 100.0, 100.1002, 100.0, 100.0])  # past 0.1%: its own axis
    assert flat_limits([("m", x, moving)]) is None
    assert flat_limits([("m", x, np.zeros(5))]) is None


def test_the_cpu_heatmap_has_a_colour_bar():
    labels = ["cpu0", "cpu1"]
    edges = np.linspace(0.0, 4.0, 5)
    values = np.array([[0.0, 0.25, 0.5, 1.0], [1.0, 0.5, 0.25, 0.0]])
    fig, ax = _drawn(Panel("cpu_cores", "CPU busy per core", "core",
                           heat=(labels, edges, values)))
    bars = ax.child_axes  # an inset beside the panel
    assert len(bars) == 1, fig.axes
    assert bars[0].get_ylabel() == "busy fraction"
    assert [t.get_text() for t in bars[0].get_yticklabels()] == ["0.0", "0.5", "1.0"]
    assert bars[0].get_position().x0 > ax.get_position().x1  # beside the panel, not on it


def test_a_panel_that_is_zero_throughout_is_left_out_with_the_reason():
    x = np.arange(4.0)
    assert all_zero([("eth0 rx", x, np.zeros(4)), ("eth0 tx", x, np.array([0, np.nan, 0, 0]))])
    assert not all_zero([("eth0 rx", x, np.array([0.0, 0.0, 1e-9, 0.0]))])
    assert all_zero([("x", x, np.full(4, np.nan))])


def test_build_panels_names_the_all_zero_panel(monkeypatch):
    x = np.arange(4.0)
    specs = (("network", "Network (non-loopback)", "MB/s",
              lambda s, a, b, t0: [("eth0 rx_bytes", x, np.zeros(4))]),
             ("memory", "Memory", "GiB", lambda s, a, b, t0: [("m", x, np.ones(4))]))
    monkeypatch.setattr(plots, "_panel_specs", lambda: specs)
    panels, omitted = plots.build_panels(None, 0, 1, 0)
    assert [p.key for p in panels] == ["memory"]
    assert omitted == ["Network (non-loopback): zero throughout this window"]

"""Node clocks against the harness clock: linear drift, uncertainty, and when to warn.

Why a module of its own: the agent handle measures an offset at a node's start and at
its end (NTP-style, the round trip with the smallest RTT wins); between the two the
node's clock is taken to drift linearly. Everything here is a pure function, so the
live run (``run/agents.py`` writes the manifest), the timeline (``NodeClock`` applies it)
and the report (warnings) agree on one arithmetic, and it can be checked on recorded
data with a known offset.

Convention, as in ``agent/handle.py``: ``offset = node_wall - harness_wall``, so
``harness_wall_ns = node_wall_ns - offset_ns``. The anchors ``t_start``/``t_end`` are
on the *node* clock (the harness midpoint of the best round trip plus its offset),
which is what ``NodeClock`` interpolates over; outside them the offset is held
at the nearer end, as the timeline does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The manifest keys of ``nodes.<node>`` that ``timeline.node_clocks`` reads.
MANIFEST_KEYS = (
    "clock_offset_ns",
    "clock_uncertainty_ns",
    "offset_start_ns",
    "offset_end_ns",
    "start_wall_ns",
    "end_wall_ns",
)


def offset_at(
    t_node_ns: np.ndarray | Sequence[int],
    offset_start: int,
    offset_end: int,
    t_start: int,
    t_end: int,
) -> np.ndarray:
    """The interpolated offset (ns, int64) at each node wall-clock time."""
    t = np.asarray(t_node_ns, dtype=np.int64)
    if offset_end == offset_start or t_end <= t_start or len(t) == 0:
        return np.full(t.shape, int(offset_start), dtype=np.int64)
    # In place, one float pass: the timeline runs this over every sample of a node.
    frac = (t - t_start).astype(np.float64)
    frac *= 1.0 / (t_end - t_start)
    np.clip(frac, 0.0, 1.0, out=frac)
    frac *= float(offset_end - offset_start)
    off = frac.astype(np.int64)  # truncation: < 1 ns from the exact line
    off += int(offset_start)
    return off


def align(
    samples_wall_ns: np.ndarray | Sequence[int],
    offset_start: int,
    offset_end: int,
    t_start: int,
    t_end: int,
) -> np.ndarray:
    """Node wall-clock stamps -> harness wall clock, with the offset interpolated linearly.

    Monotone in its input (the slope of a real drift is far below 1), so sample order
    is kept and a window slice stays two binary searches.
    """
    t = np.asarray(samples_wall_ns, dtype=np.int64)
    return t - offset_at(t, offset_start, offset_end, t_start, t_end)


@dataclass(frozen=True)
class ClockFit:
    """A node's clock as the report states it."""

    node: str
    offset_start_ns: int
    offset_end_ns: int
    start_wall_ns: int | None  # node clock at the start measurement
    end_wall_ns: int | None
    uncertainty_ns: int  # the larger of the two half round trips
    drift_ppm: float | None  # (offset_end - offset_start) / span, parts per million

    def manifest(self) -> dict[str, int | float | None]:
        """The ``nodes.<node>`` entries, under the names the timeline reads."""
        return {
            "clock_offset_ns": self.offset_start_ns,
            "clock_uncertainty_ns": self.uncertainty_ns,
            "offset_start_ns": self.offset_start_ns,
            "offset_end_ns": self.offset_end_ns,
            "start_wall_ns": self.start_wall_ns,
            "end_wall_ns": self.end_wall_ns,
            "clock_drift_ppm": self.drift_ppm,
        }


def fit(node: str, start: Any, end: Any | None = None) -> ClockFit:
    """A :class:`ClockFit` from the handle's ``ClockOffset`` at start (and at end).

    ``start``/``end`` need ``offset_ns``, ``uncertainty_ns`` and ``measured_wall_ns``
    (harness clock); the anchors are moved onto the node clock here.
    """
    s_anchor = _node_anchor(start)
    if end is None:
        return ClockFit(
            node, start.offset_ns, start.offset_ns, s_anchor, None, int(start.uncertainty_ns), None
        )
    e_anchor = _node_anchor(end)
    drift = None
    if s_anchor is not None and e_anchor is not None and e_anchor > s_anchor:
        drift = (end.offset_ns - start.offset_ns) / (e_anchor - s_anchor) * 1e6
    return ClockFit(
        node,
        int(start.offset_ns),
        int(end.offset_ns),
        s_anchor,
        e_anchor,
        int(max(start.uncertainty_ns, end.uncertainty_ns)),
        drift,
    )


@dataclass(frozen=True)
class NodeClock:
    """A node's clock as the timeline applies it: offset = node clock - harness clock.

    Measured at agent start and stop; in between the drift is taken as linear. When
    ``start_wall_ns``/``end_wall_ns`` are unknown, the span of the node's own samples
    stands in for them (the agent measures its offset as it starts and stops).
    """

    node: str
    offset_start_ns: int = 0
    offset_end_ns: int = 0
    start_wall_ns: int | None = None
    end_wall_ns: int | None = None
    uncertainty_ns: int | None = None
    measured: bool = False

    def _span(self, node_wall_ns: np.ndarray) -> tuple[int, int]:
        if len(node_wall_ns) == 0:
            return 0, 0
        t0 = self.start_wall_ns if self.start_wall_ns is not None else int(node_wall_ns.min())
        t1 = self.end_wall_ns if self.end_wall_ns is not None else int(node_wall_ns.max())
        return t0, t1

    def offsets(self, node_wall_ns: np.ndarray) -> np.ndarray:
        return offset_at(node_wall_ns, self.offset_start_ns, self.offset_end_ns,
                         *self._span(node_wall_ns))

    def to_harness(self, node_wall_ns: np.ndarray) -> np.ndarray:
        """Node wall-clock ns -> harness wall-clock ns (monotone, so order is kept)."""
        return align(node_wall_ns, self.offset_start_ns, self.offset_end_ns,
                     *self._span(node_wall_ns))


def node_clocks(manifest: Mapping[str, Any]) -> dict[str, NodeClock]:
    """Clocks from ``manifest["nodes"][<node>]``; a node without offsets gets offset 0."""
    out = {}
    for node, d in sorted((manifest.get("nodes") or {}).items()):
        if not isinstance(d, dict):
            continue
        base = d.get("offset_start_ns", d.get("clock_offset_ns"))
        end = d.get("offset_end_ns", base)
        out[node] = NodeClock(
            node=node,
            offset_start_ns=int(base or 0),
            offset_end_ns=int(end if end is not None else (base or 0)),
            start_wall_ns=_int_or_none(d.get("start_wall_ns")),
            end_wall_ns=_int_or_none(d.get("end_wall_ns")),
            uncertainty_ns=_int_or_none(d.get("clock_uncertainty_ns")),
            measured=base is not None,
        )
    return out


def _int_or_none(v: Any) -> int | None:
    return None if v is None else int(v)


def _node_anchor(off: Any) -> int | None:
    wall = getattr(off, "measured_wall_ns", 0)
    return int(wall) + int(off.offset_ns) if wall else None


def clock_warning(node: str, uncertainty_ns: int | None, interval_s: float) -> str | None:
    """A warning for the report when the offset is less certain than one sampling interval.

    Then a sample may be filed in the neighbouring interval, and short windows of that
    node (a few intervals) cannot be compared sample by sample with the harness.
    """
    if uncertainty_ns is None or interval_s <= 0:
        return None
    interval_ns = interval_s * 1e9
    if uncertainty_ns <= interval_ns:
        return None
    return (
        f"node {node}: clock offset uncertain by ±{uncertainty_ns / 1e6:.1f} ms, more than "
        f"the {interval_s * 1e3:.0f} ms sampling interval; its samples may shift by one "
        f"interval against the request markers (re-measure over a quieter link, or use "
        f"windows of many intervals)"
    )


def clock_warnings(manifest: Mapping[str, Any], interval_s: float) -> list[str]:
    """Every node of a manifest whose uncertainty (or drift across the run) exceeds one
    sampling interval."""
    out = []
    for node, d in sorted((manifest.get("nodes") or {}).items()):
        if not isinstance(d, Mapping):
            continue
        w = clock_warning(node, d.get("clock_uncertainty_ns"), interval_s)
        if w:
            out.append(w)
        a, b = d.get("offset_start_ns"), d.get("offset_end_ns")
        if a is not None and b is not None and abs(int(b) - int(a)) > interval_s * 1e9:
            out.append(
                f"node {node}: clock moved {(int(b) - int(a)) / 1e6:+.1f} ms between the "
                f"start and end measurements, more than one sampling interval; the "
                f"linear interpolation assumes it drifted steadily"
            )
    return out

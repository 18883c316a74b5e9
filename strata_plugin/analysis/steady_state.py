"""The steady state of a case: the plateau where the offered concurrency is held.

A closed loop at C=4 ramps up (the first requests start together into an empty
server), holds 4 in flight, then drains (the last requests finish with fewer and
fewer beside them). Whole-window figures mix all three; the plateau is what the
server does under the load asked for. Detected from the requests alone:

* the level: the workload's concurrency for a closed loop (at most the number of
  requests); for an open loop, the time-weighted median of the in-flight count
  over the measured window (its typical load);
* the plateau: from the first moment the in-flight count reaches the level to the
  last moment it is still there (the drain starts after it);
* over it: latency of the requests that started and ended inside it, output tokens
  whose events fall inside it per second, and requests completed inside it per second.

Fixed timeslices cut a long case into equal spans with the same per-span figures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from strata_plugin.analysis.metrics import RequestMetrics, request_metrics
from strata_plugin.analysis.stats import percentile
from strata_plugin.formats.records import RequestRecord

#: A plateau shorter than this share of the measured window, or holding fewer
#: requests than this, is reported as not found: it would be noise.
MIN_PLATEAU_SHARE = 0.2
MIN_PLATEAU_REQUESTS = 3


@dataclass(frozen=True)
class SpanFigures:
    """Headline figures over one span of a case's timeline (monotonic ns)."""

    start_ns: int
    end_ns: int
    n_inside: int  # requests that started and ended inside
    n_completed: int  # requests that ended inside
    mean_in_flight: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    e2e_p50_ms: float | None
    output_tok_s: float | None
    request_s: float | None

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True)
class SteadyState:
    """The plateau of one case, or why there is none (``plateau`` None, ``reason`` set)."""

    level: int
    window_start_ns: int
    window_end_ns: int
    plateau: SpanFigures | None
    reason: str = ""

    @property
    def share(self) -> float | None:
        if self.plateau is None or self.window_end_ns <= self.window_start_ns:
            return None
        return self.plateau.duration_s * 1e9 / (self.window_end_ns - self.window_start_ns)


MetricsOf = Callable[[RequestRecord], RequestMetrics]


def _intervals(records: Sequence[RequestRecord], metrics_of: MetricsOf
               ) -> list[tuple[int, int]]:
    out = []
    for r in records:
        if r.phase != "measured":
            continue
        m = metrics_of(r)
        out.append((m.start_ns, max(m.end_ns, m.start_ns)))
    return out


def _steps(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(time, in-flight count from that time on), one entry per change."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                   key=lambda x: (x[0], x[1]))  # an end before a start at the same ns
    out: list[tuple[int, int]] = []
    level = 0
    for t, step in edges:
        level += step
        if out and out[-1][0] == t:
            out[-1] = (t, level)
        else:
            out.append((t, level))
    return out


def _mean_in_flight(steps: list[tuple[int, int]], start: int, end: int) -> float:
    if end <= start:
        return 0.0
    total = 0.0
    for (t, level), nxt in zip(steps, [*steps[1:], (end, 0)]):
        a, b = max(t, start), min(nxt[0], end)
        if b > a:
            total += level * (b - a)
    return total / (end - start)


def _median_level(steps: list[tuple[int, int]], start: int, end: int) -> int:
    """The in-flight count held for at least half the window (time-weighted median)."""
    spans: dict[int, int] = {}
    for (t, level), nxt in zip(steps, [*steps[1:], (end, 0)]):
        a, b = max(t, start), min(nxt[0], end)
        if b > a:
            spans[level] = spans.get(level, 0) + (b - a)
    half, acc = (end - start) / 2, 0
    for level in sorted(spans):
        acc += spans[level]
        if acc >= half:
            return max(level, 1)
    return 1


def span_figures(records: Sequence[RequestRecord], start_ns: int, end_ns: int,
                 steps: list[tuple[int, int]] | None = None,
                 metrics_of: MetricsOf = request_metrics, *,
                 closed_end: bool = True, open_start: bool = False) -> SpanFigures:
    """The headline figures of ``records`` over ``[start_ns, end_ns]`` (``[start, end)``
    with ``closed_end=False``, so adjacent slices count each end and token once;
    ``open_start`` leaves out of the latencies a request dispatched at the very start,
    the one whose dispatch reached the plateau's level, which belongs to the ramp)."""
    measured = [r for r in records if r.phase == "measured"]
    ms = [(r, metrics_of(r)) for r in measured]

    def within(t: int) -> bool:
        return start_ns <= t <= end_ns if closed_end else start_ns <= t < end_ns

    inside = [m for r, m in ms if r.ok and within(m.end_ns)
              and (m.start_ns > start_ns if open_start else m.start_ns >= start_ns)]
    completed = sum(1 for r, m in ms if r.ok and within(m.end_ns))
    tokens = sum(e.n_tokens for r in measured if r.ok for e in r.events if within(e.t_ns))
    dur_s = (end_ns - start_ns) / 1e9

    def pct(vals: list[float | None], q: float) -> float | None:
        xs = [v for v in vals if v is not None]
        return percentile(xs, q) if xs else None

    if steps is None:
        steps = _steps(_intervals(measured, metrics_of))
    return SpanFigures(
        start_ns=start_ns, end_ns=end_ns, n_inside=len(inside), n_completed=completed,
        mean_in_flight=_mean_in_flight(steps, start_ns, end_ns),
        ttft_p50_ms=pct([m.ttft_ms for m in inside], 50),
        ttft_p99_ms=pct([m.ttft_ms for m in inside], 99),
        tpot_p50_ms=pct([m.tpot_ms for m in inside], 50),
        tpot_p99_ms=pct([m.tpot_ms for m in inside], 99),
        e2e_p50_ms=pct([m.e2e_ms for m in inside], 50),
        output_tok_s=tokens / dur_s if dur_s > 0 else None,
        request_s=completed / dur_s if dur_s > 0 else None,
    )


def steady_state(records: Sequence[RequestRecord], *, concurrency: int | None,
                 arrival: str = "closed", metrics_of: MetricsOf = request_metrics
                 ) -> SteadyState | None:
    """The plateau of one case's measured requests; None without measured requests."""
    intervals = _intervals(records, metrics_of)
    if not intervals:
        return None
    start = min(s for s, _ in intervals)
    end = max(e for _, e in intervals)
    steps = _steps(intervals)
    if arrival == "closed" and concurrency:
        level = max(1, min(concurrency, len(intervals)))
    else:
        level = _median_level(steps, start, end)
    reached = [t for t, n in steps if n >= level]
    if not reached:
        return SteadyState(level, start, end, None, f"in-flight never reached {level}")
    p_start = reached[0]
    # The plateau ends when the count last drops below the level.
    after = [t for (t, n), (_, prev) in zip(steps[1:], steps) if n < level <= prev]
    p_end = after[-1] if after else end
    if p_end <= p_start:
        return SteadyState(level, start, end, None, "the level was reached only for an instant")
    fig = span_figures(records, p_start, p_end, steps, metrics_of, open_start=True)
    share = (p_end - p_start) / (end - start) if end > start else 0.0
    if share < MIN_PLATEAU_SHARE or fig.n_inside < MIN_PLATEAU_REQUESTS:
        return SteadyState(level, start, end, None,
                           f"plateau too short ({100 * share:.0f}% of the window, "
                           f"{fig.n_inside} requests inside)")
    return SteadyState(level, start, end, fig)


def timeslices(records: Sequence[RequestRecord], slice_s: float,
               metrics_of: MetricsOf = request_metrics) -> list[SpanFigures]:
    """Equal spans of ``slice_s`` over the measured window (the last one may be shorter)."""
    if slice_s <= 0:
        raise ValueError("timeslice_s must be > 0")
    intervals = _intervals(records, metrics_of)
    if not intervals:
        return []
    start = min(s for s, _ in intervals)
    end = max(e for _, e in intervals)
    steps = _steps(intervals)
    step_ns = int(slice_s * 1e9)
    out, t = [], start
    while t < end:
        last = t + step_ns >= end
        out.append(span_figures(records, t, min(t + step_ns, end), steps, metrics_of,
                                closed_end=last))
        t += step_ns
    return out

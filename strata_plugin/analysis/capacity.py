"""Capacity from a rate sweep: where the server saturates, and goodput at an SLO.

Each step of a sweep is an open-loop case at an offered rate. A step is *saturated*
when the server stops following the offered rate: the rate at which requests complete
(over the span from the first completion to the last) is under ``FOLLOW_MIN`` of the
rate at which they arrived (over the span of their arrivals). That is the same fact as
"waiting grows without bound": requests arrive faster than they leave, so the queue
grows for as long as the step lasts. The growth of TTFT through the step (median of
the last third of requests over the first third) is reported beside it, but does not
decide: on steps of a few dozen requests a server near its capacity fills a
stationary queue after its first requests, and the ratio grows without the queue
growing without bound (measured here on a scripted single-slot server at 70-80% load:
3.6-3.9x).

The *knee* is the highest offered rate not saturated below the first saturated one;
*capacity at the SLO* is the highest offered rate whose goodput fraction (requests
that succeeded and met every SLO, over all requests) is at least the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from strata_plugin.analysis.metrics import Slo, case_metrics, request_metrics
from strata_plugin.analysis.stats import median
from strata_plugin.formats.records import RequestRecord

FOLLOW_MIN = 0.85
GOOD_FRACTION = 0.9


@dataclass(frozen=True)
class SweepStep:
    offered_rate: float
    achieved_rate: float | None  # successful requests / measured window
    follow: float | None  # completion rate / arrival rate (each over its own span)
    ttft_growth: float | None  # last third's median TTFT / first third's
    n_requests: int
    n_ok: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    e2e_p50_ms: float | None
    output_tok_s: float | None
    goodput_fraction: float | None
    goodput_req_s: float | None
    saturated: bool
    reason: str


def parse_slo(text: str) -> Slo:
    """``Slo.describe()``'s text back to an Slo (``ttft_ms<=500;tpot_ms<=50``)."""
    kw: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, value = part.partition("<=")
        if not sep or name not in ("ttft_ms", "tpot_ms", "e2e_ms", "ttfo_ms"):
            raise ValueError(f"SLO {text!r}: expected name<=value parts (ttft_ms, tpot_ms, "
                             "e2e_ms, ttfo_ms)")
        kw[name] = float(value)
    return Slo(**kw)


def step_figures(records: Sequence[RequestRecord], offered_rate: float,
                 slo: Slo | None) -> SweepStep:
    """One step's figures and its saturation verdict, from its measured records."""
    measured = sorted((r for r in records if r.phase == "measured"),
                      key=lambda r: r.scheduled_ns)
    cm = case_metrics(measured, slo=slo)
    ms = [request_metrics(r) for r in measured]
    ok = [m for m in ms if m.ok]
    achieved = cm.request_s
    follow = None
    ends = sorted(m.end_ns for m in ok)
    arrive_s = (measured[-1].scheduled_ns - measured[0].scheduled_ns) / 1e9 if measured else 0
    if len(ends) >= 3 and arrive_s > 0 and ends[-1] > ends[0]:
        departures = (len(ends) - 1) / ((ends[-1] - ends[0]) / 1e9)
        follow = departures / ((len(measured) - 1) / arrive_s)
    growth = None
    third = len(ms) // 3
    reasons = []
    if third >= 2:
        first = [m.ttft_ms for m in ms[:third] if m.ttft_ms is not None]
        last = [m.ttft_ms for m in ms[-third:] if m.ttft_ms is not None]
        if first and last and median(first) > 0:
            growth = median(last) / median(first)
    if follow is not None and follow < FOLLOW_MIN:
        reasons.append(f"completions kept up with {follow:.2f} of the arrivals "
                       "(the queue grew through the step)")
    if cm.n_ok == 0:
        reasons.append("no request succeeded")
    return SweepStep(
        offered_rate=offered_rate, achieved_rate=achieved, follow=follow, ttft_growth=growth,
        n_requests=cm.n_requests, n_ok=cm.n_ok, ttft_p50_ms=cm.ttft.p50,
        ttft_p99_ms=cm.ttft.p99, tpot_p50_ms=cm.tpot.p50, tpot_p99_ms=cm.tpot.p99,
        e2e_p50_ms=cm.e2e.p50, output_tok_s=cm.output_tok_s,
        goodput_fraction=cm.goodput_fraction, goodput_req_s=cm.goodput_req_s,
        saturated=bool(reasons), reason="; ".join(reasons))


def knee(steps: Sequence[SweepStep]) -> SweepStep | None:
    """The highest unsaturated rate below the first saturated one (None if none)."""
    ordered = sorted(steps, key=lambda s: s.offered_rate)
    first_sat = next((s.offered_rate for s in ordered if s.saturated), None)
    below = [s for s in ordered if not s.saturated
             and (first_sat is None or s.offered_rate < first_sat)]
    if first_sat is None or not below:
        return None
    return below[-1]


def capacity_at_slo(steps: Sequence[SweepStep], good_fraction: float = GOOD_FRACTION
                    ) -> SweepStep | None:
    """The highest offered rate whose goodput fraction meets the target."""
    ok = [s for s in steps if s.goodput_fraction is not None
          and s.goodput_fraction >= good_fraction]
    return max(ok, key=lambda s: s.offered_rate) if ok else None


def next_rate(steps: Sequence[SweepStep], *, factor: float) -> float:
    """Where to measure next: up by ``factor`` until a step saturates; below the lowest
    rate while even that one saturates; then halfway between the knee and the first
    saturated rate (the caller bounds how many times)."""
    ordered = sorted(steps, key=lambda s: s.offered_rate)
    sat = [s for s in ordered if s.saturated]
    if not sat:
        return ordered[-1].offered_rate * factor
    k = knee(ordered)
    if k is None:
        return ordered[0].offered_rate / factor
    return (k.offered_rate + sat[0].offered_rate) / 2

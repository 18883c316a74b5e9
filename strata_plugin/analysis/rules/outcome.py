"""What one rule records: its comparisons (evidence), whether it fired, its score."""

from __future__ import annotations

from dataclasses import dataclass, field

from strata_plugin.analysis.rules.window import Evidence, WindowSignals
from strata_plugin.analysis.thresholds import threshold
from strata_plugin.analysis.thresholds import value as _v


@dataclass
class _Outcome:
    cls: str
    fired: bool = False
    assessable: bool = True
    score: float = 0.0
    evidence: list[Evidence] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    trace: str = ""  # the trace that would assess it, when unassessable


def _margin(value: float, thr: float, op: str) -> float:
    """How far past its threshold a value is: 0 at the threshold, 1 at ``full_margin``.

    ``op`` is the comparison's: ">=" (fires at or above) or "<" (fires below), the two
    that a margin is taken for; any other is a caller's error, not "below" (a typo
    would silently reverse a score)."""
    if op == ">=":
        m = (value - thr) / abs(thr) if thr else value
    elif op == "<":
        m = (thr - value) / abs(thr) if thr else -value
    else:
        raise ValueError(f"unknown comparison {op!r}")
    return max(0.0, min(1.0, m / _v("full_margin")))


class _Rule:
    """Helper that records every comparison a rule makes."""

    def __init__(self, cls: str, s: WindowSignals) -> None:
        self.o = _Outcome(cls)
        self.s = s

    def need(self, *names: str) -> bool:
        """True when every named signal was measured; else mark unassessable."""
        missing = [n for n in names if getattr(self.s, n) is None]
        for n in missing:
            if n not in self.o.missing:
                self.o.missing.append(n)
        if missing:
            self.o.assessable = False
        return not missing

    def cmp(
        self,
        signal: str,
        op: str,
        thr_name: str,
        *,
        scale: float = 1.0,
        value: float | None = None,
        label: str | None = None,
    ) -> bool:
        v = getattr(self.s, signal) if value is None else value
        if v is None:
            return False
        t = threshold(thr_name)
        thr = t.value * scale
        met = _compare(float(v), op, thr)
        self.o.evidence.append(
            Evidence(
                self.o.cls,
                label or signal,
                _round(float(v)),
                op,
                t.name,
                _round(thr),
                t.unit,
                t.source,
                met,
            )
        )
        return met

    def fire(self, margin: float, *more: float) -> _Outcome:
        """The class fired; its score is the mean of its margins (each 0..1)."""
        self.o.fired = True
        self.o.assessable = True
        self.o.score = _round((margin + sum(more)) / (1 + len(more)))
        return self.o

    def unassessable(self, trace: str) -> _Outcome:
        self.o.assessable = False
        self.o.trace = trace
        return self.o


def _compare(v: float, op: str, thr: float) -> bool:
    return {">=": v >= thr, ">": v > thr, "<": v < thr, "==": v == thr}[op]


def _round(x: float) -> float:
    """Four significant digits (0, inf and nan pass through the format unchanged)."""
    return float(f"{x:.4g}")


def _m(s: WindowSignals, signal: str, thr: str, op: str = ">=", scale: float = 1.0) -> float:
    v = getattr(s, signal)
    return _margin(float(v), _v(thr) * scale, op) if v is not None else 0.0


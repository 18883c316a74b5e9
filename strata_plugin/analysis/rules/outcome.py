"""What one rule records: its comparisons (evidence), whether it fired, its score.

The names a rule is written with, Strata's own and a plugin's alike (docs/extending.md,
"A rule"; :mod:`strata_plugin.extend`): :class:`RuleCheck` records each comparison,
:class:`Outcome` is what a rule returns, :func:`signal_margin` and :func:`margin` its
score. The underscored spellings below are the same objects, kept only so that code
written with them still imports; new code uses the public names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strata_plugin.analysis.rules.window import Evidence, WindowSignals
from strata_plugin.analysis.thresholds import threshold
from strata_plugin.analysis.thresholds import value as _v


@dataclass
class Outcome:
    """What one rule returns: its class, whether it fired (and was assessable), its
    score 0..1, its comparisons, the signals it lacked and the trace that would assess it."""

    cls: str
    fired: bool = False
    assessable: bool = True
    score: float = 0.0
    evidence: list[Evidence] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    trace: str = ""  # the trace that would assess it, when unassessable


def margin(value: float, thr: float, op: str) -> float:
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


class RuleCheck:
    """Records every comparison a rule makes, as evidence, and its outcome (``.o``)."""

    def __init__(self, cls: str, s: WindowSignals) -> None:
        self.o = Outcome(cls)
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
        detail: str = "",
    ) -> bool:
        v = getattr(self.s, signal) if value is None else value
        if v is None:
            return False
        t = threshold(thr_name)
        thr = t.value * scale
        met = compare(float(v), op, thr)
        self.o.evidence.append(
            Evidence(
                self.o.cls,
                label or signal,
                round_sig(float(v)),
                op,
                t.name,
                round_sig(thr),
                t.unit,
                t.source,
                met,
                detail,
            )
        )
        return met

    def fire(self, margin: float, *more: float) -> Outcome:
        """The class fired; its score is the mean of its margins (each 0..1)."""
        self.o.fired = True
        self.o.assessable = True
        self.o.score = round_sig((margin + sum(more)) / (1 + len(more)))
        return self.o

    def unassessable(self, trace: str) -> Outcome:
        """Not measured: ``trace`` names what would measure it (the verdict lists it)."""
        self.o.assessable = False
        self.o.trace = trace
        return self.o


def compare(v: float, op: str, thr: float) -> bool:
    return {">=": v >= thr, ">": v > thr, "<": v < thr, "==": v == thr}[op]


def round_sig(x: float) -> float:
    """Four significant digits (0, inf and nan pass through the format unchanged)."""
    return float(f"{x:.4g}")


def signal_margin(s: WindowSignals, signal: str, thr: str, op: str = ">=",
                  scale: float = 1.0) -> float:
    """How far the signal is past the threshold named ``thr`` (x ``scale``): 0 at it,
    1 at ``full_margin`` past it, 0 when the signal was not measured."""
    v = getattr(s, signal)
    return margin(float(v), _v(thr) * scale, op) if v is not None else 0.0


# The spellings the rule families were first written with (the same objects): code written
# with them still imports. Remove once nothing does (grep -rn "outcome import _").
_Outcome = Outcome
_Rule = RuleCheck
_m = signal_margin
_margin = margin
_compare = compare
_round = round_sig


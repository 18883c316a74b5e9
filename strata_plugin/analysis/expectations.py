"""A/B expectations: "the treatment raises (or lowers) this metric", judged on its interval.

A case that expects an effect states it (``strata.expect_ab``), and the effect's interval
over repetitions (``analysis/effects.py``) decides it:

* **established**: the whole interval lies on the expected side of zero;
* **contradicted**: the whole interval lies on the other side: the data say the
  opposite, and the test fails;
* **not established**: the interval holds zero (or there is none). The runner then adds
  repetitions, one per arm at a time (continuing the balanced order), up to
  ``ab_max_repetitions`` per arm (``analysis/thresholds.py``); an expectation still
  undecided there is reported as *not established*, its own outcome (JUnit, terminal,
  ``cases.jsonl``, report.md, summary.json), and does not fail the test: noise is not
  evidence against the effect, only an interval on the other side is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from strata_plugin.analysis.effects import Effect
from strata_plugin.formats.typed import FormatError

ESTABLISHED = "established"
NOT_ESTABLISHED = "not established"
CONTRADICTED = "contradicted"
OUTCOMES = (ESTABLISHED, NOT_ESTABLISHED, CONTRADICTED)

Direction = Literal["increase", "decrease"]
DIRECTIONS = ("increase", "decrease")


def judge(e: Effect | None, direction: str) -> str:
    """One of ``OUTCOMES`` for an effect expected to go ``direction``."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r}: expected one of {DIRECTIONS}")
    if e is None or e.ci_lo_pct is None or e.ci_hi_pct is None:
        return NOT_ESTABLISHED
    lo, hi = e.ci_lo_pct, e.ci_hi_pct
    if direction == "decrease":
        lo, hi = -hi, -lo
    if lo > 0:
        return ESTABLISHED
    if hi < 0:
        return CONTRADICTED
    return NOT_ESTABLISHED


@dataclass(frozen=True)
class ABExpectation:
    """An expected effect of an A/B group's treatment on one metric, and its outcome."""

    group: str
    metric: str
    direction: str  # "increase" | "decrease"
    outcome: str  # one of OUTCOMES
    repetitions: int  # per arm, at the end (the fewer of the two arms)
    initial_repetitions: int  # per arm, before any was added
    max_repetitions: int  # the bound on added repetitions (per arm)
    change_pct: float | None = None
    ci_lo_pct: float | None = None
    ci_hi_pct: float | None = None
    interval_label: str = ""

    @classmethod
    def of(cls, group: str, metric: str, direction: str, e: Effect | None, *,
           initial: int, bound: int, runs: int | None = None) -> ABExpectation:
        """``runs``: repetitions run per arm (default: the effect's, which counts only the
        repetitions that define the metric)."""
        reps = runs if runs is not None else 0 if e is None else min(e.n_control, e.n_treatment)
        return cls(group, metric, direction, judge(e, direction), reps, initial, bound,
                   None if e is None else e.change_pct, None if e is None else e.ci_lo_pct,
                   None if e is None else e.ci_hi_pct, "" if e is None else e.interval_label)

    @property
    def decided(self) -> bool:
        return self.outcome != NOT_ESTABLISHED

    def line(self) -> str:
        """E.g. ``mixed: tpot_p95_ms expected to increase: not established (+12.0%,
        -30.0% .. +80.0%, 95% t-interval, 6/6 repetitions; 3 added, bound 6)``."""
        change = "-" if self.change_pct is None else f"{self.change_pct:+.1f}%"
        iv = ("no interval" if self.ci_lo_pct is None or self.ci_hi_pct is None
              else f"{self.ci_lo_pct:+.1f}% .. {self.ci_hi_pct:+.1f}%")
        added = self.repetitions - self.initial_repetitions
        return (f"{self.group}: {self.metric} expected to {self.direction}: {self.outcome} "
                f"({change}, {iv}, {self.interval_label or 'no units'}; {added} repetition(s) "
                f"added, bound {self.max_repetitions} per arm)")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any], where: str = "ab_expectations") -> ABExpectation:
        """As :meth:`to_json` wrote it; FormatError naming ``where`` and the key otherwise."""
        kinds: dict[str, type | tuple[type, ...]] = {
                 "group": str, "metric": str, "direction": str, "outcome": str,
                 "repetitions": int, "initial_repetitions": int, "max_repetitions": int,
                 "change_pct": (int, float, type(None)), "ci_lo_pct": (int, float, type(None)),
                 "ci_hi_pct": (int, float, type(None)), "interval_label": str}
        if not isinstance(d, dict):
            raise FormatError(f"{where}: expected an object, got {type(d).__name__}")
        for k, kind in kinds.items():
            if k not in d and k in ("change_pct", "ci_lo_pct", "ci_hi_pct", "interval_label"):
                continue
            v = d.get(k)
            if not isinstance(v, kind) or isinstance(v, bool):
                raise FormatError(f"{where}: {k}: expected {kind}, got {v!r}")
        if d["outcome"] not in OUTCOMES or d["direction"] not in DIRECTIONS:
            raise FormatError(f"{where}: outcome/direction: expected one of {OUTCOMES} / "
                             f"{DIRECTIONS}, got {d['outcome']!r} / {d['direction']!r}")
        return cls(**{k: d[k] for k in kinds if k in d})

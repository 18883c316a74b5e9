"""The whole verdict of a fixed set of windows, compared with a reviewed golden file.

The boundary tests (``test_thresholds.py``) say *whether* a class fires; a user reads more
than that: the evidence rows with their labels, values, operators and thresholds, the
confidence, the summary line, what was missing and which finer trace would settle it. A
changed label, a dropped trace or a score computed from the wrong margin changes none of
the classes, so only a test of the whole output can notice it (mutation testing found
dozens such changes that every other test let through: docs/validation.md).

The windows: the clean bases of ``test_attribution.py``; each boundary case of
``test_thresholds.py`` just short of, just past and well past its threshold; and each base with one
measured signal taken away (what the verdict then says is missing and which trace it
asks for). ``tests/golden/verdicts.txt`` holds the expected text. After a deliberate
change to the rules, regenerate it with ``STRATA_REGEN_GOLDEN=1 pytest
tests/test_verdict_golden.py`` and review the diff like code: every changed line is a
changed verdict.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path

from strata_plugin.analysis.rules import Verdict, WindowSignals, classify
from strata_plugin.analysis.thresholds import value
from tests.test_attribution import CPU_CLEAN, GPU_2NODE, GPU_2NODE_RAILS, GPU_CLEAN
from tests.test_thresholds import CASES, _values

GOLDEN = Path(__file__).parent / "golden" / "verdicts.txt"
BASES = {"CPU_CLEAN": CPU_CLEAN, "GPU_CLEAN": GPU_CLEAN, "GPU_2NODE": GPU_2NODE,
         "GPU_2NODE_RAILS": GPU_2NODE_RAILS}


def _f(x: object) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def _head(v: Verdict) -> list[str]:
    return [
        f"  verdict: {v.summary()} | confidence {v.confidence:.4f} {v.confidence_label}"
        f" | also {','.join(v.also_flagged) or '-'} | modifiers {','.join(v.modifiers) or '-'}",
        f"  missing: {', '.join(v.missing_signals) or '-'}",
        *(f"  trace: {t}" for t in v.finer_trace),
        *(f"  note: {n}" for n in v.notes),
    ]


def _rows(v: Verdict) -> list[str]:
    return [
        f"  ev {e.cls}: {e.metric} = {_f(e.value)} {e.unit} {e.op} {e.threshold}"
        f" {_f(e.threshold_value)} [{e.source[:40]}] {'MET' if e.met else 'not met'}"
        for e in v.evidence
    ]


def _full(v: Verdict, base: Verdict | None = None) -> list[str]:
    """The verdict; with ``base``, only the evidence rows the base window does not have
    (a boundary case moves one signal: its other rows are the base's, shown once)."""
    seen = set(_rows(base)) if base is not None else set()
    return _head(v) + [row for row in _rows(v) if row not in seen]


def _disagreeing() -> WindowSignals:
    """CPU samples that contradict each other: an inconclusive verdict that names classes."""
    host = 4.0
    edge = value("cpu_samples_disagree_factor") * host + value("cpu_samples_disagree_slack_cores")
    return dataclasses.replace(CPU_CLEAN, host_busy_cores=host, server_cpu_cores=edge + 0.05,
                               steal_frac=0.2)


def render() -> str:
    out: list[str] = []
    for name, base in BASES.items():
        out += [f"== base {name}", *_full(classify(base))]
    out += ["== CPU samples disagree, with steal", *_full(classify(_disagreeing()))]
    for b in CASES:
        short, past = _values(b)
        far = past + 4 * (past - short)  # well past: the score grows with the margin
        for side, x in (("short", short), ("past", past), ("far", far)):
            w = dataclasses.replace(b.base, **b.at(x))
            out += [f"== boundary {b.threshold} -> {b.cls}, {side} ({_f(x)});"
                    " evidence rows other than its base's",
                    *_full(classify(w), classify(b.base))]
    for name in ("CPU_CLEAN", "GPU_CLEAN", "GPU_2NODE_RAILS"):
        base = BASES[name]
        for fld in dataclasses.fields(base):
            if "None" not in str(fld.type) or getattr(base, fld.name) is None:
                continue  # only signals that may be unmeasured, and are measured here
            w = dataclasses.replace(base, **{fld.name: None})
            out += [f"== {name} without {fld.name}", *_head(classify(w))]
    return "\n".join(out) + "\n"


def test_verdicts_match_the_reviewed_golden_file() -> None:
    got = render()
    if os.environ.get("STRATA_REGEN_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(got)
    want = GOLDEN.read_text()
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                        "golden", "now", n=1))
    assert got == want, ("verdicts changed (review, then regenerate: module docstring):\n"
                         + diff[:6000])

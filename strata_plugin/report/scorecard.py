"""``python -m strata_plugin scorecard RUN...``: how well the classifier named the faults
injected on purpose, over one or more fault-suite runs.

Why: a verdict is believable only as far as it names known faults and nothing else;
the fault suite (``cases/test_faults.py``) asserts that per run, and this adds it up
across runs so a change to the rules shows as a moved number, not a feeling.

Reads, per run folder, the cases whose ``cases.jsonl`` line records an injected fault
(``fault``: the class the fault arm must name; ``fault_arm``: ``fault`` or ``clean``)
and the verdict recorded at each case's end. What "really happened" in an arm (a shared
host's real contention beside the injected fault) comes from the suite's independent
host watch in ``fault_matrix.json`` where the run has one; without it, only the
injected fault counts.

The suite's scenarios come in two sets, recorded per case as ``fault_set``: the
tuning set (the faults the rules' thresholds were set on) and the set-aside set (faults
that set no threshold: a fair test of rules that were not fitted to them). Each set is
scored apart; a case line without ``fault_set`` (a run from before the split) counts as
tuning.

Scored the way the suite judges an arm: a fault arm is a hit when its fault is among
the verdict's named classes (one or two), conclusively, with evidence past its
threshold; any arm misses when it names a fault class that did not happen. Top-1: the
fault is the first class; top-3: among the first three classes past threshold.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from strata_plugin.analysis.rules.window import Verdict
from strata_plugin.errors import StrataError
from strata_plugin.formats.atomic import atomic_write_text
from strata_plugin.formats.cases import CaseLine
from strata_plugin.formats.typed import (
    STR,
    FormatError,
    JsonLines,
    check_present,
    check_shape,
    opt,
    shown,
)

#: A clean arm expects nothing.
NONE = "none"
#: The classes of a server doing its own work: what a scenario with nothing injected
#: expects (issue 30's quiet prefill), never a fault a clean arm names falsely.
COMPUTE = frozenset(("cpu_compute", "gpu_compute"))
#: The fault suite's two sets: the scenarios the rules' thresholds were tuned on, and
#: the ones kept apart, that set no threshold (a run without ``fault_set`` predates the
#: split: all its scenarios were tuning ones).
TUNING = "tuning"
SET_ASIDE = "set-aside"
SETS = (TUNING, SET_ASIDE)


@dataclass(frozen=True)
class Arm:
    run: str
    case_id: str
    fault: str  # the scenario's class
    arm: str  # "fault" | "clean"
    classes: tuple[str, ...]
    past_threshold: tuple[str, ...]  # classes, then also_flagged
    inconclusive: bool
    evidence: tuple[str, ...]  # met evidence, "cls: metric value op threshold"
    truth: tuple[str, ...]  # fault classes that happened
    fault_classes: tuple[str, ...] = field(default=(), compare=False)
    fault_set: str = TUNING
    scenario: str = ""  # the scenario's name where it differs from its class (delays)

    @property
    def expected(self) -> str:
        return self.fault if self.arm == "fault" else NONE

    @property
    def named(self) -> str:
        head = "inconclusive: " if self.inconclusive else ""
        return head + (" + ".join(self.classes) or "none")

    @property
    def false_classes(self) -> tuple[str, ...]:
        """Fault classes named (or past threshold) that did not happen."""
        return tuple(c for c in self.past_threshold
                     if c in self.fault_classes and c not in self.truth)

    @property
    def wanted(self) -> tuple[str, ...]:
        """The classes this arm must name: its fault; for a scenario that injects nothing
        (COMPUTE expected) on a host where a fault happened anyway, that fault, first (the
        case's largest cause then is what held it, as the suite judges it)."""
        if self.fault in COMPUTE and self.arm == "fault":
            held = tuple(t for t in self.truth if t in self.fault_classes)
            if held:
                return held
        return (self.fault,)

    @property
    def fault_named(self) -> bool:
        if self.wanted != (self.fault,):
            return (bool(self.classes) and self.classes[0] in self.wanted
                    and not self.inconclusive)
        return (self.fault in self.classes and not self.inconclusive
                and any(e.startswith(self.fault + ":") for e in self.evidence))

    @property
    def hit(self) -> bool:
        named_ok = self.arm == "clean" or self.fault_named
        return named_ok and not self.false_classes

    @property
    def top1(self) -> bool:
        return self.arm == "fault" and bool(self.classes) and self.classes[0] in self.wanted

    @property
    def top3(self) -> bool:
        return self.arm == "fault" and any(c in self.wanted for c in self.past_threshold[:3])


class ScorecardError(StrataError, ValueError):
    """A folder that is not a fault-suite run; the message says which and why."""


#: The fault suite's keys of a case line (in ``CaseLine.extra``), as the scorecard reads
#: them.
_FAULT_KEYS = {"fault": opt(STR), "fault_arm": opt(STR), "fault_set": opt(STR),
               "fault_scenario": opt(STR)}
#: fault_matrix.json, as the scorecard reads it.
_MATRIX = {"fault_classes": opt(("list", STR)),
           "arms": opt(("list", {"case_id": STR, "truth": opt(("list", STR))}))}


def _lines(path: Path) -> list[CaseLine]:
    """Every case line (formats/cases.py); the fault suite's keys are in ``extra``. A
    line, key or verdict field of the wrong type raises FormatError naming
    ``path:line`` and the key (a torn last line is skipped, as the report does)."""
    out = []
    for n, d in JsonLines(path).read():
        where = f"{path}:{n}"
        line = CaseLine.from_dict(d, where)
        check_shape(dict(line.extra), _FAULT_KEYS, where, "case line")
        if line.verdict is not None:
            check_present(Verdict, line.verdict, where, "verdict")
        out.append(line)
    return out


def read_matrix(path: Path) -> dict[str, Any]:
    """fault_matrix.json, checked: FormatError naming the file (and key) otherwise."""
    raw = path.read_bytes()
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise FormatError(f"{path}: not UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
                          f"{exc.start})") from None
    except json.JSONDecodeError as exc:
        raise FormatError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    if type(doc) is not dict:
        raise FormatError(f"{path}: expected a JSON object (fault_classes, arms), got "
                          f"{shown(doc)}")
    check_shape(doc, _MATRIX, str(path), "fault_matrix")
    return doc


def rescored_verdicts(run_dir: Path, case_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each case's verdict decided again by this code from the run's raw files (samples,
    requests, markers), as the case's teardown records it.

    The analysis keeps a verdict recorded at the case's end (what JUnit reported); to
    decide afresh it reads a view of the run folder whose ``cases.jsonl`` lines have no
    verdict: every other entry is a symbolic link to the run's own, nothing is copied
    and the run folder is not changed.
    """
    import dataclasses
    import os
    import tempfile

    from strata_plugin.analysis.case_summary import summarize_case

    with tempfile.TemporaryDirectory(prefix="strata-rescore-") as tmp:
        view = Path(tmp) / run_dir.name
        view.mkdir()
        for entry in run_dir.iterdir():
            if entry.name != "cases.jsonl":
                os.symlink(entry.resolve(), view / entry.name)
        lines = []
        for c in _lines(run_dir / "cases.jsonl"):
            lines.append(replace(c, verdict=None, nulls=c.nulls - {"verdict"}).to_json()
                         + "\n")
        atomic_write_text(view / "cases.jsonl", "".join(lines))
        return {cid: dataclasses.asdict(summarize_case(view, cid).verdict)
                for cid in case_ids}


def read_run(run_dir: Path, rescore: bool = False) -> list[Arm]:
    """The fault arms and clean arms of one run folder, in the order they ran; with
    ``rescore``, each verdict decided again by this code instead of the recorded one."""
    cases = run_dir / "cases.jsonl"
    if not (run_dir / "manifest.json").exists() or not cases.exists():
        raise ScorecardError(f"{run_dir}: not a run folder (needs manifest.json and "
                             "cases.jsonl)")
    truth: dict[str, tuple[str, ...]] = {}
    fault_classes: tuple[str, ...] = ()
    matrix = run_dir / "fault_matrix.json"
    recorded: tuple[str, ...] = ()
    if matrix.exists():
        doc = read_matrix(matrix)
        recorded = tuple(doc.get("fault_classes") or ())
        for a in doc.get("arms") or ():
            truth[a["case_id"]] = tuple(a.get("truth") or ())
    latest: dict[str, CaseLine] = {}
    for ln in _lines(cases):
        if ln.extra.get("fault") and ln.extra.get("fault_arm") and ln.verdict is not None:
            latest[ln.case_id] = ln  # a case line written again replaces the first
    scenarios = tuple(sorted({ln.extra["fault"] for ln in latest.values()}))
    # the classes a fault could be (the suite records its list; an older run: what it
    # ran), less the compute classes: a quiet prefill scenario expects cpu_compute, which
    # a clean arm names rightly (a healthy server computes)
    fault_classes = tuple(sorted((set(recorded) | set(scenarios)
                                  | {x for t in truth.values() for x in t}) - COMPUTE))
    arms = []
    fresh = rescored_verdicts(run_dir, list(latest)) if rescore else {}
    for cid, line in latest.items():
        c = line.extra  # the fault suite's keys: fault, fault_arm, fault_set, fault_scenario
        v = fresh[cid] if rescore else line.verdict or {}
        classes = tuple(v.get("classes", ()))
        evidence = tuple(
            f"{e['cls']}: {e['metric']} {e['value']:g} {e['op']} {e['threshold_value']:g}"
            for e in v.get("evidence", ()) if e.get("met")
        )
        injected = (c["fault"],) if c["fault_arm"] == "fault" else ()
        arms.append(Arm(
            run=run_dir.name,
            case_id=cid,
            fault=c["fault"],
            arm=c["fault_arm"],
            classes=classes,
            past_threshold=classes + tuple(v.get("also_flagged", ())),
            inconclusive=bool(v.get("inconclusive")),
            evidence=evidence,
            truth=tuple(sorted(set(truth.get(cid, injected)) | set(injected))),
            fault_classes=fault_classes,
            fault_set=_fault_set(cid, c, cases),
            scenario=str(c.get("fault_scenario") or c["fault"]),
        ))
    if not arms:
        raise ScorecardError(f"{run_dir}: no case records an injected fault (cases.jsonl "
                             "'fault' / 'fault_arm'); is it a fault-suite run?")
    return arms


def _fault_set(case_id: str, case: Mapping[str, Any], path: Path) -> str:
    value = case.get("fault_set", TUNING)
    if value not in SETS:
        raise ScorecardError(f"{path}: case {case_id!r} has fault_set {value!r}; "
                             f"expected one of {', '.join(SETS)}")
    return value


@dataclass(frozen=True)
class ClassScore:
    cls: str
    runs: int  # fault arms injecting it
    tp: int
    fp: int  # arms naming it (top two, conclusively) where it did not happen
    fn: int

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None


def class_scores(arms: Sequence[Arm]) -> list[ClassScore]:
    out = []
    for cls in sorted({a.fault for a in arms}):
        # (a quiet scenario on a held host is scored by what held it: Arm.wanted)
        mine = [a for a in arms if a.arm == "fault" and a.fault == cls and a.wanted == (cls,)]
        tp = sum(a.fault_named for a in mine)
        if arms and cls in arms[0].fault_classes:
            fp = sum(cls in a.classes and not a.inconclusive and cls not in a.truth
                     for a in arms)
        else:  # a class no fault is (cpu_compute): wrong where it came first over a fault
            fp = sum(bool(a.classes) and a.classes[0] == cls and not a.inconclusive
                     and any(t in a.fault_classes for t in a.truth) for a in arms)
        out.append(ClassScore(cls, len(mine), tp, fp, len(mine) - tp))
    return out


def _score(x: float | None) -> str:
    """A precision or recall, a fraction shown as one (0.67), not as a percent."""
    return "-" if x is None else f"{x:.2f}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _totals_lines(arms: Sequence[Arm]) -> list[str]:
    """Hits, top-1/top-3, per-class precision and recall, and the confusion matrix."""
    faults = [a for a in arms if a.arm == "fault"]
    runs = sorted({a.run for a in arms})
    hits = sum(a.hit for a in arms)
    lines = [
        f"Runs: {', '.join(runs)}. Arms: {len(arms)} ({len(faults)} with a fault, "
        f"{len(arms) - len(faults)} clean). Hits: {hits} of {len(arms)}.",
        "",
        f"Top-1 accuracy (the fault is the first class named): "
        f"{sum(a.top1 for a in faults)} of {len(faults)}; top-3 (among the first three "
        f"classes past threshold): {sum(a.top3 for a in faults)} of {len(faults)}.",
        "",
        "| class | fault arms | named (TP) | missed (FN) | named, did not happen (FP) "
        "| precision | recall |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in class_scores(arms):
        lines.append(f"| {s.cls} | {s.runs} | {s.tp} | {s.fn} | {s.fp} | "
                     f"{_score(s.precision)} | {_score(s.recall)} |")
    # confusion matrix: expected x first class named
    firsts = sorted({(a.classes[0] if a.classes else "none") for a in arms})
    expected = [NONE, *sorted({a.fault for a in faults})]
    lines += ["", "Confusion matrix (rows: injected; columns: the first class named, "
              "inconclusive verdicts included):", "",
              "| injected | runs | " + " | ".join(firsts) + " |",
              "| --- | --- | " + " | ".join("---" for _ in firsts) + " |"]
    for e in expected:
        rs = [a for a in arms if a.expected == e]
        if not rs:
            continue
        cells = [str(sum((a.classes[0] if a.classes else "none") == f for a in rs))
                 for f in firsts]
        lines.append(f"| {e} | {len(rs)} | " + " | ".join(cells) + " |")
    return lines


def scorecard_markdown(arms: Sequence[Arm]) -> str:
    """The scorecard: totals, per class and the confusion matrix for each set (tuning,
    set-aside) apart, then every arm."""
    lines: list[str] = []
    sets = [s for s in SETS if any(a.fault_set == s for a in arms)]
    for name in sets:
        mine = [a for a in arms if a.fault_set == name]
        if len(sets) > 1 or name != TUNING:
            what = ("the scenarios the thresholds were tuned on" if name == TUNING else
                    "scenarios that set no threshold")
            lines += [f"### {name.capitalize()} set ({what})", ""]
        lines += [*_totals_lines(mine), ""]
    lines += ["| run | set | case | expected | named | hit | evidence (past threshold) |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for a in arms:
        shown = [x for x in a.evidence if a.arm == "clean"
                 or any(x.startswith(w + ":") for w in a.wanted)]
        expected = (a.expected if a.wanted == (a.fault,) else
                    f"{a.expected}; the host held it: {' or '.join(a.wanted)} first")
        why = [*(["missed"] if a.arm == "fault" and not a.fault_named else []),
               *([f"false: {', '.join(a.false_classes)}"] if a.false_classes else [])]
        lines.append(f"| {a.run} | {a.fault_set} | {a.case_id} | {expected} | "
                     f"{_cell(a.named)} | "
                     f"{'hit' if a.hit else 'miss (' + '; '.join(why) + ')'} | "
                     f"{_cell('; '.join(shown) or '-')} |")
    return "\n".join(lines) + "\n"


def scorecard_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m strata_plugin scorecard",
        description="Score the verdicts of fault-suite runs (cases/test_faults.py): per "
        "scenario the expected class, the named class, hit or miss and the evidence; "
        "per class precision and recall; top-1 / top-3 accuracy; for the tuning set "
        "and the set-aside set apart.",
    )
    p.add_argument("runs", type=Path, nargs="+", help="reports/<RUN_ID> of fault-suite runs")
    p.add_argument("-o", "--out", type=Path, help="also write the scorecard (Markdown) here")
    p.add_argument("--json", type=Path, help="also write every arm and class score as JSON")
    p.add_argument("--rescore", action="store_true",
                   help="decide every verdict again with this code from the runs' raw "
                   "files, instead of the verdict recorded when the case ran")
    args = p.parse_args(argv)
    try:
        arms = [a for run in args.runs for a in read_run(run, rescore=args.rescore)]
    except (ScorecardError, FormatError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = scorecard_markdown(arms)
    print(text, end="")
    if args.out:
        atomic_write_text(args.out, text)
    if args.json:
        atomic_write_text(args.json, json.dumps({
            "arms": [{**a.__dict__, "expected": a.expected, "hit": a.hit, "top1": a.top1,
                      "top3": a.top3} for a in arms],
            "classes": [{**s.__dict__, "precision": s.precision, "recall": s.recall}
                        for s in class_scores(arms)],
            "sets": {name: {
                "arms": len(mine), "hits": sum(a.hit for a in mine),
                "fault_arms": sum(a.arm == "fault" for a in mine),
                "top1": sum(a.top1 for a in mine), "top3": sum(a.top3 for a in mine),
                "classes": [{**s.__dict__, "precision": s.precision, "recall": s.recall}
                            for s in class_scores(mine)]}
                for name in SETS for mine in [[a for a in arms if a.fault_set == name]]
                if mine},
        }, indent=2) + "\n")
    return 0 if arms else 1

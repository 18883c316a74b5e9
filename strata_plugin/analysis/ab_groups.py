"""A/B groups: arms compared repetition by repetition, then request by request.

Cases carry ``ab_group``, ``ab_arm`` and ``repetition`` in their ``cases.jsonl`` line
(``ABArm``). The first arm (``control`` when there is one, else the first by name) is
the reference; every other arm is compared with it. The first table is the seed
experiment's metrics (``metrics.AB_HEADLINE``), one value per repetition, with
intervals over repetitions (``effects``); the request-level rows below it resample
requests and say so. Beside the latency deltas, the per-request server-process deltas
(CPU seconds, major faults, MB read) are compared, and paired by output SHA: two arms
that produced the same text did the same work, so their resource use can be compared
one to one.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strata_plugin.analysis.effects import Effect, effect
from strata_plugin.analysis.expectations import ABExpectation
from strata_plugin.analysis.interference import Interference, analyze
from strata_plugin.analysis.metrics import (
    AB_HEADLINE,
    AB_INTERFERENCE,
    REQUEST_COMPARED,
    CaseMetrics,
    headline,
)
from strata_plugin.analysis.request_values import PROC_METRICS, proc_value, values
from strata_plugin.analysis.run_folder import RunBundle

#: Request-level rows of the details table.
AB_METRICS = (*REQUEST_COMPARED, *PROC_METRICS)


@dataclass(frozen=True)
class ArmDelta:
    """One request-level row: a metric of one treatment arm against the control."""

    group: str
    control_arm: str
    treatment_arm: str
    effect: Effect  # unit "request": the arms' requests pooled, median, bootstrap


@dataclass(frozen=True)
class ArmEffects:
    """The seed's metrics of one treatment arm against the control, repetitions as units."""

    group: str
    control_arm: str
    treatment_arm: str
    control_cases: tuple[str, ...]
    treatment_cases: tuple[str, ...]
    effects: tuple[Effect, ...]
    #: (arm, case id, {metric: value}) per repetition, in run order
    per_repetition: tuple[tuple[str, str, dict[str, float]], ...]

    def get(self, metric: str) -> Effect | None:
        return next((e for e in self.effects if e.metric == metric), None)


def repetition_values(cm: CaseMetrics, inter: Interference | None = None) -> dict[str, float]:
    """One repetition's values of the seed's metrics (those it defines), and its stalls."""
    h = headline(cm)
    out = {k: float(h[k]) for k in AB_HEADLINE if isinstance(h.get(k), (int, float))}
    if inter is not None and inter.n_decode:
        out.update((k, float(getattr(inter, k))) for k in AB_INTERFERENCE)
    return out


def arm_effects(
    control: Sequence[CaseMetrics],
    treatment: Sequence[CaseMetrics],
    control_inter: Sequence[Interference | None] = (),
    treatment_inter: Sequence[Interference | None] = (),
) -> list[Effect]:
    """The seed's metrics (and stalls, when given), treatment against control, one value
    per repetition."""
    vc = [repetition_values(cm, i) for cm, i in zip(control, _pad(control_inter, control),
                                                     strict=True)]
    vt = [repetition_values(cm, i) for cm, i in zip(treatment, _pad(treatment_inter, treatment),
                                                     strict=True)]
    out = []
    for metric in (*AB_HEADLINE, *AB_INTERFERENCE):
        a = [v[metric] for v in vc if metric in v]
        b = [v[metric] for v in vt if metric in v]
        if a and b:
            out.append(effect(metric, a, b, unit="repetition"))
    return out


def _pad(xs: Sequence[Interference | None], like: Sequence[object]) -> list[Interference | None]:
    return list(xs) if len(xs) == len(like) else [None] * len(like)


def mixed_effects(control_runs, treatment_runs) -> list[Effect]:
    """``arm_effects`` of two lists of ``CaseResult`` (what ``strata.ab_results`` gives),
    stalls included (from each repetition's measured and injected records)."""
    def inter(r) -> Interference:
        return analyze(r.case_id, (*r.records, *r.injected))

    return arm_effects(
        [r.metrics for r in control_runs],
        [r.metrics for r in treatment_runs],
        [inter(r) for r in control_runs],
        [inter(r) for r in treatment_runs],
    )


def outputs_identical(runs_a, runs_b) -> bool | None:
    """Whether the same prompts gave the same output text (SHA-256) in both arms."""

    def shas(runs):
        return {r.request_id.rsplit("/", 1)[-1]: r.output_sha256
                for run in runs for r in run.records if r.ok}

    a, b = shas(runs_a), shas(runs_b)
    common = set(a) & set(b)
    if not common:
        return None
    return all(a[k] == b[k] for k in common)


@dataclass(frozen=True)
class ShaPair:
    """One output text produced by both arms: its resource use in each."""

    group: str
    treatment_arm: str
    sha: str
    n_control: int
    n_treatment: int
    control: dict[str, float | None]  # metric -> median over that arm's requests
    treatment: dict[str, float | None]
    shared: bool  # some request overlapped others: process deltas are shared


#: One arm of an A/B group: its name and the cases (repetitions) that ran it.
Arm = tuple[str, tuple[str, ...]]


def ab_groups(bundle: RunBundle) -> dict[str, list[Arm]]:
    """group -> arms, the reference arm first; repetitions of an arm are pooled."""
    groups: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for cid in bundle.case_ids():
        info = bundle.case_info(cid)
        if info.ab_group:
            groups[info.ab_group][info.ab_arm or cid].append(cid)
    out = {}
    for g, arms in sorted(groups.items()):
        names = sorted(arms, key=lambda a: (a != "control", a))
        out[g] = [(a, tuple(arms[a])) for a in names]
    return out


def _records(bundle: RunBundle, cases: tuple[str, ...]) -> list:
    return [r for cid in cases for r in bundle.records.get(cid, [])]


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def group_effects(
    group: str,
    arms: list[Arm],
    metrics: Mapping[str, CaseMetrics],
    inter: Mapping[str, Interference | None] | None = None,
) -> list[ArmEffects]:
    """Per treatment arm, the seed's metrics against the control (repetitions as units)."""
    if len(arms) < 2:
        return []
    c_arm, c_cases = arms[0]
    out = []
    for t_arm, t_cases in arms[1:]:
        inter = inter or {}
        per_rep = tuple(
            (arm, cid, repetition_values(metrics[cid], inter.get(cid)))
            for arm, cases in ((c_arm, c_cases), (t_arm, t_cases))
            for cid in cases
            if cid in metrics
        )
        out.append(
            ArmEffects(
                group,
                c_arm,
                t_arm,
                c_cases,
                t_cases,
                tuple(
                    arm_effects(
                        [metrics[c] for c in c_cases if c in metrics],
                        [metrics[c] for c in t_cases if c in metrics],
                        [inter.get(c) for c in c_cases if c in metrics],
                        [inter.get(c) for c in t_cases if c in metrics],
                    )
                ),
                per_rep,
            )
        )
    return out


def arm_deltas(bundle: RunBundle, group: str, arms: list[Arm]) -> list[ArmDelta]:
    """Request-level rows: the arms' requests pooled, medians, bootstrap over requests."""
    out: list[ArmDelta] = []
    if len(arms) < 2:
        return out
    c_arm, c_case = arms[0]
    for t_arm, t_case in arms[1:]:
        for metric in AB_METRICS:
            a = values(_records(bundle, c_case), metric, bundle.metrics_of)
            b = values(_records(bundle, t_case), metric, bundle.metrics_of)
            if a and b:
                out.append(ArmDelta(group, c_arm, t_arm, effect(metric, a, b, unit="request")))
    return out


def same_output_pairs(bundle: RunBundle, group: str, arms: list[Arm]) -> list[ShaPair]:
    out: list[ShaPair] = []
    if len(arms) < 2:
        return out
    c_case = arms[0][1]
    by_sha_c = _by_sha(bundle, c_case)
    for t_arm, t_case in arms[1:]:
        by_sha_t = _by_sha(bundle, t_case)
        for sha in sorted(set(by_sha_c) & set(by_sha_t)):
            rc, rt = by_sha_c[sha], by_sha_t[sha]
            out.append(
                ShaPair(
                    group=group,
                    treatment_arm=t_arm,
                    sha=sha[:12],
                    n_control=len(rc),
                    n_treatment=len(rt),
                    control=_medians(bundle, rc),
                    treatment=_medians(bundle, rt),
                    shared=any(r.proc is not None and r.proc.shared for r in rc + rt),
                )
            )
    return out


def _by_sha(bundle: RunBundle, cases: tuple[str, ...]) -> dict[str, list]:
    out: dict[str, list] = defaultdict(list)
    for r in _records(bundle, cases):
        if r.phase == "measured" and r.ok and r.output_sha256:
            out[r.output_sha256].append(r)
    return out


def _medians(bundle: RunBundle, recs: list) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for metric in PROC_METRICS:
        xs = [v for v in (proc_value(r, metric) for r in recs) if v is not None]
        out[metric] = _median(xs)
    out["e2e_ms"] = _median(values(recs, "e2e_ms", bundle.metrics_of))
    return out


def group_expectations(bundle: RunBundle, group: str, arms: list[Arm]) -> list[ABExpectation]:
    """The A/B expectations judged on ``group`` (``cases.jsonl`` ``ab_expectations``, on
    each case of the group the judging test ran): one per metric and direction, the last
    judged."""
    out: dict[tuple[str, str], ABExpectation] = {}
    for _, cases in arms:
        for cid in cases:
            for i, d in enumerate(bundle.case_info(cid).line.ab_expectations or ()):
                e = ABExpectation.from_json(d, f"case {cid!r}: ab_expectations[{i}]")
                if e.group == group:
                    out[(e.metric, e.direction)] = e
    return list(out.values())

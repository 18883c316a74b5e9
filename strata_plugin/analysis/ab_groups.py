"""A/B tables: arms of one group compared request by request, with intervals.

Cases carry ``ab_group`` and ``ab_arm`` in their ``cases.jsonl`` line. The first arm
(``control`` when there is one, else the first by name) is the reference; every other
arm is compared with it. Beside the latency deltas, the per-request server-process
deltas (CPU seconds, major faults, MB read) are compared, and paired by output SHA:
two arms that produced the same text did the same work, so their resource use can be
compared one to one.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from strata_plugin.analysis.request_values import PROC_METRICS, proc_value, unit, values
from strata_plugin.analysis.run_folder import RunBundle
from strata_plugin.analysis.stats import bootstrap_ci, mann_whitney_u

AB_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms", "proc_cpu_s", "proc_major_faults", "proc_read_mb")
CONF = 0.95


@dataclass(frozen=True)
class ArmDelta:
    group: str
    control_arm: str
    treatment_arm: str
    control_cases: tuple[str, ...]
    treatment_cases: tuple[str, ...]
    metric: str
    unit: str
    n_control: int
    n_treatment: int
    control_median: float | None
    treatment_median: float | None
    delta: float | None  # median(treatment) - median(control)
    lo: float | None  # 95% bootstrap interval of delta
    hi: float | None
    rel: float | None  # delta / median(control)
    p_value: float | None  # two-sided Mann-Whitney


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


def arm_deltas(bundle: RunBundle, group: str, arms: list[Arm]) -> list[ArmDelta]:
    out = []
    if len(arms) < 2:
        return out
    c_arm, c_case = arms[0]
    for t_arm, t_case in arms[1:]:
        for metric in AB_METRICS:
            a = values(_records(bundle, c_case), metric, bundle.metrics_of)
            b = values(_records(bundle, t_case), metric, bundle.metrics_of)
            if not a and not b:
                continue
            delta = lo = hi = rel = p = None
            ma, mb = _median(a), _median(b)
            if len(a) >= 2 and len(b) >= 2:
                delta, lo, hi = bootstrap_ci(a, b, conf=CONF)
                p = mann_whitney_u(a, b)
            elif ma is not None and mb is not None:
                delta = mb - ma
            if delta is not None and ma:
                rel = delta / ma
            out.append(
                ArmDelta(
                    group,
                    c_arm,
                    t_arm,
                    c_case,
                    t_case,
                    metric,
                    unit(metric),
                    len(a),
                    len(b),
                    ma,
                    mb,
                    delta,
                    lo,
                    hi,
                    rel,
                    p,
                )
            )
    return out


def same_output_pairs(bundle: RunBundle, group: str, arms: list[Arm]) -> list[ShaPair]:
    out = []
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

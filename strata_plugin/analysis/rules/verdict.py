"""The machinery: every rule over a window, then ranking, conflicts and confidence.

The rules themselves are in the family modules (``gpu.py``, ``host.py``, ``serving.py``)
and are declared, with their classes, groups and signals, in ``table.py``. This module
knows nothing about any one class except the few the verdict treats apart: the client
(it leads), the modifiers, ``unexplained`` (the time ledger did not close: it is named
last, and alone it makes the verdict inconclusive) and ``headroom`` (what is left when
nothing fired, everything core was measured and the ledger closed).
"""

from __future__ import annotations

from dataclasses import replace

from strata_plugin.analysis.rules.outcome import Outcome, margin, round_sig
from strata_plugin.analysis.rules.registry import active
from strata_plugin.analysis.rules.table import AMBIGUOUS, CLIENT_MEASURED, CONTRADICTIONS
from strata_plugin.analysis.rules.traces import TRACE_CLOCK, TRACE_LEDGER, TRACE_SCHED
from strata_plugin.analysis.rules.window import Evidence, Verdict, WindowSignals
from strata_plugin.analysis.thresholds import threshold
from strata_plugin.analysis.thresholds import value as _v


def _missing_text(signal: str, s: WindowSignals, distrusted: tuple[str, ...] = ()) -> str:
    src = active().signal_sources.get(signal, signal)
    if signal in distrusted:
        return f"{signal} <- {src} (not trusted: the load generator's self-check flagged it)"
    collector = src.split(":", 1)[0]
    metric = src.split(":", 1)[-1]

    def concerns(where: str) -> bool:
        # where: "<node>/<collector>" or "<node>/<collector>/<device>/<metric>" (one metric)
        parts = where.split("/")[1:] or [where]
        return parts[0] == collector or parts[0] in metric or parts[-1] in metric

    reasons = [f"{where}: {why}" for where, why in s.unavailable if concerns(where)]
    if reasons:
        why = f" (unavailable: {'; '.join(reasons)})"
    elif collector in ("requests", "cases.jsonl"):
        why = " (not recorded for this case)"
    else:
        why = " (no samples in the window)"
    return f"{signal} <- {src}{why}"


def classify(s: WindowSignals, background: frozenset[str] | set[str] = frozenset()) -> Verdict:
    """Every rule over one window, then the verdict: top classes, evidence, confidence.

    ``background``: classes past threshold in the idle baseline before the load (host
    background, from the case analysis). They rank after the classes that appeared
    with the load, so a busy host's standing contention does not push the cause of
    this window out of the named slots; they stay in the verdict, marked background.
    """
    v = _classify(s, frozenset(background))
    if not background:
        return v
    return replace(v, background=tuple(c for c in v.past_threshold if c in background))


def _classify(s: WindowSignals, background: frozenset[str]) -> Verdict:
    gpu_mode = s.gpu_present or s.gpu_expected
    notes: list[str] = []
    distrusted: tuple[str, ...] = ()
    if s.client_bound:
        distrusted = tuple(n for n in CLIENT_MEASURED if getattr(s, n) is not None)
        s = replace(s, **dict.fromkeys(CLIENT_MEASURED))  # type: ignore[arg-type]  # all optional
        notes.append(
            "the load generator fell behind its own schedule: the server did not get the "
            "load asked for, and request-side signals ("
            + ", ".join(CLIENT_MEASURED)
            + ") are not trusted for this window"
        )
    t = active()  # the table's rules and the installed plugins' (rules/registry.py)
    rules = list(t.host_rules) + list(t.serving_rules)
    rules = (list(t.gpu_rules) if gpu_mode else list(t.cpu_server_rules)) + rules
    outcomes = {o.cls: o for o in (rule(s) for rule in rules)}
    if not gpu_mode:
        notes.append("no GPU telemetry and none expected: GPU classes not assessed")

    fired = [o for o in outcomes.values() if o.fired]
    modifiers = tuple(o.cls for o in fired if o.cls in t.modifiers)
    ordered = _rank([o for o in fired if o.cls not in t.modifiers], background)

    missing_signals = sorted({m for o in outcomes.values() for m in o.missing} | set(distrusted))
    unassessed = [o for o in outcomes.values() if not o.assessable]
    missing_text = tuple(_missing_text(m, s, distrusted) for m in missing_signals)
    penalty = threshold("missing_penalty").value ** len(
        {t.signal_sources.get(m, m).split(":", 1)[0] for m in missing_signals}
    )

    # Signals that contradict each other: the server used more CPU than the whole node.
    if (
        s.server_cpu_cores is not None
        and s.host_busy_cores is not None
        and s.server_cpu_cores
        > _v("cpu_samples_disagree_factor") * s.host_busy_cores
        + _v("cpu_samples_disagree_slack_cores")
    ):
        return Verdict(
            classes=tuple(o.cls for o in ordered[:2]),
            evidence=_evidence(ordered[:2]),
            confidence=0.2,
            inconclusive=True,
            finer_trace=(TRACE_SCHED, TRACE_CLOCK),
            missing_signals=missing_text,
            modifiers=modifiers,
            notes=(
                *notes,
                f"server CPU {s.server_cpu_cores:.3g} cores exceeds the node's busy "
                f"{s.host_busy_cores:.3g} cores: proc and cpu samples disagree",
            ),
        )

    conflict = _conflict(ordered)
    if conflict is not None:
        a, b, trace, why = conflict
        pair = [outcomes[a], outcomes[b]]
        return Verdict(
            classes=(a, b),
            evidence=_evidence(pair + [o for o in ordered if o.cls not in (a, b)]),
            confidence=round_sig(min(0.4, 0.4 * penalty)),
            inconclusive=True,
            finer_trace=(trace,),
            missing_signals=missing_text,
            modifiers=modifiers,
            also_flagged=tuple(o.cls for o in ordered if o.cls not in (a, b)),
            notes=(*notes, f"{a} and {b} both past threshold: {why}"),
        )

    if [o.cls for o in ordered] == ["unexplained"]:
        # Nothing past threshold, but the ledger does not close: part of the metric went
        # where no clock or state looks. Not "headroom": the escalation round takes it.
        return Verdict(
            classes=("unexplained",),
            evidence=_evidence(ordered + [outcomes[c] for c in modifiers]),
            confidence=round_sig(min(0.4, 0.4 * penalty)),
            inconclusive=True,
            finer_trace=(TRACE_LEDGER, *_in_question(unassessed, s)),
            missing_signals=missing_text,
            modifiers=modifiers,
            notes=(*notes, _unexplained_note(s)),
            weights=_weights(s, ("unexplained",)),
        )

    if ordered:
        names_fired = {o.cls for o in ordered}
        top = ordered[:2]
        conf = max(_class_confidence(o) for o in top[:1]) * penalty
        traces = _in_question(unassessed, s)
        return Verdict(
            classes=tuple(o.cls for o in top),
            evidence=_evidence(ordered + [outcomes[c] for c in modifiers]),
            confidence=round_sig(max(0.1, conf)),
            inconclusive=False,
            finer_trace=traces if missing_signals else (),
            missing_signals=missing_text,
            modifiers=modifiers,
            also_flagged=tuple(o.cls for o in ordered[2:]),
            notes=(*notes, *_second_slot_notes(ordered),
                   *((_unexplained_note(s),) if "unexplained" in names_fired else ())),
            weights=_weights(s, tuple(o.cls for o in ordered)),
        )

    if modifiers:
        mod = outcomes[modifiers[0]]
        return Verdict(
            classes=modifiers,
            evidence=_evidence([mod]),
            confidence=round_sig(_class_confidence(mod) * penalty),
            inconclusive=False,
            finer_trace=(),
            missing_signals=missing_text,
            modifiers=(),
            notes=tuple(notes),
        )

    core = t.core_gpu if gpu_mode else t.core_cpu
    blind = [c for c in core if c in outcomes and not outcomes[c].assessable]
    if blind:
        traces = tuple(sorted({outcomes[c].trace for c in blind if outcomes[c].trace}))
        return Verdict(
            classes=(),
            evidence=_evidence(list(outcomes.values())),
            confidence=0.0,
            inconclusive=True,
            finer_trace=traces,
            missing_signals=missing_text,
            notes=(*notes, "nothing past threshold, but not measured: " + ", ".join(blind)),
        )

    clear = [o for o in outcomes.values() if o.assessable and o.evidence]
    headroom_margin = _headroom_margin(clear)
    conf = (0.5 + 0.4 * headroom_margin) * penalty
    return Verdict(
        classes=("headroom",),
        evidence=_evidence(clear),
        confidence=round_sig(conf),
        inconclusive=False,
        finer_trace=_in_question(unassessed, s),
        missing_signals=missing_text,
        notes=(*notes, "no dominant bottleneck: no rule had all its conditions met",
               *_closed_note(s)),
        weights=_weights(s, ()),
    )


def _in_question(unassessed: list[Outcome], s: WindowSignals) -> tuple[str, ...]:
    """Finer traces for the unassessed classes that could matter in this window: a
    one-node run serves over loopback, so no network class is in question there."""
    return tuple(sorted({
        o.trace for o in unassessed
        if o.trace and not (o.cls == "network" and not s.multi_node)
    }))


def _rank(fired: list[Outcome], background: frozenset[str] | set[str] = frozenset()
          ) -> list[Outcome]:
    """The order classes are named in: the client, a resource, a serving symptom, the rest.

    A client that fell behind leads: nothing below it was measured under the load asked
    for. Then the strongest resource class (what the hardware waited on), then the
    strongest serving symptom (what a user of the server saw), so a queue or a full KV
    cache is not pushed out by a second resource class; then the rest, by kind and
    score; ``unexplained`` (what no clock explains) last, since any class that fired
    explains part of it. Score ties break by ``CLASSES`` order. Within each kind,
    classes already past threshold in the idle baseline (``background``) come after
    those that appeared with the load.
    """
    t = active()
    ranked = sorted(fired, key=lambda o: (o.cls in background, -o.score,
                                          t.classes.index(o.cls)))
    client = [o for o in ranked if o.cls == "client_bound"]
    resource = [o for o in ranked if o.cls not in t.serving]
    serving = [o for o in ranked if o.cls in t.serving and o.cls not in LAST]
    last = [o for o in ranked if o.cls == "unexplained"]
    return client + resource[:1] + serving[:1] + resource[1:] + serving[1:] + last


def _close_pairs(ordered: list[Outcome], cls: str):
    """AMBIGUOUS pairs of ``cls`` with another fired class it does not lead by the margin."""
    names = {o.cls: o for o in ordered}
    dominance = _v("dominance_margin")
    for a, b, trace, why in AMBIGUOUS:
        if cls in (a, b) and a in names and b in names:
            if abs(names[a].score - names[b].score) < dominance:
                yield a, b, trace, why


def _conflict(ordered: list[Outcome]) -> tuple[str, str, str, str] | None:
    """A contradiction anywhere, or an ambiguous pair that puts the leading class in doubt.

    An ambiguous pair further down (two weak classes the counters cannot separate,
    beside a clear leader) does not make the verdict inconclusive: see
    :func:`_second_slot_notes`.
    """
    names = {o.cls for o in ordered}
    for a, b, trace, why in CONTRADICTIONS:
        if a in names and b in names:
            return a, b, trace, f"contradictory signals: {why}"
    if ordered:
        return next(_close_pairs(ordered, ordered[0].cls), None)
    return None


def _second_slot_notes(ordered: list[Outcome]) -> list[str]:
    if len(ordered) < 2:
        return []
    return [
        f"{ordered[1].cls} could equally be {b if a == ordered[1].cls else a}: {why} ({trace})"
        for a, b, trace, why in _close_pairs(ordered, ordered[1].cls)
    ]


def _class_confidence(o: Outcome) -> float:
    """0.5 at the threshold, up to 0.9 far past it; +0.1 when two signals agree."""
    met = sum(1 for e in o.evidence if e.met)
    return min(1.0, 0.5 + 0.4 * o.score + (0.1 if met >= 2 else 0.0))


def _headroom_margin(clear: list[Outcome]) -> float:
    """How far the assessed comparisons stayed from firing (0..1, the closest).

    Each row not met is measured on the other side of its threshold: a ">=" row by how
    far under, a "<" row by how far over. A zero threshold has no relative distance
    (``preemptions > 0`` with none is not "at" its threshold), so such rows are left out;
    so is ``==`` (the client-bound flag)."""
    other_side = {">=": "<", ">": "<", "<": ">="}
    margins = [
        margin(e.value, e.threshold_value, other_side[e.op])
        for o in clear
        for e in o.evidence
        if not e.met and e.op in other_side and e.threshold_value
    ]
    return min(margins) if margins else 0.5


def _evidence(outcomes: list[Outcome]) -> tuple[Evidence, ...]:
    return tuple(e for o in outcomes for e in o.evidence)


#: Classes ranked apart: the client first, the ledger's residual last.
LAST = ("client_bound", "unexplained")
#: The metric each ledger weight is a share of, as the report names it.
METRIC_LABELS = {"ttft": "TTFT", "itl": "TPOT/ITL", "e2e": "end-to-end time"}


def _weights(s: WindowSignals, classes: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """Each ledger part's share of the case's metric (``s.ledger_shares``), the named
    classes' first: the weight of each class in the time the case is about."""
    if not s.ledger_shares:
        return ()
    return tuple(sorted(s.ledger_shares, key=lambda kv: (kv[0] not in classes, -kv[1], kv[0])))


def _unexplained_note(s: WindowSignals) -> str:
    metric = METRIC_LABELS.get(s.ledger_metric or "", s.ledger_metric or "the metric")
    ms = f"{s.ledger_residual_ms:.3g} ms, " if s.ledger_residual_ms is not None else ""
    where = f" (largest: {s.ledger_residual_part})" if s.ledger_residual_part else ""
    return (f"the time ledger does not close: {ms}{(s.ledger_residual_frac or 0):.1%} of "
            f"{metric} is explained by no clock or server state{where}")


def _closed_note(s: WindowSignals) -> tuple[str, ...]:
    if s.ledger_residual_frac is None:
        return ()
    metric = METRIC_LABELS.get(s.ledger_metric or "", s.ledger_metric or "the metric")
    return (f"the time ledger closes: residual {s.ledger_residual_frac:.1%} of {metric}",)

"""The machinery: every rule over a window, then the first class, ranking, conflicts and
confidence.

The rules themselves are in the family modules (``gpu.py``, ``host.py``, ``serving.py``)
and are declared, with their classes, groups and signals, in ``table.py``. The verdict
is put together in steps (:func:`_classify`), each a function of its own:

1. :func:`_assess`: every rule over the window (a client that fell behind its schedule
   makes the request-side signals untrusted first), what was missing and the penalty;
2. :func:`_disagreeing`: proc and cpu samples that contradict each other;
3. :func:`_contradicted`: two classes that cannot both hold;
4. :func:`_ledger_led`: where the case has a time ledger by cause (analysis/ledger.py),
   the first class is its largest cause of the case's metric mapped to the resource
   behind it (:func:`first_cause`: running -> the device's compute, waiting for a CPU
   -> ``cpu_limited`` or ``cpu_contention``, blocked -> I/O, stopped -> the stall,
   outside -> the path or the client, the queue -> ``queueing``), with the resource
   rules as its evidence and the strongest other class past threshold second; a server
   stalled for ``server_stalled_window_lead`` of the window while requests were in
   flight is first whatever its share of the metric (:func:`_stall_first`);
5. :func:`_rule_led`: without a ledger, the classes past threshold by rank, as before;
6. :func:`_engine_first`: where the path ends at several engines, the one held by its
   own quota and slower than the others beyond ``engine_pace_ratio`` is first, named
   (a slow one its own evidence does not explain is named in a note).

There is always a largest cause, so there is no "headroom" class: the spare capacity
(the idle share of the CPUs the server may use, or of its GPUs) is stated beside the first
class (:func:`spare_capacity`), and where a rule's collector had too few samples in the
window the verdict says so (:func:`_sparse_notes`). ``client_bound`` is the first class
only where the client's own time is the ledger's largest cause; otherwise a modifier.
``unexplained`` (the ledger did not close) is named last, and alone it makes the verdict
inconclusive.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from strata_plugin.analysis.ledger import METRIC_LABELS, cause_words
from strata_plugin.analysis.rules.host import (
    named_share_words,
    others_host_cores,
    process_starts_words,
    stalled_lead,
)
from strata_plugin.analysis.rules.outcome import Outcome, margin, round_sig
from strata_plugin.analysis.rules.registry import ActiveRules, active
from strata_plugin.analysis.rules.table import AMBIGUOUS, CLIENT_MEASURED, CONTRADICTIONS
from strata_plugin.analysis.rules.traces import TRACE_CLOCK, TRACE_LEDGER, TRACE_SCHED
from strata_plugin.analysis.rules.window import EngineFacts, Evidence, Verdict, WindowSignals
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

    ``background``: classes past threshold in the idle baseline before the load (from
    the case analysis). Being there before the run is a fact about the host, stated
    beside the class, never a lower rank: a co-tenant that runs all the time is still
    the case's cause where it takes the largest share of its metric
    (:func:`with_background`).
    """
    return with_background(_classify(s), s, background)


def with_background(v: Verdict, s: WindowSignals,
                    background: frozenset[str] | set[str] | tuple[str, ...]) -> Verdict:
    """The verdict with the idle baseline's classes said beside it: ``background``, those
    the case feels too (past threshold in the case, and, where the run-state grid
    split the ledger and measures the class, ``ledger_second_min_share`` of the metric
    or more), in the verdict's order; ``baseline_unfelt``, those the baseline showed that
    the case's ledger does not feel (not past threshold in the case, or a share of the
    metric under that). Neither changes a rank."""
    if not background:
        return replace(v, background=(), baseline_unfelt=())
    a = _assess(s)
    fc = first_cause(a)
    small = _v("ledger_second_min_share")

    def felt(cls: str) -> bool:
        if cls not in v.past_threshold:
            return False
        if fc is None or not s.ledger_run_state or cls not in MEASURED_BY_RUN_STATE:
            return True
        o = a.outcomes.get(cls)
        return cls == fc.cls or (o is not None and _ledger_share(fc, o) >= small)

    order = {c: i for i, c in enumerate(a.t.classes)}
    return replace(
        v, background=tuple(c for c in v.past_threshold if c in background and felt(c)),
        baseline_unfelt=tuple(sorted((c for c in background if not felt(c)),
                                     key=lambda c: (order.get(c, len(order)), c))))


@dataclass(frozen=True)
class _Assessed:
    """Every rule over one window, and what the verdict's steps share."""

    s: WindowSignals  # with untrusted request-side signals cleared
    t: ActiveRules
    gpu_mode: bool
    notes: tuple[str, ...]
    outcomes: dict[str, Outcome]
    modifiers: tuple[str, ...]  # modifier classes past threshold (client_bound apart)
    ordered: list[Outcome]  # classes past threshold, ranked (_rank), no modifier
    missing_text: tuple[str, ...]
    missing_any: bool
    unassessed: list[Outcome]
    penalty: float


def _classify(s: WindowSignals) -> Verdict:
    a = _assess(s)
    v = _disagreeing(a) or _contradicted(a) or _engine_first(_ledger_led(a) or _rule_led(a), a)
    return _with_capacity(v, a)


# --- several engines: the one its own quota holds, and slow, first -----------------------


def held_slow_engine(s: WindowSignals) -> EngineFacts | None:
    """Of several engines, the one its own cgroup throttled in ``cgroup_throttled_frac``
    of its periods or more that is also the slow one (its median TPOT beyond
    ``engine_pace_ratio`` x the fastest's); None where no engine is both."""
    least = _v("cgroup_throttled_frac")
    return next((e for e in s.engines if e.slower is not None and e.throttled_frac is not None
                 and e.throttled_frac >= least), None)


def _engine_first(v: Verdict, a: _Assessed) -> Verdict:
    """Where the path ends at several engines and one of them is held by its own quota
    and slower than the others beyond ``engine_pace_ratio``, that is the case's story:
    ``cpu_limited`` first, naming the engine, whatever the whole server's ledger ranks
    first (its sum over the engines is mostly the free ones' compute); the class it
    would have named stands second. An inconclusive verdict is left as it is."""
    e = held_slow_engine(a.s)
    own = a.outcomes.get("cpu_limited")
    if e is None or own is None or not own.fired or v.inconclusive:
        slow = next((x for x in a.s.engines if x.slower is not None), None)
        if slow is None:
            return v
        # slower, but its own cgroup does not hold it: named, no cause claimed
        return replace(v, notes=(*v.notes, (
            f"PID {slow.pid} on {slow.node} is {slow.slower:.2f}x slower than the fastest "
            f"engine (beyond engine_pace_ratio); its own evidence names no cause: "
            f"{slow.words}")))
    before = [c for c in v.past_threshold if c != "cpu_limited"]
    classes = ("cpu_limited", *before[:1])
    rows = [x for x in v.evidence if x.cls == "cpu_limited"] or list(own.evidence)
    was = f"; the whole server's largest cause: {v.lead}" if v.lead else ""
    return replace(
        v, classes=classes, also_flagged=tuple(before[1:]),
        evidence=(*rows, *(x for x in v.evidence if x.cls != "cpu_limited")),
        confidence=round_sig(max(_v("confidence_floor"), _class_confidence(own) * a.penalty)),
        lead=(f"PID {e.pid} on {e.node} held by its own CPU quota and {e.slower:.2f}x "
              f"slower than the fastest engine: {e.words}"),
        notes=(*v.notes, "cpu_limited first: one engine of several held by its own CPU "
               f"quota and slower than the others beyond engine_pace_ratio{was}"),
        weights=_weights(a.s, classes))


def _assess(s: WindowSignals) -> _Assessed:
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
    # a client that fell behind is beside the classes (first only where the ledger's
    # largest cause is its own time: _ledger_led)
    modifiers = tuple(o.cls for o in fired if o.cls in t.modifiers or o.cls == CLIENT)
    ordered = _rank([o for o in fired if o.cls not in modifiers])
    missing_signals = sorted({m for o in outcomes.values() for m in o.missing} | set(distrusted))
    penalty = threshold("missing_penalty").value ** len(
        {t.signal_sources.get(m, m).split(":", 1)[0] for m in missing_signals}
    )
    return _Assessed(
        s=s, t=t, gpu_mode=gpu_mode, notes=tuple(notes), outcomes=outcomes,
        modifiers=modifiers, ordered=ordered,
        missing_text=tuple(_missing_text(m, s, distrusted) for m in missing_signals),
        missing_any=bool(missing_signals),
        unassessed=[o for o in outcomes.values() if not o.assessable], penalty=penalty,
    )


def _disagreeing(a: _Assessed) -> Verdict | None:
    """Signals that contradict each other: the server used more CPU than the whole node."""
    s = a.s
    if (
        s.server_cpu_cores is None
        or s.host_busy_cores is None
        or s.server_cpu_cores <= _v("cpu_samples_disagree_factor") * s.host_busy_cores
        + _v("cpu_samples_disagree_slack_cores")
    ):
        return None
    return Verdict(
        classes=tuple(o.cls for o in a.ordered[:2]),
        evidence=_evidence(a.ordered[:2]),
        confidence=_v("confidence_disagreeing_samples"),
        inconclusive=True,
        finer_trace=(TRACE_SCHED, TRACE_CLOCK),
        missing_signals=a.missing_text,
        modifiers=a.modifiers,
        notes=(
            *a.notes,
            f"server CPU {s.server_cpu_cores:.3g} cores exceeds the node's busy "
            f"{s.host_busy_cores:.3g} cores: proc and cpu samples disagree",
        ),
    )


def _conflict_verdict(a: _Assessed, pair: tuple[str, str, str, str]) -> Verdict:
    x, y, trace, why = pair
    ordered = a.ordered
    return Verdict(
        classes=(x, y),
        evidence=_evidence([a.outcomes[x], a.outcomes[y]]
                           + [o for o in ordered if o.cls not in (x, y)]),
        confidence=round_sig(min(_v("confidence_conflict_max"),
                                 _v("confidence_conflict_max") * a.penalty)),
        inconclusive=True,
        finer_trace=(trace,),
        missing_signals=a.missing_text,
        modifiers=a.modifiers,
        also_flagged=tuple(o.cls for o in ordered if o.cls not in (x, y)),
        notes=(*a.notes, f"{x} and {y} both past threshold: {why}"),
    )


def _contradicted(a: _Assessed) -> Verdict | None:
    """Two classes past threshold that cannot both hold (``CONTRADICTIONS``)."""
    names = {o.cls for o in a.ordered}
    for x, y, trace, why in CONTRADICTIONS:
        if x in names and y in names:
            return _conflict_verdict(a, (x, y, trace, f"contradictory signals: {why}"))
    return None


# --- the first class: the ledger's largest cause of the case's metric ---------------------

#: Pairs the counters cannot tell apart that the run-state grid does: on a CPU or held
#: back from one, on a CPU or blocked in I/O (the ledger by cause measured which).
SETTLED_BY_RUN_STATE = (frozenset(("cpu_compute", "cpu_contention")),
                        frozenset(("cpu_compute", "io_page_faults")))
#: The resource classes a GPU server's time on the device may be named by, the first
#: past threshold of them; ``gpu_compute`` where none is.
GPU_COMPUTE_CLASSES = ("gpu_compute", "gpu_memory_bandwidth", "gpu_latency_low_occupancy",
                       "host_cpu_launch", "gpu_communication", "gpu_pcie_copy",
                       "waiting_on_peer")
def _allowed_cpus(s: WindowSignals) -> tuple[float | None, str, str]:
    """(CPUs, "allowed" | "host", what says so): the server's allowance where observed
    (affinity, cpuset, quota: ``server_allowed_cpus``), else the host's cores."""
    allowed = getattr(s, "server_allowed_cpus", None)
    if allowed is not None:
        return float(allowed), "allowed", getattr(s, "server_allowance_by", "") or ""
    if s.n_cores:
        return float(s.n_cores), "host", "allowance not observed"
    return None, "", ""


def _runnable(s: WindowSignals) -> float | None:
    x = getattr(s, "server_runnable_cores", None)
    return x if x is not None else s.ledger_runnable_cores


def _waiting_class(s: WindowSignals, cause: str, outcomes: dict[str, Outcome]) -> str:
    """Who the server's threads waited for: its own quota or its own threads on too few
    CPUs (``cpu_limited``), or other processes (``cpu_contention``)."""
    if cause.endswith(":throttled"):
        return "cpu_limited"
    fired = [outcomes[c] for c in ("cpu_limited", "cpu_contention")
             if c in outcomes and outcomes[c].fired]
    if fired:
        return max(fired, key=lambda o: o.score).cls
    runnable, (allowed, _, _) = _runnable(s), _allowed_cpus(s)
    if runnable is not None and allowed is not None and (
            runnable - allowed >= _v("runnable_excess_threads")):
        return "cpu_limited"
    others = _others_cores_frac(s)
    if others is not None and others < _v("other_cpu_frac"):
        # the threads waited while other processes held little of the CPUs: for the
        # server's own threads, on fewer CPUs than they (an allowance, observed or not)
        return "cpu_limited"
    return "cpu_contention"


def _others_cores_frac(s: WindowSignals) -> float | None:
    """Other processes' CPU over the host's cores (the path's proxies left out), as
    ``cpu_contention`` reads it; None where unmeasured."""
    others = others_host_cores(s)
    if others is None or not s.n_cores:
        return None
    return others / s.n_cores


def _class_of(cause: str, a: _Assessed) -> str:
    """The resource (class) behind a ``group:state`` cause of the ledger."""
    group, _, state = cause.partition(":")
    s, outcomes = a.s, a.outcomes
    if group == "unexplained":
        return "unexplained"
    if group == "outside":
        if state == "client_send" or (s.client_bound and state in ("delivery",
                                                                  "ttft_delivery", "tail")):
            return "client_bound"
        return "outside_server"
    if state in ("waiting", "throttled"):
        return _waiting_class(s, cause, outcomes)
    if state == "io":
        return "io_page_faults"
    if state == "sleeping" and s.client_bound:
        # asleep with tokens to send while the client's own check says it fell behind:
        # the server waits to write to a reader that does not read (the fault suite's
        # client_bound arm: 67% of TPOT/ITL in such stalls, named server_stalled before)
        return "client_bound"
    if state in ("stopped", "sleeping"):
        return "server_stalled"
    if group == "queue":
        return "queueing"
    if a.gpu_mode:
        fired = [o for o in a.ordered if o.cls in GPU_COMPUTE_CLASSES]
        return fired[0].cls if fired else "gpu_compute"
    if not s.ledger_run_state:
        # no run state: the server's clock ran, doing what it is not measured; a resource
        # past threshold says what (the strongest), else its compute
        fired = [o for o in a.ordered if o.cls not in a.t.serving]
        return fired[0].cls if fired else "cpu_compute"
    return "cpu_compute"


#: The two classes the ledger's waiting goes to: the threads waited for CPUs their own
#: allowance or threads kept from them, or for CPUs other processes held. Both can be
#: true at once (two threads pinned to one CPU that a foreign loop also runs on): the
#: waiting is then each one's, and the one not chosen first may stand beside it.
WAITING_CLASSES = ("cpu_limited", "cpu_contention")


def _ledger_share(fc: FirstCause, o: Outcome) -> float:
    """The ledger's share a class past threshold can claim for the second slot: its own,
    or, for the other waiting class beside a waiting first class, the waiting's."""
    if fc.cls in WAITING_CLASSES and o.cls in WAITING_CLASSES and o.fired:
        return max(fc.share_of(o.cls), fc.share)
    return fc.share_of(o.cls)


#: Classes the run-state grid measures in the ledger: where it split the ledger, one of
#: them is named beside the first only with ``ledger_second_min_share`` of the metric.
#: Not ``io_page_faults``: the grid sees a major fault's wait for the disk (threads in D
#: at its instants), not the fault's own kernel work, which the faulting thread does on
#: its CPU and the grid books as running; in the fault suite's page-out arms (a final-code
#: run) the case was about 16% slower than its clean arms while D held 2-3% of TPOT/ITL,
#: so the grid's small share does not say the time did not go there.
MEASURED_BY_RUN_STATE = ("cpu_compute", "cpu_contention", "cpu_limited", "server_stalled")


@dataclass(frozen=True)
class FirstCause:
    """The ledger's largest cause of the case's metric, as a class."""

    cls: str
    share: float  # the class's causes' share of the metric
    next_share: float  # the next class's
    causes: tuple[tuple[str, float], ...]  # its causes, largest first
    metric: str  # "TTFT", ...
    #: the largest other class's share but ``unexplained``, and the residual's (what no
    #: clock explains could belong to it)
    rival_share: float = 0.0
    residual_share: float = 0.0
    by_class: tuple[tuple[str, float], ...] = ()  # every class's share, largest first
    #: set where the stall leads by the window (``server_stalled_window_lead``), not by
    #: its share of the metric: the share of the window it held with requests in flight
    window_frac: float | None = None

    def share_of(self, cls: str) -> float:
        return dict(self.by_class).get(cls, 0.0)

    @property
    def robust(self) -> bool:
        """First however the residual is shared out."""
        return self.share >= self.rival_share + self.residual_share

    def words(self) -> str:
        top, top_share = self.causes[0]
        if self.window_frac is not None:
            return (f"{cause_words(top)} {self.window_frac:.0%} of the window with requests "
                    f"in flight, {self.share:.0%} of {self.metric}")
        if top_share >= 2 / 3 * self.share or len(self.causes) == 1:
            what = cause_words(top)
            if self.cls == "client_bound" and top in ("outside:delivery",
                                                      "outside:ttft_delivery"):
                # tokens the server had made, stamped late by the client that read them
                what += " to a client that fell behind (its own check)"
        else:
            what = "; ".join(f"{cause_words(c)} {x:.0%}" for c, x in self.causes[:2])
            what = f"{self.cls} ({what})"
        return f"{what}, {self.share:.0%} of {self.metric}"


def first_cause(a: _Assessed) -> FirstCause | None:
    """The largest cause of the case's metric in the ledger, summed by the class each
    cause maps to; None without a ledger by cause. Ties break by the order the causes
    are listed in (largest single cause first). A server stalled for
    ``server_stalled_window_lead`` of the window while requests were in flight is first
    whatever its share of the metric (:func:`_stall_first`)."""
    s = a.s
    if not s.ledger_causes:
        return None
    by_class: dict[str, list[tuple[str, float]]] = {}
    for cause, share in s.ledger_causes:
        by_class.setdefault(_class_of(cause, a), []).append((cause, share))
    totals = sorted(((sum(x for _, x in cs), -i, c) for i, (c, cs) in
                     enumerate(by_class.items())), reverse=True)
    share, _, cls = totals[0]
    metric = METRIC_LABELS.get(s.ledger_metric or "", s.ledger_metric or "the metric")
    rivals = [x for x, _, c in totals[1:] if c != "unexplained"]
    residual = sum(abs(x) for _, x in by_class.get("unexplained", ()))
    fc = FirstCause(cls=cls, share=share, next_share=totals[1][0] if len(totals) > 1 else 0.0,
                    causes=tuple(sorted(by_class[cls], key=lambda kv: -kv[1])),
                    metric=metric, rival_share=rivals[0] if rivals else 0.0,
                    residual_share=0.0 if cls == "unexplained" else residual,
                    by_class=tuple((c, x) for x, _, c in totals))
    return _stall_first(fc, by_class, a)


def _stall_first(fc: FirstCause, by_class: dict[str, list[tuple[str, float]]],
                 a: _Assessed) -> FirstCause:
    """A server that did nothing for ``server_stalled_window_lead`` of the window while
    requests waited on it is the case's story, first, whatever share of the metric the
    stall shows in: compute is the largest cause of any healthy case, and a headline
    that leaves the stall out (TPOT when the stalls fell in TTFT, a median) must not
    hide it. Its rule must be past threshold (it reads the same window row)."""
    own = a.outcomes.get("server_stalled")
    if fc.cls == "server_stalled" or own is None or not own.fired or not stalled_lead(a.s):
        return fc
    causes = by_class.get("server_stalled") or [("stall:stopped", 0.0)]
    share = sum(x for _, x in causes)
    rivals = [x for c, x in fc.by_class if c not in ("server_stalled", "unexplained")]
    return replace(fc, cls="server_stalled", share=share, next_share=fc.share,
                   causes=tuple(sorted(causes, key=lambda kv: -kv[1])),
                   rival_share=rivals[0] if rivals else 0.0,
                   window_frac=a.s.server_stalled_inflight_frac)


def _ledger_row(fc: FirstCause) -> Evidence:
    """The first class's evidence from the ledger: its share of the metric, at least the
    next class's (``ledger_cause_lead`` x)."""
    t = threshold("ledger_cause_lead")
    bound = t.value * fc.next_share
    return Evidence(cls=fc.cls, metric="ledger_cause_share", value=round(fc.share, 4),
                    op=">=", threshold=t.name, threshold_value=round(bound, 4),
                    unit=f"of {fc.metric}", source=t.source, met=fc.share >= bound)


def _ledger_confidence(fc: FirstCause, backed: bool, penalty: float) -> float:
    """``confidence_at_threshold`` at a tie with the next cause, ``confidence_span`` more
    when the first is twice the next or more; ``confidence_agreement`` more where its
    resource rule is past threshold too; the missing collectors' penalty."""
    lead = 1.0 if fc.share <= 0 else min(1.0, max(0.0, fc.share - fc.next_share) / fc.share * 2)
    conf = (_v("confidence_at_threshold") + _v("confidence_span") * lead
            + (_v("confidence_agreement") if backed else 0.0))
    return round_sig(max(_v("confidence_floor"), min(1.0, conf) * penalty))


def _ledger_led(a: _Assessed) -> Verdict | None:
    """The first class from the ledger (module docstring, step 4); None without one."""
    fc = first_cause(a)
    if fc is None:
        return None
    s = a.s
    if fc.cls == "unexplained" or (fc.window_frac is None and not fc.robust
                                   and "unexplained" in {o.cls for o in a.ordered}):
        # what no clock explains is the largest cause, or could hold a larger one than
        # the first: the escalation round takes it
        return _unexplained(a)
    others = [o for o in a.ordered if o.cls != fc.cls]
    # a pair the counters cannot tell apart is settled by the run state where it split
    # the ledger; otherwise it puts the first class in doubt, as before
    fired = {o.cls for o in a.ordered}
    for x, y, trace, why in AMBIGUOUS:
        if fc.cls in (x, y) and x in fired and y in fired:
            if s.ledger_run_state and frozenset((x, y)) in SETTLED_BY_RUN_STATE:
                continue
            ox, oy = a.outcomes[x], a.outcomes[y]
            if abs(ox.score - oy.score) < _v("dominance_margin"):
                return _conflict_verdict(a, (x, y, trace, why))
    # beside it: the strongest other class past threshold, but not one the run state
    # measured small in the ledger (a second class the time did not go to)
    small = _v("ledger_second_min_share")
    eligible = [o for o in others if not (s.ledger_run_state and o.cls in MEASURED_BY_RUN_STATE
                                          and _ledger_share(fc, o) < small)]
    second = [o for o in eligible if o.cls != "unexplained"][:1] or [
        o for o in eligible if o.cls == "unexplained"][:1]
    own = a.outcomes.get(fc.cls)
    backed = own is not None and own.fired
    modifiers = tuple(c for c in a.modifiers if c != fc.cls)
    notes = _ledger_notes(a, fc, modifiers, fired)
    # the time is the server's clocks', but neither the run state nor the rules that
    # would say what its threads did measured it: named, inconclusive, with the traces
    core = a.t.core_gpu if a.gpu_mode else a.t.core_cpu
    blind = [c for c in core if c in a.outcomes and not a.outcomes[c].assessable
             and c != "unexplained"]
    unmeasured = bool(blind) and not s.ledger_run_state and all(
        c.endswith(":running") and not c.startswith("stall:") for c, x in fc.causes if x)
    if unmeasured:
        notes.append(f"{fc.words()}, but what the server's threads did meanwhile is not "
                     "measured: " + ", ".join(blind))
    # the ledger's row, its resource rule's (met or not), the classes past threshold,
    # then every other rule's assessed rows: why nothing else was named
    shown = [*([own] if own is not None else []), *(o for o in a.ordered if o.cls != fc.cls),
             *(a.outcomes[c] for c in modifiers)]
    rest = [o for o in a.outcomes.values() if o.assessable and all(o is not x for x in shown)]
    # a stall first by the window: its rule's window row is the lead's evidence
    evidence = [*(() if fc.window_frac is not None else (_ledger_row(fc),)),
                *_evidence(shown + rest)]
    named = {fc.cls, *(o.cls for o in second)}
    also = tuple(o.cls for o in others if o.cls not in named)
    confidence = (round_sig(max(_v("confidence_floor"), _class_confidence(own) * a.penalty))
                  if fc.window_frac is not None and own is not None
                  else _ledger_confidence(fc, backed, a.penalty))
    if fc.window_frac is not None:
        notes.append(_stall_lead_note(fc))
    return Verdict(
        classes=(fc.cls, *(o.cls for o in second)),
        evidence=tuple(evidence),
        confidence=(min(_v("confidence_conflict_max"), confidence) if unmeasured
                    else confidence),
        inconclusive=unmeasured,
        finer_trace=_in_question(a.unassessed, s) if a.missing_any else (),
        missing_signals=a.missing_text,
        modifiers=modifiers,
        also_flagged=also,
        notes=(*notes, *_second_slot_notes([*second, *others]),
               *((_unexplained_note(s),) if "unexplained" in fired else ())),
        weights=_weights(s, (fc.cls, *(o.cls for o in second))),
        lead=fc.words(),
    )


def _stall_lead_note(fc: FirstCause) -> str:
    """Why a stall leads that the metric's ledger ranks lower: the ledger's own largest
    cause, beside it."""
    top = next(((c, x) for c, x in fc.by_class if c != "server_stalled"), None)
    largest = f"; the ledger's largest cause of {fc.metric}: {top[0]}, {top[1]:.0%}" if top else ""
    return (f"server_stalled first: the server did nothing for {fc.window_frac:.0%} of the "
            "window while requests were in flight (server_stalled_window_lead), whatever "
            f"share of {fc.metric} it shows in ({fc.share:.0%}){largest}")


def _ledger_notes(a: _Assessed, fc: FirstCause, modifiers: tuple[str, ...],
                  fired: set[str]) -> list[str]:
    """What a ledger-led verdict says beside its classes: a client set beside, a pair the
    run state settled, a ledger no run state split, the processes that held the CPUs."""
    s = a.s
    notes = list(a.notes)
    if CLIENT in modifiers:
        notes.append("client_bound beside it, not first: the client's own time is not the "
                     "largest cause of the metric in the ledger")
    for x, y, _, why in AMBIGUOUS:
        if (s.ledger_run_state and frozenset((x, y)) in SETTLED_BY_RUN_STATE
                and fc.cls in (x, y) and x in fired and y in fired):
            notes.append(f"{x} and {y} both past threshold ({why}): the run-state grid "
                         f"settles it, {fc.words()}")
    if not s.ledger_run_state:
        notes.append("no run-state samples: the server's clocks are not split by what its "
                     "threads did (its time is the strongest resource past threshold, else "
                     "its compute)")
    if fc.cls == "cpu_contention":
        notes += _actors(s)
    return notes


def _actors(s: WindowSignals) -> list[str]:
    """The other processes that held the CPUs (``other_processes``, where observed)."""
    procs = getattr(s, "other_processes", None) or ()
    if not procs:
        return []
    tail = "".join(f"; {w}" for w in (named_share_words(s), process_starts_words(s)) if w)
    return ["other processes on the CPUs: " + ", ".join(
        f"PID {pid} `{cmd}` {cores:.2g} cores{' (Strata)' if own else ''}"
        for pid, cmd, cores, own in procs) + tail]


def _unexplained(a: _Assessed) -> Verdict:
    """Part of the metric went where no clock or state looks: the escalation round takes
    it, and the verdict is inconclusive."""
    present = [o for o in a.ordered if o.cls == "unexplained"]
    return Verdict(
        classes=("unexplained",),
        evidence=_evidence(present + [o for o in a.ordered if o.cls != "unexplained"]
                           + [a.outcomes[c] for c in a.modifiers]),
        confidence=round_sig(min(_v("confidence_conflict_max"),
                                 _v("confidence_conflict_max") * a.penalty)),
        inconclusive=True,
        finer_trace=(TRACE_LEDGER, *_in_question(a.unassessed, a.s)),
        missing_signals=a.missing_text,
        modifiers=a.modifiers,
        also_flagged=tuple(o.cls for o in a.ordered if o.cls != "unexplained"),
        notes=(*a.notes, _unexplained_note(a.s)),
        weights=_weights(a.s, ("unexplained",)),
    )


# --- without a ledger: the classes past threshold, ranked ------------------------------


def _rule_led(a: _Assessed) -> Verdict:
    """No ledger by cause (an idle baseline, a window of no request): the classes past
    threshold by rank; none past it is a clear window, said with what was measured."""
    s, ordered, outcomes = a.s, a.ordered, a.outcomes
    if ordered:
        conflict = next(_close_pairs(ordered, ordered[0].cls), None)
        if conflict is not None:
            return _conflict_verdict(a, conflict)
    if [o.cls for o in ordered] == ["unexplained"]:
        return _unexplained(a)
    if ordered:
        names_fired = {o.cls for o in ordered}
        top = ordered[:2]
        notes = a.notes + ((f"{CLIENT} beside them, not first: the load generator fell "
                            "behind, the classes past threshold are the server's",)
                           if CLIENT in a.modifiers else ())
        conf = max(_class_confidence(o) for o in top[:1]) * a.penalty
        return Verdict(
            classes=tuple(o.cls for o in top),
            evidence=_evidence(ordered + [outcomes[c] for c in a.modifiers]),
            confidence=round_sig(max(_v("confidence_floor"), conf)),
            inconclusive=False,
            finer_trace=_in_question(a.unassessed, s) if a.missing_any else (),
            missing_signals=a.missing_text,
            modifiers=a.modifiers,
            also_flagged=tuple(o.cls for o in ordered[2:]),
            notes=(*notes, *_second_slot_notes(ordered),
                   *((_unexplained_note(s),) if "unexplained" in names_fired else ())),
            weights=_weights(s, tuple(o.cls for o in ordered)),
        )
    if a.modifiers:  # a modifier alone (throttled GPUs, a late client) is named
        mod = outcomes[a.modifiers[0]]
        return Verdict(
            classes=a.modifiers,
            evidence=_evidence([mod]),
            confidence=round_sig(_class_confidence(mod) * a.penalty),
            inconclusive=False,
            # a late client alone: what it left unmeasured is still in question
            finer_trace=(_in_question(a.unassessed, s) if mod.cls == CLIENT and a.missing_any
                         else ()),
            missing_signals=a.missing_text,
            modifiers=(),
            notes=a.notes,
        )
    core = a.t.core_gpu if a.gpu_mode else a.t.core_cpu
    blind = [c for c in core if c in outcomes and not outcomes[c].assessable]
    if blind:
        traces = tuple(sorted({outcomes[c].trace for c in blind if outcomes[c].trace}))
        return Verdict(
            classes=(),
            evidence=_evidence(list(outcomes.values())),
            confidence=0.0,
            inconclusive=True,
            finer_trace=traces,
            missing_signals=a.missing_text,
            notes=(*a.notes, "nothing past threshold, but not measured: " + ", ".join(blind)),
        )
    clear = [o for o in outcomes.values() if o.assessable and o.evidence]
    conf = (_v("confidence_at_threshold") + _v("confidence_span") * _clear_margin(clear)
            ) * a.penalty
    return Verdict(
        classes=(),
        evidence=_evidence(clear),
        confidence=round_sig(conf),
        inconclusive=False,
        finer_trace=_in_question(a.unassessed, s),
        missing_signals=a.missing_text,
        notes=(*a.notes, "no rule had all its conditions met, and no time ledger names "
               "where the time went", *_closed_note(s)),
        weights=_weights(s, ()),
    )


# --- beside the first class: spare capacity, and rules resting on too few samples --------


def spare_capacity(s: WindowSignals, gpu_mode: bool) -> tuple[str, float | None]:
    """(words, spare cores): the idle share of what the server may use. CPUs: its run
    cores (the run-state grid where sampled, else its proc CPU) and other processes'
    CPU on the same CPUs, against its allowance (else the host's cores); GPUs: NVML
    utilization. ("", None) where unmeasured."""
    if gpu_mode and s.gpu_util is not None:
        n = f" of {s.n_gpus} GPUs" if s.n_gpus else ""
        return (f"GPUs busy {s.gpu_util:.0%} of the window; spare {1 - s.gpu_util:.0%}{n}"
                "' time (NVML utilization)", None)
    used = getattr(s, "server_run_cores", None)
    src = "run-state grid"
    if used is None:
        used = s.ledger_run_cores
    if used is None:
        used, src = s.server_cpu_cores, "proc samples"
    allowed, noun, by = _allowed_cpus(s)
    if used is None or allowed is None:
        return "", None
    # what other processes held of the same CPUs is not spare either
    others = getattr(s, "allowed_cpus_other_cores", None)
    if others is None and noun == "host":
        frac = _others_cores_frac(s)
        others = None if frac is None else frac * allowed
    spare = max(0.0, allowed - used - (others or 0.0))
    why = "; ".join(x for x in (by, src) if x)
    held = f", other processes {others:.3g}" if others is not None and others >= 0.005 else ""
    return (f"on {used:.3g} of {allowed:.3g} {noun} cores ({why}){held}; spare {spare:.3g} "
            "cores", round(spare, 4))


def _sparse_notes(a: _Assessed) -> tuple[str, ...]:
    """The rules that rest on a collector with fewer than ``rule_min_samples`` samples in
    the window: said, not left to fail silently."""
    counts = dict(a.s.collector_samples)
    if not counts:
        return ()
    least = _v("rule_min_samples")
    by_rule = {r.cls: r for r in a.t.rules}
    rules: list[str] = []
    thin: set[str] = set()
    for cls, o in a.outcomes.items():
        rule = by_rule.get(cls)
        if rule is None or not o.assessable:
            continue
        few = {src.split(":", 1)[0] for _, src in rule.signals
               if counts.get(src.split(":", 1)[0], least) < least}
        if few:
            rules.append(cls)
            thin |= few
    if not rules:
        return ()
    what = ", ".join(f"{c} {counts[c]}" for c in sorted(thin))
    return (f"too few samples in the {a.s.duration_s:.3g} s window ({what}; fewer than "
            f"{least:.0f}) to support {', '.join(rules)}: their rows rest on them",)


def _with_capacity(v: Verdict, a: _Assessed) -> Verdict:
    words, spare = spare_capacity(a.s, a.gpu_mode)
    lead = f"{v.lead}, {words}" if v.lead and words else v.lead
    return replace(v, lead=lead, spare=words, spare_cores=spare,
                   notes=(*v.notes, *_sparse_notes(a)))


# --- ranking and confidence --------------------------------------------------------------


def _in_question(unassessed: list[Outcome], s: WindowSignals) -> tuple[str, ...]:
    """Finer traces for the unassessed classes that could matter in this window: a
    one-node run serves over loopback, so no network class is in question there."""
    return tuple(sorted({
        o.trace for o in unassessed
        if o.trace and not (o.cls == "network" and not s.multi_node)
    }))


def _rank(fired: list[Outcome]) -> list[Outcome]:
    """The order classes are named in: a resource, a serving symptom, the rest.

    The strongest resource class (what the hardware waited on), then the strongest
    serving symptom (what a user of the server saw), so a queue or a full KV cache is
    not pushed out by a second resource class; then the rest, by kind and score;
    ``unexplained`` (what no clock explains) last, since any class that fired explains
    part of it. A client that fell behind is not ranked: it is a modifier (first only
    where the ledger's largest cause is the client's own time). Score ties break by
    ``CLASSES`` order. A class past threshold in the idle baseline too ranks as any
    other (:func:`with_background`).
    """
    t = active()
    ranked = sorted(fired, key=lambda o: (-o.score, t.classes.index(o.cls)))
    resource = [o for o in ranked if o.cls not in t.serving]
    serving = [o for o in ranked if o.cls in t.serving and o.cls not in LAST]
    last = [o for o in ranked if o.cls == "unexplained"]
    return resource[:1] + serving[:1] + resource[1:] + serving[1:] + last


def _close_pairs(ordered: list[Outcome], cls: str):
    """AMBIGUOUS pairs of ``cls`` with another fired class it does not lead by the margin."""
    names = {o.cls: o for o in ordered}
    dominance = _v("dominance_margin")
    for a, b, trace, why in AMBIGUOUS:
        if cls in (a, b) and a in names and b in names:
            if abs(names[a].score - names[b].score) < dominance:
                yield a, b, trace, why


def _second_slot_notes(ordered: list[Outcome]) -> list[str]:
    if len(ordered) < 2:
        return []
    return [
        f"{ordered[1].cls} could equally be {b if a == ordered[1].cls else a}: {why} ({trace})"
        for a, b, trace, why in _close_pairs(ordered, ordered[1].cls)
    ]


def _class_confidence(o: Outcome) -> float:
    """``confidence_at_threshold`` at the threshold, ``confidence_span`` more far past
    it; ``confidence_agreement`` more when two signals agree."""
    met = sum(1 for e in o.evidence if e.met)
    return min(1.0, _v("confidence_at_threshold") + _v("confidence_span") * o.score
               + (_v("confidence_agreement") if met >= 2 else 0.0))


def _clear_margin(clear: list[Outcome]) -> float:
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


#: Classes ranked apart: the ledger's residual last (the client is a modifier).
LAST = ("unexplained",)
CLIENT = "client_bound"


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

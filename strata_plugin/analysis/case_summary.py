"""One case, analysed: request metrics, hardware summary, energy, verdict.

``summarize_case`` is what the plugin calls at a case's teardown (from the files on
disk so far); ``write_report`` calls ``analyze_run`` for every case at the end. Both go
through the same :func:`analyze_case`, so a case's verdict at teardown and in the
report agree when the inputs do.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from strata_plugin.analysis import engine_clocks, interference, rails, roofline, run_states
from strata_plugin.analysis.clocks import node_clocks
from strata_plugin.analysis.engine_case import EngineCase, case_engines, engine_case, server_rows
from strata_plugin.analysis.failures import failed_verdict, mostly_failed
from strata_plugin.analysis.ledger import CaseLedger, case_ledger, server_clocks
from strata_plugin.analysis.metrics import (
    HEADLINE_STATS,
    CaseMetrics,
    case_metrics,
    headline,
)
from strata_plugin.analysis.rules import Evidence, Verdict, WindowSignals, classify
from strata_plugin.analysis.rules.registry import active as active_rules
from strata_plugin.analysis.rules.verdict import with_background
from strata_plugin.analysis.run_folder import CaseInfo, RunBundle, load_bundle
from strata_plugin.analysis.signals import (
    GPU_SOURCES,
    HwView,
    RequestFacts,
    build_signals,
    server_node,
)
from strata_plugin.analysis.sufficiency import (
    PER_REQUEST_DISTRIBUTIONS,
    percentile_of_stat,
    supported,
)
from strata_plugin.analysis.thresholds import value as threshold_value
from strata_plugin.analysis.timeline import (
    HwStat,
    SampleStore,
    Window,
    load_samples,
    summarize_window,
)
from strata_plugin.entry_points import collector_names
from strata_plugin.formats.cases import CaseLine
from strata_plugin.formats.printable import printable
from strata_plugin.formats.records import RequestRecord
from strata_plugin.formats.request_path import Engine
from strata_plugin.formats.telemetry import TelemetryFacts, engine_reports_gpu


@dataclass(frozen=True)
class Energy:
    """GPU energy over a case's measured window, from NVML's energy counter."""

    joules: float
    n_gpus: int
    j_per_output_token: float | None
    j_per_request: float | None
    min_coverage: float  # the least-covered GPU's share of the window


@dataclass(frozen=True)
class CaseAnalysis:
    """Everything the report says about one case. (``case.CaseResult`` is the live
    runner's result; this is the analysis of the files.)"""

    case_id: str
    name: str
    config_id: str
    params: dict[str, Any]
    window: Window | None
    metrics: CaseMetrics
    headline: dict[str, float | int | str]
    hw: tuple[HwStat, ...]
    signals: WindowSignals
    verdict: Verdict
    energy: Energy | None
    info: CaseLine  # the cases.jsonl line (the case id alone until it is written)
    rails: rails.RailsReport | None = None  # rail, link and GPU-peer findings (None: no window)
    interference: interference.Interference | None = None  # decode stalls against prefills
    ledger: CaseLedger | None = None  # where each request's time went (analysis/ledger.py)
    #: the case against its device's roofline (analysis/roofline.py); None: no facts recorded
    roofline: roofline.CaseRoofline | None = None
    #: ``info`` once the line is written; None until then
    line: CaseLine | None = None
    #: why the case did not run to its end ("" when it did): its numbers are labelled
    #: partial and are never a headline (report.md, summary.json, the CI files)
    partial: str = ""
    #: where the path ends at several engines: each one's line, the requests it served
    #: and their pace (analysis/engine_case.py); None for one engine
    engines: EngineCase | None = None

    def hw_headline(self) -> dict[str, float]:
        """The hardware at a glance, where measured: host CPU busy and server CPU (cores),
        GPU utilization (%), summed GPU power (W), throttled share, RDMA GB/s."""
        s = self.signals
        out: dict[str, float] = {}
        for key, v, scale in (
            ("hw_cpu_busy_cores", s.host_busy_cores, 1.0),
            ("hw_server_cpu_cores", s.server_cpu_cores, 1.0),
            ("hw_gpu_util_pct", s.gpu_util, 100.0),
            ("hw_throttle_frac", s.throttle_frac, 1.0),
        ):
            if v is not None:
                out[key] = round(v * scale, 4)
        power: dict[tuple[str, str], float] = {}
        for r in sorted(self.hw, key=lambda r: r.source != "nvml"):  # NVML first, then DCGM
            if r.source in GPU_SOURCES and r.metric == "power_w" and r.mean is not None:
                power.setdefault((r.node, r.device), r.mean)
        if power:
            out["hw_gpu_power_w"] = round(sum(power.values()), 2)
        rdma = [r.rate for r in self.hw if r.source == "rdma" and r.rate is not None
                and r.metric in ("xmit_bytes", "rcv_bytes")]
        if rdma:
            out["hw_rdma_gb_s"] = round(sum(rdma) / 1e9, 4)
        return out

    def headline_support(self) -> dict[str, int]:
        """``<dist>_<pXX>_ms_supported``: 1 where the requests behind that headline
        percentile support it (analysis/sufficiency.py), 0 where they are too few."""
        out: dict[str, int] = {}
        for dist in PER_REQUEST_DISTRIBUTIONS:
            d = getattr(self.metrics, dist)
            for stat in HEADLINE_STATS:
                q = percentile_of_stat(stat)
                key = f"{dist}_{stat}_ms"
                if q is not None and d.n and key in self.headline:
                    out[f"{key}_supported"] = int(supported(d.n, q))
        return out

    def user_properties(self) -> list[tuple[str, float | int | str]]:
        """Plain scalars for the test's JUnit properties, sorted by name."""
        v = self.verdict
        props: dict[str, float | int | str] = dict(self.headline)
        props["verdict"] = v.summary() or "none"
        props["verdict_confidence"] = v.confidence
        props["verdict_inconclusive"] = int(v.inconclusive)
        for i, cls in enumerate(v.classes[:2], 1):
            props[f"bottleneck_{i}"] = cls
        if v.lead:  # where the metric's time went, the spare capacity beside it
            props["verdict_lead"] = v.lead
        if v.spare:
            props["spare_capacity"] = v.spare
        if v.spare_cores is not None:
            props["spare_cores"] = v.spare_cores
        if v.finer_trace:
            props["finer_trace"] = " | ".join(v.finer_trace)
        led = self.ledger
        if led is not None and led.n and led.residual_frac() is not None:
            props["ledger_metric"] = led.metric
            props["ledger_residual_frac"] = round(led.residual_frac() or 0.0, 4)
            props["ledger_closes"] = int((led.residual_frac() or 0.0)
                                         < threshold_value("ledger_residual_max"))
        head = self.roofline.headline if self.roofline is not None else None
        if head is not None and head.share is not None:
            props.update(roofline_phase=head.phase, roofline_roof=head.roof,
                         roofline_share=round(head.share, 4))
        props.update(self.hw_headline())
        props.update(self.headline_support())
        if self.energy is not None:
            props["energy_j"] = self.energy.joules
            if self.energy.j_per_output_token is not None:
                props["energy_j_per_output_token"] = self.energy.j_per_output_token
        return sorted(props.items())


def _energy(hw: Sequence[HwStat], cm: CaseMetrics) -> Energy | None:
    rows = [
        r for r in hw if r.source in GPU_SOURCES and r.metric == "energy_mj" and r.delta is not None
    ]
    seen: dict[tuple[str, str], HwStat] = {}
    for r in sorted(rows, key=lambda r: GPU_SOURCES.index(r.source)):
        seen.setdefault((r.node, r.device), r)
    if not seen:
        return None
    joules = sum(r.delta or 0.0 for r in seen.values()) / 1000.0  # every delta is set
    out_tokens = cm.total_output_tokens
    return Energy(
        joules=joules,
        n_gpus=len(seen),
        j_per_output_token=joules / out_tokens if out_tokens else None,
        j_per_request=joules / cm.n_ok if cm.n_ok else None,
        min_coverage=min(r.coverage for r in seen.values()),
    )


def _mono_window(bundle: RunBundle, case_id: str, window: Window | None) -> tuple[int, int] | None:
    """The measured window on the monotonic clock, for throughput denominators."""
    mono = bundle.case_info(case_id).line.window_mono_ns
    if mono is not None:
        return mono
    a = bundle.anchor
    if window is not None and a is not None:
        return window.start_ns - a.wall_ns + a.mono_ns, window.end_ns - a.wall_ns + a.mono_ns
    return None


def _window_mono(rec: RequestRecord) -> tuple[int, int]:
    """A request's span as ``metrics.RequestMetrics`` defines it (start_ns, end_ns):
    dispatch to the last token-bearing event, else done, else first byte. Computed here
    without the full per-request metrics, which cost ~20x more and are not needed.
    """
    ends = [e.t_ns for e in rec.events if e.n_tokens > 0]
    end_candidates = [
        x for x in (max(ends) if ends else None, rec.done_ns, rec.first_byte_ns) if x is not None
    ]
    return rec.dispatched_ns, max(end_candidates, default=rec.dispatched_ns)


def request_intervals(bundle: RunBundle, case_id: str) -> tuple[tuple[int, int], ...]:
    """(start, end) on the harness wall clock of each measured request of a case."""
    measured = [r for r in bundle.records.get(case_id, []) if r.phase == "measured"]
    a = bundle.anchor
    if a is not None:
        return tuple(
            (a.to_wall_ns(s), a.to_wall_ns(e)) for s, e in (_window_mono(r) for r in measured)
        )
    # No anchor: the request markers are on the wall clock already.
    ids = {r.request_id for r in measured}
    return tuple(
        (m.start_wall_ns, m.end_wall_ns)
        for m in bundle.markers
        if m.kind == "request" and m.name in ids
    )


def request_facts(
    bundle: RunBundle, case_id: str, records: Sequence[RequestRecord], cm: CaseMetrics
) -> RequestFacts:
    info = bundle.case_info(case_id)
    intervals = request_intervals(bundle, case_id)
    conc = info.params.get("concurrency")
    return RequestFacts(
        intervals_wall=intervals,
        chunk_gap_p50=cm.chunk_gap.p50,
        chunk_gap_p99=cm.chunk_gap.p99,
        n_chunk_gaps=cm.chunk_gap.n,
        tpot_p50=cm.tpot.p50,
        server_queue_frac=None,  # the time ledger's (ledger_of)
        concurrency=int(conc) if isinstance(conc, (int, float)) else None,
        client_bound=info.client_bound,
        client_lateness_p99_ms=info.self_check("dispatch_lateness_p99_ms"),
        client_cpu_fraction=info.self_check("client_cpu_cores"),
    )


@dataclass(frozen=True)
class RunContext:
    """Run-wide facts every case's signals need."""

    gpu_present: bool
    gpu_expected: bool
    multi_node: bool
    unavailable: tuple[tuple[str, str], ...]
    #: (node, iface) -> bytes/s per direction, from the profile's telemetry.link_caps
    link_caps: dict[tuple[str, str], float] = field(default_factory=dict)
    expect_rdma: bool = False  # the profile samples rdma or sets NCCL_IB_HCA
    #: each configuration's model facts and device limits (analysis/roofline.py)
    roofline: dict[str, roofline.RooflineInputs] = field(default_factory=dict)


def run_context(bundle: RunBundle, store: SampleStore) -> RunContext:
    sources = store.sources()
    nodes_with_samples = {n for n, _ in sources}
    unavailable = tuple(
        (f"{node}/{col}", why)
        for node in sorted(store.unavailable)
        for col, why in sorted(store.unavailable[node].items())
    )
    facts = TelemetryFacts.from_manifest(bundle.manifest)
    gpu_present = any(s in GPU_SOURCES for _, s in sources)
    gpu_expected = facts.gpu_expected or engine_reports_gpu(bundle.run_dir) is not None
    return RunContext(
        gpu_present=gpu_present,
        gpu_expected=gpu_expected,
        multi_node=len(nodes_with_samples) > 1,
        unavailable=unavailable,
        link_caps=facts.link_caps(),
        expect_rdma=facts.expects_rdma,
        roofline=roofline.run_inputs(bundle.manifest, bundle.run_dir,
                                     gpu_run=gpu_present or gpu_expected),
    )


def metrics_for(bundle: RunBundle, case_id: str) -> CaseMetrics:
    """``metrics.case_metrics`` of a case over its measured window (monotonic clock)."""
    window = bundle.case_windows().get(case_id)
    records = bundle.records.get(case_id, [])
    return case_metrics(records, window_ns=_mono_window(bundle, case_id, window))


def recorded_verdict(d: dict[str, Any] | None) -> Verdict | None:
    """The verdict computed at the end of the case (``cases.jsonl`` ``verdict``), if any."""
    if not isinstance(d, dict):
        return None
    try:
        ev = tuple(Evidence(**e) for e in d.get("evidence", ()))
        tuples = {k: tuple(v) for k, v in d.items() if isinstance(v, list) and k != "evidence"}
        if "weights" in tuples:
            tuples["weights"] = tuple(tuple(w) for w in tuples["weights"])
        return Verdict(**{**d, **tuples, "evidence": ev})
    except TypeError:  # written by another version: recompute
        return None


def the_verdict(
    recorded: dict[str, Any] | None,
    sig: WindowSignals,
    inter: interference.Interference | None = None,
    background: frozenset[str] = frozenset(),
) -> Verdict:
    """One verdict per case: the one recorded at the case's end, else computed now.

    Recomputing later could differ (samples written after the case ended, an A/B
    control that ran in a later test); the recorded one is what JUnit reported, so it
    stands, with a note when the files now say otherwise.
    """
    fresh = classify(sig, background)
    if inter is not None and "prefill_decode_interference" in fresh.classes + fresh.also_flagged:
        fresh = replace(fresh, notes=(*fresh.notes, f"interference: {inter.line()}"))
    kept = recorded_verdict(recorded)
    if kept is None:
        return fresh
    if kept.summary() != fresh.summary():
        note = (f"recomputed from the files now: {fresh.summary() or 'no class'} (the "
                "verdict above was computed at the end of the case and is the one reported)")
        kept = replace(kept, notes=(*kept.notes, note))
    return kept


def control_cases(bundle: RunBundle, case_id: str) -> tuple[str, ...]:
    """The reference arm's cases of this case's A/B group; () for a reference or no group."""
    info = bundle.case_info(case_id)
    if not info.ab_group:
        return ()
    arms: dict[str, list[str]] = {}
    for cid in bundle.case_ids():
        other = bundle.case_info(cid)
        if other.ab_group == info.ab_group:
            arms.setdefault(other.ab_arm or cid, []).append(cid)
    ref = min(arms, key=lambda a: (a != "control", a))  # as analysis/ab_groups.py orders
    return () if case_id in arms[ref] else tuple(arms[ref])


def interference_of(bundle: RunBundle, case_id: str) -> interference.Interference:
    return interference.analyze(case_id, bundle.records.get(case_id, []))


def interference_signals(
    bundle: RunBundle, case_id: str, inter: interference.Interference, cm: CaseMetrics
) -> dict[str, Any]:
    """The classifier's interference inputs (WindowSignals fields, floats or None); a
    treatment's against its A/B control."""
    refs = [c for c in control_cases(bundle, case_id) if bundle.records.get(c)]
    return interference.signals(
        inter,
        [interference_of(bundle, c) for c in refs],
        cm.tpot.p95,
        [p for c in refs if (p := metrics_for(bundle, c).tpot.p95) is not None],
    )


def baseline_window(bundle: RunBundle, case_id: str) -> Window | None:
    """The idle baseline held before this case's server block: the last one of its
    configuration that started before the case."""
    case = bundle.case_windows().get(case_id)
    config = bundle.case_info(case_id).config_id
    found = [
        w
        for w in bundle.windows()
        if w.kind == "baseline"
        and (not config or w.name == f"baseline:{config}")
        and (case is None or w.start_ns <= case.start_ns)
    ]
    return max(found, key=lambda w: w.start_ns) if found else None


def background_classes(ctx: RunContext, window: Window, hw: Sequence[HwStat]) -> set[str]:
    """Classes already past threshold in the idle baseline (no requests: host classes)."""
    sig = _signals(ctx, window.name, window, hw, requests=None, link_caps=ctx.link_caps,
                   expect_rdma=ctx.expect_rdma)
    return set(classify(sig).past_threshold) - {"headroom"}


def _signals(ctx: RunContext, name: str, window: Window, hw: Sequence[HwStat],
             **kw: Any) -> WindowSignals:
    """The classifier's inputs for one window of this run (the case's or its baseline)."""
    return build_signals(
        window=name,
        duration_s=window.duration_s,
        start_ns=window.start_ns,
        end_ns=window.end_ns,
        hw=hw,
        gpu_present=ctx.gpu_present,
        gpu_expected=ctx.gpu_expected,
        multi_node=ctx.multi_node,
        unavailable=ctx.unavailable,
        **kw,
    )


def ledger_of(
    bundle: RunBundle,
    case_id: str,
    hw: Sequence[HwStat],
    cm: CaseMetrics,
    sig: WindowSignals,
    store: SampleStore | None,
    window: Window | None,
) -> CaseLedger:
    """The case's time ledger: its records, the engine's queue/prefill clocks (or the
    waiting count), and the server's run state where the agent sampled it."""
    info = bundle.case_info(case_id)
    states = None
    if store is not None and window is not None:
        states = run_states.from_store(store, window.start_ns, window.end_ns,
                                       node=_server_node(hw))
    return case_ledger(
        case_id, info.name, info.params, bundle.records.get(case_id, []),
        clocks=server_clocks(hw, sig.waiting_mean, cm.n_requests, cm.window_s),
        states=states, anchor=bundle.anchor,
        clock_error_ms=info.self_check("timing_error_bound_ms"),
        window_ns=(window.start_ns, window.end_ns) if window is not None else None,
        client_late=bool(info.self_check("client_bound")),
        client_lag_max_ms=info.self_check("loop_lag_max_ms"),
    )


def collector_samples(hw: Sequence[HwStat]) -> tuple[tuple[str, int], ...]:
    """(collector, samples in the window) on the server's node: the most of any of its
    series (a rule resting on fewer than ``rule_min_samples`` is said so)."""
    node = _server_node(hw)
    out: dict[str, int] = {}
    for r in hw:
        if node is None or r.node == node:
            out[r.source] = max(out.get(r.source, 0), int(r.n))
    return tuple(sorted(out.items()))


def _server_node(hw: Sequence[HwStat]) -> str | None:
    return server_node(HwView(hw))


def _engine_case(bundle: RunBundle, store: SampleStore | None, case_id: str,
                 hw: Sequence[HwStat], engines: Sequence[Engine]
                 ) -> tuple[EngineCase | None, str]:
    """The case's engines (analysis/engine_case.py), or None and why they were not
    analysed: the engines' evidence is one part of the verdict, and a failure in it
    must cost that part only, never the case's analysis and with it the report."""
    try:
        return engine_case(bundle, store, case_id, hw, engines), ""
    except Exception as exc:  # any failure costs this part alone, and is said
        return None, (f"engines: each engine's own evidence not analysed "
                      f"({type(exc).__name__}: {printable(str(exc))[:200]})")


def analyze_case(
    bundle: RunBundle,
    ctx: RunContext,
    case_id: str,
    hw: Sequence[HwStat],
    cm: CaseMetrics | None = None,
    baseline: tuple[Window, Sequence[HwStat]] | None = None,
    store: SampleStore | None = None,
) -> CaseAnalysis:
    """One case from its hardware rows; ``cm`` when the case metrics are already known;
    ``baseline`` (its window and rows) marks which classes were there before the load;
    ``store`` (the run's samples) gives the time ledger the server's run state."""
    info = bundle.case_info(case_id)
    window = bundle.case_windows().get(case_id)
    records = bundle.records.get(case_id, [])
    cm = cm if cm is not None else metrics_for(bundle, case_id)
    lost = agents_lost(bundle.manifest, case_id)
    if lost:  # every signal of that node is named after the lost agent, not "no samples"
        ctx = replace(ctx, unavailable=ctx.unavailable + tuple(
            (f"{node}/{col}", why) for node, why in lost for col in collector_names()))
    facts = request_facts(bundle, case_id, records, cm)
    rep = None
    engines = case_engines(bundle.manifest, info.config_id)
    several, engines_failed = None, ""
    if window is not None:
        rep = rails.analyze(
            hw, window=case_id, link_caps=ctx.link_caps, expect_rdma=ctx.expect_rdma
        )
        # several engines: the server's cgroup rows are the first engine's alone, so
        # the rules read each engine's own instead (analysis/engine_case.py)
        sig = _signals(ctx, case_id, window, server_rows(hw, engines), requests=facts,
                       rails_report=rep)
        several, engines_failed = _engine_case(bundle, store, case_id, hw, engines)
        if several is not None:
            sig = replace(sig, engines=several.facts())
    else:  # no marker yet: no window to slice, so no hardware signal at all
        sig = active_rules().signals_class(
            window=case_id,
            duration_s=0.0,
            gpu_present=ctx.gpu_present,
            gpu_expected=ctx.gpu_expected,
            multi_node=ctx.multi_node,
            unavailable=ctx.unavailable,
        )
    ledger = ledger_of(bundle, case_id, hw, cm, sig, store, window)
    # the stalls are the server's: the gaps the ledger put down to delivery are not
    inter = interference.analyze(case_id, records, delivered=ledger.delivered_gaps())
    if window is not None:
        sig = replace(sig, **interference_signals(bundle, case_id, inter, cm))
    sig = replace(sig, **ledger.signals(), collector_samples=collector_samples(hw))
    idle: frozenset[str] = frozenset()
    if baseline is not None and baseline[1]:
        idle = frozenset(background_classes(ctx, baseline[0],
                                            server_rows(baseline[1], engines)))
    # Failures first: a case whose requests mostly failed is named for that, never for a
    # resource (analysis/failures.py); the rules are not consulted.
    failed = mostly_failed(records)
    verdict = failed_verdict(failed) if failed else the_verdict(info.line.verdict, sig, inter, idle)
    if idle and not failed:  # a recorded verdict: its baseline's classes said all the same
        verdict = with_background(verdict, sig, idle)
    if "server_stalled" in verdict.past_threshold:
        verdict = replace(verdict, notes=(*verdict.notes, ledger.stall_line()))
    if ("outside_server" in verdict.past_threshold and ledger.delivery is not None
            and ledger.delivery.n_delayed and ledger.delivery.line() not in verdict.notes):
        verdict = replace(verdict, notes=(*verdict.notes, ledger.delivery.line()))
    if lost:
        verdict = replace(verdict, notes=verdict.notes + tuple(
            f"{why}: this node's signals are missing or cover part of the window"
            for _, why in lost))
    if engines_failed:
        verdict = replace(verdict, notes=(*verdict.notes, engines_failed))
    if (clocks_left_out := engine_clocks.dropped_line(records)) is not None:
        verdict = replace(verdict, notes=(*verdict.notes, clocks_left_out))
    inp = ctx.roofline.get(info.config_id)
    roof = roofline.case_roofline(inp, records, ledger, hw)
    if inp is not None and inp.limits is not None:  # the roofline as evidence (a note)
        verdict = roofline.annotate(verdict, roof, sig, inp.limits.kind, inp.limits.n_cpus)
    return CaseAnalysis(
        partial=partial_reason(info, window, records),
        case_id=case_id,
        name=info.name,
        config_id=info.config_id,
        params=dict(info.params),
        window=window,
        metrics=cm,
        headline=headline(cm),
        hw=tuple(hw),
        signals=sig,
        verdict=verdict,
        energy=_energy(hw, cm),
        info=info.line,
        line=info.line if info.recorded else None,
        rails=rep,
        interference=inter,
        ledger=ledger,
        roofline=roof,
        engines=several,
    )


def partial_reason(info: CaseInfo, window: Window | None,
                   records: Sequence[RequestRecord]) -> str:
    """Why a case did not run to its end, or "": cut short by an interrupt (its line says
    so), or a run that ended inside it (killed: its measured requests are on disk, but
    neither its measured window nor its cases.jsonl line is)."""
    if info.line.interrupted:
        return "cut short by an interrupt in its measured load"
    if window is None and not info.recorded and any(r.phase == "measured" for r in records):
        return ("the run ended inside this case: no measured window and no cases.jsonl "
                "line, only the requests it had recorded")
    return ""


def agents_lost(manifest: dict[str, Any], case_id: str) -> list[tuple[str, str]]:
    """(node, why) for each sampling agent that was lost during the case (the manifest's
    ``agents_lost``, written by the run when it found an agent gone)."""
    out = []
    for e in manifest.get("agents_lost") or ():
        if isinstance(e, dict) and case_id in (e.get("cases") or ()):
            node = str(e.get("node", "?"))
            out.append((node, f"agent on {node} lost during this case ({e.get('reason', '')})"))
    return out


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC while loading: parsing builds millions of small objects and no cycles,
    and full collections triggered by them cost more than the parse (2-3x on 50k requests).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def load_run(run_dir: Path, case_id: str | None = None, *,
             live: bool = False) -> tuple[RunBundle, SampleStore]:
    bundle = load_bundle(run_dir, case_id, live=live)
    store = load_samples(bundle.run_dir, node_clocks(bundle.manifest))
    return bundle, store


def summarize_case(run_dir: Path, case_id: str) -> CaseAnalysis:
    """The case's metrics, hardware summary and verdict from the files on disk so far.

    Needs ``markers.csv`` with the case's "measured" (or "case") marker for a window;
    ``requests.jsonl`` lines of the case; samples and ``manifest.json`` as far as
    written. The ``cases.jsonl`` line is optional (client self-check, params).
    """
    with gc_paused():
        bundle, store = load_run(Path(run_dir), case_id, live=True)
        if control_cases(bundle, case_id):  # a treatment is judged against its control
            bundle = load_bundle(Path(run_dir), live=True)
        window = bundle.case_windows().get(case_id)
        hw = summarize_window(store, window) if window is not None else []
        base = baseline_window(bundle, case_id)
        baseline = (base, summarize_window(store, base)) if base is not None else None
        return analyze_case(bundle, run_context(bundle, store), case_id, hw,
                            baseline=baseline, store=store)


@dataclass
class RunAnalysis:
    """A run read from disk and analysed: what every derived file is made from."""

    bundle: RunBundle
    store: SampleStore
    windows: list[Window]
    hw_by_window: dict[str, list[HwStat]]
    ctx: RunContext
    analyses: list[CaseAnalysis]


#: Sample files above this size are loaded in a second process while this one parses
#: the requests: the two halves are independent and each takes seconds on a long run.
PARALLEL_MIN_SAMPLE_BYTES = 64 * 2**20


def _samples_and_summaries(
    run_dir: str, manifest: dict[str, Any], windows: list[Window]
) -> tuple[SampleStore, dict[str, list[HwStat]]]:
    from strata_plugin.analysis.timeline import summarize_windows

    with gc_paused():
        store = load_samples(Path(run_dir), node_clocks(manifest))
        return store, summarize_windows(store, windows)


def _several(windows: Sequence[Window], name: str) -> bool:
    """More than one window of that name (repeated baselines of one configuration):
    the summary by name is only the last one's."""
    return sum(1 for w in windows if w.name == name) > 1


def _sample_bytes(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in run_dir.glob("nodes/*/samples/*.csv"))


def analyze_run(run_dir: Path | str, *, parallel: bool | None = None) -> RunAnalysis:
    """Load the raw files, summarize every window, analyse every case.

    ``parallel`` (default: when the sample files exceed 64 MiB and there is a second
    core) loads and summarizes the samples in a spawned process while this one reads
    the requests and computes the case metrics. Same result either way.
    """
    import os

    from strata_plugin.analysis.timeline import load_markers, run_windows
    from strata_plugin.formats.manifest import read_manifest

    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir / "manifest.json")
    windows = run_windows(load_markers(run_dir))
    if parallel is None:
        parallel = (os.cpu_count() or 1) > 1 and _sample_bytes(run_dir) > PARALLEL_MIN_SAMPLE_BYTES
    pool = future = None
    if parallel:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        future = pool.submit(_samples_and_summaries, str(run_dir), manifest, windows)
    try:
        with gc_paused():
            bundle = load_bundle(run_dir)
            cms = {cid: metrics_for(bundle, cid) for cid in bundle.case_ids()}
            if future is not None:
                store, hw_by_window = future.result()
            else:
                store, hw_by_window = _samples_and_summaries(str(run_dir), manifest, windows)
            ctx = run_context(bundle, store)
            analyses = []
            for cid in bundle.case_ids():
                base = baseline_window(bundle, cid)
                baseline = None
                if base is not None:
                    rows = hw_by_window.get(base.name)
                    if rows is None or _several(windows, base.name):
                        rows = summarize_window(store, base)
                    baseline = (base, rows)
                analyses.append(
                    analyze_case(bundle, ctx, cid, hw_by_window.get(cid, []), cms[cid],
                                 baseline=baseline, store=store)
                )
    finally:
        if pool is not None:
            pool.shutdown()
    return RunAnalysis(bundle, store, windows, hw_by_window, ctx, analyses)

"""The verdict decided again, with a trace's evidence beside the window's counters.

Why: the counter rules (``analysis/rules/``) stop at "inconclusive" when two classes
fire together that counters cannot separate (``rules.AMBIGUOUS``). A diagnostic round
captures the trace the verdict named; this module reads the trace's findings as evidence
(the same :class:`rules.Evidence` shape, each comparison with its threshold and source)
and decides the class the trace covers:

* scheduling trace -> ``cpu_contention`` when the server's threads waited runnable for
  at least ``runq_delay_per_cpu_s`` of their run time and other processes held their CPUs
  for at least ``trace_other_share`` of that wait; ``cpu_compute`` when the server's own
  threads were the ones it waited for, or it ran on ``server_cores_of_threads`` of the
  CPUs its threads could use without waiting; neither when it did neither;
* block / fault trace -> ``io_page_faults`` when the kernel read at least
  ``read_bytes_s`` from files the server maps, naming the file; not it when it did not.

The before and after verdicts are both kept (:class:`Settlement`); the after verdict
says which trace settled it in its notes, and ``settled_by`` names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from strata_plugin.analysis.rules import AMBIGUOUS, Evidence, Verdict
from strata_plugin.analysis.thresholds import Threshold, threshold
from strata_plugin.analysis.traces.blockio import OTHER, BlockReport
from strata_plugin.analysis.traces.sched import SchedReport
from strata_plugin.analysis.traces.sockets import SocketReport

#: Numbers a trace is compared with: in the one threshold table (analysis/thresholds.py).
TRACE_THRESHOLD_NAMES = ("trace_other_share", "trace_rtt_p50_ms", "trace_retrans_per_s")
CPU_PAIR = ("cpu_compute", "cpu_contention")
#: Which classes each trace can decide.
COVERS = {"sched": CPU_PAIR, "block": ("io_page_faults",), "net": ("network",)}
#: Which traces a class asks for (the diagnostic round captures their union).
TRACES_FOR = {
    "cpu_compute": ("sched",), "cpu_contention": ("sched",), "host_cpu_launch": ("sched",),
    "io_page_faults": ("block", "sched"), "memory_pressure": ("block",),
    "network": ("net",), "client_bound": ("net",),
}
#: Every trace a named case gets ("engine": the engine's own profile, run/engine_profile.py).
ALL_TRACES: tuple[str, ...] = ("sched", "block", "net", "engine")
#: Causes inside the engine (its kernels, copies, collectives, its own CPU work): where a
#: verdict names two of them, counters cannot tell them apart and the engine's own
#: profile is the finer trace.
ENGINE_CLASSES = frozenset({"host_cpu_launch", "gpu_latency_low_occupancy", "gpu_pcie_copy",
                            "gpu_compute", "gpu_memory_bandwidth", "gpu_communication",
                            "cpu_compute"})


def _thr(name: str) -> Threshold:
    return threshold(name)


def _ev(cls: str, metric: str, value: float, op: str, thr: str, scale: float = 1.0) -> Evidence:
    t = _thr(thr)
    tv = t.value * scale
    met = value >= tv if op == ">=" else value < tv
    return Evidence(cls, metric, float(f"{value:.4g}"), op, t.name, float(f"{tv:.4g}"), t.unit,
                    t.source, met)


@dataclass(frozen=True)
class TraceDecision:
    trace: str  # "sched" | "block"
    decided: str | None  # the class the trace supports among those it covers; None: none
    evidence: tuple[Evidence, ...]
    why: str


def decide_sched(r: SchedReport) -> TraceDecision:
    """cpu_contention, cpu_compute or neither, from one window's scheduling."""
    usable = float(min(max(1, sum(1 for t in r.threads if t.run_s > 0.01 * r.window_s)),
                       max(1, len(r.cpus))))
    wait = _ev("cpu_contention", "trace_wait_per_run", r.wait_per_run, ">=",
               "runq_delay_per_cpu_s")
    other = r.displaced_share("other", "kernel", "harness")
    share = _ev("cpu_contention", "trace_other_share_of_wait", other, ">=", "trace_other_share")
    busy = _ev("cpu_compute", "trace_server_cores", r.server_cores, ">=",
               "server_cores_of_threads", scale=usable)
    top = ", ".join(f"{k} {s:.3g} s" for k, s in r.displaced_top[:3])
    if wait.met and share.met:
        return TraceDecision("sched", "cpu_contention", (wait, share),
                             f"server threads waited {r.wait_s:.3g} s runnable for "
                             f"{r.run_s:.3g} s on CPU; other processes held its CPUs "
                             f"{other:.0%} of that wait ({top})")
    if wait.met:
        return TraceDecision("sched", "cpu_compute", (wait, share),
                             f"server threads waited {r.wait_s:.3g} s runnable, mostly for "
                             f"the server's own threads ({1 - other:.0%} of the wait)")
    if busy.met:
        return TraceDecision("sched", "cpu_compute", (wait, busy),
                             f"server threads ran {r.server_cores:.3g} cores of "
                             f"{usable:g} usable and rarely waited")
    return TraceDecision("sched", None, (wait, busy),
                         f"server threads ran {r.server_cores:.3g} cores and waited "
                         f"{r.wait_per_run:.3g} s per s on CPU: neither CPU class")


def decide_block(r: BlockReport) -> TraceDecision:
    """io_page_faults (naming the file) or not, from one window's reads."""
    top = r.top
    win = max(r.window_s, 1e-9)
    rate = (max(top.read_in_bytes, top.request_bytes) / win) if top else 0.0
    ev = _ev("io_page_faults", "trace_file_read_bytes_s", rate, ">=", "read_bytes_s")
    if top is not None and ev.met:
        lat = top.latency
        tail = (f"; block requests p50 {lat.p50_ms:.3g} ms, p99 {lat.p99_ms:.3g} ms "
                f"(n={lat.n})" if lat else "")
        return TraceDecision("block", "io_page_faults", (ev,),
                             f"{rate / 1e6:.3g} MB/s read from {top.path} "
                             f"({top.server_faults} server faults on it){tail}")
    other = next((f for f in r.files if f.path == OTHER), None)
    extra = f"; {other.read_in_bytes / 1e6:.3g} MB read for other files" if other else ""
    return TraceDecision("block", None, (ev,),
                         f"{rate / 1e6:.3g} MB/s read from the server's files{extra}")


def decide_net(r: SocketReport) -> TraceDecision:
    """network, or not, from the benchmark connections' TCP info."""
    rtt = _ev("network", "trace_rtt_p50_ms", r.rtt_p50_ms or 0.0, ">=", "trace_rtt_p50_ms")
    rx = _ev("network", "trace_retrans_per_s", r.retrans_per_s, ">=", "trace_retrans_per_s")
    desc = (f"{r.connections} sockets, RTT p50 {r.rtt_p50_ms} ms, p99 {r.rtt_p99_ms} ms, "
            f"{r.retransmits} retransmitted segments, send-q up to {r.max_send_q} B")
    if r.samples == 0 or r.connections == 0:
        return TraceDecision("net", None, (), "no benchmark connection was sampled")
    return TraceDecision("net", "network" if rtt.met or rx.met else None, (rtt, rx), desc)


@dataclass(frozen=True)
class Settlement:
    """A case's verdict before and after its diagnostic round."""

    case_id: str
    traced_case_id: str
    before: Verdict
    after: Verdict
    settled_by: tuple[str, ...]  # traces whose decision the after verdict took
    decisions: tuple[TraceDecision, ...]
    unavailable: tuple[tuple[str, str], ...] = ()  # (trace, why)
    tables: dict[str, Any] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return (self.before.classes, self.before.inconclusive) != \
            (self.after.classes, self.after.inconclusive)


def _ambiguous(v: Verdict) -> bool:
    named = set(v.classes) | set(v.also_flagged)
    return any(a in named and b in named for a, b, _t, _w in AMBIGUOUS)


def needs_diagnosis(v: Verdict) -> bool:
    """Inconclusive, or two classes the counters cannot separate both named."""
    return v.inconclusive or _ambiguous(v)


def traces_for(v: Verdict) -> tuple[str, ...]:
    """The trace sets a verdict asks for (both when it names none they cover), and the
    engine's own profile where it names two causes inside the engine."""
    out: list[str] = []
    for c in (*v.classes, *v.also_flagged):
        for t in TRACES_FOR.get(c, ()):
            if t not in out:
                out.append(t)
    out = out or ["sched", "block"]  # nothing named they cover: the CPU and disk
    if len(ENGINE_CLASSES & {*v.classes, *v.also_flagged}) >= 2:
        out.append("engine")
    return tuple(out)


def settle(before: Verdict, decisions: tuple[TraceDecision, ...], *, case_id: str = "",
           traced_case_id: str = "", unavailable: tuple[tuple[str, str], ...] = (),
           tables: dict[str, Any] | None = None) -> Settlement:
    """The after verdict: each trace's decision replaces the classes it covers."""
    named = list(before.classes) + [c for c in before.also_flagged if c not in before.classes]
    settled: list[str] = []
    notes: list[str] = []
    for d in decisions:
        covered = COVERS[d.trace]
        present = [c for c in named if c in covered]
        if d.decided is not None:
            if present:
                i = named.index(present[0])
                named = [c for c in named if c not in covered]
                named.insert(min(i, len(named)), d.decided)
            else:
                named.append(d.decided)
        else:
            named = [c for c in named if c not in covered]
        if present or d.decided is not None:
            settled.append(d.trace)
        notes.append(f"{d.trace} trace: {d.decided or 'none of ' + '/'.join(covered)}: {d.why}")
    named = [c for c in named if c != "headroom"]  # a class of older verdicts, no more
    pair_open = before.inconclusive and any(
        c not in {x for d in decisions for x in COVERS[d.trace]}
        for c in before.classes if c != "headroom")
    inconclusive = before.inconclusive and (pair_open or not settled)
    met = [e for d in decisions if d.trace in settled for e in d.evidence if e.met]
    margin = (sum(min(1.0, (e.value - e.threshold_value) / (0.25 * e.threshold_value))
                  for e in met if e.threshold_value) / len(met)) if met else 0.0
    conf = before.confidence if not settled else min(0.95, 0.5 + 0.4 * max(0.0, margin))
    after = replace(
        before,
        classes=tuple(named[:2]),
        also_flagged=tuple(named[2:]),
        evidence=before.evidence + tuple(e for d in decisions for e in d.evidence),
        confidence=round(conf, 3),
        inconclusive=inconclusive,
        finer_trace=before.finer_trace if inconclusive else (),
        notes=(*before.notes,
               ("settled by the " + " and ".join(f"{t} trace" for t in settled)
                if settled and not inconclusive else "not settled by the trace"),
               *notes,
               *(f"{t} trace UNAVAILABLE: {why}" for t, why in unavailable)),
    )
    return Settlement(case_id, traced_case_id, before, after, tuple(settled), tuple(decisions),
                      tuple(unavailable), dict(tables or {}))

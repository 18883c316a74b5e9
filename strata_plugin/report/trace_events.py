"""The run on one timeline, as a Chrome "Trace Event Format" file that Perfetto UI
(ui.perfetto.dev, Open trace file) and chrome://tracing open: docs/timeline.md.

Why a file of this format: the engineer chasing one slow request already reads torch
and nsys traces in these viewers; here the requests, the ledger's parts, the server's
run state, every sampled series, the markers and the verdicts lie on one clock beside
each other, and an engine's own trace can be merged onto the same clock
(:class:`EngineTrace`, :func:`engine_events`).

One clock: the harness's wall clock (markers are on it; requests through the run's
clock anchor; each node's samples through its measured offset, analysis/timeline.py
and analysis/clocks.py), written as microseconds from the run's start (``ts``), the
start stated in the file's metadata (``origin_wall_ns``).

Built from the analysed run alone (``RunAnalysis``: the raw files read), so an old run
folder gets one too, and the same raw files give the same bytes.

Tracks (process ids are integers, named by "M" events):

* ``client`` (pid 1): each request an "X" slice on its stream's thread, a nested
  ``TTFT`` slice (dispatch to the first token) and each token's arrival an instant;
  the record carries no stream id, so requests are laid on the fewest lanes where none
  overlaps (first fit by dispatch time): in a closed loop, its streams.
* ``ledger`` (pid 2): each measured request's time ledger on the same lane: its
  segments (TTFT, decode, tail) at their measured times; under TTFT its parts laid end
  to end in the ledger's order (their lengths are the ledger's, their order is not
  measured); under decode its stalls at their measured times, named by the server's
  state.
* ``markers`` (pid 3): run, baselines and cooldowns, cases, warm-up and measured
  phases, events (injections), and each case's verdict with its evidence as a slice
  over the case's window.
* one process per node (pid 10 + k): a "C" counter track per sampled series (gauges as
  sampled, counters as their rate per second between two samples) and the server's
  run state over each case's window (slices per run of one dominant state).
* an engine's own trace, merged with its clock offset (pid 1000 + ...).
"""

from __future__ import annotations

import errno
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strata_plugin.analysis.ledger import TTFT_PARTS, stall_spans
from strata_plugin.analysis.metrics import first_token_ns
from strata_plugin.analysis.run_states import STATES, nodes_with_run_state
from strata_plugin.analysis.signals import HwView, server_node
from strata_plugin.errors import StrataError
from strata_plugin.formats.atomic import atomic_write_text

if TYPE_CHECKING:
    from strata_plugin.analysis.case_summary import CaseAnalysis, RunAnalysis
    from strata_plugin.analysis.run_folder import RunBundle
    from strata_plugin.analysis.timeline import SampleStore
    from strata_plugin.analysis.traces.engine_profile import EngineCapture

#: Points kept per counter series in one file. A track is drawn on a screen about 1,000
#: pixels wide: more points than that cannot be told apart until one zooms in, and
#: then the case's own file has the case's points. A 30-minute run sampled every
#: 0.5 s has 3,600 points a series; a 20 ms run-state grid 90,000. Past it, each of
#: ``MAX_POINTS_PER_SERIES / 2`` equal buckets keeps its lowest and its highest sample
#: (samples, not averages: a peak stays a peak), and the metadata names the series.
MAX_POINTS_PER_SERIES = 1000
#: Token arrivals drawn as instants in one file. An instant costs about 90 bytes of
#: JSON: 100,000 of them 9 MB, which both viewers open in seconds. Past it each request
#: keeps an even share of its tokens (its first and last always), and the metadata says
#: how many were kept.
MAX_TOKEN_INSTANTS = 100_000
#: Context kept around a case's window in its own file (each side, ns): the idle
#: seconds before and after show what the load changed.
CASE_MARGIN_NS = 1_000_000_000
#: The folder of a run's timeline files, beside report.md.
FOLDER = "timeline"
RUN_FILE = "run.json"

CLIENT_PID, LEDGER_PID, MARKERS_PID, NODE_PID0, ENGINE_PID0 = 1, 2, 3, 10, 1000
#: The markers' threads, by marker kind; events (injections) get lanes from EVENTS_TID.
_MARKER_TID = {"run": 1, "baseline": 2, "cooldown": 2, "case": 3, "warmup": 4,
               "measured": 4}
_MARKER_THREADS = {1: "run", 2: "baselines and cooldowns", 3: "cases",
                   4: "warm-up and measured", 5: "verdicts"}
VERDICT_TID = 5
EVENTS_TID = 10
RUNSTATE_TID = 1


class TimelineError(StrataError, ValueError):
    """A timeline that cannot be made as asked: no such case or request, an engine
    trace that is not trace events. The message says which, in the user's terms."""


def _us(ns: int | float) -> float:
    """ns on the timeline -> the file's microseconds (ns precision kept)."""
    return round(ns / 1000.0, 3)


@dataclass(frozen=True)
class EngineTrace:
    """An engine's own profile (a torch profiler trace, SGLang's, perf's samples turned
    into trace events), already parsed, and how to put it on the run's timeline.

    ``offset_us``: added to each event's ``ts`` to put it in the run's microseconds
    (the engine's clock related to Strata's by whoever captured it); ``method`` and
    ``error_us`` say how that relation was found and how far it can be off, and go into
    the metadata beside the trace's name."""

    name: str
    events: tuple[Mapping[str, Any], ...]
    offset_us: float
    method: str = ""
    error_us: float | None = None


def engine_events(trace: EngineTrace, pid0: int = ENGINE_PID0) -> list[dict[str, Any]]:
    """``trace``'s events on the run's clock: each ``ts`` moved by its offset, its
    processes renumbered from ``pid0`` (so they meet no track of Strata's) and named
    after the trace. Raises TimelineError naming the first event that is not one."""
    pids: dict[Any, int] = {}
    named: set[int] = set()
    out: list[dict[str, Any]] = []
    for i, ev in enumerate(trace.events):
        if not isinstance(ev, Mapping) or not isinstance(ev.get("ph"), str):
            raise TimelineError(f"{trace.name}: event {i} is not a trace event (an object "
                                f"with a string 'ph'): {str(ev)[:80]}")
        e = dict(ev)
        pid = pids.setdefault(e.get("pid"), pid0 + len(pids))
        e["pid"] = pid
        if "ts" in e:
            ts = e["ts"]
            if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts):
                raise TimelineError(f"{trace.name}: event {i} has a ts that is not a number: "
                                    f"{ts!r}")
            e["ts"] = round(float(ts) + trace.offset_us, 3)
        if e["ph"] == "M" and e.get("name") == "process_name":
            inner = (e.get("args") or {}).get("name", "")
            e["args"] = {"name": f"{trace.name}: {inner}" if inner else trace.name}
            named.add(pid)
        out.append(e)
    for pid in sorted(set(pids.values()) - named):
        out.append(_meta("process_name", pid, None, trace.name))
    return out


def _meta(what: str, pid: int, tid: int | None, value: Any) -> dict[str, Any]:
    key = "sort_index" if what.endswith("sort_index") else "name"
    e: dict[str, Any] = {"ph": "M", "name": what, "pid": pid, "args": {key: value}}
    if tid is not None:
        e["tid"] = tid
    return e


# --- requests on the timeline ---------------------------------------------------------


@dataclass(frozen=True)
class RequestSpan:
    """One record on the timeline: its times (harness wall ns) and its lane."""

    request_id: str
    case_id: str
    phase: str
    start_ns: int
    end_ns: int
    first_token_ns: int | None
    tokens: tuple[tuple[int, int, str], ...]  # (wall ns, n_tokens, kind)
    shift_ns: int  # monotonic -> wall for this record
    lane: int = 0
    args: Mapping[str, Any] = field(default_factory=dict)


def record_end_ns(rec: Any) -> int:
    """A record's end: its stream's end, else its last token or first byte."""
    ends = [x for x in (rec.done_ns, rec.first_byte_ns,
                        *(e.t_ns for e in rec.events if e.n_tokens > 0)) if x is not None]
    return max([rec.dispatched_ns, *ends])


def request_spans(bundle: RunBundle) -> tuple[list[RequestSpan], list[str]]:
    """Every record on the harness clock, with its lane; and what could not be placed.

    The clock anchor turns a record's monotonic stamps into wall time; a run without
    one (older) places each record by its request marker instead."""
    anchor = bundle.anchor
    markers = {m.name: m for m in bundle.markers if m.kind == "request"} if anchor is None \
        else {}
    spans: list[RequestSpan] = []
    missing = 0
    for cid in sorted(bundle.records):
        for rec in bundle.records[cid]:
            if anchor is not None:
                shift = anchor.wall_ns - anchor.mono_ns
            elif rec.request_id in markers:
                shift = markers[rec.request_id].start_wall_ns - rec.dispatched_ns
            else:
                missing += 1
                continue
            first = first_token_ns(rec)
            args: dict[str, Any] = {"request_id": rec.request_id, "case_id": rec.case_id,
                                    "phase": rec.phase}
            for k in ("isl", "osl", "finish_reason", "server_request_id"):
                v = getattr(rec, k)
                if v is not None:
                    args[k] = v
            args["output_tokens"] = sum(e.n_tokens for e in rec.events)
            if rec.error is not None:
                args["error"] = f"{rec.error.cls}: {rec.error.message}"[:300]
            spans.append(RequestSpan(
                rec.request_id, rec.case_id, rec.phase, rec.dispatched_ns + shift,
                record_end_ns(rec) + shift, None if first is None else first + shift,
                tuple((e.t_ns + shift, e.n_tokens, e.kind) for e in rec.events
                      if e.n_tokens > 0), shift, 0, args))
    spans.sort(key=lambda s: (s.start_ns, s.end_ns, s.request_id))
    lanes = first_fit([(s.start_ns, s.end_ns) for s in spans])
    out = [_with_lane(s, lane) for s, lane in zip(spans, lanes, strict=True)]
    notes = [f"{missing} records without a request marker or a clock anchor: not placed"
             ] if missing else []
    return out, notes


def _with_lane(s: RequestSpan, lane: int) -> RequestSpan:
    return RequestSpan(s.request_id, s.case_id, s.phase, s.start_ns, s.end_ns,
                       s.first_token_ns, s.tokens, s.shift_ns, lane, s.args)


def first_fit(intervals: Sequence[tuple[int, int]]) -> list[int]:
    """Each interval's lane (0, 1, ...): the first lane free when it starts, intervals
    taken in the order given (sorted by start): no two on a lane overlap."""
    ends: list[int] = []
    out = []
    for a, b in intervals:
        for k, e in enumerate(ends):
            if e <= a:
                ends[k] = b
                out.append(k)
                break
        else:
            ends.append(b)
            out.append(len(ends) - 1)
    return out


# --- what one file covers ------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """What one file shows: a span of the timeline (harness wall ns; None: the whole
    run); for one case's file, that case's requests and verdict alone (the samples and
    markers of the span around it stay); for one request's file, that request alone."""

    title: str
    start_ns: int | None = None
    end_ns: int | None = None
    request_id: str | None = None
    case_id: str | None = None

    def overlaps(self, a: int, b: int) -> bool:
        return ((self.start_ns is None or b >= self.start_ns)
                and (self.end_ns is None or a <= self.end_ns))

    def clip(self, a: int, b: int) -> tuple[int, int]:
        """``a``..``b`` cut to this file's span: a viewer opens on the span its slices
        cover, so the run's marker, whole, would open a request's file zoomed out to the
        whole run with the request a sliver in it."""
        return (a if self.start_ns is None else max(a, self.start_ns),
                b if self.end_ns is None else min(b, self.end_ns))


def origin_ns(bundle: RunBundle, spans: Sequence[RequestSpan] = ()) -> int:
    """The run's start on the harness wall clock: its run marker, else its first marker,
    else its first request (``spans``; 0 without either)."""
    runs = [m for m in bundle.markers if m.kind == "run"]
    if runs:
        return runs[-1].start_wall_ns
    if bundle.markers:
        return min(m.start_wall_ns for m in bundle.markers)
    return min((s.start_ns for s in spans), default=0)


def case_scope(bundle: RunBundle, case_id: str) -> Scope:
    """A case's file: its whole marked span (warm-up to its end) and the measured window,
    with CASE_MARGIN_NS either side. TimelineError where the case was never marked."""
    marks = [m for m in bundle.markers if m.case_id == case_id
             and m.kind in ("case", "warmup", "measured")]
    if not marks:
        spans = [s for s in request_spans(bundle)[0] if s.case_id == case_id]
        if not spans:
            raise TimelineError(f"case {case_id!r} has neither markers nor requests: no "
                                "span of the timeline to show")
        a, b = min(s.start_ns for s in spans), max(s.end_ns for s in spans)
    else:
        a, b = min(m.start_wall_ns for m in marks), max(m.end_wall_ns for m in marks)
    return Scope(f"case {case_id}", a - CASE_MARGIN_NS, b + CASE_MARGIN_NS, case_id=case_id)


# --- building --------------------------------------------------------------------------


@dataclass
class _Builder:
    origin: int
    scope: Scope
    events: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    downsampled: list[dict[str, Any]] = field(default_factory=list)
    threads: dict[tuple[int, int], str] = field(default_factory=dict)
    #: the "C" events, apart: in series order, each series in time order already
    counters: list[dict[str, Any]] = field(default_factory=list)

    def ts(self, ns: int | float) -> float:
        return _us(ns - self.origin)

    def slice(self, pid: int, tid: int, name: str, a: int, b: int,
              args: Mapping[str, Any] | None = None, cat: str = "") -> None:
        e: dict[str, Any] = {"ph": "X", "name": name, "pid": pid, "tid": tid,
                             "ts": self.ts(a), "dur": _us(max(0, b - a))}
        if cat:
            e["cat"] = cat
        if args:
            e["args"] = dict(args)
        self.events.append(e)

    def thread(self, pid: int, tid: int, name: str) -> None:
        self.threads.setdefault((pid, tid), name)


def _client(b: _Builder, spans: Sequence[RequestSpan]) -> None:
    per_request = MAX_TOKEN_INSTANTS // max(1, len(spans))
    kept = total = 0
    for s in spans:
        tid = s.lane + 1
        b.thread(CLIENT_PID, tid, f"stream {tid}")
        short = s.request_id.rsplit("/", 1)[-1]
        b.slice(CLIENT_PID, tid, f"{s.phase} {short}", s.start_ns, s.end_ns,
                {**s.args, "e2e_ms": round((s.end_ns - s.start_ns) / 1e6, 6)}, "request")
        if s.first_token_ns is not None:
            b.slice(CLIENT_PID, tid, "TTFT", s.start_ns, s.first_token_ns,
                    {"ttft_ms": round((s.first_token_ns - s.start_ns) / 1e6, 6)}, "request")
        toks = _thin(s.tokens, per_request)
        total += len(s.tokens)
        kept += len(toks)
        for t, n, kind in toks:
            e: dict[str, Any] = {"ph": "i", "s": "t", "name": "token", "pid": CLIENT_PID,
                                 "tid": tid, "ts": b.ts(t)}
            if n != 1 or kind != "content":
                e["args"] = {"n_tokens": n, "kind": kind}
            b.events.append(e)
    if kept < total:
        b.notes.append(f"token arrivals: {kept} of {total} drawn as instants (at most "
                       f"{MAX_TOKEN_INSTANTS} a file: {per_request} a request, its first, its "
                       "last and an even spread between)")


def _thin(xs: Sequence[Any], n: int) -> Sequence[Any]:
    """At most ``n`` items of ``xs``, evenly spread, the first and (n > 1) the last kept."""
    if len(xs) <= n:
        return xs
    if n <= 1:
        return xs[:n]
    step = (len(xs) - 1) / (n - 1)
    return [xs[round(i * step)] for i in range(n)]


def _ledger(b: _Builder, analyses: Sequence[CaseAnalysis], spans: Mapping[str, RequestSpan],
            bundle: RunBundle, stalls: dict[str, list[tuple[int, int, str]]]) -> None:
    recs = {r.request_id: r for recs in bundle.records.values() for r in recs}
    no_stalls = False
    for a in analyses:
        led = a.ledger
        if led is None:
            continue
        deliveries = {r.request_id: r.delivery for r in led.requests}
        for r in led.requests:
            s = spans.get(r.request_id)
            rec = recs.get(r.request_id)
            if s is None or rec is None or s.first_token_ns is None:
                continue
            tid = s.lane + 1
            b.thread(LEDGER_PID, tid, f"stream {tid}")
            first = s.first_token_ns
            last = max(t for t, _, _ in s.tokens)
            end = max(last, s.end_ns)
            parts = dict(r.parts)
            b.slice(LEDGER_PID, tid, "TTFT", s.start_ns, first,
                    {"request_id": r.request_id, "ttft_ms": r.ttft_ms,
                     **{f"{p}_ms": parts[p] for p in TTFT_PARTS if parts[p]},
                     **({"merged": list(r.merged)} if r.merged else {})}, "ledger")
            t = s.start_ns
            for p in TTFT_PARTS:  # end to end in the ledger's order (module docstring)
                ms = parts[p]
                if ms <= 0 or t >= first:
                    continue
                u = min(first, t + round(ms * 1e6))
                b.slice(LEDGER_PID, tid, p, t, u, {"ms": ms}, "ledger")
                t = u
            if last > first:
                decode = {f"{p}_ms": v for p, v in r.parts if p not in TTFT_PARTS
                          and p != "tail" and v}
                b.slice(LEDGER_PID, tid, "decode", first, last,
                        {"request_id": r.request_id, "decode_ms": r.decode_ms,
                         "n_tokens": r.n_tokens, "pace_ms": r.pace_ms, **decode}, "ledger")
                if bundle.anchor is None:
                    no_stalls = True
                else:
                    got = stalls.get(r.request_id)
                    if got is None:
                        got = stalls[r.request_id] = stall_spans(
                            rec, led.states, bundle.anchor, deliveries.get(r.request_id))
                    for x, y, state in got:
                        b.slice(LEDGER_PID, tid, f"stall: {state}", x + s.shift_ns,
                                y + s.shift_ns, {"ms": round((y - x) / 1e6, 4)}, "ledger")
            if end > last:
                b.slice(LEDGER_PID, tid, "tail", last, end, {"ms": r.tail_ms}, "ledger")
    if no_stalls:
        b.notes.append("ledger: decode stalls not placed (no clock anchor in the manifest)")


def _markers(b: _Builder, bundle: RunBundle, analyses: Sequence[CaseAnalysis]) -> None:
    events = []
    for m in bundle.markers:
        if m.kind == "request" or not b.scope.overlaps(m.start_wall_ns, m.end_wall_ns):
            continue
        if m.kind == "event":
            events.append(m)
            continue
        tid = _MARKER_TID[m.kind]
        b.thread(MARKERS_PID, tid, _MARKER_THREADS[tid])
        b.slice(MARKERS_PID, tid, m.kind if m.kind in ("warmup", "measured") else m.name,
                *b.scope.clip(m.start_wall_ns, m.end_wall_ns),
                _clipped(b, {"kind": m.kind, "name": m.name, "case_id": m.case_id},
                         m.start_wall_ns, m.end_wall_ns), "marker")
    events.sort(key=lambda m: (m.start_wall_ns, m.end_wall_ns, m.name))
    spans = [b.scope.clip(m.start_wall_ns, m.end_wall_ns) for m in events]
    for m, (lo, hi), lane in zip(events, spans, first_fit(spans), strict=True):
        b.thread(MARKERS_PID, EVENTS_TID + lane, "events" + (f" {lane + 1}" if lane else ""))
        b.slice(MARKERS_PID, EVENTS_TID + lane, m.name, lo, hi,
                _clipped(b, {"kind": m.kind, "name": m.name, "case_id": m.case_id},
                         m.start_wall_ns, m.end_wall_ns), "marker")
    for a in analyses:
        w = a.window
        if w is None or not b.scope.overlaps(w.start_ns, w.end_ns):
            continue
        b.thread(MARKERS_PID, VERDICT_TID, _MARKER_THREADS[VERDICT_TID])
        b.slice(MARKERS_PID, VERDICT_TID, f"verdict: {a.verdict.summary() or 'none'}",
                *b.scope.clip(w.start_ns, w.end_ns),
                _clipped(b, verdict_args(a), w.start_ns, w.end_ns), "verdict")


def _clipped(b: _Builder, args: dict[str, Any], start_ns: int, end_ns: int
             ) -> dict[str, Any]:
    """A slice's arguments, with its whole span where the file shows only part of it."""
    if b.scope.clip(start_ns, end_ns) != (start_ns, end_ns):
        args["whole_span_ms"] = [round((start_ns - b.origin) / 1e6, 3),
                                 round((end_ns - b.origin) / 1e6, 3)]
    return args


def verdict_args(a: CaseAnalysis) -> dict[str, Any]:
    """A case's verdict as the slice's arguments: what it named, how sure, its evidence."""
    v = a.verdict
    out: dict[str, Any] = {"case_id": a.case_id, "summary": v.summary(),
                           "confidence": round(v.confidence, 4),
                           "confidence_label": v.confidence_label}
    if v.lead:
        out["lead"] = v.lead
    if v.spare:
        out["spare"] = v.spare
    out["evidence"] = [
        f"{e.cls}: {e.metric} {e.value:.4g} {e.unit} {e.op} {e.threshold} "
        f"{e.threshold_value:.4g} ({'met' if e.met else 'not met'})"
        + (f"; {e.detail}" if e.detail else "") for e in v.evidence]
    for k in ("also_flagged", "missing_signals", "finer_trace", "notes"):
        if getattr(v, k):
            out[k] = list(getattr(v, k))
    return out


def _series_name(source: str, device: str, metric: str) -> str:
    return f"{source}.{metric}" + (f" [{device}]" if device else "")


@dataclass(frozen=True)
class _Series:
    """One sampled series as its track draws it: times (harness wall ns) and values
    (gauges as sampled, counters as the rate to the next sample)."""

    node: str
    name: str
    arg: str  # "value" | "per_s"
    t: Any  # np.ndarray int64
    v: Any  # np.ndarray float64


def _all_series(store: SampleStore) -> list[_Series]:
    import numpy as np

    out = []
    for i, k in enumerate(store.keys):
        t, v = store.series(i)
        arg = "value"
        if k.kind == "counter":
            a0, a1 = int(store.bounds[i]), int(store.bounds[i + 1])
            dt = np.diff(t)
            ok = dt > 0
            v = np.diff(store.acc[a0:a1])[ok] / (dt[ok] / 1e9)
            t = t[:-1][ok]
            arg = "per_s"
        ok = np.isfinite(v)
        if len(t) and ok.any():
            out.append(_Series(k.node, _series_name(k.source, k.device, k.metric), arg,
                               t[ok], v[ok]))
    return out


def _counters(b: _Builder, series: Sequence[_Series], node_pid: Mapping[str, int]) -> None:
    import numpy as np

    for sr in series:
        t, v = sr.t, sr.v
        # the samples in the scope, and the last one before it, moved to the scope's
        # start: a counter track holds a value until its next sample (a rate, over the
        # interval its sample opens), so the track is right from the scope's first
        # instant, and no sample outside it stretches the file's span (a viewer opens a
        # file on the span its events cover; a 60 s series' neighbours would be a
        # minute away from a 0.1 s request)
        i0 = 0 if b.scope.start_ns is None else max(
            0, int(np.searchsorted(t, b.scope.start_ns, "right")) - 1)
        i1 = len(t) if b.scope.end_ns is None else int(
            np.searchsorted(t, b.scope.end_ns, "right"))
        t, v = np.array(t[i0:i1]), v[i0:i1]  # its own: its first time is moved
        if len(t) == 0:
            continue
        if b.scope.start_ns is not None and t[0] < b.scope.start_ns:
            t[0] = b.scope.start_ns
        # a sample equal to the one before adds nothing: a counter track holds its value
        keep = np.r_[True, v[1:] != v[:-1]]
        t, v = t[keep], v[keep]
        idx = downsample_index(v, MAX_POINTS_PER_SERIES)
        if len(idx) < len(t):
            b.downsampled.append({"node": sr.node, "series": sr.name, "kept": len(idx),
                                  "of": len(t)})
            t, v = t[idx], v[idx]
        ts = np.round((t - b.origin) / 1000.0, 3).tolist()
        pid, name, arg = node_pid[sr.node], sr.name, sr.arg
        b.counters.extend({"ph": "C", "name": name, "pid": pid, "ts": x, "args": {arg: y}}
                          for x, y in zip(ts, v.tolist(), strict=True))


def downsample_index(v: Any, n: int) -> list[int]:
    """Indexes of at most ``n`` points of ``v`` (in order): all of them when they fit,
    else each of ``n // 2`` equal buckets' lowest and highest (samples, not averages)."""
    import numpy as np

    m = len(v)
    if m <= n:
        return list(range(m))
    k = max(1, n // 2)
    edges = np.linspace(0, m, k + 1).astype(np.int64)
    out: list[int] = []
    for a, c in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        if c <= a:
            continue
        seg = v[a:c]
        lo, hi = a + int(np.argmin(seg)), a + int(np.argmax(seg))
        out.extend(sorted({lo, hi}))
    return out


def _run_states(b: _Builder, store: SampleStore, analyses: Sequence[CaseAnalysis],
                node_pid: Mapping[str, int]) -> None:
    import numpy as np

    run_nodes = nodes_with_run_state(store)
    drawn_to: dict[int, int] = {}  # per track: where its last slice ended
    for a in sorted(analyses, key=lambda a: a.window.start_ns if a.window else 0):
        led = a.ledger
        w = a.window
        if led is None or led.states is None or w is None:
            continue
        if not b.scope.overlaps(w.start_ns, w.end_ns):
            continue
        node = server_node(HwView(a.hw))
        if node not in run_nodes:
            node = run_nodes[0] if run_nodes else None
        if node is None or node not in node_pid:
            continue
        st = led.states
        t = st.t
        secs = np.diff(st.cum, axis=0)
        if len(t) < 2:
            continue
        # buckets of whole grid intervals when the case has more than a track shows
        n = len(secs)
        k = min(n, MAX_POINTS_PER_SERIES)
        edges = np.linspace(0, n, k + 1).astype(np.int64)
        runs: list[tuple[int, int, str, np.ndarray]] = []
        for x, y in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
            if y <= x:
                continue
            s = secs[x:y].sum(axis=0)
            if s.sum() <= 0:
                continue
            state = STATES[int(np.argmax(s))]
            ta, tb = int(t[x]), int(t[y])
            if runs and runs[-1][2] == state and runs[-1][1] == ta:
                p = runs[-1]
                runs[-1] = (p[0], tb, state, p[3] + s)
            else:
                runs.append((ta, tb, state, s))
        if k < n:
            b.downsampled.append({"node": node, "series": f"run state ({a.case_id})",
                                  "kept": k, "of": n})
        pid = node_pid[node]
        b.thread(pid, RUNSTATE_TID, "server threads: run state")
        for ta, tb, state, s in runs:
            # the window's own seconds only (its states reach an interval past each edge):
            # two cases' windows never share a slice of the track
            ta, tb = max(ta, w.start_ns, drawn_to.get(pid, ta)), min(tb, w.end_ns)
            if tb <= ta or not b.scope.overlaps(ta, tb):
                continue
            drawn_to[pid] = tb
            tot = float(s.sum())
            b.slice(pid, RUNSTATE_TID, state, ta, tb,
                    {f"{name}_share": round(float(x) / tot, 4)
                     for name, x in zip(STATES, s.tolist(), strict=True) if x > 0}
                    | {"case_id": a.case_id, "busy_ref_cores": round(st.busy_ref_cores, 4)},
                    "runstate")


@dataclass(frozen=True)
class Prepared:
    """What every file of one run shares, computed once: the run's start, its requests
    on the timeline, its series as tracks, each request's stalls (filled as asked)."""

    origin: int
    spans: tuple[RequestSpan, ...]
    notes: tuple[str, ...]
    series: tuple[_Series, ...]
    stalls: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)


def prepare(ra: RunAnalysis) -> Prepared:
    spans, notes = request_spans(ra.bundle)
    return Prepared(origin_ns(ra.bundle, spans), tuple(spans), tuple(notes),
                    tuple(_all_series(ra.store)))


def build(ra: RunAnalysis, scope: Scope | None = None,
          engine: Sequence[EngineTrace] = (), prepared: Prepared | None = None
          ) -> dict[str, Any]:
    """The trace (the JSON object form) of ``scope`` (default: the whole run), with the
    engine traces given merged onto the run's clock. ``prepared``: the run's shared
    parts, when several files of one run are built."""
    scope = scope or Scope("run")
    pre = prepared or prepare(ra)
    bundle, store = ra.bundle, ra.store
    b = _Builder(pre.origin, scope)
    b.notes.extend(pre.notes)
    if scope.request_id is not None:
        shown = [s for s in pre.spans if s.request_id == scope.request_id]
    else:
        shown = [s for s in pre.spans if scope.overlaps(s.start_ns, s.end_ns)
                 and scope.case_id in (None, s.case_id)]
    _client(b, shown)
    shown_ids = {s.request_id for s in shown}
    cases = [a for a in ra.analyses if scope.case_id in (None, a.case_id) and (
        a.window is None or scope.overlaps(a.window.start_ns, a.window.end_ns))]
    _ledger(b, [_only(a, shown_ids) for a in cases], {s.request_id: s for s in shown}, bundle,
            pre.stalls)
    _markers(b, bundle, cases)
    nodes = store.nodes()
    node_pid = {n: NODE_PID0 + k for k, n in enumerate(nodes)}
    _counters(b, pre.series, node_pid)
    _run_states(b, store, cases, node_pid)
    engines = []
    pid0 = ENGINE_PID0
    for eng in engine:
        evs = engine_events(eng, pid0)
        pid0 = max([pid0, *(e["pid"] for e in evs)]) + 1
        evs = _in_scope(b, evs)
        b.events.extend(evs)
        engines.append({"name": eng.name, "offset_us": eng.offset_us, "method": eng.method,
                        "error_us": eng.error_us, "events": len(evs)})
    meta = _names(b, nodes, node_pid)
    events = sorted(b.events, key=_order)
    metadata: dict[str, Any] = {
        "run_id": bundle.run_id,
        "scope": scope.title,
        "clock": "the harness's wall clock: requests through the run's clock anchor, each "
                 "node's samples through its measured offset (analysis/clocks.py); ts in "
                 "microseconds from origin_wall_ns, the run's start",
        "origin_wall_ns": pre.origin,
        "span_us": None if scope.start_ns is None or scope.end_ns is None
        else [b.ts(scope.start_ns), b.ts(scope.end_ns)],
        "streams": "the records carry no stream id: requests are laid on the fewest lanes "
                   "where none overlaps (first fit by dispatch time), in a closed loop its "
                   "streams",
        "ledger": "segments (TTFT, decode, tail) at their measured times; TTFT's parts laid "
                  "end to end in the ledger's order (lengths measured, order not); decode "
                  "stalls at their measured times",
        "counters": "gauges as sampled ('value'); counters as their rate per second between "
                    "one sample and the next, stamped at the first ('per_s'); a sample equal "
                    "to the one before is left out (the track holds its value)",
        "run_state": "the server's process tree over each case's window, all threads "
                     "together (the runstate collector sums them), sliced by the state that "
                     "took most of each run of grid intervals (analysis/run_states.py)",
        "max_points_per_series": MAX_POINTS_PER_SERIES,
        "max_token_instants": MAX_TOKEN_INSTANTS,
        "downsampled": b.downsampled,
        "notes": b.notes,
        "verdicts": {a.case_id: verdict_args(a) for a in cases if a.window is not None},
        "engine_traces": engines,
    }
    return {"traceEvents": meta + events + b.counters, "displayTimeUnit": "ms",
            "metadata": metadata}


def _in_scope(b: _Builder, evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An engine trace's events within the file's span: a slice that reaches beyond it
    cut to it (its whole span in ``whole_span_ms``), any other event outside it left out,
    the metadata kept. (The profiler's own span, seconds long, would open a request's file
    zoomed out to the whole capture.)"""
    if b.scope.start_ns is None and b.scope.end_ns is None:
        return evs
    lo = -math.inf if b.scope.start_ns is None else b.ts(b.scope.start_ns)
    hi = math.inf if b.scope.end_ns is None else b.ts(b.scope.end_ns)
    out = []
    for e in evs:
        if e["ph"] == "M" or "ts" not in e:
            out.append(e)
            continue
        ts = e["ts"]
        dur = e.get("dur", 0.0) if e["ph"] == "X" else 0.0
        end = ts + (dur if isinstance(dur, (int, float)) and dur > 0 else 0.0)
        if end < lo or ts > hi:
            continue
        if e["ph"] == "X" and (ts < lo or end > hi):
            args = e.get("args")
            e = {**e, "ts": round(max(ts, lo), 3), "dur": round(min(end, hi) - max(ts, lo), 3),
                 "args": {**(args if isinstance(args, Mapping) else {}),
                          "whole_span_ms": [round(ts / 1000, 3), round(end / 1000, 3)]}}
        out.append(e)
    return out


def _only(a: CaseAnalysis, ids: set[str]) -> CaseAnalysis:
    """``a`` with its ledger's requests cut to ``ids`` (one request's file)."""
    import dataclasses

    if a.ledger is None or all(r.request_id in ids for r in a.ledger.requests):
        return a
    led = dataclasses.replace(a.ledger, requests=tuple(r for r in a.ledger.requests
                                                       if r.request_id in ids))
    return dataclasses.replace(a, ledger=led)


def _order(e: Mapping[str, Any]) -> tuple[Any, ...]:
    # by time, a parent before the slices it holds (longer first at one ts): both
    # viewers nest "X" slices by containment, and a stable order keeps the bytes fixed
    return (e.get("ts", 0.0), -e.get("dur", 0.0), str(e.get("pid")), str(e.get("tid", "")),
            e.get("ph", ""), e.get("name", ""))


def _names(b: _Builder, nodes: Sequence[str], node_pid: Mapping[str, int]
           ) -> list[dict[str, Any]]:
    procs = {CLIENT_PID: "client (requests by stream)", LEDGER_PID: "ledger (per request)",
             MARKERS_PID: "markers and verdicts"}
    procs.update({node_pid[n]: f"node {n}" for n in nodes})
    pids_used = {e["pid"] for e in (*b.events, *b.counters) if e["ph"] != "M"}
    out = []
    for i, (pid, name) in enumerate(sorted(procs.items())):
        if pid not in pids_used:
            continue
        out.append(_meta("process_name", pid, None, name))
        out.append(_meta("process_sort_index", pid, None, i))
    for (pid, tid), name in sorted(b.threads.items()):
        out.append(_meta("thread_name", pid, tid, name))
        out.append(_meta("thread_sort_index", pid, tid, tid))
    return out


def dumps(trace: Mapping[str, Any]) -> str:
    """The file's text: keys sorted, no spaces, so the same run gives the same bytes."""
    return json.dumps(trace, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"


# --- the report's files --------------------------------------------------------------


def case_file_names(case_ids: Iterable[str]) -> dict[str, str]:
    """Each case's file name in FOLDER: its id made safe for a path, unique."""
    used: set[str] = set()
    out = {}
    for cid in case_ids:
        base = "".join(c if c.isalnum() or c in "-_." else "_" for c in cid)[:80] or "case"
        name, k = f"case-{base}.json", 2
        while name in used:
            name, k = f"case-{base}-{k}.json", k + 1
        used.add(name)
        out[cid] = name
    return out


@dataclass(frozen=True)
class Written:
    """The report's timeline files: each case's file and span (seconds from the run's
    start), and why none was written ("" when they were)."""

    cases: Mapping[str, tuple[str, float, float]] = field(default_factory=dict)
    problem: str = ""
    #: each case's engine-profile lines: what was captured, where, its clock error, or
    #: why it was not (analysis/traces/engine_profile.py)
    engine: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def case_line(self, case_id: str) -> str | None:
        """The lines report.md shows under a case's timeline (None: nothing to say)."""
        eng = list(self.engine.get(case_id, ()))
        if self.problem:
            return "\n\n".join([f"Trace not written: {self.problem}.", *eng])
        got = self.cases.get(case_id)
        if got is None:
            return "\n\n".join(eng) or None
        name, a, b = got
        return "\n\n".join([f"Trace (Perfetto UI or chrome://tracing, docs/timeline.md): "
                             f"`{FOLDER}/{name}`, {a:.3f} s to {b:.3f} s of the run's "
                             f"timeline (the whole run: `{FOLDER}/{RUN_FILE}`).", *eng])


def write_all(ra: RunAnalysis, run_dir: Path) -> Written:
    """The whole run's file and each case's, in ``run_dir/timeline``; earlier files of
    this folder not written again are removed. Never raises: a failure is the returned
    ``problem`` (the report says it; the rest of the report stands)."""
    try:
        return _write_all(ra, Path(run_dir) / FOLDER)
    except OSError as exc:
        if exc.errno in _DISK_FULL:  # the run's disk, not the timeline's: the report fails
            raise
        return Written(problem=f"{type(exc).__name__}: {exc}"[:500])
    except Exception as exc:  # the timeline is one output among many: it costs only itself
        return Written(problem=f"{type(exc).__name__}: {exc}"[:500])


#: A write refused for room (a full disk, a quota, a file-size limit) fails every later
#: file of the report too: it is the report's failure, as for any other output.
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def engine_traces(run_dir: Path, origin: int, captures: Sequence[EngineCapture] | None = None
                  ) -> dict[str, tuple[EngineTrace, ...]]:
    """Each case's engine profile (``traces/engine/``, analysis/traces/engine_profile.py)
    as EngineTraces on the run's clock, by case id: perf's samples, and each torch trace
    the server's own profiler wrote (analysis/traces/torch_trace.py, one track each);
    what failed is left out (the report says why: :class:`Written`)."""
    from strata_plugin.analysis.traces.engine_profile import read_all

    out: dict[str, list[EngineTrace]] = {}
    for cap in read_all(run_dir) if captures is None else captures:
        if not cap.problem and cap.wall_minus_mono_ns is not None:
            out.setdefault(cap.case_id, []).append(EngineTrace(
                f"engine {cap.kind} ({cap.case_id})", cap.events,
                (int(cap.wall_minus_mono_ns) - origin) / 1000.0,
                "perf -k mono (CLOCK_MONOTONIC) + the capture's measured wall-minus-monotonic: "
                + cap.method, None if cap.error_ns is None else cap.error_ns / 1000.0))
        for t in cap.torch:
            if t.problem:
                continue
            out.setdefault(cap.case_id, []).append(EngineTrace(
                f"engine torch profiler ({cap.case_id}): {Path(t.file).name}", t.events,
                t.offset_us(origin), TORCH_CLOCK_METHOD
                + (f"; {t.clock_note}" if t.clock_note else ""),
                None if t.error_ns is None else t.error_ns / 1000.0))
    return {k: tuple(v) for k, v in out.items()}


#: How a torch trace is put on the run's clock (analysis/traces/torch_trace.py).
TORCH_CLOCK_METHOD = (
    "ts + baseTimeNanoseconds (the engine host's wall clock), checked against Strata's "
    "stamps of /start_profile and /stop_profile (each sent, answered): the profiler's own "
    "span must start and stop between them; error: the farthest end of the offsets they "
    "allow")


def _write_all(ra: RunAnalysis, out: Path) -> Written:
    out.mkdir(exist_ok=True)
    bundle = ra.bundle
    pre = prepare(ra)
    origin = pre.origin
    names = case_file_names([a.case_id for a in ra.analyses])
    written = {RUN_FILE}
    from strata_plugin.analysis.traces.engine_profile import read_all

    captures = read_all(out.parent)
    engines = engine_traces(out.parent, origin, captures)
    case_ids = {a.case_id for a in ra.analyses}
    engine_lines: dict[str, list[str]] = {}
    for cap in captures:  # a diagnostic repetition's capture is said under its case
        cid = cap.case_id if cap.case_id in case_ids else cap.case_id.split("~", 1)[0]
        engine_lines.setdefault(cid, []).append(cap.line(out.parent))
    atomic_write_text(out / RUN_FILE, dumps(build(ra, prepared=pre,
                                                  engine=[t for ts in engines.values()
                                                          for t in ts])))
    cases = {}
    for a in ra.analyses:
        try:
            scope = case_scope(bundle, a.case_id)
        except TimelineError:
            continue
        name = names[a.case_id]
        eng = list(engines.get(a.case_id, ()))
        atomic_write_text(out / name, dumps(build(ra, scope, prepared=pre, engine=eng)))
        written.add(name)
        assert scope.start_ns is not None and scope.end_ns is not None
        cases[a.case_id] = (name, (scope.start_ns - origin) / 1e9, (scope.end_ns - origin) / 1e9)
    for p in out.glob("*.json"):
        if p.name not in written:
            p.unlink(missing_ok=True)
    return Written(cases, engine={k: tuple(v) for k, v in engine_lines.items()})


def request_scope(bundle: RunBundle, request_id: str) -> Scope:
    """One request's file: its own span with a tenth of it (at least 100 ms) either side."""
    spans = {s.request_id: s for s in request_spans(bundle)[0]}
    s = spans.get(request_id)
    if s is None:
        raise TimelineError(f"no request {request_id!r} in this run")
    margin = max((s.end_ns - s.start_ns) // 10, 100_000_000)
    return Scope(f"request {request_id}", s.start_ns - margin, s.end_ns + margin, request_id)

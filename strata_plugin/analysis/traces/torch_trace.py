"""The server's own torch profiler trace read back: the files run/engine_profile.py moved
into ``traces/engine/<case>/torch/``, their operations as trace events, on Strata's wall
clock with the error of that placement stated.

The clock: torch's chrome trace stamps ``ts`` in microseconds from
``baseTimeNanoseconds`` (a top-level key, nanoseconds since the epoch, on the host's
realtime clock), so an event's wall time is ``baseTimeNanoseconds + ts * 1000`` ns
(checked on a real vLLM CPU trace: its ops fell inside Strata's stamps of the window).
SGLang's scheduler exports its trace through torch's ``export_chrome_trace``, the same
writer: the same keys, the same clock (checked on a real SGLang 0.5.23 CPU trace: its
``baseTimeNanoseconds`` a whole second, its ``Trace`` span inside Strata's stamps of
``/start_profile`` and ``/stop_profile``). Both engines' file names are read
(run/engine_http_profile.py: ``TRACE_SUFFIXES``).

The error, measured per file: the profiler's own span (the ``Trace`` slice "PyTorch
Profiler (0)", from its start to its stop) began after Strata sent ``/start_profile``
and before it was answered, and ended after ``/stop_profile`` was sent and before it was
answered; every operation lies between the first send and the last answer. Each of
these gives the interval the trace's clock offset (its stamp minus the true wall time)
can lie in; their intersection is what is known. Same host, same clock: no correction is
applied while that interval holds zero, and the error is its farthest end. An interval
without zero (an engine on another host's clock) is corrected by its middle, error half
its width; an empty one (stamps that contradict each other) is said, not corrected.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata_plugin.errors import StrataError
from strata_plugin.formats.bounded import BoundedReadError, parse_json, read_bytes
from strata_plugin.formats.printable import printable
from strata_plugin.limits import TORCH_TRACE_BYTES_MAX
from strata_plugin.run.engine_http_profile import TRACE_SUFFIXES

#: The torch profiler's own span in its chrome trace: one "X" slice of this category.
PROFILER_SPAN_CAT = "Trace"


class TorchTraceError(StrataError, ValueError):
    """A torch trace that cannot be read as one: the message names the file and what is
    wrong with it, in the user's terms."""


@dataclass(frozen=True)
class TorchTrace:
    """One torch trace file of a case: its events as torch wrote them (``ts`` in µs from
    ``base_ns``), the wall-clock correction and its error (ns), or why it is not merged."""

    file: str
    base_ns: int = 0
    events: tuple[Mapping[str, Any], ...] = ()
    ops: int = 0
    #: the operations' first start and last end, on Strata's wall clock (ns)
    span_ns: tuple[int, int] | None = None
    #: where the trace's clock offset can lie (ns; stamp minus true wall time)
    offset_bounds_ns: tuple[int, int] | None = None
    #: subtracted from the trace's wall stamps (0 on the same host's clock)
    correction_ns: int = 0
    error_ns: int | None = None
    #: operations outside Strata's stamps of the window, after the correction
    outside: int = 0
    clock_note: str = ""
    problem: str = ""
    #: the op names most of the ops' own time went to (each op's duration less its
    #: children's on the same thread), with their share of it
    top: tuple[tuple[str, float], ...] = ()

    def offset_us(self, origin_ns: int) -> float:
        """Added to each ``ts`` to put the event in a timeline's µs from ``origin_ns``."""
        return (self.base_ns - self.correction_ns - origin_ns) / 1000.0

    def said(self) -> str:
        """This file on the timeline, in words (the report's case section)."""
        if self.problem:
            return f"`{self.file}` not merged: {self.problem}"
        err = ("clock error unknown" if self.error_ns is None
               else f"clock error ±{self.error_ns / 1e6:.1f} ms")
        fix = (f", corrected by {self.correction_ns / 1e6:+.1f} ms" if self.correction_ns
               else "")
        out = f"; {self.outside} ops outside Strata's window" if self.outside else ""
        note = f" ({self.clock_note})" if self.clock_note else ""
        top = ", ".join(f"`{printable(name)}` {share:.0%}" for name, share in self.top)
        most = f"; most of the ops' own time in {top}" if top else ""
        return f"`{self.file}`: {self.ops} ops on the timeline, {err}{fix}{out}{note}{most}"


def decompressed(raw: bytes, name: str) -> bytes:
    """A gzipped trace's JSON, at most TORCH_TRACE_BYTES_MAX bytes of it."""
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(raw, TORCH_TRACE_BYTES_MAX + 1)
    except zlib.error as exc:
        raise TorchTraceError(f"{name}: not gzip ({exc})") from None
    if len(out) > TORCH_TRACE_BYTES_MAX or d.unconsumed_tail:
        raise TorchTraceError(f"{name}: more than TORCH_TRACE_BYTES_MAX "
                              f"({TORCH_TRACE_BYTES_MAX} bytes) of JSON once gunzipped: "
                              "not read")
    if not d.eof:
        raise TorchTraceError(f"{name}: the gzip stream ends early (a file cut short)")
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse(raw: bytes, name: str) -> tuple[int, tuple[dict[str, Any], ...]]:
    """A torch chrome trace's JSON -> (baseTimeNanoseconds, its events); TorchTraceError
    naming the file and the first thing that is not as torch writes it."""
    try:
        top = parse_json(raw, name)
    except BoundedReadError as exc:
        raise TorchTraceError(str(exc)) from None
    if not isinstance(top, dict) or not isinstance(top.get("traceEvents"), list):
        raise TorchTraceError(f"{name}: not a torch trace (no traceEvents list)")
    base = top.get("baseTimeNanoseconds")
    if not isinstance(base, int) or isinstance(base, bool) or base < 0:
        raise TorchTraceError(f"{name}: no baseTimeNanoseconds (ns since the epoch): its "
                              f"times cannot be put on the wall clock (found {base!r})")
    events = []
    for i, ev in enumerate(top["traceEvents"]):
        if not isinstance(ev, dict) or not isinstance(ev.get("ph"), str):
            raise TorchTraceError(f"{name}: event {i} is not a trace event (an object with "
                                  f"a string 'ph'): {str(ev)[:80]}")
        if "ts" in ev and not _number(ev["ts"]):
            raise TorchTraceError(f"{name}: event {i} has a ts that is not a number: "
                                  f"{ev['ts']!r}")
        if ev["ph"] == "X" and not (_number(ev.get("dur")) and ev["dur"] >= 0 and "ts" in ev):
            raise TorchTraceError(f"{name}: event {i} ('X') has no ts or no duration >= 0: "
                                  f"{str(ev)[:80]}")
        events.append(ev)
    return base, tuple(events)


def read_file(path: Path, name: str) -> tuple[int, tuple[dict[str, Any], ...]]:
    """One trace file, gzipped or not, read within TORCH_TRACE_BYTES_MAX."""
    try:
        raw = read_bytes(path, TORCH_TRACE_BYTES_MAX, "TORCH_TRACE_BYTES_MAX")
    except BoundedReadError as exc:
        raise TorchTraceError(str(exc)) from None
    except OSError as exc:
        raise TorchTraceError(f"{name}: cannot be read ({exc.strerror or exc})") from None
    if name.endswith(".gz"):
        raw = decompressed(raw, name)
    return parse(raw, name)


def _wall(base_ns: int, ts_us: float) -> int:
    return base_ns + round(ts_us * 1000)


def relate(base_ns: int, events: Sequence[Mapping[str, Any]],
           start_wall: Sequence[int] | None, stop_wall: Sequence[int] | None
           ) -> dict[str, Any]:
    """The clock placement of one trace (TorchTrace's fields), from Strata's stamps of
    ``/start_profile`` (sent, answered) and ``/stop_profile`` (sent, answered)."""
    ops = [e for e in events if e["ph"] == "X" and e.get("cat") != PROFILER_SPAN_CAT]
    spans = [e for e in events if e["ph"] == "X" and e.get("cat") == PROFILER_SPAN_CAT]
    first = min((_wall(base_ns, e["ts"]) for e in ops), default=None)
    last = max((_wall(base_ns, e["ts"] + e["dur"]) for e in ops), default=None)
    lo, hi = -math.inf, math.inf
    if spans and start_wall:
        t0 = _wall(base_ns, spans[0]["ts"])
        lo, hi = max(lo, t0 - start_wall[1]), min(hi, t0 - start_wall[0])
    if spans and stop_wall:
        t1 = _wall(base_ns, spans[0]["ts"] + spans[0]["dur"])
        lo, hi = max(lo, t1 - stop_wall[1]), min(hi, t1 - stop_wall[0])
    if first is not None and last is not None and start_wall and stop_wall:
        lo, hi = max(lo, last - stop_wall[1]), min(hi, first - start_wall[0])
    out: dict[str, Any] = {"ops": len(ops),
                           "span_ns": None if first is None or last is None else (first, last)}
    if math.isinf(lo) or math.isinf(hi):
        out["clock_note"] = ("no stamps of the window to check the clock against: placed "
                             "by baseTimeNanoseconds alone")
        return out
    lo_i, hi_i = int(lo), int(hi)
    out["offset_bounds_ns"] = (lo_i, hi_i)
    if lo_i > hi_i:
        out["clock_note"] = (f"the trace's own span and Strata's stamps disagree by "
                             f"{(lo_i - hi_i) / 1e6:.1f} ms: placed by baseTimeNanoseconds "
                             "alone")
        return out
    corr = 0 if lo_i <= 0 <= hi_i else (lo_i + hi_i) // 2
    out["correction_ns"] = corr
    out["error_ns"] = max(hi_i - corr, corr - lo_i)
    if start_wall and stop_wall:
        out["outside"] = sum(
            1 for e in ops if _wall(base_ns, e["ts"]) - corr < start_wall[0]
            or _wall(base_ns, e["ts"] + e["dur"]) - corr > stop_wall[1])
    return out


#: Annotations an engine puts around its waits for work, not its work: SGLang's
#: scheduler marks each stage of its loop ``scheduler.<stage>``, and its ``idle`` stage
#: (``sglang/srt/observability/scheduler_stage_metrics.py``, ``SCHEDULER_STAGE_IDLE``) is
#: where it waits, or sleeps under ``--sleep-on-idle``, between batches. Their own time is
#: no op's: a window of requests one at a time is mostly that wait, which would otherwise
#: lead "most of the ops' own time".
IDLE_ANNOTATIONS = frozenset({"scheduler.idle"})


def self_time_top(events: Sequence[Mapping[str, Any]], n: int = 3
                  ) -> tuple[tuple[str, float], ...]:
    """The ``n`` op names with the most own time (an op's duration less its children's,
    the ops it encloses on its thread), with their share of all ops' own time. Torch's
    ops nest (``aten::linear`` holds ``aten::addmm``), so summed durations would count a
    child's time once per ancestor. An engine's idle annotations (``IDLE_ANNOTATIONS``)
    hold no op time of their own: they are left out of the ranking and of the whole."""
    by_thread: dict[tuple[Any, Any], list[Mapping[str, Any]]] = {}
    for e in events:
        if e["ph"] == "X" and e.get("cat") != PROFILER_SPAN_CAT:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    own: dict[str, float] = {}
    for ops in by_thread.values():
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list[Any]] = []  # [end, name, own time so far]
        for e in ops:
            while stack and stack[-1][0] <= e["ts"]:
                _end, name, mine = stack.pop()
                own[name] = own.get(name, 0.0) + mine
            if stack:
                stack[-1][2] -= e["dur"]  # a child: not its parent's own time
            stack.append([e["ts"] + e["dur"], str(e.get("name", "")), float(e["dur"])])
        for _end, name, mine in stack:
            own[name] = own.get(name, 0.0) + mine
    for name in IDLE_ANNOTATIONS:
        own.pop(name, None)
    total = sum(v for v in own.values() if v > 0)
    if total <= 0:
        return ()
    ranked = sorted(own.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return tuple((name, v / total) for name, v in ranked if v > 0)


#: The thread ids given to the tracks torch names by a string ("PyTorch Profiler"):
#: above any real thread id (the kernel's pid_max is at most 2^22).
NAMED_TID0 = 1 << 22


def timeline_events(events: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The events the timeline keeps: the slices (ops, annotations, the profiler's own
    span) and the process and thread names. Torch names some tracks by a string (its
    span on pid "Spans", tid "PyTorch Profiler"): those get integer thread ids and a
    thread name, as both viewers need; its instants (the span's start and end again)
    and its labels and sort indexes (by the engine's real pids) are left out."""
    tids: dict[tuple[Any, Any], int] = {}
    named: set[tuple[Any, int]] = set()
    out: list[dict[str, Any]] = []
    for ev in events:
        if ev["ph"] == "M" and ev.get("name") in ("process_name", "thread_name"):
            e = dict(ev)
            e.pop("ts", None)  # a name holds for the whole trace
        elif ev["ph"] == "X":
            e = dict(ev)
        else:
            continue
        if "tid" in e and not (isinstance(e["tid"], int) and not isinstance(e["tid"], bool)):
            key = (e.get("pid"), e["tid"])
            if key not in tids:
                tids[key] = NAMED_TID0 + len(tids)
                out.append({"ph": "M", "name": "thread_name", "pid": e.get("pid"),
                            "tid": tids[key], "args": {"name": str(e["tid"]) or "torch"}})
                named.add((e.get("pid"), tids[key]))
            e["tid"] = tids[key]
        if e["ph"] == "M" and e["name"] == "thread_name":
            named.add((e.get("pid"), e["tid"]))
        out.append(e)
    for pid, tid in sorted({(e.get("pid"), e["tid"]) for e in out if e["ph"] == "X"} - named,
                           key=str):
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                    "args": {"name": f"thread {tid}"}})
    return tuple(out)


def read_torch(folder: Path, said: Mapping[str, Any]) -> tuple[TorchTrace, ...]:
    """Each torch trace file the capture's meta names (``engine_profiler.files``), read
    and placed; a file that cannot be comes back with its problem, the others stand."""
    out = []
    for rel in said.get("files") or ():
        name = str(rel)
        if not name.endswith(TRACE_SUFFIXES):
            continue  # vLLM's key-averages table beside the traces
        try:
            base, events = read_file(folder / name, name)
        except TorchTraceError as exc:
            out.append(TorchTrace(name, problem=str(exc)))
            continue
        placed = relate(base, events, said.get("start_wall_ns"), said.get("stop_wall_ns"))
        out.append(TorchTrace(name, base, timeline_events(events), top=self_time_top(events),
                              **placed))
    return tuple(out)

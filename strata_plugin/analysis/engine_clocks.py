"""The engine's own clocks of a request as the analysis uses them: each one within the
request the client timed, and those left out counted with their reasons.

The engine times a request's queue, prefill and decode inside the request the client
timed, from its dispatch to the stream's end. A clock longer than that span (plus
ENGINE_CLOCK_SLACK_MS and 1000 ppm, strata_plugin/limits.py) is not this request's in
milliseconds (an engine reporting seconds, or 1e300), and every figure built on it would
be wrong ("server decode tok/s 0", a ledger part longer than the request). Such a clock
is left out where the records are read (analysis/run_folder.py), named in the record's
``extra.engine_clock_dropped`` beside the fields the client dropped as it read the stream
(load/client/parse_base.py: a string, an integer past a float, Infinity); requests.jsonl
keeps what the engine sent. The case's verdict notes count them (:func:`dropped_line`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import fields, replace
from typing import Any

from strata_plugin.formats.records import RequestRecord
from strata_plugin.limits import ENGINE_CLOCK_SLACK_MS

DROPPED = "engine_clock_dropped"  # the key in RequestRecord.extra


def span_ms(rec: RequestRecord) -> float | None:
    """The request as the client timed it: dispatch to the stream's end (or its last
    event, for a stream cut short)."""
    end = rec.done_ns
    if end is None and rec.events:
        end = max(e.t_ns for e in rec.events)
    return None if end is None else (end - rec.dispatched_ns) / 1e6


def _longer(ms: float, span: float) -> str:
    return f"{ms:.6g} ms, past the {span:.6g} ms the client timed the request for"


def _within(x: Any, most: float, span: float, where: str, dropped: dict[str, str]) -> Any:
    if x is None:
        return None
    drop: dict[str, Any] = {}
    for f in fields(x):
        v = getattr(x, f.name)
        if f.name == "token_ms":
            if v and isinstance(v[-1], (int, float)) and v[-1] > most:
                drop[f.name] = ()
                dropped[f"{where}.token_ms"] = _longer(v[-1], span)
        elif (f.name.endswith("_ms") and isinstance(v, (int, float))
              and not isinstance(v, bool) and v > most):
            drop[f.name] = None
            dropped[f"{where}.{f.name}"] = _longer(v, span)
    return replace(x, **drop) if drop else x


def within_request(rec: RequestRecord) -> RequestRecord:
    """``rec`` without the engine clocks (``engine``, llama.cpp's ``timings``) longer than
    the request itself, each one left out named in ``extra.engine_clock_dropped``."""
    if rec.engine is None and rec.timings is None:
        return rec
    span = span_ms(rec)
    if span is None:
        return rec
    most = span * 1.001 + ENGINE_CLOCK_SLACK_MS
    dropped: dict[str, str] = {}
    timings = _within(rec.timings, most, span, "timings", dropped)
    engine = _within(rec.engine, most, span, "engine", dropped)
    if not dropped:
        return rec
    before = rec.extra.get(DROPPED)
    extra = {**rec.extra, DROPPED: {**(before if isinstance(before, dict) else {}), **dropped}}
    return replace(rec, timings=timings, engine=engine, extra=extra)


def dropped_line(records: Iterable[RequestRecord]) -> str | None:
    """The case's note: how many of its measured requests had engine clock fields left
    out, per field, with the first reason seen; None when none did."""
    measured = [r for r in records if r.phase == "measured"]
    per_field: Counter[str] = Counter()
    first_why: dict[str, str] = {}
    n_requests = 0
    for r in measured:
        d = r.extra.get(DROPPED)
        if not isinstance(d, dict) or not d:
            continue
        n_requests += 1
        for k, why in d.items():
            per_field[str(k)] += 1
            first_why.setdefault(str(k), str(why)[:200])
    if not n_requests:
        return None
    shown = sorted(per_field.items(), key=lambda kv: (-kv[1], kv[0]))
    parts = [f"{k} in {n} ({first_why[k]})" for k, n in shown[:5]]
    more = f"; {len(shown) - 5} more fields" if len(shown) > 5 else ""
    return (f"the engine's own clocks: fields left out in {n_requests} of {len(measured)} "
            f"requests (the requests stand): " + "; ".join(parts) + more)

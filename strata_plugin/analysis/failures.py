"""A case whose requests mostly failed: ``requests_failed``, before any resource rule.

Why first: the rules read a window's hardware and its requests' timing as the load the
case asked for. When most requests failed (HTTP 500, refused, a reply that was not a
stream), the server never had that load; a window of error replies looks idle, and the
rules then name ``input_starved`` or nothing at all for a server that did not serve. The
failures are the finding: their share, their error classes with counts, and the first
message the server sent, so the reader sees the cause without opening requests.jsonl.

The share that makes a case "mostly failed" is ``requests_failed_share`` in the one
threshold table (``analysis/thresholds.py``). The requests counted are the measured
ones (and the injected one); a case with no measured request (its warm-ups already
failed and stopped it) is judged by its warm-ups. Requests cut short by an interrupt
(``interrupted``) are the user's doing, not the server's, and are not counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from strata_plugin.analysis.rules import Evidence, Verdict
from strata_plugin.analysis.thresholds import threshold
from strata_plugin.formats.engine_events import ENGINE_EXIT, ENGINE_NEW, EngineEvent
from strata_plugin.formats.printable import printable
from strata_plugin.formats.records import ClockAnchor, RequestRecord

VERDICT_CLASS = "requests_failed"
#: The evidence's metric name (the failed share of the case's requests).
FAILED_SHARE = "failed_share"


@dataclass(frozen=True)
class RequestsFailed:
    """How a case's requests failed: counts by error class and the first message."""

    n_failed: int
    n_total: int
    by_class: tuple[tuple[str, int], ...]  # (error class, count), most frequent first
    first_message: str  # the earliest failed request's message (what the server said)
    phase: str = "measured"  # which requests were counted: "measured" or "warmup"

    @property
    def share(self) -> float:
        return self.n_failed / self.n_total if self.n_total else 0.0

    @property
    def mostly_failed(self) -> bool:
        return self.n_total > 0 and self.share >= threshold("requests_failed_share").value

    def line(self) -> str:
        """``4 of 4 requests failed (http_status: 4); first: HTTP 500: ...``"""
        counts = ", ".join(f"{cls}: {n}" for cls, n in self.by_class)
        what = "warm-up requests" if self.phase == "warmup" else "requests"
        # the server's words, on one line, its controls shown rather than obeyed
        first = printable(" ".join(self.first_message.split())[:300])
        return (f"{self.n_failed} of {self.n_total} {what} failed ({counts})"
                + (f"; first: {first}" if first else ""))


@dataclass
class FailureTally:
    """Counts records as they arrive (the live run keeps one per case; cheap)."""

    n_total: int = 0
    n_failed: int = 0
    by_class: dict[str, int] = field(default_factory=dict)
    first: tuple[int, str] | None = None  # (dispatched_ns, message) of the earliest failure
    warm_total: int = 0
    warm_failed: int = 0
    warm_by_class: dict[str, int] = field(default_factory=dict)
    warm_first: tuple[int, str] | None = None

    def add(self, rec: RequestRecord) -> None:
        if rec.error is not None and rec.error.cls == "interrupted":
            return  # cut short by the user (Ctrl-C), not failed by the server
        warm = rec.phase == "warmup"
        if warm:
            self.warm_total += 1
        else:
            self.n_total += 1
        if rec.error is None:
            return
        counts = self.warm_by_class if warm else self.by_class
        counts[rec.error.cls] = counts.get(rec.error.cls, 0) + 1
        here = (rec.dispatched_ns, rec.error.message)
        if warm:
            self.warm_failed += 1
            if self.warm_first is None or here < self.warm_first:
                self.warm_first = here
        else:
            self.n_failed += 1
            if self.first is None or here < self.first:
                self.first = here

    def summary(self) -> RequestsFailed | None:
        """The measured requests' failures; the warm-ups' when none was measured; None
        when there was no request at all."""
        if self.n_total:
            return RequestsFailed(self.n_failed, self.n_total, _ranked(self.by_class),
                                  self.first[1] if self.first else "")
        if self.warm_total:
            return RequestsFailed(self.warm_failed, self.warm_total,
                                  _ranked(self.warm_by_class),
                                  self.warm_first[1] if self.warm_first else "", "warmup")
        return None


class RunFailures:
    """Every case's :class:`FailureTally`, counted as the live run records its requests,
    and the failures each case allows (its ``allow_errors``): a case whose requests
    mostly failed in ways it did not allow makes the run incomplete, with its counts."""

    def __init__(self) -> None:
        self.tallies: dict[str, FailureTally] = {}
        self.allowed: dict[str, bool | tuple[str, ...]] = {}  # case id -> allow_errors

    def add(self, rec: RequestRecord) -> None:
        tally = self.tallies.get(rec.case_id)
        if tally is None:
            tally = self.tallies[rec.case_id] = FailureTally()
        tally.add(rec)

    def allow(self, case_id: str, allow_errors: bool | tuple[str, ...]) -> None:
        self.allowed[case_id] = allow_errors

    def lines(self) -> list[str]:
        """``case X: requests_failed: 4 of 4 requests failed (...)`` per case whose
        requests mostly failed in ways it did not allow (``allow_errors``)."""
        out = []
        for case_id, tally in self.tallies.items():
            f = tally.summary()
            if f is None or not f.mostly_failed:
                continue
            allowed = self.allowed.get(case_id)
            if allowed is True or (allowed and {c for c, _ in f.by_class} <= set(allowed)):
                continue  # a case that expects these failures (a fault case) measured them
            out.append(f"case {case_id}: requests_failed: {f.line()}")
        return out

def _ranked(counts: dict[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def failures_of(records: Iterable[RequestRecord]) -> RequestsFailed | None:
    """The failures of one case's records (every phase; see :class:`FailureTally`)."""
    tally = FailureTally()
    for r in records:
        tally.add(r)
    return tally.summary()


def mostly_failed(records: Iterable[RequestRecord]) -> RequestsFailed | None:
    """The case's failures when they reach ``requests_failed_share``, else None."""
    f = failures_of(records)
    return f if f is not None and f.mostly_failed else None


def failed_verdict(f: RequestsFailed) -> Verdict:
    """The ``requests_failed`` verdict: no resource class, the failures as its evidence.

    Confident (1.0) and conclusive: the failures were counted, not inferred. The
    resource rules are not consulted, so nothing is "missing" for them.
    """
    t = threshold("requests_failed_share")
    ev = Evidence(cls=VERDICT_CLASS, metric=FAILED_SHARE, value=round(f.share, 4), op=">=",
                  threshold=t.name, threshold_value=t.value, unit=t.unit, source=t.source,
                  met=True)
    return Verdict(classes=(VERDICT_CLASS,), evidence=(ev,), confidence=1.0,
                   inconclusive=False, finer_trace=(), missing_signals=(),
                   notes=(f.line(), "the resource rules were not consulted: the server did "
                          "not serve the load the case asked for"))


# --- an engine that died mid-run, and the failures it caused ---------------------------


def request_end_ns(rec: RequestRecord) -> int:
    """When a request ended as the client saw it (monotonic): its stream's end, else its
    last event, else its first byte, else its dispatch (a connection refused)."""
    ends = [t for t in (rec.done_ns, rec.first_byte_ns) if t is not None]
    ends += [e.t_ns for e in rec.events[-1:]]
    return max(ends, default=rec.dispatched_ns)


@dataclass(frozen=True)
class EngineOutage:
    """A followed engine that ended, the one that took over (if any), and the failed
    requests tied to it: those that ended from ``engine_outage_margin_s`` before the
    death (the watch's last look that saw the engine alive) to as long after the new
    engine's first answer (the first request answered after the death; the takeover
    itself where none was; the run's end where no engine took over)."""

    died: EngineEvent
    new: EngineEvent | None
    first_answer_wall_ns: int | None
    tied_failed: int | None  # None: the requests could not be placed (no clock anchor)
    margin_s: float

    def line(self, case_id: str = "", case_start_wall_ns: int | None = None) -> str:
        """``the engine (pid 1234) died 4.2 s into case x: killed by SIGKILL; pid 1301
        took over port 8080 1.1 s later; 3 failed requests tied to it (...)``"""
        d = self.died
        when = ""
        if case_start_wall_ns is not None:
            when = f" {(d.wall_ns - case_start_wall_ns) / 1e9:.1f} s into case `{case_id}`"
        how = (f"killed by {d.how.removeprefix('signal ')}" if d.how.startswith("signal ")
               else f"exited with code {d.how.removeprefix('exit code ')}"
               if d.how.startswith("exit code ")
               else "gone (not Strata's child: how it ended went to its own parent)"
               if d.how == "gone" else d.how)
        out = f"the engine (pid {d.pid}) died{when}: {how}"
        if self.new is not None:
            where = f" port {self.new.port}" if self.new.port else " its port"
            out += (f"; pid {self.new.pid} took over{where} "
                    f"{(self.new.wall_ns - d.wall_ns) / 1e9:.1f} s later")
        else:
            out += "; no engine took over its port"
        span = ("its death and the new engine's first answer" if self.first_answer_wall_ns
                else "its death and the run's end")
        n = self.tied_failed
        if n is None:
            return out + "; its failed requests cannot be placed (no clock anchor)"
        return (out + f"; {n} failed request{'' if n == 1 else 's'} tied to it (ended "
                f"between {span}, ±{self.margin_s:g} s: engine_outage_margin_s)")


def engine_outages(events: Sequence[EngineEvent], records: Iterable[RequestRecord],
                   anchor: ClockAnchor | None) -> list[EngineOutage]:
    """Each engine death among ``events`` with its successor and its failed requests
    (``records``: the run's, on the monotonic clock ``anchor`` puts on the wall's)."""
    margin_s = threshold("engine_outage_margin_s").value
    if anchor is None:
        return [EngineOutage(d, next((e for e in events[i + 1:] if e.kind == ENGINE_NEW),
                                     None), None, None, margin_s)
                for i, d in enumerate(events) if d.kind == ENGINE_EXIT]
    margin = int(margin_s * 1e9)
    recs = [(anchor.to_wall_ns(request_end_ns(r)), r) for r in records
            if not (r.error is not None and r.error.cls == "interrupted")]
    out = []
    for i, died in enumerate(events):
        if died.kind != ENGINE_EXIT:
            continue
        new = next((e for e in events[i + 1:] if e.kind == ENGINE_NEW), None)
        answers = [anchor.to_wall_ns(r.first_byte_ns) for _, r in recs
                   if r.ok and r.first_byte_ns is not None
                   and anchor.to_wall_ns(r.first_byte_ns) >= died.after_ns]
        first = min(answers) if answers else (new.wall_ns if new is not None else None)
        hi = (first + margin) if first is not None else None
        lo = died.after_ns - margin  # it died after the watch's last look saw it alive
        tied = sum(1 for end, r in recs if not r.ok and end >= lo and (hi is None or end <= hi))
        out.append(EngineOutage(died, new, first, tied, margin_s))
    return out

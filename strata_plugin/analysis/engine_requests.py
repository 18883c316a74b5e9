"""Which engine served each request, and each engine's share and pace of a case's requests.

Behind a router that opens one upstream connection per client connection, the engine
that served a request holds a connection that opened when the request was sent and
closed when it ended. The agent records every engine's connections on a 20 ms grid
(``agent/collectors/conns.py``: first and last seen, source ``conns``, metric
``conn_open_s``, device ``pid<N>``, with the spans it opened and closed in: the grid
step as it was kept). A request is attributed to an engine when that engine, and no
other, had a connection that opened within ``engine_conn_match_s`` of the request's
dispatch and closed within it of the request's end (both on the harness's clock).
Otherwise its engine is not known, for one of the reasons of :data:`REASONS`:
a router that keeps a pool of connections to its engines open (keep-alive), or two
engines' requests that began and ended together, cannot be told apart this way.

An engine is keyed by its root PID (the process the agent follows for it), as in
``analysis/engine_lines.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strata_plugin.analysis import thresholds
from strata_plugin.analysis.engine_lines import EngineLine
from strata_plugin.analysis.stats import median
from strata_plugin.analysis.timeline import SampleStore

#: Where the agent records each engine's connections (agent/collectors/conns.py).
SOURCE, METRIC = "conns", "conn_open_s"
OPENED, CLOSED = "conn_opened_within_s", "conn_closed_within_s"

#: Why a request's engine is not known, in the user's words.
REASONS = {
    "no_connection": "no engine had a connection that opened and closed with it (a router "
                     "that keeps its connections to the engines open, or a connection that "
                     "came and went between two of the agent's steps: 20 ms apart, more "
                     "while the agent is kept from a CPU)",
    "several": "more than one engine had a connection that opened and closed with it "
               "(requests on several engines that began and ended together)",
    "unfinished": "it never ended (cut, or still open when the case ended)",
    "no_clock": "the run has no clock anchor to place the request on the samples' clock",
    "no_samples": "the agent recorded no engine's connections (its conns collector was "
                  "not running)",
}


@dataclass(frozen=True)
class Span:
    """One request's span on the harness's wall clock (ns), or why it has none."""

    request_id: str
    start_ns: int | None
    end_ns: int | None


@dataclass(frozen=True)
class Attribution:
    """Each request's engine (its root PID), and the reason for each one not known."""

    engine_of: Mapping[str, int]  # request id -> engine PID
    not_known: Mapping[str, str]  # request id -> a key of REASONS

    def reasons(self) -> str:
        """``2 not known: 1 ...; 1 ...`` or ``""``."""
        n = Counter(self.not_known.values())
        return "; ".join(f"{c} {REASONS[k]}" for k, c in sorted(n.items(), key=lambda x: -x[1]))


@dataclass(frozen=True)
class Conn:
    """One engine connection on the harness's clock (ns): it opened in
    (``opened_after``, ``first_seen``] and closed in [``last_seen``, ``closed_before``)."""

    opened_after: int
    first_seen: int
    last_seen: int
    closed_before: int

    def opened_and_closed_with(self, start: int, end: int, slack: int) -> bool:
        return (self.opened_after - slack <= start <= self.first_seen + slack
                and self.last_seen - slack <= end <= self.closed_before + slack)


def _series(store: SampleStore, node: str, dev: str, metric: str) -> tuple[Any, Any]:
    found = store.find(node=node, source=SOURCE, metric=metric, device=dev)
    return store.series(found[0]) if found else ((), ())


def connections(store: SampleStore, pids: Iterable[int]) -> dict[int, list[Conn]]:
    """Each engine's connections: the k-th row of each of its three series is one
    connection (agent/collectors/conns.py)."""
    out: dict[int, list[Conn]] = {}
    for pid in pids:
        conns = out.setdefault(pid, [])
        dev = f"pid{pid}"
        for node in sorted({store.keys[i].node for i in store.find(source=SOURCE,
                                                                   device=dev)}):
            t, seen = _series(store, node, dev, METRIC)
            _, opened = _series(store, node, dev, OPENED)
            _, closed = _series(store, node, dev, CLOSED)
            for a, s, o, c in zip(t, seen, opened, closed):
                first = int(a)
                last = first + round(float(s) * 1e9)
                conns.append(Conn(first - round(float(o) * 1e9), first, last,
                                  last + round(float(c) * 1e9)))
    return out


def attribute(spans: Sequence[Span], conns: Mapping[int, Sequence[Conn]]) -> Attribution:
    """Each request to the one engine whose connection opened and closed with it (module
    docstring)."""
    slack = int(thresholds.value("engine_conn_match_s") * 1e9)
    recorded = any(conns.values())
    engine_of: dict[str, int] = {}
    not_known: dict[str, str] = {}
    for s in spans:
        if s.start_ns is None:
            not_known[s.request_id] = "no_clock"
            continue
        if s.end_ns is None:
            not_known[s.request_id] = "unfinished"
            continue
        if not recorded:
            not_known[s.request_id] = "no_samples"
            continue
        start, end = s.start_ns, s.end_ns
        hits = {pid for pid, cs in conns.items()
                if any(c.opened_and_closed_with(start, end, slack) for c in cs)}
        if len(hits) == 1:
            engine_of[s.request_id] = hits.pop()
        else:
            not_known[s.request_id] = "several" if hits else "no_connection"
    return Attribution(engine_of, not_known)


@dataclass(frozen=True)
class EnginePace:
    """One engine's part of a case: the requests it served and their pace."""

    pid: int
    served: int
    of: int  # the case's requests considered (attributed or not)
    tpot_ms: float | None  # median time per output token of those it served
    e2e_ms: float | None  # median end-to-end latency of those it served
    paced: int = 0  # those of them with a TPOT (the median's count)

    @property
    def share(self) -> float | None:
        return self.served / self.of if self.of else None


def paces(attribution: Attribution, pids: Sequence[int],
          tpot_ms: Mapping[str, float | None], e2e_ms: Mapping[str, float | None]
          ) -> tuple[EnginePace, ...]:
    """Each engine's share of the requests and the medians of those it served
    (``tpot_ms`` / ``e2e_ms``: each request's own, ``analysis/metrics.py``)."""
    of = len(attribution.engine_of) + len(attribution.not_known)
    out = []
    for pid in pids:
        mine = [r for r, p in attribution.engine_of.items() if p == pid]
        tp = [x for x in (tpot_ms.get(r) for r in mine) if x is not None]
        ee = [x for x in (e2e_ms.get(r) for r in mine) if x is not None]
        out.append(EnginePace(pid, len(mine), of, median(tp) if tp else None,
                              median(ee) if ee else None, len(tp)))
    return tuple(out)


@dataclass(frozen=True)
class Imbalance:
    """One engine slower than the fastest beyond ``engine_pace_ratio``."""

    slow: EnginePace
    fastest: EnginePace

    @property
    def ratio(self) -> float:
        assert self.slow.tpot_ms is not None and self.fastest.tpot_ms  # imbalance() checks
        return self.slow.tpot_ms / self.fastest.tpot_ms


def imbalance(engine_paces: Sequence[EnginePace]) -> Imbalance | None:
    """The slowest engine by median TPOT against the fastest, where its median is over
    ``engine_pace_ratio`` times the fastest's; each compared engine has at least
    ``engine_pace_min_requests`` requests with a TPOT. TPOT, not end-to-end latency: a
    request's length and its queue are not the engine's pace."""
    least = thresholds.value("engine_pace_min_requests")
    known = sorted((p for p in engine_paces
                    if p.tpot_ms is not None and p.tpot_ms > 0 and p.paced >= least),
                   key=lambda p: (p.tpot_ms, p.pid))
    if len(known) < 2:
        return None
    found = Imbalance(known[-1], known[0])
    return found if found.ratio > thresholds.value("engine_pace_ratio") else None


def imbalance_finding(found: Imbalance | None, lines: Sequence[EngineLine]) -> str:
    """The finding in words: the slow engine, its pace against the fastest's, and its
    cause from its own evidence (its quota where it holds it), or ""."""
    if found is None:
        return ""
    by_pid = {x.pid: x for x in lines}
    slow, fast = by_pid.get(found.slow.pid), by_pid.get(found.fastest.pid)
    assert found.slow.tpot_ms is not None and found.fastest.tpot_ms is not None
    head = (f"Slower than the others: PID {found.slow.pid}, median TPOT "
            f"{found.slow.tpot_ms:.3g} ms over {found.slow.paced} requests against "
            f"{found.fastest.tpot_ms:.3g} ms on PID {found.fastest.pid}"
            f"{f' `{fast.name}`' if fast and fast.name else ''} ({found.ratio:.2f}x, over "
            f"{thresholds.value('engine_pace_ratio'):g}x).")
    if slow is None:
        return head + " It has no samples of its own in this window to name a cause."
    if slow.held_by_quota:
        return f"{head} Cause, from its own evidence: its own CPU quota. {slow.evidence()}."
    return f"{head} Its own evidence names no cause: {slow.evidence()}."

"""Delivery told apart from the server's pace: when the tokens were made, when they came.

The client's clock says when each token event arrived; a gap between two events is the
server's time to make the next token *plus* any change in how long the path held it. A
reverse proxy that buffers the response (nginx ``proxy_buffering``, a gateway that
flushes every N ms) holds tokens the server made at a steady pace and hands them over
late and in clumps: the client sees long gaps and bursts, as if the server stalled.
Only the server's own token clock separates the two.

**With the server's token clock** (``EngineClocks.token_ms``: llama.cpp's
``timings_per_token``, when it produced each token event, ms after the first): each
event's offset is its arrival (ms after the first arrival) less its production; the
path's constant is the least offset over the request (the fastest any token got
through), and an event's *delivery delay* is its offset beyond that constant. A gap the
client saw is the server's production between the same two events plus the change in
delivery delay; where the gap exceeds the production by ``delivery_gap_min_ms`` (or the
client's own clock error, if larger), that excess is delivery: the time the client
waited beyond the next token's production. The first token's delivery delay is
delivery too (in TTFT). Tokens a flush hands over together arrive in gaps shorter than
their production and count as the server's only up to the gap the client saw, so a
stream flushed every P ms at pace q reads (P - q) / P of its decode time as delivery:
what the client waited beyond the server's next token.

The stamp is taken in the engine's loop, before the server's own HTTP thread sends the
token, so two holders after the stamp are not the path, and are taken out:

* the server's sender: a late gap during which the server's threads were held from a
  CPU (run queue, CFS quota, frozen, stopped) for ``delivery_server_held_frac`` of it
  held its sender too, and is a stall of the server (a 0.5-CPU quota on 3.7 runnable
  threads read 15% of TPOT/ITL as delivery, gaps held 85-100% of their time);
* the client: a request whose only late read is within the client's own worst loop lag
  (its self-check's probe, plus the probe's interval) had that read late because the
  client's loop was (a 100 ms hiccup of the loop, seen by every stream in flight at
  once, read 16% of a short decode case as delivery). A flush pattern (two late reads or
  more) stays delivery whatever the client's lag.

**Without one** (vLLM, SGLang, a llama.cpp build that does not stamp tokens): the
clumping itself is evidence, weaker: a read that carries ``delivery_burst_events`` token
events or more after a gap, while the server's run state over the gap shows it running
(``delivery_running_frac`` of the time the samples cover), had its tokens made during
the gap and held; the gap beyond one token's time at the request's mean pace is
delivery. It takes two such reads in a request (a flush pattern, not one late read),
and no speculative decoding (whose verify steps hand over their tokens at once: the
server's own bursts). Without run-state samples nothing is inferred, and the note says
so. What clumping cannot tell apart, the token clock can: a client that read late, or
a server whose own HTTP thread sent late, clump the stream alike.

The ledger (analysis/ledger.py) takes delivery out of the gaps before it looks for
stalls, and judges stalls against the server's pace (its own clock where it has one).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from strata_plugin.analysis.run_states import MIN_COVERAGE, RunStates
from strata_plugin.analysis.thresholds import value as threshold_value
from strata_plugin.formats.records import ClockAnchor, RequestRecord, TokenEvent
from strata_plugin.load.client.loopstats import PROBE_S

TOKEN_CLOCK, CLUMPING = "token_clock", "clumping"
EVIDENCE = {
    TOKEN_CLOCK: "the server's own token clock (when it made each token against when the "
                 "client read it)",
    CLUMPING: "clumping alone (token events read together after gaps while the server ran; "
              "no server token clock: weaker evidence)",
}
_NS_MS = 1e6
#: The run states in which the server's threads could not run: its own sender among them.
HELD_STATES = ("waiting", "throttled", "stalled")
SERVER_HELD_NOTE = ("tokens stamped, then held while the server's threads were held from a "
                    "CPU (delivery_server_held_frac of the gap): the server's own sender, "
                    "not the path; a stall of the server")
CLIENT_HICCUP_NOTE = ("a request's one late read within the client's own worst loop lag "
                      "(plus its probe interval): the client's hiccup, not the path")


@dataclass(frozen=True)
class RequestDelivery:
    """One request's delivery delays, on the ledger's gaps (token events in arrival order)."""

    evidence: str = ""  # TOKEN_CLOCK | CLUMPING | "" (no split)
    gap_ms: tuple[float, ...] = ()  # per gap i (events i -> i+1): the delivery part, ms
    first_ms: float = 0.0  # the first token's delivery delay beyond the path's constant
    #: the server's time per token between events (its own clock, or the request's mean
    #: pace where delivery was inferred from clumping): the ledger's stall yardstick
    pace_ms: float | None = None
    bursts: tuple[int, ...] = ()  # token events in each read that ended a delivery gap
    flush_ms: tuple[float, ...] = ()  # the intervals between those reads
    note: str = ""  # why nothing was split where it could have been

    @property
    def total_ms(self) -> float:
        return self.first_ms + sum(self.gap_ms)


NONE = RequestDelivery()


def _floor_ms(clock_error_ms: float | None) -> float:
    return max(threshold_value("delivery_gap_min_ms"), clock_error_ms or 0.0)


def _reads(toks: Sequence[TokenEvent]) -> Counter[int]:
    """Token events per read: one read stamps every event it completes with its time."""
    return Counter(e.t_ns for e in toks)


def _pattern(toks: Sequence[TokenEvent], gap_ms: Sequence[float]
             ) -> tuple[tuple[int, ...], tuple[float, ...]]:
    ends = [i + 1 for i, d in enumerate(gap_ms) if d > 0]
    reads = _reads(toks)
    bursts = tuple(reads[toks[i].t_ns] for i in ends)
    flush = tuple((toks[b].t_ns - toks[a].t_ns) / _NS_MS for a, b in pairwise(ends))
    return bursts, flush


def request_delivery(
    rec: RequestRecord,
    toks: Sequence[TokenEvent] | None = None,
    *,
    states: RunStates | None = None,
    anchor: ClockAnchor | None = None,
    clock_error_ms: float | None = None,
    client_lag_max_ms: float | None = None,
) -> RequestDelivery:
    """The delivery split of one request. ``toks``: its token-bearing events in arrival
    order (the ledger's); by default taken from the record. ``client_lag_max_ms``: the
    client's own worst loop lag (its self-check), which explains one late read."""
    if toks is None:
        toks = sorted((e for e in rec.events if e.n_tokens > 0), key=lambda e: e.t_ns)
    if len(toks) < 2:
        return NONE
    eng = rec.engine
    if eng is not None and len(eng.token_ms) == len(toks):
        out = _by_token_clock(toks, eng.token_ms, _floor_ms(clock_error_ms), states, anchor,
                              client_lag_max_ms)
        if out is not None:
            return out
    if served_with_drafts(rec):  # speculative decoding: the server itself sends tokens in bursts
        return NONE
    return _by_clumping(toks, states, anchor, _floor_ms(clock_error_ms))


def served_with_drafts(rec: RequestRecord) -> bool:
    """The request was served with speculative decoding: each verify step hands over its
    accepted tokens at once, so clumped reads are the server's, not the path's."""
    t, eng = rec.timings, rec.engine
    return bool((t is not None and t.draft_n) or (eng is not None and eng.draft_tokens)
                or rec.extra.get("spec_verify_ct"))


def _server_held(a_ns: int, b_ns: int, states: RunStates | None,
                 anchor: ClockAnchor | None) -> bool:
    """The server's threads were held from a CPU (run queue, CFS quota, frozen or
    stopped) for ``delivery_server_held_frac`` of the span the samples cover."""
    if states is None or anchor is None:
        return False
    secs, covered = states.over(anchor.to_wall_ns(a_ns), anchor.to_wall_ns(b_ns))
    if covered <= 0 or covered < MIN_COVERAGE * (b_ns - a_ns) / 1e9:
        return False
    held = sum(secs[s] for s in HELD_STATES)
    return held / covered >= threshold_value("delivery_server_held_frac")


def _by_token_clock(toks: Sequence[TokenEvent], made: Sequence[float], floor: float,
                    states: RunStates | None = None, anchor: ClockAnchor | None = None,
                    client_lag_max_ms: float | None = None) -> RequestDelivery | None:
    if any(b < a for a, b in pairwise(made)):
        return None  # a clock that runs backwards is not a token clock
    t0 = toks[0].t_ns
    got = [(e.t_ns - t0) / _NS_MS for e in toks]
    offset = [g - m for g, m in zip(got, made, strict=True)]
    path = min(offset)
    first = offset[0] - path
    gaps = []
    per_token = []
    notes = []
    n_held = 0
    for i in range(1, len(toks)):
        seen, produced = got[i] - got[i - 1], made[i] - made[i - 1]
        excess = seen - produced
        if excess >= floor and _server_held(toks[i - 1].t_ns, toks[i].t_ns, states, anchor):
            n_held += 1  # stamped, then held by the server's own sender: not the path's
            excess = 0.0
        gaps.append(excess if excess >= floor else 0.0)
        if toks[i].n_tokens > 0:
            per_token.append(produced / toks[i].n_tokens)
    first = first if first >= floor else 0.0
    if first and _server_held(toks[0].t_ns - int(first * _NS_MS), toks[0].t_ns, states,
                              anchor):
        n_held += 1
        first = 0.0
    if n_held:
        notes.append(SERVER_HELD_NOTE)
    late = [i for i, d in enumerate(gaps) if d > 0]
    if (len(late) == 1 and not first and client_lag_max_ms is not None
            and gaps[late[0]] <= client_lag_max_ms + PROBE_S * 1e3):
        gaps[late[0]] = 0.0
        notes.append(CLIENT_HICCUP_NOTE)
    bursts, flush = _pattern(toks, gaps)
    return RequestDelivery(
        evidence=TOKEN_CLOCK, gap_ms=tuple(gaps), first_ms=first,
        pace_ms=statistics.median(per_token) if len(per_token) >= 2 else None,
        bursts=bursts, flush_ms=flush, note="; ".join(notes))


def _by_clumping(toks: Sequence[TokenEvent], states: RunStates | None,
                 anchor: ClockAnchor | None, floor: float) -> RequestDelivery:
    n_min = int(threshold_value("delivery_burst_events"))
    # the first event of each read that carries n_min token events or more (not the first
    # read: nothing before it in the decode)
    reads = _reads(toks)
    starts = [i for i in range(1, len(toks))
              if toks[i].t_ns != toks[i - 1].t_ns and reads[toks[i].t_ns] >= n_min]
    if not starts:
        return NONE
    if states is None or anchor is None:
        return RequestDelivery(note=f"{len(starts)} reads of {n_min}+ token events after a "
                                    "gap, not assessed as delivery: no run-state samples")
    decode_ms = (toks[-1].t_ns - toks[0].t_ns) / _NS_MS
    n_out = sum(e.n_tokens for e in toks[1:])
    pace = decode_ms / n_out if n_out else None
    if pace is None:
        return NONE
    running_min = threshold_value("delivery_running_frac")
    gaps = [0.0] * (len(toks) - 1)
    for i in starts:
        a, b = toks[i - 1].t_ns, toks[i].t_ns
        excess = (b - a) / _NS_MS - toks[i].n_tokens * pace
        if excess < floor:
            continue
        secs, covered = states.over(anchor.to_wall_ns(a), anchor.to_wall_ns(b))
        if covered <= 0 or covered < MIN_COVERAGE * (b - a) / 1e9:
            continue
        if secs["running"] / covered >= running_min:
            gaps[i - 1] = excess
    if sum(1 for d in gaps if d > 0) < 2:
        return NONE  # one late read is not a flush pattern (a client or host hiccup)
    bursts, flush = _pattern(toks, gaps)
    return RequestDelivery(evidence=CLUMPING, gap_ms=tuple(gaps), pace_ms=pace,
                           bursts=bursts, flush_ms=flush)


@dataclass(frozen=True)
class CaseDelivery:
    """A case's delivery: which evidence, how many requests it covered, the pattern."""

    #: TOKEN_CLOCK where any request had the server's token clock, else CLUMPING where
    #: any was inferred from clumping, else ""
    evidence: str
    n_requests: int
    n_clocked: int  # requests whose split came from the server's token clock
    n_delayed: int  # requests with any delivery delay
    burst_events: float | None  # median token events per burst
    flush_ms: float | None  # median interval between bursts
    notes: tuple[str, ...] = field(default=())

    def line(self) -> str:
        """The evidence sentence beside ``outside_server`` (delivery)."""
        if not self.evidence:
            return ""
        pat = ""
        if self.burst_events is not None:
            every = f" every {self.flush_ms:.0f} ms" if self.flush_ms is not None else ""
            pat = f"bursts of {self.burst_events:.0f} token events{every} (medians); "
        return (f"delivery: {pat}{self.n_delayed} of {self.n_requests} requests held on the "
                f"way to the client; evidence: {EVIDENCE[self.evidence]}"
                + (f", {self.n_clocked} of {self.n_requests} requests stamped"
                   if self.evidence == TOKEN_CLOCK else ""))


def case_delivery(splits: Sequence[RequestDelivery]) -> CaseDelivery:
    clocked = [d for d in splits if d.evidence == TOKEN_CLOCK]
    clumped = [d for d in splits if d.evidence == CLUMPING]
    delayed = [d for d in splits if d.total_ms > 0]
    bursts = [b for d in delayed for b in d.bursts]
    flush = [f for d in delayed for f in d.flush_ms]
    return CaseDelivery(
        evidence=TOKEN_CLOCK if clocked else CLUMPING if clumped else "",
        n_requests=len(splits), n_clocked=len(clocked), n_delayed=len(delayed),
        burst_events=statistics.median(bursts) if bursts else None,
        flush_ms=statistics.median(flush) if flush else None,
        notes=tuple(sorted({d.note for d in splits if d.note})))

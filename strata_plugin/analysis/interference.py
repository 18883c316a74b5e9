"""Prefill-decode interference, measured from the token stream of every decode request.

A long prefill sharing a server with running decodes stalls them: the engine spends
its steps on the prompt, and the streams wait. Two facts separate that from any other
slow token: *when* the stall happened, and whether a prefill was in flight then. A
prefill is in flight from a request's dispatch to its first token (client view); where
the server reports ``timings.prompt_ms`` (llama.cpp), the server's own prefill is the
last ``prompt_ms`` before that first token.

Per decode request (measured, successful, two tokens or more): how long its decode
span overlapped the injected prefill, its longest stall, and its pace (ms per token)
inside and outside that overlap. Per case:

* ``interference_factor``: mean time per token of gaps that overlap the injected
  prefill, over the mean outside it, minus 1 (0: no effect);
* ``stall_ms_per_request``: summed stall time (a gap past ``STALL_FACTOR`` x the case's
  median time per token, counted beyond that median) per decode request, split by what
  was in flight: the injected prefill, another request's prefill, or no prefill (a
  stall with no prefill in flight is not interference);
* ``tokens_lost``: output tokens the load would have produced during the injected
  prefill at its pace outside it, minus those it produced.

A gap the time ledger put down to delivery (``delivered``: tokens the server made and
the path held, analysis/delivery.py) is not the server's: only its rest can be a stall,
and the gaps between token events read together (clumped by the path) say nothing of
the server's pace, so a request with delivery gives the pace only its other gaps.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from strata_plugin.analysis.metrics import first_token_ns
from strata_plugin.formats.records import RequestRecord

#: A gap is a stall past this many times the case's median time per token.
STALL_FACTOR = 3.0

Span = tuple[int, int]  # monotonic ns, start <= end


def _overlap(a: Span, b: Span) -> int:
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))


def _token_times(rec: RequestRecord) -> list[tuple[int, int]]:
    """(t_ns, n_tokens) of token-bearing events, in arrival order."""
    return sorted((e.t_ns, e.n_tokens) for e in rec.events if e.n_tokens > 0)


def prefill_span(rec: RequestRecord) -> Span | None:
    """Dispatch to first token: the request's prefill (and queueing) in flight."""
    first = first_token_ns(rec)
    return None if first is None else (rec.dispatched_ns, max(first, rec.dispatched_ns))


def server_prefill_span(rec: RequestRecord) -> Span | None:
    """The server's own prefill: the last ``timings.prompt_ms`` before the first token."""
    first = first_token_ns(rec)
    if first is None or rec.timings is None or rec.timings.prompt_ms is None:
        return None
    return max(rec.dispatched_ns, first - int(rec.timings.prompt_ms * 1e6)), first


@dataclass(frozen=True)
class RequestInterference:
    """One decode request against the injected prefill."""

    request_id: str
    overlap_ms: float  # its decode span (first..last token) overlapping the injected prefill
    longest_stall_ms: float  # its longest gap between token-bearing events
    longest_stall_during: str  # "injected" | "prefill" | "none": what was in flight then
    ms_per_token_inside: float | None  # pace in gaps overlapping the injected prefill
    ms_per_token_outside: float | None


@dataclass(frozen=True)
class Interference:
    """One case's decode streams against the prefills in flight while they ran."""

    case_id: str
    n_decode: int  # decode requests (measured, ok, >= 2 token events)
    median_ms_per_token: float | None  # the case's typical pace, the stall yardstick
    decode_ms_per_request: float  # mean first-to-last-token span of a decode request
    stall_ms_per_request: float  # all stalls
    stall_injected_ms_per_request: float  # stalls while the injected prefill was in flight
    stall_prefill_ms_per_request: float  # stalls while another request's prefill was
    stall_no_prefill_ms_per_request: float  # stalls with no prefill in flight
    longest_stall_ms: float | None
    longest_stall_during: str  # "injected" | "prefill" | "none" | ""
    # the injected prefill (None without one)
    injected_id: str | None = None
    injected_ms: float | None = None  # dispatch to first token
    injected_server_prompt_ms: float | None = None
    n_overlapping: int = 0  # decode requests whose decode span overlapped it
    ms_per_token_inside: float | None = None
    ms_per_token_outside: float | None = None
    interference_factor: float | None = None
    tokens_lost: float | None = None
    requests: tuple[RequestInterference, ...] = ()

    @property
    def stall_with_prefill_ms_per_request(self) -> float:
        return self.stall_injected_ms_per_request + self.stall_prefill_ms_per_request

    @property
    def prefill_stall_frac(self) -> float | None:
        """Stall time with a prefill in flight, over decode time."""
        if not self.n_decode or self.decode_ms_per_request <= 0:
            return None
        return self.stall_with_prefill_ms_per_request / self.decode_ms_per_request

    @property
    def prefill_stall_share(self) -> float | None:
        """The share of all stall time that coincided with a prefill in flight."""
        if not self.n_decode:
            return None
        if self.stall_ms_per_request <= 0:
            return 0.0
        return self.stall_with_prefill_ms_per_request / self.stall_ms_per_request

    def line(self) -> str:
        """The evidence sentence the report and the verdict quote."""
        head = (f"stall {self.stall_ms_per_request:.1f} ms per decode request "
                f"({self.stall_with_prefill_ms_per_request:.1f} with a prefill in flight, "
                f"{self.stall_no_prefill_ms_per_request:.1f} without)")
        if self.injected_id is None:
            return head
        parts = [head, f"{self.n_overlapping} of {self.n_decode} decode requests overlapped "
                       f"the injected prefill ({_f(self.injected_ms)} ms in flight)"]
        if self.interference_factor is not None:
            parts.append(f"interference factor {self.interference_factor:+.2f} "
                         f"({_f(self.ms_per_token_inside)} vs "
                         f"{_f(self.ms_per_token_outside)} ms/token)")
        if self.tokens_lost is not None:
            parts.append(f"{self.tokens_lost:.0f} output tokens lost")
        return "; ".join(parts)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _during(gap: Span, injected: Span | None, others: Sequence[Span]) -> str:
    if injected is not None and _overlap(gap, injected) > 0:
        return "injected"
    if any(_overlap(gap, p) > 0 for p in others):
        return "prefill"
    return "none"


def _mean_pace(gaps: Iterable[tuple[int, int]]) -> float | None:
    """Mean ms per token of (gap ns, tokens) pairs."""
    total_ns = total_tok = 0
    for g, k in gaps:
        total_ns += g
        total_tok += k
    return total_ns / 1e6 / total_tok if total_tok else None


def _server_gaps(r: RequestRecord, delivered: Mapping[str, Sequence[float]]
                 ) -> list[tuple[float, bool]]:
    """Each gap's ms less its delivery part, and whether it tells the server's pace (not
    a gap between events read together on a request the path held)."""
    toks = _token_times(r)
    dl = delivered.get(r.request_id)
    if not dl or len(dl) != len(toks) - 1:
        return [((b[0] - a[0]) / 1e6, True) for a, b in pairwise(toks)]
    return [((b[0] - a[0]) / 1e6 - d, b[0] != a[0]) for (a, b), d in zip(pairwise(toks), dl,
                                                                         strict=True)]


def analyze(case_id: str, records: Iterable[RequestRecord],
            delivered: Mapping[str, Sequence[float]] | None = None) -> Interference:
    """The interference of one case from its records (measured and injected phases).
    ``delivered``: the ledger's delivery part of each gap, by request id."""
    recs = list(records)
    delivered = delivered or {}
    decode = [r for r in recs if r.phase == "measured" and r.ok and len(_token_times(r)) >= 2]
    injected = next((r for r in recs if r.phase == "injected"), None)
    inj = prefill_span(injected) if injected is not None else None
    others = [(r.request_id, p) for r in recs
              if r.phase == "measured" and (p := prefill_span(r)) is not None]
    server_gaps = {r.request_id: _server_gaps(r, delivered) for r in decode}
    per_gap = [
        g_ms / b[1]
        for r in decode
        for (g_ms, paced), (_, b) in zip(server_gaps[r.request_id], pairwise(_token_times(r)),
                                         strict=True)
        if paced
    ]
    med = statistics.median(per_gap) if per_gap else None
    stall = {"injected": 0.0, "prefill": 0.0, "none": 0.0}
    longest: tuple[float, str] | None = None
    rows = []
    inside: list[tuple[int, int]] = []
    outside: list[tuple[int, int]] = []
    for r in decode:
        toks = _token_times(r)
        span = (toks[0][0], toks[-1][0])
        r_in: list[tuple[int, int]] = []
        r_out: list[tuple[int, int]] = []
        r_long: tuple[float, str] = (0.0, "none")
        not_mine = [p for rid, p in others if rid != r.request_id]
        for (a, b), (g_ms, _) in zip(pairwise(toks), server_gaps[r.request_id], strict=True):
            gap = (a[0], b[0])
            g_ns = b[0] - a[0]
            during = _during(gap, inj, not_mine)
            (r_in if during == "injected" else r_out).append((g_ns, b[1]))
            if med is not None and g_ms > STALL_FACTOR * med * b[1]:
                stall[during] += g_ms - med * b[1]
            if g_ms > r_long[0]:
                r_long = (g_ms, during)
        inside += r_in
        outside += r_out
        if longest is None or r_long[0] > longest[0]:
            longest = r_long
        rows.append(RequestInterference(
            r.request_id,
            _overlap(span, inj) / 1e6 if inj is not None else 0.0,
            r_long[0],
            r_long[1],
            _mean_pace(r_in),
            _mean_pace(r_out),
        ))
    n = len(decode)
    out: dict[str, Any] = dict(  # the fields of every Interference
        case_id=case_id,
        n_decode=n,
        median_ms_per_token=med,
        decode_ms_per_request=(sum(_token_times(r)[-1][0] - _token_times(r)[0][0] for r in decode)
                               / 1e6 / n if n else 0.0),
        stall_ms_per_request=sum(stall.values()) / n if n else 0.0,
        stall_injected_ms_per_request=stall["injected"] / n if n else 0.0,
        stall_prefill_ms_per_request=stall["prefill"] / n if n else 0.0,
        stall_no_prefill_ms_per_request=stall["none"] / n if n else 0.0,
        longest_stall_ms=longest[0] if longest else None,
        longest_stall_during=longest[1] if longest else "",
        requests=tuple(rows),
    )
    if injected is None or inj is None:
        return Interference(**out)
    p_in, p_out = _mean_pace(inside), _mean_pace(outside)
    server = server_prefill_span(injected)
    lost = None
    if decode:
        t0 = min(_token_times(r)[0][0] for r in decode)
        t1 = max(_token_times(r)[-1][0] for r in decode)
        window = (max(t0, inj[0]), min(t1, inj[1]))
        w_ns = max(0, window[1] - window[0])
        tok_in = sum(k for r in decode for t, k in _token_times(r)[1:]
                     if window[0] <= t < window[1])
        tok_all = sum(k for r in decode for _, k in _token_times(r)[1:])
        rest_ns = (t1 - t0) - w_ns
        if rest_ns > 0:
            lost = max(0.0, (tok_all - tok_in) / rest_ns * w_ns - tok_in)
    return Interference(
        **out,
        injected_id=injected.request_id,
        injected_ms=(inj[1] - inj[0]) / 1e6,
        injected_server_prompt_ms=(server[1] - server[0]) / 1e6 if server else None,
        n_overlapping=sum(1 for x in rows if x.overlap_ms > 0),
        ms_per_token_inside=p_in,
        ms_per_token_outside=p_out,
        interference_factor=(p_in / p_out - 1.0) if p_in is not None and p_out else None,
        tokens_lost=lost,
    )


def _gmean(xs: Sequence[float]) -> float | None:
    import math

    pos = [x for x in xs if x > 0]
    if not pos or len(pos) != len(xs):
        return statistics.fmean(xs) if xs else None
    return math.exp(statistics.fmean(math.log(x) for x in pos))


def signals(
    inter: Interference,
    reference: Sequence[Interference] = (),
    tpot_p95_ms: float | None = None,
    reference_tpot_p95_ms: Sequence[float] = (),
) -> dict[str, float | None]:
    """The classifier's interference inputs (``rules.WindowSignals`` fields).

    ``reference``: the control arm's repetitions when this case is a treatment of an
    A/B group; then the stall time with a prefill in flight and the tail pace (TPOT
    p95) are compared with the control's (mean / geometric mean of its repetitions).
    """
    out: dict[str, float | None] = {
        "prefill_stall_frac": inter.prefill_stall_frac,
        "prefill_stall_share": inter.prefill_stall_share,
        "ab_prefill_stall_ratio": None,
        "ab_tail_pace_rise": None,
        "injected_pace_factor": None,
    }
    if reference and inter.n_decode:
        out["injected_pace_factor"] = inter.interference_factor
        ref = statistics.fmean(r.stall_with_prefill_ms_per_request for r in reference)
        mine = inter.stall_with_prefill_ms_per_request
        # a control with no stall at all: the yardstick is one token's time, not zero
        floor = inter.median_ms_per_token or 1e-3
        out["ab_prefill_stall_ratio"] = mine / max(ref, floor)
        ref_tail = _gmean(list(reference_tpot_p95_ms))
        if tpot_p95_ms is not None and ref_tail:
            out["ab_tail_pace_rise"] = tpot_p95_ms / ref_tail - 1.0
    return out

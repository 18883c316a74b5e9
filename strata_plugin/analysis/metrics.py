"""Per-request and per-case metrics, computed from :class:`RequestRecord` alone.

Definitions follow docs/metrics.md; the points most tools disagree on:

* Every latency starts at ``dispatched_ns`` (bytes handed to the socket). The
  client's own queueing (``dispatched - scheduled``) is ``queue_ms``, reported
  apart and never folded into ttft/e2e.
* ``ttft`` counts reasoning tokens; ``ttfo`` waits for the first answer token.
* ``tpot`` is one number per request (decode pace, first token excluded);
  ``chunk_gap`` is every gap between token-bearing events. Neither is "ITL".
* Throughput uses only the measured phase, over the measured window.
* Speculative acceptance is sum(accepted) / sum(drafted), never a mean of ratios.

All times in records are ``time.monotonic_ns``; metrics are in ms (latency) or
per second (throughput).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, fields
from itertools import pairwise

from strata_plugin.analysis.stats import PERCENTILE_METHOD, Distribution, distribution
from strata_plugin.formats.records import RequestRecord

__all__ = [
    "PERCENTILE_METHOD",
    "CaseMetrics",
    "Distribution",
    "RequestMetrics",
    "Slo",
    "acceptance",
    "case_metrics",
    "distribution",
    "headline",
    "request_metrics",
]

MEASURED = "measured"
_NS_PER_MS = 1e6
_NS_PER_S = 1e9


def _ms(later: int | None, earlier: int | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier) / _NS_PER_MS


@dataclass(frozen=True)
class RequestMetrics:
    """What one request measured. None means "undefined for this request"."""

    request_id: str
    case_id: str
    phase: str
    ok: bool
    error_class: str | None
    # client-side latencies, ms; all from dispatched_ns except queue_ms
    queue_ms: float  # dispatched - scheduled: the client's own wait
    ttfb_ms: float | None  # first byte of any kind
    ttft_ms: float | None  # first token-bearing event, reasoning included
    ttfo_ms: float | None  # first content (answer) token
    tpot_ms: float | None  # (t_last_token - t_first_token) / (n_out - 1)
    e2e_ms: float | None  # to the last token-bearing event (done_ns if none)
    e2e_incl_queue_ms: float | None  # queue_ms + e2e_ms
    e2e_per_token_ms: float | None  # e2e / n_out (GuideLLM "tpot", inference-perf NTPOT)
    # output token counts
    n_out: int
    n_out_source: str  # "usage" | "timings" | "tokenizer" | "events"
    n_out_events: int  # sum of n_tokens over events, to check n_out against
    n_events: int  # token-bearing events (chunks)
    # prompt token counts
    prompt_tokens: int | None
    cached_tokens: int | None
    computed_prompt_tokens: int | None  # prompt_tokens - cached_tokens
    prompt_source: str  # "usage" | "timings" | "tokenizer" | "none"
    # every gap between consecutive token-bearing events, with the later chunk's tokens
    chunk_gaps_ms: tuple[float, ...]
    chunk_gap_tokens: tuple[int, ...]
    # server-side (llama.cpp timings)
    server_prompt_ms: float | None
    server_decode_ms: float | None
    server_prompt_n: int | None
    server_decode_n: int | None
    server_prefill_tok_s: float | None  # prompt_n / prompt_ms
    server_decode_tok_s: float | None  # predicted_n / predicted_ms
    ttft_minus_server_prompt_ms: float | None  # queue + HTTP + tokenize, outside prefill
    # e2e - (server prompt + decode ms): what no server clock accounts for (network,
    # proxy, client, and the server's own queue, which llama.cpp timings leave out)
    outside_server_ms: float | None
    draft_n: int | None
    draft_accepted: int | None
    spec_acceptance: float | None  # this request's draft_accepted / draft_n
    finish_reason: str | None
    # absolute window (monotonic ns), for throughput windows and timelines
    start_ns: int  # dispatched_ns
    end_ns: int  # last token, else done, else first byte, else dispatched


def _output_tokens(rec: RequestRecord, from_events: int) -> tuple[int, str]:
    u = rec.usage
    if u.completion_tokens is not None:
        return u.completion_tokens, (u.source if u.source != "none" else "usage")
    if rec.timings is not None and rec.timings.predicted_n is not None:
        return rec.timings.predicted_n, "timings"
    return from_events, "events"


def _prompt_tokens(rec: RequestRecord) -> tuple[int | None, int | None, int | None, str]:
    """(prompt, cached, computed, source). usage first, llama.cpp timings second."""
    u, t = rec.usage, rec.timings
    prompt: int | None = None
    source = "none"
    if u.prompt_tokens is not None:
        prompt, source = u.prompt_tokens, (u.source if u.source != "none" else "usage")
    elif t is not None and t.prompt_n is not None:
        # llama.cpp: prompt_n excludes cache hits; the context holds prompt_n + cache_n.
        prompt, source = t.prompt_n + (t.cache_n or 0), "timings"
    cached = u.cached_tokens
    if cached is None and t is not None:
        cached = t.cache_n
    computed: int | None = None
    if prompt is not None and cached is not None:
        computed = prompt - cached
    elif t is not None and t.prompt_n is not None:
        computed = t.prompt_n
    return prompt, cached, computed, source


def _rate(n: int | None, ms: float | None) -> float | None:
    if n is None or ms is None or ms <= 0:
        return None
    return n * 1000.0 / ms


def first_token_ns(rec: RequestRecord) -> int | None:
    """When the first token-bearing event arrived (reasoning included): TTFT's end.

    The one definition of TTFT is ``first_token_ns - dispatched_ns``; whoever needs a
    TTFT without the full :func:`request_metrics` calls :func:`ttft_ms`.
    """
    return min((e.t_ns for e in rec.events if e.n_tokens > 0), default=None)


def ttft_ms(rec: RequestRecord) -> float | None:
    return _ms(first_token_ns(rec), rec.dispatched_ns)


def request_metrics(rec: RequestRecord) -> RequestMetrics:
    """Derive one request's metrics; failed requests keep whatever was measured."""
    disp = rec.dispatched_ns
    tok = sorted((e for e in rec.events if e.n_tokens > 0), key=lambda e: e.t_ns)
    last_tok = tok[-1].t_ns if tok else None
    first_content = next((e.t_ns for e in tok if e.kind != "reasoning"), None)
    from_events = sum(e.n_tokens for e in tok)
    n_out, n_out_source = _output_tokens(rec, from_events)

    # tpot needs a time span: with fewer than two token-bearing events the stream
    # shows no decode pace at all, and 0 ms would be a false value.
    tpot = None
    if n_out >= 2 and len(tok) >= 2:
        tpot = (tok[-1].t_ns - tok[0].t_ns) / _NS_PER_MS / (n_out - 1)

    end_tok = last_tok if last_tok is not None else rec.done_ns
    e2e = _ms(end_tok, disp)
    queue = (disp - rec.scheduled_ns) / _NS_PER_MS
    ttft = ttft_ms(rec)

    gaps = tuple((b.t_ns - a.t_ns) / _NS_PER_MS for a, b in pairwise(tok))
    gap_tokens = tuple(b.n_tokens for b in tok[1:])

    prompt, cached, computed, prompt_source = _prompt_tokens(rec)
    t = rec.timings
    s_prompt_ms = t.prompt_ms if t else None
    s_decode_ms = t.predicted_ms if t else None
    s_prompt_n = t.prompt_n if t else None
    s_decode_n = t.predicted_n if t else None
    draft_n = t.draft_n if t else None
    # llama.cpp omits draft_n_accepted when it is 0; drafted-but-none-accepted is 0.
    draft_acc = (t.draft_n_accepted or 0) if (t and draft_n is not None) else None

    end_candidates = [x for x in (last_tok, rec.done_ns, rec.first_byte_ns) if x is not None]
    return RequestMetrics(
        request_id=rec.request_id,
        case_id=rec.case_id,
        phase=rec.phase,
        ok=rec.ok,
        error_class=rec.error.cls if rec.error else None,
        queue_ms=queue,
        ttfb_ms=_ms(rec.first_byte_ns, disp),
        ttft_ms=ttft,
        ttfo_ms=_ms(first_content, disp),
        tpot_ms=tpot,
        e2e_ms=e2e,
        e2e_incl_queue_ms=None if e2e is None else e2e + queue,
        e2e_per_token_ms=(e2e / n_out) if (e2e is not None and n_out > 0) else None,
        n_out=n_out,
        n_out_source=n_out_source,
        n_out_events=from_events,
        n_events=len(tok),
        prompt_tokens=prompt,
        cached_tokens=cached,
        computed_prompt_tokens=computed,
        prompt_source=prompt_source,
        chunk_gaps_ms=gaps,
        chunk_gap_tokens=gap_tokens,
        server_prompt_ms=s_prompt_ms,
        server_decode_ms=s_decode_ms,
        server_prompt_n=s_prompt_n,
        server_decode_n=s_decode_n,
        server_prefill_tok_s=_rate(s_prompt_n, s_prompt_ms),
        server_decode_tok_s=_rate(s_decode_n, s_decode_ms) if (s_decode_n or 0) >= 2 else None,
        ttft_minus_server_prompt_ms=(
            ttft - s_prompt_ms if ttft is not None and s_prompt_ms is not None else None
        ),
        outside_server_ms=(
            max(0.0, e2e - s_prompt_ms - s_decode_ms)
            if e2e is not None and s_prompt_ms is not None and s_decode_ms is not None
            else None
        ),
        draft_n=draft_n,
        draft_accepted=draft_acc,
        spec_acceptance=(draft_acc / draft_n) if (draft_n and draft_acc is not None) else None,
        finish_reason=rec.finish_reason,
        start_ns=disp,
        end_ns=max(end_candidates, default=disp),
    )


def acceptance(records: Iterable[RequestRecord | RequestMetrics]) -> float | None:
    """Speculative acceptance of a group: sum(accepted) / sum(drafted).

    A mean of per-request ratios would weight a 2-token draft like a 2000-token
    one. None when no request reported drafts (or none were drafted).
    """
    drafted = accepted = 0
    for r in records:
        m = r if isinstance(r, RequestMetrics) else request_metrics(r)
        if m.draft_n is not None:
            drafted += m.draft_n
            accepted += m.draft_accepted or 0
    return accepted / drafted if drafted > 0 else None


@dataclass(frozen=True)
class Slo:
    """Per-request service-level objectives; None means "not constrained"."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    ttfo_ms: float | None = None

    def is_set(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

    def met_by(self, m: RequestMetrics) -> bool:
        """A good request succeeded and meets every set SLO.

        An undefined ttft/ttfo/e2e (no token arrived) fails its SLO. An
        undefined tpot (fewer than two tokens) passes: there was no decode pace
        to violate (vLLM counts it as 0 for the same reason).
        """
        if not m.ok:
            return False
        for name in ("ttft_ms", "ttfo_ms", "e2e_ms"):
            limit = getattr(self, name)
            if limit is not None:
                v = getattr(m, name)
                if v is None or v > limit:
                    return False
        return not (self.tpot_ms is not None and m.tpot_ms is not None and m.tpot_ms > self.tpot_ms)

    def describe(self) -> str:
        """Stable text form, e.g. ``ttft_ms<=500;tpot_ms<=50``."""
        return ";".join(
            f"{f.name}<={getattr(self, f.name):g}"
            for f in fields(self)
            if getattr(self, f.name) is not None
        )


@dataclass(frozen=True)
class CaseMetrics:
    """One case's measured phase. Latency distributions cover successful requests."""

    n_requests: int  # measured requests scheduled, failed ones included
    n_ok: int
    n_errors: int
    errors_by_class: tuple[tuple[str, int], ...]
    n_warmup: int  # excluded from everything below
    window_s: float | None
    ttft: Distribution
    ttfo: Distribution
    ttfb: Distribution
    tpot: Distribution
    e2e: Distribution
    queue: Distribution
    chunk_gap: Distribution  # pooled over every chunk of every successful request
    chunk_gap_per_token: Distribution  # each gap / tokens in its chunk (SGLang-style)
    e2e_per_token: Distribution
    input_tok_s: float | None
    input_computed_tok_s: float | None
    input_cached_tok_s: float | None
    output_tok_s: float | None
    request_s: float | None
    goodput_req_s: float | None  # None when no SLO is set
    goodput_fraction: float | None  # good / n_requests (errors in the denominator)
    success_fraction: float | None  # n_ok / n_requests
    spec_acceptance: float | None
    server_prefill_tok_s: float | None  # sum prompt_n / sum prompt_ms
    server_decode_tok_s: float | None  # sum predicted_n / sum predicted_ms
    total_output_tokens: int
    total_prompt_tokens: int | None
    total_cached_tokens: int | None
    total_computed_prompt_tokens: int | None
    n_out_sources: tuple[tuple[str, int], ...]
    prompt_sources: tuple[tuple[str, int], ...]
    slo: str  # Slo.describe(), "" when none
    percentile_method: str = PERCENTILE_METHOD


def _sum_if_all(values: list[int | None]) -> int | None:
    """Sum, or None when any value is unknown: a partial total would mislead."""
    if any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


def _per_s(total: float | None, window_s: float | None) -> float | None:
    if total is None or not window_s:
        return None
    return total / window_s


def case_metrics(
    records: Iterable[RequestRecord],
    *,
    slo: Slo | None = None,
    window_ns: tuple[int, int] | None = None,
) -> CaseMetrics:
    """Summarize one case's measured requests (``phase == "measured"`` only).

    The window runs from the first measured dispatch to the last measured end
    (failed requests included: they occupied the server too). An explicit
    ``window_ns`` (monotonic start, end) replaces that denominator; which
    records count is still decided by phase alone.
    """
    recs = list(records)
    measured = [request_metrics(r) for r in recs if r.phase == MEASURED]
    n_warmup = len(recs) - len(measured)
    ok = [m for m in measured if m.ok]

    if window_ns is not None:
        start, end = window_ns
    elif measured:
        start = min(m.start_ns for m in measured)
        end = max(m.end_ns for m in measured)
    else:
        start = end = 0
    window_s = (end - start) / _NS_PER_S if end > start else None

    errors = Counter(m.error_class or "unknown" for m in measured if not m.ok)
    total_out = sum(m.n_out for m in ok)
    total_prompt = _sum_if_all([m.prompt_tokens for m in ok])
    total_cached = _sum_if_all([m.cached_tokens for m in ok])
    total_computed = _sum_if_all([m.computed_prompt_tokens for m in ok])

    good_req_s = good_frac = None
    if slo is not None and slo.is_set():
        n_good = sum(1 for m in measured if slo.met_by(m))
        good_req_s = _per_s(n_good, window_s)
        good_frac = n_good / len(measured) if measured else None

    with_prompt = [m for m in ok if m.server_prompt_n is not None and m.server_prompt_ms]
    with_decode = [m for m in ok if (m.server_decode_n or 0) >= 2 and m.server_decode_ms]
    prefill = _rate(
        sum(m.server_prompt_n or 0 for m in with_prompt),
        sum(m.server_prompt_ms or 0.0 for m in with_prompt),
    )
    decode = _rate(
        sum(m.server_decode_n or 0 for m in with_decode),
        sum(m.server_decode_ms or 0.0 for m in with_decode),
    )

    gaps = [g for m in ok for g in m.chunk_gaps_ms]
    per_token = [
        g / k for m in ok for g, k in zip(m.chunk_gaps_ms, m.chunk_gap_tokens, strict=True) if k
    ]
    return CaseMetrics(
        n_requests=len(measured),
        n_ok=len(ok),
        n_errors=len(measured) - len(ok),
        errors_by_class=tuple(sorted(errors.items())),
        n_warmup=n_warmup,
        window_s=window_s,
        ttft=distribution(m.ttft_ms for m in ok),
        ttfo=distribution(m.ttfo_ms for m in ok),
        ttfb=distribution(m.ttfb_ms for m in ok),
        tpot=distribution(m.tpot_ms for m in ok),
        e2e=distribution(m.e2e_ms for m in ok),
        queue=distribution(m.queue_ms for m in ok),
        chunk_gap=distribution(gaps),
        chunk_gap_per_token=distribution(per_token),
        e2e_per_token=distribution(m.e2e_per_token_ms for m in ok),
        input_tok_s=_per_s(total_prompt, window_s),
        input_computed_tok_s=_per_s(total_computed, window_s),
        input_cached_tok_s=_per_s(total_cached, window_s),
        output_tok_s=_per_s(total_out, window_s),
        request_s=_per_s(len(ok), window_s),
        goodput_req_s=good_req_s,
        goodput_fraction=good_frac,
        success_fraction=len(ok) / len(measured) if measured else None,
        spec_acceptance=acceptance(ok),
        server_prefill_tok_s=prefill,
        server_decode_tok_s=decode,
        total_output_tokens=total_out,
        total_prompt_tokens=total_prompt,
        total_cached_tokens=total_cached,
        total_computed_prompt_tokens=total_computed,
        n_out_sources=tuple(sorted(Counter(m.n_out_source for m in ok).items())),
        prompt_sources=tuple(sorted(Counter(m.prompt_source for m in ok).items())),
        slo=slo.describe() if slo is not None else "",
    )


#: Distributions in the headline, and the stats taken from each.
HEADLINE_DISTRIBUTIONS = ("ttft", "ttfo", "ttfb", "tpot", "e2e", "queue", "chunk_gap")
HEADLINE_STATS = ("mean", "p50", "p90", "p95", "p99", "max")
HEADLINE_SCALARS = (
    "n_requests",
    "n_ok",
    "n_errors",
    "window_s",
    "input_tok_s",
    "input_computed_tok_s",
    "input_cached_tok_s",
    "output_tok_s",
    "request_s",
    "goodput_req_s",
    "goodput_fraction",
    "success_fraction",
    "spec_acceptance",
    "server_prefill_tok_s",
    "server_decode_tok_s",
    "total_output_tokens",
    "total_prompt_tokens",
    "total_cached_tokens",
    "total_computed_prompt_tokens",
)


#: The seed experiment's metrics (headline keys), one value per repetition: the first
#: rows of every A/B table, and what the mixed case asserts on.
AB_HEADLINE = (
    "output_tok_s",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "tpot_p99_ms",
    "chunk_gap_p99_ms",
    "chunk_gap_max_ms",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "e2e_p95_ms",
)
#: Interference figures (``analysis/interference.py``) compared per repetition beside them.
AB_INTERFERENCE = ("stall_with_prefill_ms_per_request", "stall_ms_per_request")
#: Per-request metrics compared request by request (A/B details, run against run,
#: benchmark.json entries).
REQUEST_COMPARED = ("ttft_ms", "tpot_ms", "e2e_ms")
#: Names a reader knows: "chunk gap" is the streamed inter-token latency (ITL).
LABELS = {
    "chunk_gap": "ITL (chunk gap)",
    "ttft": "TTFT",
    "ttfo": "TTFO",
    "ttfb": "TTFB",
    "tpot": "TPOT",
    "output_tok_s": "output tok/s",
    "stall_with_prefill_ms_per_request": "stall with a prefill in flight, per decode request (ms)",
    "stall_ms_per_request": "stall, all, per decode request (ms)",
}


def metric_label(name: str) -> str:
    """``chunk_gap_p99_ms`` -> ``ITL (chunk gap) p99 (ms)``, for tables."""
    if name in LABELS:
        return LABELS[name]
    for dist in HEADLINE_DISTRIBUTIONS:
        for stat in HEADLINE_STATS:
            if name == f"{dist}_{stat}_ms":
                return f"{LABELS.get(dist, dist)} {stat} (ms)"
    return name


def metric_unit(name: str) -> str:
    if name.endswith("_ms"):
        return "ms"
    if name.endswith("_tok_s"):
        return "tok/s"
    if name.endswith("_req_s") or name == "request_s":
        return "req/s"
    return ""


def higher_is_worse(name: str) -> bool:
    """Latencies and resource use get worse upwards; rates and acceptance downwards."""
    return not (
        name.endswith(("_tok_s", "_per_s", "_req_s"))
        or name in ("request_s", "spec_acceptance", "n_out", "goodput_fraction",
                    "success_fraction")
    )


def _pairs(items: tuple[tuple[str, int], ...]) -> str:
    return ",".join(f"{k}:{v}" for k, v in items)


def headline(cm: CaseMetrics) -> dict[str, float | int | str]:
    """Flat scalars for JUnit ``user_properties``, keys like ``ttft_p99_ms``.

    Key names never change; a key is left out when its value is undefined
    (no SLO, no drafts, no successful request), so no "None" strings reach XML.
    """
    out: dict[str, float | int | str] = {}
    for name in HEADLINE_SCALARS:
        v = getattr(cm, name)
        if v is not None:
            out[name] = v
    for dist in HEADLINE_DISTRIBUTIONS:
        d: Distribution = getattr(cm, dist)
        for stat in HEADLINE_STATS:
            v = getattr(d, stat)
            if v is not None:
                out[f"{dist}_{stat}_ms"] = v
    if cm.errors_by_class:
        out["errors_by_class"] = _pairs(cm.errors_by_class)
    if cm.n_out_sources:
        out["n_out_source"] = _pairs(cm.n_out_sources)
    if cm.slo:
        out["slo"] = cm.slo
    return out

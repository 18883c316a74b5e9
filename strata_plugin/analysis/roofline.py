"""Each case against the roofline of the device it ran on: how close its prefill came to
the compute roof, its decode to the memory-bandwidth roof, and which roof applies.

Why: "what did the case wait on" (the verdict) leaves "how much better could it get"
open. A decode that moves 90% of the memory bandwidth the hardware has cannot get much
faster whatever the utilization counters say; one at 10% of both roofs on a busy device
is losing its time to scheduling or launches, not to the hardware. The formulas, their
assumptions and their sources are in docs/roofline.md; in short:

* **Prefill** of ``n`` new tokens after ``c`` cached ones (per request, the engine's
  token counts): FLOPs = 2 x (matrix parameters - LM head) x n + 2 x LM head (logits for
  the last token only) + 4 x layers x heads x head_dim x sum over the new positions p of
  p (QK^T and softmax x V: 2 FLOPs per multiply-add, each query against the p keys before
  it; Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Table 1, with the
  attention term made causal). Time: the union of the requests' prefill spans, each the
  engine's prefill clock ending at the request's first token, so prefills batched
  together are not counted twice. Bytes: the least traffic, the weights once and the
  KV cache written once (and the cached prefix read once).
* **Decode**: each step reads the weights once (a mixture of experts: the experts the
  step's tokens routed to, expected under uniform routing) and every running sequence's
  KV cache at its context length. Per request, at each of its tokens, the sequences
  decoding then (the case's requests between their first and last token) and their
  contexts give the step's bytes and FLOPs; steps per second from the engine's decode
  clock. The case's rate: the requests' bytes over their decode time.
* **Which roof**: arithmetic intensity (FLOPs per byte) against the machine balance
  (peak FLOPs / peak bandwidth); below it the memory roof applies, above it the compute
  roof (Williams, Waterman and Patterson, "Roofline: An Insightful Visual Performance
  Model for Multicore Architectures", CACM 52(4), 2009). On a CPU, a step whose bytes
  fit in the last-level cache is held against the bandwidth measured there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from strata_plugin.analysis.device_limits import (
    DeviceLimits,
    Peak,
    compute_dtype,
    cpu_limits,
    gpu_limits,
    snapshot_gpus,
)
from strata_plugin.analysis.metrics import first_token_ns
from strata_plugin.analysis.rules.window import Evidence, Verdict, WindowSignals
from strata_plugin.analysis.thresholds import threshold
from strata_plugin.configure.model_facts import FACT_NAMES, Fact, ModelFacts
from strata_plugin.errors import failure_words
from strata_plugin.formats.records import RequestRecord, Timings, TokenEvent

#: token events of one request sampled for its decode steps' batch (evenly, at most)
MAX_STEP_SAMPLES = 256
_NEED = ("params_matmul_active", "params_lm_head", "stored_bytes", "stored_bytes_embedding",
         "stored_bytes_experts", "layers", "heads", "head_dim", "kv_bytes_per_token",
         "experts", "experts_per_token", "tied_embeddings")


@dataclass(frozen=True)
class RooflineInputs:
    """One server configuration's model facts and device limits (run-wide)."""

    model: ModelFacts
    limits: DeviceLimits | None
    why_no_limits: str = ""
    #: GPUs of the run (snapshots), for a case's own subset; () on a CPU
    gpus: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class PhaseRoof:
    phase: str  # "prefill" | "decode"
    requests: int
    tokens: int  # prefill: tokens prefilled; decode: tokens decoded after the first
    #: decode steps (speculative decoding: fewer than tokens); prefill: batches (prefills
    #: in flight together)
    steps: int
    seconds: float  # the device time the phase took
    flops: float
    bytes: float
    clock: str  # which clock timed it
    roof: str  # "compute" | "memory" | "" (no limit known)
    memory_level: str  # "DRAM" | "HBM/GDDR" | "last-level cache"
    limit: float | None  # the applicable roof's peak (FLOP/s or B/s)
    share: float | None  # achieved / limit
    flops_share: float | None
    bytes_share: float | None  # against the memory level that applies
    balance: float | None  # peak FLOPs / peak bandwidth of that level
    batch_mean: float | None = None  # decode: running sequences per step
    bytes_per_step: float | None = None  # decode
    notes: tuple[str, ...] = ()

    @property
    def flops_s(self) -> float:
        return self.flops / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_s(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def intensity(self) -> float | None:
        return self.flops / self.bytes if self.bytes > 0 else None

    @property
    def achieved(self) -> float:
        return self.flops_s if self.roof == "compute" else self.bytes_s

    @property
    def unit(self) -> str:
        return "FLOP/s" if self.roof == "compute" else "B/s"

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "requests": self.requests, "tokens": self.tokens,
                "steps": self.steps, "seconds": _r(self.seconds), "flops": _r(self.flops),
                "bytes": _r(self.bytes), "flops_s": _r(self.flops_s),
                "bytes_s": _r(self.bytes_s), "intensity": _r(self.intensity),
                "balance": _r(self.balance), "roof": self.roof,
                "memory_level": self.memory_level, "limit": _r(self.limit),
                "share": _r(self.share), "flops_share": _r(self.flops_share),
                "bytes_share": _r(self.bytes_share), "clock": self.clock,
                "batch_mean": _r(self.batch_mean), "bytes_per_step": _r(self.bytes_per_step),
                "notes": list(self.notes)}


@dataclass(frozen=True)
class CaseRoofline:
    headline_phase: str  # the phase the case is about: "prefill" | "decode"
    prefill: PhaseRoof | None
    decode: PhaseRoof | None
    device: str
    model: str
    unavailable: str = ""  # why there is no row at all
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def headline(self) -> PhaseRoof | None:
        return self.prefill if self.headline_phase == "prefill" else self.decode

    def to_json(self) -> dict[str, Any]:
        h = self.headline
        return {"phase": self.headline_phase, "device": self.device, "model": self.model,
                "share": None if h is None else _r(h.share),
                "roof": None if h is None else h.roof,
                "achieved": None if h is None else _r(h.achieved),
                "limit": None if h is None else _r(h.limit),
                "unit": None if h is None else h.unit,
                "prefill": None if self.prefill is None else self.prefill.to_json(),
                "decode": None if self.decode is None else self.decode.to_json(),
                "unavailable": self.unavailable, "notes": list(self.notes)}


def _r(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.6g}")


# --- run-wide inputs ----------------------------------------------------------------------


def run_inputs(manifest: Mapping[str, Any], run_dir: Path | str, gpu_run: bool
               ) -> dict[str, RooflineInputs]:
    """Each configuration's model facts and its device's limits, from the manifest's
    ``roofline`` entries (run/roofline_facts.py) and, for GPUs, the static snapshots.
    An entry that cannot be read costs that configuration's roofline (said as its
    reason), never the analysis of the run."""
    out: dict[str, RooflineInputs] = {}
    entries = manifest.get("roofline")
    if not isinstance(entries, dict):
        return out
    gpus = tuple(snapshot_gpus(Path(run_dir))) if gpu_run else ()
    for cid, e in sorted(entries.items()):
        if not isinstance(e, dict):
            continue
        try:
            out[cid] = _inputs(e, gpus, gpu_run)
        except Exception as exc:  # a fact or a probe of a shape no reader expected
            why = f"the recorded facts could not be read: {failure_words(exc)}"
            out[cid] = RooflineInputs(ModelFacts.unavailable("", why), None, why)
    servers = manifest.get("servers")
    if (out and ATTACHED not in out and isinstance(servers, dict) and servers
            and not any(isinstance(s, dict) and s.get("argv") for s in servers.values())):
        # An attached run's cases carry the configuration ``attached``; a run recorded
        # before the facts were kept under it has them under the profile's id. There is
        # one server in such a run, so its entry is that server's.
        out[ATTACHED] = out[min(out)]
    return out


#: the configuration id of an attached server's cases (run/server.py, Server.config_id)
ATTACHED = "attached"


def _inputs(e: Mapping[str, Any], gpus: tuple[Mapping[str, Any], ...], gpu_run: bool
            ) -> RooflineInputs:
    model = ModelFacts.from_json(e.get("model") or {})
    if gpu_run:
        if not gpus:
            return RooflineInputs(model, None, "no GPU in the agents' static snapshots "
                                  "(gpus.json)")
        dtype = compute_dtype(model.get("weight_dtype"))
        return RooflineInputs(model, gpu_limits(list(gpus), dtype), gpus=gpus)
    probe = e.get("cpu")
    if isinstance(probe, dict) and probe.get("cpus"):
        return RooflineInputs(model, cpu_limits(probe, compute_dtype(model.get("weight_dtype"))))
    why = (probe or {}).get("unavailable") if isinstance(probe, dict) else None
    return RooflineInputs(model, None, str(why or "no CPU probe recorded"))


def _case_gpus(inp: RooflineInputs, hw: Sequence[Any]) -> DeviceLimits | None:
    """The GPUs a case ran on: those whose utilization rose above 0 in its window (all of
    the run's when none was sampled)."""
    if not inp.gpus or inp.limits is None:
        return inp.limits
    used = {(r.node, r.device) for r in hw if getattr(r, "metric", "") == "util_gpu_pct"
            and (r.mean or 0) > 0}
    pick = [g for g in inp.gpus if (g.get("node"), f"gpu{g.get('index')}") in used]
    if not pick or len(pick) == len(inp.gpus):
        return inp.limits
    return gpu_limits(pick, compute_dtype(inp.model.get("weight_dtype")))


# --- the model's arithmetic ---------------------------------------------------------------


@dataclass(frozen=True)
class _Model:
    mm: float  # matrix-multiply parameters per token (active)
    head: float  # LM head parameters
    attn: float  # 4 x layers x heads x head_dim: attention FLOPs per token per context token
    kv: float  # KV bytes per token of context
    dense_bytes: float  # weight bytes read every step, experts aside
    expert_bytes: float
    experts: int
    per_token: int

    def weight_bytes(self, tokens: float) -> float:
        """Weight bytes one step reads for ``tokens`` tokens: the dense weights once and
        the routed experts the tokens are expected to touch (uniform independent routing:
        E x (1 - (1 - k/E)^tokens) distinct experts of E)."""
        if not self.expert_bytes or self.experts <= 1:
            return self.dense_bytes + self.expert_bytes
        k, e = self.per_token, self.experts
        touched = 1.0 - (1.0 - k / e) ** max(1.0, tokens)
        return self.dense_bytes + self.expert_bytes * touched


#: facts that are counts or sizes a step multiplies by: a finite number above zero
_POSITIVE = ("params_matmul_active", "stored_bytes", "layers", "heads", "head_dim",
             "experts", "experts_per_token")
#: ... or at least zero (a dense model has no expert bytes; a tied head, no own bytes; a
#: pass with no attention, no KV cache)
_NON_NEGATIVE = ("params_lm_head", "stored_bytes_embedding", "stored_bytes_experts",
                 "kv_bytes_per_token")


def _unusable(m: ModelFacts, name: str) -> str:
    """Why this fact cannot enter the arithmetic ("" when it can): its type, finiteness
    and sign, named with where it was read."""
    f = m.fact(name)
    v = f.value
    src = f" (read from {f.source})" if f.source else ""
    shown = format(repr(v), ".40")
    if name == "tied_embeddings":
        return "" if isinstance(v, bool) else \
            f"{name}: {shown}{src} is a {type(v).__name__}, not true or false"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"{name}: {shown}{src} is a {type(v).__name__}, not a number"
    try:
        x = float(v)
    except OverflowError:
        return f"{name}: {shown}{src} is too large for a number of this kind"
    if not math.isfinite(x):
        return f"{name}: {shown}{src} is not a finite number"
    if name in _POSITIVE and x <= 0:
        return f"{name}: {shown}{src} is not above zero"
    if x < 0:
        return f"{name}: {shown}{src} is negative"
    return ""


def _model(m: ModelFacts) -> tuple[_Model | None, str]:
    missing = m.missing(*_NEED)
    if missing:
        return None, "model facts unavailable: " + "; ".join(missing)
    bad = [w for n in _NEED if (w := _unusable(m, n))]
    if bad:
        return None, "model facts unusable: " + "; ".join(bad)
    g = m.get
    if g("experts_per_token") > g("experts"):
        return None, (f"model facts unusable: experts_per_token {g('experts_per_token')} is "
                      f"more than experts {g('experts')}")
    tied = bool(g("tied_embeddings"))
    dense = g("stored_bytes") - g("stored_bytes_experts")
    if not tied:  # the embedding is a lookup of a row per token, not a read of it all
        dense -= g("stored_bytes_embedding")
    if dense <= 0:
        return None, (f"model facts unusable: stored_bytes {g('stored_bytes')} is not more "
                      "than the experts' and the embedding's bytes")
    return _Model(mm=float(g("params_matmul_active")), head=float(g("params_lm_head")),
                  attn=4.0 * g("layers") * g("heads") * g("head_dim"),
                  kv=float(g("kv_bytes_per_token")), dense_bytes=float(dense),
                  expert_bytes=float(g("stored_bytes_experts")), experts=int(g("experts")),
                  per_token=int(g("experts_per_token"))), ""


def _positive(x: Any) -> float | None:
    """A clock reading, a peak or a size the arithmetic can take and divide by: a finite
    number above zero; None for anything else (NaN, a negative, a string, a bool)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        v = float(x)
    except OverflowError:
        return None
    return v if math.isfinite(v) and v > 0 else None


# --- per request --------------------------------------------------------------------------


def _prompt(rec: RequestRecord) -> tuple[int, int] | None:
    """(tokens prefilled, tokens already cached) as the engine counted them."""
    t = rec.timings
    if t is not None and t.prompt_n is not None:
        return int(t.prompt_n), int(t.cache_n or 0)
    u = rec.usage
    if u.prompt_tokens is not None:
        cached = int(u.cached_tokens or 0)
        return max(0, int(u.prompt_tokens) - cached), cached
    if rec.isl:
        return int(rec.isl), 0
    return None


def _prefill_ms(rec: RequestRecord, fallback_ms: float | None, fallback_src: str
                ) -> tuple[float, str] | None:
    """The engine's own prefill time of the request, else the case's mean prefill."""
    e = rec.engine
    if e is not None and (ms := _positive(e.prefill_ms)) is not None:
        return ms, f"the engine's prefill clock ({e.source})"
    t = rec.timings
    if t is not None and (ms := _positive(t.prompt_ms)) is not None:
        return ms, "llama.cpp timings.prompt_ms"
    if (ms := _positive(fallback_ms)) is not None:
        return ms, f"the case's mean prefill ({fallback_src})"
    return None


def _tokens(rec: RequestRecord) -> tuple[np.ndarray, np.ndarray]:
    """Token events' times and cumulative token counts, in time order."""
    ev = sorted((e.t_ns, e.n_tokens) for e in rec.events if e.n_tokens > 0)
    if not ev:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    t = np.fromiter((x for x, _ in ev), dtype=np.int64, count=len(ev))
    n = np.cumsum(np.fromiter((k for _, k in ev), dtype=np.int64, count=len(ev)))
    return t, n


@dataclass(frozen=True)
class _Stream:
    times: np.ndarray
    cum: np.ndarray
    context0: int  # prompt tokens (cached ones included): the context at the first token

    @property
    def first(self) -> int:
        return int(self.times[0])

    @property
    def last(self) -> int:
        return int(self.times[-1])


def _decode_seconds(rec: RequestRecord, s: _Stream, decoded: int) -> tuple[float, str] | None:
    e = rec.engine
    if e is not None and (ms := _positive(e.decode_ms)) is not None:
        return ms / 1e3, f"the engine's decode clock ({e.source})"
    t = rec.timings
    if (t is not None and (ms := _positive(t.predicted_ms)) is not None
            and t.predicted_n is not None and t.predicted_n >= 2):
        return (ms / t.predicted_n * decoded / 1e3,
                "llama.cpp timings.predicted_ms / predicted_n")
    if s.last > s.first:
        return (s.last - s.first) / 1e9, "the client's first to last token"
    return None


def _accepted(rec: RequestRecord) -> int:
    e, t = rec.engine, rec.timings
    if e is not None and e.accepted_tokens:
        return int(e.accepted_tokens)
    if t is not None and t.draft_n_accepted:
        return int(t.draft_n_accepted)
    return 0


# --- the phases ---------------------------------------------------------------------------


def _clusters(spans: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """Overlapping (start, end, tokens) spans merged: prefills in flight together, which
    an engine batches into the same steps (one weight read for all of them)."""
    out: list[list[float]] = []
    for a, b, n in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
            out[-1][2] += n
        else:
            out.append([a, b, n])
    return [(a, b, int(n)) for a, b, n in out]


def prefill_phase(records: Sequence[RequestRecord], m: _Model, fallback_ms: float | None,
                  fallback_src: str) -> PhaseRoof | None:
    spans: list[tuple[float, float, int]] = []
    flops = kv_bytes = 0.0
    tokens = n = 0
    clocks = set()
    for rec in records:
        first = first_token_ns(rec)
        p = _prompt(rec)
        ms = _prefill_ms(rec, fallback_ms, fallback_src)
        if first is None or p is None or ms is None or p[0] <= 0 or ms[0] <= 0:
            continue
        new, cached = p
        # positions cached+1 .. cached+new, each attending to itself and those before it
        positions = new * cached + new * (new + 1) / 2
        flops += 2 * (m.mm - m.head) * new + 2 * m.head + m.attn * positions
        kv_bytes += m.kv * (new + cached)  # the new tokens' KV written, the prefix's read
        spans.append((first - ms[0] * 1e6, float(first), new))
        tokens += new
        n += 1
        clocks.add(ms[1])
    if not n:
        return None
    merged = _clusters(spans)
    seconds = sum(b - a for a, b, _ in merged) / 1e9
    nbytes = kv_bytes + sum(m.weight_bytes(k) for _, _, k in merged)
    return PhaseRoof("prefill", n, tokens, len(merged), seconds, flops, nbytes,
                     "; ".join(sorted(clocks)), "", "", None, None, None, None, None)


class _Batch:
    """The case's streams at any instant, by sweep: how many were decoding (between their
    first and last token, inclusive) and the sum of their contexts (prompt, cached part
    included, plus the tokens each had received before that instant). Each query costs a
    few binary searches, so a case of 50,000 requests is as cheap as one of 50."""

    def __init__(self, streams: Sequence[_Stream]) -> None:
        firsts = np.array([s.first for s in streams], dtype=np.int64)
        lasts = np.array([s.last for s in streams], dtype=np.int64)
        c0 = np.array([s.context0 for s in streams], dtype=np.float64)
        total = np.array([s.cum[-1] for s in streams], dtype=np.float64)
        by_first, by_last = np.argsort(firsts, kind="stable"), np.argsort(lasts, kind="stable")
        self.firsts, self.lasts = firsts[by_first], lasts[by_last]
        self.c0_first = np.concatenate(([0.0], np.cumsum(c0[by_first])))
        self.c0_last = np.concatenate(([0.0], np.cumsum(c0[by_last])))
        self.total_last = np.concatenate(([0.0], np.cumsum(total[by_last])))
        times = np.concatenate([s.times for s in streams]) if streams else np.empty(0)
        steps = np.concatenate([np.diff(s.cum, prepend=0) for s in streams]) if streams \
            else np.empty(0)
        order = np.argsort(times, kind="stable")
        self.times = times[order]
        self.tokens = np.concatenate(([0.0], np.cumsum(steps[order].astype(np.float64))))

    def at(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sequences decoding, their summed context) at each instant of ``t``."""
        started = np.searchsorted(self.firsts, t, side="right")  # first <= t
        ended = np.searchsorted(self.lasts, t, side="left")  # last < t
        batch = (started - ended).astype(np.float64)
        received = self.tokens[np.searchsorted(self.times, t, side="left")]  # before t
        ctx = (self.c0_first[started] - self.c0_last[ended]
               + received - self.total_last[ended])
        return batch, ctx


def decode_phase(records: Sequence[RequestRecord], every: Sequence[RequestRecord],
                 m: _Model) -> PhaseRoof | None:
    """``records``: the measured requests; ``every``: all of the case's requests (warm-ups
    too), whose streams share the server's batch."""
    streams: list[_Stream] = []
    for rec in every:
        t, c = _tokens(rec)
        p = _prompt(rec)
        if len(t):
            streams.append(_Stream(t, c, (p[0] + p[1]) if p else 0))
    sweep = _Batch(streams)
    seconds = flops = nbytes = 0.0
    tokens = steps = n = 0
    batch_w = bps_w = 0.0
    clocks = set()
    for rec in records:
        t, c = _tokens(rec)
        if len(t) < 2:
            continue
        decoded = int(c[-1] - c[0])
        p = _prompt(rec)
        s = _Stream(t, c, (p[0] + p[1]) if p else 0)
        sec = _decode_seconds(rec, s, decoded)
        if decoded <= 0 or sec is None or sec[0] <= 0:
            continue
        k = max(1, decoded - _accepted(rec))
        idx = np.unique(np.linspace(1, len(t) - 1, min(len(t) - 1, MAX_STEP_SAMPLES))
                        .round().astype(int))
        batch, ctx = sweep.at(t[idx])
        batch = np.maximum(batch, 1)
        step_bytes = np.array([m.weight_bytes(b) for b in batch]) + m.kv * ctx
        step_flops = batch * 2 * m.mm + m.attn * ctx
        seconds += sec[0]
        nbytes += float(step_bytes.mean()) * k
        flops += float(step_flops.mean()) * k
        batch_w += float(batch.mean()) * sec[0]
        bps_w += float(step_bytes.mean()) * sec[0]
        tokens += decoded
        steps += k
        n += 1
        clocks.add(sec[1])
    if not n or seconds <= 0:
        return None
    notes: tuple[str, ...] = ()
    if steps < tokens:
        notes = ("speculative decoding: steps = tokens - accepted drafts; the draft model's "
                 "reads and the rejected drafts' FLOPs are not counted",)
    return PhaseRoof("decode", n, tokens, steps, seconds, flops, nbytes,
                     "; ".join(sorted(clocks)), "", "", None, None, None, None, None,
                     batch_mean=batch_w / seconds, bytes_per_step=bps_w / seconds,
                     notes=notes)


def _phase_unusable(p: PhaseRoof | None) -> str:
    """Why a phase's own figures cannot be held against a roof ("" when they can): its
    time, FLOPs and bytes each a finite number above zero (each clock reading is checked
    as it is taken, but a sum of finite ones can still overflow)."""
    if p is None:
        return ""
    bad = [f"{k} {v!r}" for k, v in (("seconds", p.seconds), ("FLOPs", p.flops),
                                     ("bytes", p.bytes)) if _positive(v) is None]
    return f"{p.phase}: {', '.join(bad)} not a finite number above zero" if bad else ""


NO_PEAK = "no peak of this device known"


def _against(p: PhaseRoof, lim: DeviceLimits, working_set: float) -> PhaseRoof:
    """The phase held against the device: the memory level its working set reaches,
    the balance, which roof, the share."""
    mem: Peak = lim.bandwidth
    level = "DRAM" if lim.kind == "cpu" else "HBM/GDDR"
    notes = list(p.notes)
    cache = _positive(lim.cache_bytes)
    if (lim.kind == "cpu" and cache and lim.cache_bandwidth is not None
            and _positive(lim.cache_bandwidth.value) and working_set <= cache):
        mem, level = lim.cache_bandwidth, "last-level cache"  # its bytes a step fit there
    fpk, bpk = _positive(lim.flops.value), _positive(mem.value)
    for peak, got in ((lim.flops, fpk), (mem, bpk)):
        if got is None and peak.value is not None:  # a peak no roof can be
            notes.append(f"the {peak.what or 'peak'} recorded, {format(repr(peak.value), '.40')}"
                         ", is not a finite number above zero: left out")
    fsh = p.flops_s / fpk if fpk else None
    bsh = p.bytes_s / bpk if bpk else None
    balance = fpk / bpk if fpk and bpk else None
    inten = p.intensity
    if balance is not None and inten is not None:
        roof = "compute" if inten >= balance else "memory"
    elif bpk:
        roof = "memory"
        notes.append(f"no compute peak ({lim.flops.unavailable}): the memory roof only")
    elif fpk:
        roof = "compute"
        notes.append(f"no bandwidth peak ({mem.unavailable}): the compute roof only")
    else:
        return replace(p, notes=(*notes, NO_PEAK))
    limit = fpk if roof == "compute" else bpk
    share = fsh if roof == "compute" else bsh
    if share is None or not math.isfinite(share) or share < 0:
        return replace(p, notes=(*notes, f"its share of the {roof} roof came out "
                                 f"{share!r}: no share"))
    return replace(p, roof=roof, memory_level=level, limit=limit, share=share,
                   flops_share=fsh, bytes_share=bsh, balance=balance, notes=tuple(notes))


def case_roofline(inp: RooflineInputs | None, records: Sequence[RequestRecord],
                  ledger: Any = None, hw: Sequence[Any] = ()) -> CaseRoofline | None:
    """The case against its device's roofline; None where the run recorded no facts
    (a run made before Strata read them). Whatever the facts, the peaks or the records
    hold, the answer is a roofline or its reason: the roofline is a note beside the
    verdict and a section of the report, and a failure in it costs only that."""
    if inp is None:
        return None
    try:
        return _case_roofline(inp, records, ledger, hw)
    except Exception as exc:  # an input of a shape no check above foresaw
        return CaseRoofline("", None, None, "-", str(inp.model.path or "-"),
                            unavailable=f"roofline unavailable ({failure_words(exc)})")


def _case_roofline(inp: RooflineInputs, records: Sequence[RequestRecord],
                   ledger: Any, hw: Sequence[Any]) -> CaseRoofline:
    model = inp.model
    metric = getattr(ledger, "metric", "e2e") if ledger is not None else "e2e"
    lim = _case_gpus(inp, hw)
    where = model.path or "-"
    device = lim.device if lim is not None else "-"
    m, why = _model(model)
    if m is None:
        return CaseRoofline("", None, None, device, where, unavailable=why)
    measured = [r for r in records if r.phase == "measured" and r.ok]
    clocks = getattr(ledger, "clocks", None)
    pre = prefill_phase(measured, m, getattr(clocks, "prefill_ms", None),
                        getattr(clocks, "prefill_source", ""))
    dec = decode_phase(measured, [r for r in records if r.ok], m)
    bad = "; ".join(w for w in (_phase_unusable(pre), _phase_unusable(dec)) if w)
    if bad:
        return CaseRoofline("", None, None, device, where,
                            unavailable=f"the case's figures are unusable: {bad}")
    if metric == "ttft":
        head = "prefill"
    elif metric == "itl":
        head = "decode"
    else:
        head = "decode" if dec is not None and (pre is None or dec.seconds >= pre.seconds) \
            else "prefill"
    if lim is None:
        return CaseRoofline(head, pre, dec, device, where,
                            unavailable=f"device limits unavailable: {inp.why_no_limits}")
    if pre is not None:
        pre = _against(pre, lim, pre.bytes / max(1, pre.steps))
    if dec is not None:
        dec = _against(dec, lim, dec.bytes_per_step or 0.0)
    notes = list(lim.notes)
    wd = str(model.get("weight_dtype") or "")
    if lim.kind == "cpu" and wd.startswith(("Q", "IQ", "TQ")):
        notes.append(f"the weights are {wd}: llama.cpp multiplies them as int8 dot products, "
                     "whose peak on a CPU is above the float32 one measured, so the compute "
                     "share overstates how close the case came")
    why = ""
    h = pre if head == "prefill" else dec
    if h is None:
        why = (f"no {head} measured: no request with "
               + ("a prefill clock and token counts" if head == "prefill"
                  else "two token events and a decode clock"))
    elif h.roof == "":  # no usable peak, or no usable share: the phase's notes say which
        why = "; ".join(n for n in h.notes if n.endswith(("left out", "no share"))
                        or n == NO_PEAK) or NO_PEAK
    return CaseRoofline(head, pre, dec, device, where, unavailable=why, notes=tuple(notes))


def weight_pass(nbytes: int, params: int, steps: int, seconds: float,
                limits: DeviceLimits) -> CaseRoofline:
    """A pass that reads one weight matrix once a step (``scripts/gpu_check.sh``'s
    decode-like pass: a matrix-vector product per step) held against the device exactly as
    a decode case is: a one-matrix "model" and one request of ``steps`` tokens."""
    vals = {**dict.fromkeys(_NEED, 0), "params_matmul_active": params, "stored_bytes": nbytes,
            "layers": 1, "heads": 1, "head_dim": 1, "experts": 1, "experts_per_token": 1,
            "tied_embeddings": False}
    model = ModelFacts("weight pass", "", tuple(
        (n, Fact(vals[n], "weight pass") if n in vals else Fact(None, unavailable="-"))
        for n in FACT_NAMES))
    t0, span = 10**12, int(seconds * 1e9)
    ev = tuple(TokenEvent(t0 + span * k // steps, 1) for k in range(steps + 1))
    rec = RequestRecord("pass", "pass", "measured", "completions", t0, t0, events=ev,
                        timings=Timings(prompt_n=1, prompt_ms=1e-3, predicted_n=steps + 1,
                                        predicted_ms=seconds * 1e3 * (steps + 1) / steps))
    roof = case_roofline(RooflineInputs(model, limits), [rec])
    assert roof is not None
    return replace(roof, headline_phase="decode")


# --- the verdict's evidence ---------------------------------------------------------------

ROOF_CLASS = "roofline"  # the evidence rows' and notes' tag (not a verdict class)


def _busy(sig: WindowSignals, lim_kind: str, n_cpus: int | None) -> tuple[bool, str]:
    """Was the device busy meanwhile: GPU utilization or SM activity at their busy cuts,
    or the server's CPU at the share of its CPUs that cpu_compute calls CPU-bound."""
    if lim_kind == "gpu":
        for name, v in (("gpu_util_busy", sig.gpu_util), ("sm_active_busy", sig.sm_active)):
            if v is not None and v >= threshold(name).value:
                return True, f"{name.replace('_busy', '')} {v:.2f}"
        return False, ""
    caps = [x for x in (sig.server_threads, n_cpus, sig.n_cores) if x]
    usable = float(min(caps)) if caps else 0.0
    if sig.server_cpu_cores is not None and usable and \
            sig.server_cpu_cores >= threshold("server_cores_of_threads").value * usable:
        return True, (f"the server used {sig.server_cpu_cores:.2f} of its {usable:g} "
                      f"CPU{'s' if usable != 1 else ''}")
    return False, ""


def annotate(v: Verdict, roof: CaseRoofline | None, sig: WindowSignals,
             device_kind: str = "cpu", n_cpus: int | None = None) -> Verdict:
    """The verdict with the roofline as evidence: one row (the headline phase's share
    against ``roof_near_frac``) and one note, first among the notes. Idempotent: an
    earlier roofline row and note are replaced. Never changes the classes, and never
    fails the verdict: a note that cannot be made is said as the note."""
    try:
        return _annotate(v, roof, sig, device_kind, n_cpus)
    except Exception as exc:  # the verdict stands without its roofline note
        notes = tuple(n for n in v.notes if not n.startswith(f"{ROOF_CLASS}:"))
        return replace(v, notes=(f"{ROOF_CLASS}: unavailable ({failure_words(exc)})", *notes),
                       evidence=tuple(e for e in v.evidence if e.cls != ROOF_CLASS))


def _annotate(v: Verdict, roof: CaseRoofline | None, sig: WindowSignals,
              device_kind: str, n_cpus: int | None) -> Verdict:
    notes = tuple(n for n in v.notes if not n.startswith(f"{ROOF_CLASS}:"))
    evidence = tuple(e for e in v.evidence if e.cls != ROOF_CLASS)
    v = replace(v, notes=notes, evidence=evidence)
    p = roof.headline if roof is not None else None
    if p is None or p.share is None or v.classes == ("requests_failed",):
        return v
    near, far = threshold("roof_near_frac"), threshold("roof_far_frac")
    bound = "bandwidth-bound" if p.roof == "memory" else "compute-bound"
    ev = Evidence(ROOF_CLASS, f"{p.phase}_{p.roof}_roof_share", round(p.share, 4), ">=",
                  near.name, near.value, "of the roof", near.source, p.share >= near.value)
    what = (f"{ROOF_CLASS}: {p.phase} at {p.share:.1%} of its {p.roof} roof "
            f"({p.memory_level if p.roof == 'memory' else 'peak FLOPs'})")
    busy, how = _busy(sig, device_kind, n_cpus)
    other = p.bytes_share if p.roof == "compute" else p.flops_share
    if p.share > 1:
        note = (f"{what}: above the peak, which a phase cannot be; the peak was measured "
                "low (a busy host: see the device's peaks) or the bytes or FLOPs are "
                "over-counted")
    elif p.share >= near.value:
        note = f"{what}: {bound} whatever the utilization counters say"
    elif p.share < far.value and other is not None and other < far.value and busy:
        where = ("a scheduling or kernel-launch question" if device_kind == "gpu" else
                 "a scheduling, synchronization or per-operation overhead question")
        note = (f"{what}, {other:.1%} of the other, both under {far.name} "
                f"{far.value:g}, with the device busy ({how}): {where}, not the "
                "hardware's limit")
    else:
        note = what
    return replace(v, notes=(note, *notes), evidence=(*evidence, ev))

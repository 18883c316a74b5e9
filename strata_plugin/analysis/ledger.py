"""The time ledger: where every millisecond of a request went, parts that sum to it.

A rule that fires past a threshold says nothing about the time no rule looks at; an
accounting that must close does (as top-down analysis of CPU pipelines accounts every
slot). Each request's wall time, dispatch to its last byte, is split in three segments
and each segment into parts, on the client's monotonic clock:

* **TTFT** (dispatch -> first token event): ``client_send`` (dispatch -> the request's
  last byte out, the client's own); ``server_queue`` (the engine's queue, where it has a
  clock for it: vLLM/SGLang histograms; llama.cpp has none, so its waiting count by
  Little's law, the case's mean queue time = mean waiting / arrival rate; plus the
  front-end wait: each request's time before prefill beyond the case's least, since a
  path delays every request alike and the server's load does not); ``prefill``
  (llama.cpp ``timings.prompt_ms``; vLLM's prefill histogram); ``ttft_stalled`` (the
  server neither running nor able to run meanwhile: run state); ``ttft_waiting`` and
  ``ttft_io`` (the front-end wait while the server was runnable but not running, or
  blocked in I/O); ``before_server`` (the case's least time before prefill: network, a
  proxy, TLS, the fixed cost of the HTTP front end, before the server's clock starts);
  ``residual_ttft`` (<= 0: the server's clocks claim more than the client saw);
  ``ttft_delivery`` (the first token's delivery delay: made by the server, held on the
  way, analysis/delivery.py). Queue and prefill are the request's own from the engine's
  clocks (``RequestRecord.engine``: vLLM's per-request metrics, SGLang's meta_info,
  llama.cpp's timings) where its response carried them; the case's means are the
  fallback, and ``merged`` says which part fell back and why.
* **Decode** (first -> last token event): first the gap's ``delivery`` (the client's
  wait beyond the server's production of the same tokens: analysis/delivery.py, from the
  server's token clock, or inferred from clumping), then the rest against the request's
  pace (the server's own time per token where it stamps tokens, else the client's median
  time per token): a gap within ``ledger_stall_factor`` x its tokens' pace is
  ``decode_compute``; past it, the pace's worth is compute and the excess a stall,
  split by what the server did during the gap (``stall_stalled``, ``stall_waiting``,
  ``stall_io``, ``stall_sleeping``, the rest ``stall_running``); a
  stall no run-state sample covers is ``residual_decode``: no clock explains it.
* **Tail** (last token -> last byte): ``tail``; by cause, the time the server's threads
  were stopped in it is a stall (``stall:stopped``), the time they waited for a CPU is
  waiting (``tail:waiting``, ``tail:throttled``), the rest the tail's own.

**By cause** (issue 30): each server-side part is split again by what the server's threads
did during it, from the run-state grid (analysis/run_states.py): the queue, prefill and
decode at its pace are the server's clocks, so their time is ``running`` except where the
threads were held back from a CPU (``waiting`` in the run queue, ``throttled`` by the
quota) or blocked in I/O (``io``); a stall keeps its own state (``stopped`` for the
frozen/stopped time, ``sleeping`` for a stall its threads slept through). Stopped,
traced or frozen is a stall wherever it falls (the queue, the way there, prefill, a decode
gap, the tail), and waiting for a CPU is waiting wherever the request is at the server
(the queue, the front end's wait, prefill, decode, the tail; not the way there, where the
threads' wait is other work's). A token that
took 40x its clean time because its threads queued for one CPU is at its pace, but its
time is ``waiting``, not compute. Each such cause is ``group:state`` (groups ``queue``,
``prefill``, ``decode``, ``stall``; the parts outside the server are ``outside:<part>``,
the residual ``unexplained:<part>``), and the causes of a request sum to its parts. The
level-1 split (:data:`LEVEL1`: running, waiting, blocked, stopped, outside, and the
residual as ``unexplained``) of a case's metric sums to 100% the way top-down analysis
accounts every pipeline slot (Ahmad Yasin, "A Top-Down Method for Performance Analysis
and Counters Architecture", ISPASS 2014). Without run-state samples a server clock's
time is ``running``: its own clock's word, and the case says so.

``residual = residual_ttft + residual_decode``; the parts sum to the wall time exactly,
and the ledger states its clock error (the client's loop lag p99 from its self-check, at
least ``ledger_clock_error_ms``). Per case, each part's share of TTFT, of the decode
time (TPOT/ITL) and of end-to-end time (ratios of sums, so the shares sum to 100%); the
case's metric decides which the verdict weighs. Beside them, the share of the window the
server was stalled while any request was in flight (``stalled_inflight_frac``): a stall
the metric's definition leaves out (TPOT when the freezes fell in TTFT) is still the
case's story (rules/verdict.py, ``server_stalled_window_lead``).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from strata_plugin.analysis.delivery import (
    CaseDelivery,
    RequestDelivery,
    case_delivery,
    request_delivery,
    served_with_drafts,
)
from strata_plugin.analysis.metrics import first_token_ns
from strata_plugin.analysis.run_states import STATES, WAITING_STATES, RunStates
from strata_plugin.analysis.thresholds import value as threshold_value
from strata_plugin.formats.records import ClockAnchor, RequestRecord, TokenEvent

if TYPE_CHECKING:
    from strata_plugin.analysis.timeline import HwStat

TTFT_PARTS = ("client_send", "before_server", "server_queue", "prefill", "ttft_waiting",
              "ttft_io", "ttft_stalled", "ttft_delivery", "residual_ttft")
DECODE_PARTS = ("decode_compute", *(f"stall_{s}" for s in STATES), "delivery",
                "residual_decode")
TAIL_PARTS = ("tail",)
PARTS = (*TTFT_PARTS, *DECODE_PARTS, *TAIL_PARTS)
RESIDUAL_PARTS = ("residual_ttft", "residual_decode")
#: Each part's class-like name in the verdict's weights: the class whose share it is.
WEIGHT_OF = {
    "client_send": "client_bound",
    "before_server": "outside_server",
    "server_queue": "queueing",
    "prefill": "compute",
    "decode_compute": "compute",
    "stall_running": "compute",
    "stall_waiting": "cpu_wait",
    "stall_throttled": "cpu_throttled",
    "stall_io": "io_page_faults",
    "stall_sleeping": "server_sleeping",
    "ttft_stalled": "server_stalled",
    "ttft_waiting": "cpu_wait",
    "ttft_io": "io_page_faults",
    "stall_stalled": "server_stalled",
    "ttft_delivery": "outside_server",
    "delivery": "outside_server",
    "tail": "tail",
    "residual_ttft": "unexplained",
    "residual_decode": "unexplained",
}
#: The metric a case is about, and its parts.
METRICS = {"ttft": TTFT_PARTS, "itl": DECODE_PARTS, "e2e": PARTS}
#: The level-1 split of a case's metric by cause (module docstring): it sums to 100%.
LEVEL1 = ("running", "waiting", "blocked", "stopped", "outside", "unexplained")
#: The server's parts by cause: where each group's time is (module docstring).
CAUSE_GROUPS = ("queue", "prefill", "decode", "stall", "tail")
#: The states a server clock's time is split into (the rest of it is ``running``).
_IMPEDED = (*WAITING_STATES, "io")
#: Each part outside the server, and the residual, as a cause of its own.
_OUTSIDE = ("client_send", "before_server", "ttft_delivery", "delivery", "tail")
#: The segment each cause's time belongs to: ``ttft``, ``itl`` (decode) or ``tail``.
SEGMENTS = {"ttft": ("ttft",), "itl": ("itl",), "e2e": ("ttft", "itl", "tail")}


#: A server cause's class-like name by its state (``running``: by its group, below).
_WEIGHT_OF_STATE = {"waiting": "cpu_wait", "throttled": "cpu_throttled",
                    "io": "io_page_faults", "sleeping": "server_sleeping",
                    "stopped": "server_stalled"}


def weight_of(cause: str) -> str:
    """The class-like name of a ``group:state`` cause in the verdict's weights: outside
    parts as WEIGHT_OF names them; the server's time by what its threads did, its running
    time as ``queueing`` while the request queued and ``compute`` otherwise."""
    group, _, state = cause.partition(":")
    if group in ("outside", "unexplained"):
        return WEIGHT_OF.get(state, "unexplained")
    if state in _WEIGHT_OF_STATE:
        return _WEIGHT_OF_STATE[state]
    return "queueing" if group == "queue" else "compute"


def level1_of(cause: str) -> str:
    """The level-1 category of a ``group:state`` cause (``LEVEL1``)."""
    group, _, state = cause.partition(":")
    if group == "outside":
        return "outside"
    if group == "unexplained":
        return "unexplained"
    if state in WAITING_STATES:
        return "waiting"
    if state == "io" or (group == "stall" and state == "sleeping"):
        return "blocked"
    if state == "stopped":
        return "stopped"
    return "running"


_GROUP_WORDS = {"queue": "the server's queue", "prefill": "prefill", "decode": "decode",
                "stall": "decode stalls", "tail": "the tail"}
_OUTSIDE_WORDS = {"client_send": "the client's send", "before_server": "before the server",
                  "ttft_delivery": "the first token's delivery", "delivery": "delivery",
                  "tail": "the tail", "residual_ttft": "what no clock explains in TTFT",
                  "residual_decode": "decode stalls no clock explains"}


def cause_words(cause: str) -> str:
    """A ``group:state`` cause of the ledger in words."""
    group, _, state = cause.partition(":")
    if group in ("outside", "unexplained"):
        return _OUTSIDE_WORDS.get(state, state)
    where = _GROUP_WORDS.get(group, group)
    return {
        "running": ("the server's queue (its threads busy with other work)"
                    if group == "queue" else
                    "decode stalls, the server running" if group == "stall" else
                    f"{where} compute"),
        "waiting": f"{where}, its threads waiting for a CPU (run queue)",
        "throttled": f"{where}, its threads held by the CPU quota",
        "io": f"{where}, its threads blocked in I/O",
        "sleeping": f"{where}, its threads asleep",
        "stopped": "the server stopped (frozen or stopped threads)",
    }.get(state, f"{where} {state}")


def _impeded(states_ms: Mapping[str, float] | None) -> dict[str, float]:
    """A server clock's span by cause: the share its threads were held back from a CPU
    or blocked in I/O (of the time they were not stalled, counted apart), the rest
    ``running`` (on a CPU, or asleep while the clock ran: a GPU's kernels, its own
    wait). No samples: all ``running``, the clock's word."""
    if not states_ms:
        return {"running": 1.0}
    tot = sum(v for k, v in states_ms.items() if k != "stalled")
    if tot <= 0:
        return {"running": 1.0}
    out = {k: max(0.0, states_ms[k]) / tot for k in _IMPEDED}
    out["running"] = max(0.0, 1.0 - sum(out.values()))
    return out
METRIC_LABELS = {"ttft": "TTFT", "itl": "TPOT/ITL", "e2e": "end-to-end time"}
_NS_MS = 1e6
#: why a response carries no per-request engine clocks, where Strata knows
_NO_CLOCKS = ("vLLM sends them with --enable-per-request-metrics; SGLang with "
              "--enable-metrics")


@dataclass(frozen=True)
class ServerClocks:
    """The case's server-side figures the records lack: per-request means from the
    engine's histograms (vLLM, SGLang), or llama.cpp's waiting count (Little's law)."""

    queue_ms: float | None = None
    queue_source: str = ""
    prefill_ms: float | None = None  # only where records carry no per-request prefill
    prefill_source: str = ""
    #: the least time before prefill over the case's requests: the way to the server
    #: (network, proxy), alike for every request; the rest varies with the server's load
    path_floor_ms: float | None = None


@dataclass(frozen=True)
class RequestLedger:
    request_id: str
    case_id: str
    wall_ms: float  # dispatch -> last byte
    ttft_ms: float
    decode_ms: float  # first -> last token event
    tail_ms: float
    n_tokens: int  # output tokens after the first event (the decode's per-token unit)
    parts: tuple[tuple[str, float], ...]  # PARTS order, ms
    clock_error_ms: float
    pace_ms: float | None  # the request's median time per token between events
    server_pace_ms: float | None  # llama.cpp predicted_ms / predicted_n (stalls included)
    n_gaps: int
    n_stalls: int
    merged: tuple[str, ...] = ()
    #: the parts by cause (module docstring): (segment, ``group:state``, ms); they sum
    #: to the parts (``ttft``: TTFT's, ``itl``: the decode's, ``tail``: the tail)
    causes: tuple[tuple[str, str, float], ...] = ()
    #: the delivery split the decode parts were taken with (analysis/delivery.py)
    delivery: RequestDelivery | None = field(default=None, compare=False, repr=False)
    _by_name: dict[str, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", dict(self.parts))

    def part(self, name: str) -> float:
        return self._by_name[name]

    @property
    def residual_ms(self) -> float:
        return sum(self.part(p) for p in RESIDUAL_PARTS)

    def to_json(self) -> str:
        d = {
            "request_id": self.request_id, "case_id": self.case_id,
            "wall_ms": _r(self.wall_ms), "ttft_ms": _r(self.ttft_ms),
            "decode_ms": _r(self.decode_ms), "tail_ms": _r(self.tail_ms),
            "n_tokens": self.n_tokens, "parts": {k: _r(v) for k, v in self.parts},
            "residual_ms": _r(self.residual_ms), "clock_error_ms": _r(self.clock_error_ms),
            "pace_ms": None if self.pace_ms is None else _r(self.pace_ms),
            "server_pace_ms": None if self.server_pace_ms is None else _r(self.server_pace_ms),
            "n_gaps": self.n_gaps, "n_stalls": self.n_stalls, "merged": list(self.merged),
            "causes": {f"{seg}/{c}": _r(ms) for seg, c, ms in self.causes if ms},
        }
        return json.dumps(d, sort_keys=True, separators=(",", ":"))


def _r(x: float) -> float:
    return round(float(x), 4)


def _state_ms(states: RunStates, a_ns: int, b_ns: int) -> dict[str, float]:
    """Milliseconds of [a, b] in each state, scaled up to the whole span from what the
    samples cover; all zero where they cover under half of it."""
    secs, covered = states.over(a_ns, b_ns)
    span = (b_ns - a_ns) / 1e9
    if span <= 0 or covered < 0.5 * span:
        return dict.fromkeys(STATES, 0.0)
    return {k: v * span / covered * 1e3 for k, v in secs.items()}


def _stall_split(excess_ms: float, gap: tuple[int, int], states: RunStates | None,
                 anchor: ClockAnchor | None) -> dict[str, float]:
    """A stall's excess over the pace, by what the server did during the gap: the non-
    running states first (the pace's worth of the gap was compute), the rest running."""
    out = dict.fromkeys((f"stall_{s}" for s in STATES), 0.0)
    out["residual_decode"] = 0.0
    if states is None or anchor is None:
        out["residual_decode"] = excess_ms
        return out
    a, b = anchor.to_wall_ns(gap[0]), anchor.to_wall_ns(gap[1])
    secs, covered = states.over(a, b)
    span = (b - a) / 1e9
    if covered <= 0 or covered < 0.5 * span:
        out["residual_decode"] = excess_ms
        return out
    scale = span / covered
    left = excess_ms
    for s in STATES[1:-1]:  # stalled time is counted apart, over the whole gap
        take = min(left, secs[s] * scale * 1e3)
        out[f"stall_{s}"] = take
        left -= take
    out["stall_running"] = left
    return out


@dataclass(frozen=True)
class _Gap:
    a: int  # monotonic ns
    b: int
    k: int  # tokens in the later event
    stalled_ms: float  # the server neither running nor able to run during it
    excess_ms: float  # beyond k x pace (after the stalled and delivery time), 0 unless a stall
    delivery_ms: float = 0.0  # the client's wait beyond the server's production

    @property
    def ms(self) -> float:
        return (self.b - self.a) / _NS_MS


#: Speculative decoding: a gap shorter than this share of the request's mean gap is
#: inside one verify step's hand-over (llama.cpp streams a step's accepted tokens as
#: separate events 0.1-0.7 ms apart where its steps took 3-32 ms: the smoke matrix's
#: spec_l35 sweep), not a step of its own.
STEP_GAP_SHARE = 0.2


def _step_tokens(raw: Sequence[tuple[int, int, int]], eff: Sequence[float],
                 made: Sequence[float] | None) -> list[int]:
    """Speculative decoding hands a verify step's accepted tokens over together: the gap
    that opens a step carries all of its tokens (the step made them), the gaps inside it
    none. A step's events share one production time on the server's token clock
    (``made``, per event) where it has one; else their gaps are under ``STEP_GAP_SHARE``
    of the mean."""
    if made is not None:
        opens = [made[i + 1] > made[i] for i in range(len(raw))]
    else:
        mean = sum(eff) / len(eff)
        opens = [e >= STEP_GAP_SHARE * mean for e in eff]
    out = [0] * len(raw)
    head = None
    for i, (_, _, k) in enumerate(raw):
        if opens[i] or head is None:
            head = i
        out[head] += k
    return out


def _gaps(toks: Sequence[TokenEvent], states: RunStates | None, anchor: ClockAnchor | None,
          dv: RequestDelivery | None = None, *, drafts: bool = False,
          made: Sequence[float] | None = None) -> tuple[list[_Gap], float | None]:
    """Each gap between token events and the request's pace. Time the run state shows the
    server stalled in a gap is never compute, however short the gap; its delivery part
    (``dv``) is not the server's either; the rest of the gap is compute up to
    ``ledger_stall_factor`` x its tokens' pace (the server's own time per token where
    ``dv`` has it, else the median time per token, stalled time left out), and past it
    the excess is a stall. With fewer than two gaps there is no pace and no stall.

    ``drafts`` (speculative decoding): a gap's tokens are its verify step's
    (:func:`_step_tokens`), the pace is per token of a step, and a gap inside a step is
    never a stall. Counted per event, the steps' gaps were 3-30x the median (mostly the
    gaps inside steps), and the smoke matrix's speculative sweeps read 85-88% of
    TPOT/ITL as "decode stalls, the server running"."""
    raw = [(toks[i - 1].t_ns, toks[i].t_ns, toks[i].n_tokens) for i in range(1, len(toks))]
    if not raw:
        return [], None
    stalled = [0.0] * len(raw)
    if states is not None and anchor is not None:
        a = np.array([anchor.to_wall_ns(x) for x, _, _ in raw], np.int64)
        b = np.array([anchor.to_wall_ns(y) for _, y, _ in raw], np.int64)
        stalled = [min(float(v), (y - x) / _NS_MS) for v, (x, y, _) in
                   zip(states.seconds_between(a, b, "stalled") * 1e3, raw, strict=True)]
    held = [0.0] * len(raw)
    if dv is not None and len(dv.gap_ms) == len(raw):  # stalled time wins over delivery
        held = [min(d, max(0.0, (y - x) / _NS_MS - st))
                for d, (x, y, _), st in zip(dv.gap_ms, raw, stalled, strict=True)]
    eff = [(y - x) / _NS_MS - st - d
           for (x, y, _), st, d in zip(raw, stalled, held, strict=True)]
    ks = [k for _, _, k in raw]
    if drafts and sum(eff) > 0:
        ks = _step_tokens(raw, eff, made)
    per_token = [e / k for e, k in zip(eff, ks, strict=True) if k > 0]
    pace = statistics.median(per_token) if len(per_token) >= 2 else None
    if dv is not None and dv.pace_ms is not None and not drafts:
        pace = dv.pace_ms
    factor = threshold_value("ledger_stall_factor")
    out = []
    for (x, y, _), k, st, e, d in zip(raw, ks, stalled, eff, held, strict=True):
        inside = drafts and k == 0  # a step's hand-over: its tokens were made with the step
        excess = (e - k * pace if pace is not None and not inside and e > factor * k * pace
                  else 0.0)
        out.append(_Gap(x, y, k, st, excess, d))
    return out, pace


def _draft_args(rec: RequestRecord, toks: Sequence[TokenEvent]) -> dict[str, Any]:
    """:func:`_gaps`' speculative-decoding arguments for a request: whether it was
    served with drafts, and the server's token clock per event where it has one."""
    if not served_with_drafts(rec):
        return {}
    made = rec.engine.token_ms if rec.engine is not None else ()
    return {"drafts": True, "made": made if len(made) == len(toks) else None}


def stall_spans(rec: RequestRecord, states: RunStates | None, anchor: ClockAnchor | None,
                delivery: RequestDelivery | None = None) -> list[tuple[int, int, str]]:
    """The request's decode stalls (monotonic start, end) with the state that took most
    of their time beyond the pace ("unknown" where no run-state sample covers them):
    what the timeline colours. ``delivery``: the split its ledger was taken with
    (:attr:`RequestLedger.delivery`), so that the picture's stalls are the ledger's: the
    floor below which a late token is not delivery depends on the client's clock error
    and its own check (:func:`request_ledger`), which the record alone does not carry."""
    toks = sorted((e for e in rec.events if e.n_tokens > 0), key=lambda e: e.t_ns)
    dv = delivery if delivery is not None else request_delivery(
        rec, toks, states=states, anchor=anchor)
    gaps, _ = _gaps(toks, states, anchor, dv, **_draft_args(rec, toks))
    out = []
    for g in gaps:
        if g.excess_ms <= 0 and g.stalled_ms <= 0:
            continue
        split = _stall_split(g.excess_ms, (g.a, g.b), states, anchor)
        split["stall_stalled"] += g.stalled_ms
        top = max(split, key=lambda n: split[n])
        out.append((g.a, g.b, "unknown" if top == "residual_decode" else top[len("stall_"):]))
    return out


def request_ledger(
    rec: RequestRecord,
    *,
    clocks: ServerClocks = ServerClocks(),
    states: RunStates | None = None,
    anchor: ClockAnchor | None = None,
    clock_error_ms: float | None = None,
    delivery: RequestDelivery | None = None,
    client_late: bool = False,
    client_lag_max_ms: float | None = None,
) -> RequestLedger | None:
    """One request's ledger; None for a request with no token event (nothing to split).
    ``delivery``: its delivery split (analysis/delivery.py), made here when not given.
    ``client_late``: the client's own self-check says it fell behind. Its stamps are then
    late by its loop lag (``clock_error_ms``) *because of the client*: that lag is where
    the measured time went, not an error bar on it, so it does not raise the floor below
    which a token's late arrival is not delivery. (The fault suite's client_bound arm, a
    client held to 2% of a core: a 1.4 s loop lag p99 as the floor hid every late token,
    and the client's gaps read as decode stalls with the server running.)
    ``client_lag_max_ms``: the client's worst loop lag, which explains a request's one
    late read (analysis/delivery.py); not used where the client fell behind (then every
    late read is its own)."""
    first = first_token_ns(rec)
    if first is None:
        return None
    toks = sorted((e for e in rec.events if e.n_tokens > 0), key=lambda e: e.t_ns)
    last = toks[-1].t_ns
    end = max(last, rec.done_ns or last)
    disp = rec.dispatched_ns
    ttft = (first - disp) / _NS_MS
    merged: list[str] = []
    parts = dict.fromkeys(PARTS, 0.0)

    # --- TTFT -----------------------------------------------------------------------
    sent = rec.extra.get("sent_ns")
    send = 0.0
    if isinstance(sent, int):
        send = min(max(0.0, (sent - disp) / _NS_MS), ttft)
    else:
        merged.append("client_send in before_server: the record has no send time")
    t, eng = rec.timings, rec.engine
    err = max(threshold_value("ledger_clock_error_ms"), clock_error_ms or 0.0)
    dv = delivery if delivery is not None else request_delivery(
        rec, toks, states=states, anchor=anchor,
        clock_error_ms=threshold_value("ledger_clock_error_ms") if client_late else err,
        client_lag_max_ms=None if client_late else client_lag_max_ms)
    if client_late and err > threshold_value("ledger_clock_error_ms"):
        merged.append(f"delivery includes the client's own lateness: its self-check says it "
                      f"fell behind, so its stamps' lag (p99 {err:.3g} ms) is its time, not "
                      "an error bar")
    # the request's own clocks first (the engine's), the case's means only as a fallback
    prefill = eng.prefill_ms if eng is not None else None
    if prefill is None and t is not None:
        prefill = t.prompt_ms
    if prefill is None and clocks.prefill_ms is not None:
        prefill = clocks.prefill_ms
        merged.append(f"prefill: the case's mean ({clocks.prefill_source}): the response "
                      f"carried no per-request prefill ({_NO_CLOCKS})")
    elif prefill is None:
        merged.append("prefill in before_server: the engine reports no prefill time")
    avail = ttft - send
    pf = max(0.0, prefill or 0.0)
    q = 0.0
    own_q = eng.queue_ms if eng is not None else None
    if own_q is not None:
        q = min(max(0.0, own_q), max(0.0, avail - pf))
    elif clocks.queue_ms is not None:
        q = min(max(0.0, clocks.queue_ms), max(0.0, avail - pf))
        merged.append(f"server_queue: the case's mean ({clocks.queue_source}): the response "
                      f"carried no per-request queue time ({_NO_CLOCKS})")
    else:
        merged.append("server_queue in before_server: the engine reports no queue time "
                      "and no waiting count")
    pre = avail - pf - q  # before the server's prefill clock, outside its queue clock
    residual_ttft = min(0.0, pre)
    pre = max(0.0, pre)
    # the first token, made by the server, held on the way (its delivery delay beyond
    # the path's constant): outside the server, and not the path's floor either
    held_first = min(pre, dv.first_ms)
    pre -= held_first
    before, front = pre, 0.0
    if clocks.path_floor_ms is not None:
        # The way to the server (a network path, a proxy) delays every request alike; what
        # varies from request to request with the server's load (its front end, a loop
        # that takes new tasks between batch steps, a queue it does not count) is the
        # server's. The case's least time before prefill is the path; the rest, queue.
        before = min(pre, max(0.0, clocks.path_floor_ms))
        front = pre - before
        merged.append(f"server_queue includes the front-end wait: the time before prefill "
                      f"beyond the case's least ({clocks.path_floor_ms:.3g} ms, which stays "
                      "before_server: the way there, alike for every request)")
    stalled_ttft = waiting_ttft = io_ttft = 0.0
    in_pf: dict[str, float] | None = None
    pre_states: dict[str, float] | None = None
    if states is not None and anchor is not None:
        a = anchor.to_wall_ns(disp + int(send * _NS_MS))
        b = anchor.to_wall_ns(first)
        p0 = max(a, b - int(pf * _NS_MS))
        in_pf = _state_ms(states, p0, b)
        pre_states = _state_ms(states, a, p0)
        take_pf = min(in_pf["stalled"], pf)
        pf -= take_pf
        # A freeze before prefill: from the server's own wait first, then the way there,
        # then the first token's delivery (stalled time wins over delivery, as in a gap:
        # a stopped server's own sender holds the token too)
        take = min(pre_states["stalled"], front + q + before + held_first)
        for have in ("front", "q", "before", "held"):
            got = min(take, {"front": front, "q": q, "before": before,
                             "held": held_first}[have])
            take -= got
            stalled_ttft += got
            if have == "front":
                front -= got
            elif have == "q":
                q -= got
            elif have == "before":
                before -= got
            else:
                held_first -= got
        stalled_ttft += take_pf
        # The server's own wait, by what it did meanwhile: runnable without a CPU, in I/O.
        # Not the way there: while the request is on the path its threads' wait is other
        # work's (a relay's 3 s read 326 ms shorter when it was taken from the path).
        waiting_ttft = min(sum(pre_states[k] for k in WAITING_STATES), front)
        front -= waiting_ttft
        io_ttft = min(pre_states["io"], front)
        front -= io_ttft
    parts.update(client_send=send, before_server=before, server_queue=q + front, prefill=pf,
                 ttft_waiting=waiting_ttft, ttft_io=io_ttft, ttft_stalled=stalled_ttft,
                 ttft_delivery=held_first, residual_ttft=residual_ttft)
    causes: dict[tuple[str, str], float] = {}

    def add(seg: str, cause: str, ms: float) -> None:
        causes[seg, cause] = causes.get((seg, cause), 0.0) + ms

    for name in ("client_send", "before_server", "ttft_delivery"):
        add("ttft", f"outside:{name}", parts[name])
    add("ttft", "unexplained:residual_ttft", residual_ttft)
    add("ttft", "stall:stopped", stalled_ttft)
    if pre_states is not None:  # the front-end wait: the quota's share of it apart
        held = sum(pre_states[k] for k in WAITING_STATES)
        for k in WAITING_STATES:
            add("ttft", f"queue:{k}", waiting_ttft * (pre_states[k] / held if held > 0 else
                                                       float(k == "waiting")))
    else:
        add("ttft", "queue:waiting", waiting_ttft)
    add("ttft", "queue:io", io_ttft)
    if pre_states is not None:  # what the wait above took is not the queue's again
        pre_states = dict(pre_states, waiting=max(0.0, pre_states["waiting"] - waiting_ttft),
                          io=max(0.0, pre_states["io"] - io_ttft))
    for group, ms, st in (("queue", q + front, pre_states), ("prefill", pf, in_pf)):
        for k, share in _impeded(st).items():
            add("ttft", f"{group}:{k}", ms * share)

    # --- decode ---------------------------------------------------------------------
    gaps, pace = _gaps(toks, states, anchor, dv, **_draft_args(rec, toks))
    fracs = _gap_fractions(gaps, states, anchor)
    n_stalls = 0
    for i, g in enumerate(gaps):
        parts["stall_stalled"] += g.stalled_ms
        parts["delivery"] += g.delivery_ms
        compute = g.ms - g.stalled_ms - g.delivery_ms - max(0.0, g.excess_ms)
        for k, share in fracs[i].items():
            add("itl", f"decode:{k}", compute * share)
        if g.excess_ms <= 0:
            parts["decode_compute"] += g.ms - g.stalled_ms - g.delivery_ms
            # a stall when more than its pace's worth of it was stalled (a sampling
            # interval's edge spilling into a neighbouring gap is less)
            n_stalls += pace is not None and g.stalled_ms > g.k * pace
            continue
        n_stalls += 1
        parts["decode_compute"] += g.ms - g.stalled_ms - g.delivery_ms - g.excess_ms
        for name, ms in _stall_split(g.excess_ms, (g.a, g.b), states, anchor).items():
            parts[name] += ms
    if n_stalls and states is None:
        merged.append("decode stalls in residual_decode: no run-state samples (agent "
                      "collector runstate)")
    if dv.note:
        merged.append(f"delivery: {dv.note}")
    parts["tail"] = (end - last) / _NS_MS
    add("itl", "outside:delivery", parts["delivery"])
    add("itl", "unexplained:residual_decode", parts["residual_decode"])
    for state in STATES:
        add("itl", f"stall:{'stopped' if state == 'stalled' else state}",
            parts[f"stall_{state}"])
    for cause, ms in _tail_split(parts["tail"], (last, end), states, anchor).items():
        add("tail", cause, ms)

    server_pace = None
    if t is not None and t.predicted_ms is not None and (n_pred := t.predicted_n or 0) >= 2:
        server_pace = t.predicted_ms / n_pred
    n_out = sum(e.n_tokens for e in toks)
    return RequestLedger(
        request_id=rec.request_id, case_id=rec.case_id, wall_ms=(end - disp) / _NS_MS,
        ttft_ms=ttft, decode_ms=(last - first) / _NS_MS, tail_ms=parts["tail"],
        n_tokens=max(0, n_out - toks[0].n_tokens), parts=tuple((p, parts[p]) for p in PARTS),
        clock_error_ms=err, pace_ms=pace, server_pace_ms=server_pace, n_gaps=len(gaps),
        n_stalls=n_stalls, merged=tuple(merged), delivery=dv,
        causes=tuple((seg, c, ms) for (seg, c), ms in causes.items()),
    )


def _tail_split(tail_ms: float, span: tuple[int, int], states: RunStates | None,
                anchor: ClockAnchor | None) -> dict[str, float]:
    """The tail (last token event -> last byte) by what the server's threads did: the
    response's last bytes are the server's to send, so time its threads were stopped is a
    stall (``stall:stopped``) and time they waited for a CPU or the quota is waiting
    (``tail:waiting``, ``tail:throttled``), as anywhere else in the request; the rest is
    the tail's own (``outside:tail``). No samples over half of it: all the tail's."""
    out = {"outside:tail": tail_ms}
    if tail_ms <= 0 or states is None or anchor is None:
        return out
    st = _state_ms(states, anchor.to_wall_ns(span[0]), anchor.to_wall_ns(span[1]))
    left = tail_ms
    for state, cause in (("stalled", "stall:stopped"), *((k, f"tail:{k}")
                                                          for k in WAITING_STATES)):
        take = min(left, st[state])
        if take > 0:
            out[cause] = take
            left -= take
    out["outside:tail"] = left
    return out


def _gap_fractions(gaps: Sequence[_Gap], states: RunStates | None,
                   anchor: ClockAnchor | None) -> list[dict[str, float]]:
    """Each gap's compute by cause (:func:`_impeded`): the run state over the gap, where
    the samples cover at least half of it (else the clock's word: running)."""
    if not gaps or states is None or anchor is None:
        return [{"running": 1.0}] * len(gaps)
    a = np.array([anchor.to_wall_ns(g.a) for g in gaps], np.int64)
    b = np.array([anchor.to_wall_ns(g.b) for g in gaps], np.int64)
    secs = {k: states.seconds_between(a, b, k) for k in STATES}
    covered = sum(secs.values(), np.zeros(len(gaps)))
    span = (b - a) / 1e9
    out = []
    for i in range(len(gaps)):
        if span[i] <= 0 or covered[i] < 0.5 * span[i]:
            out.append({"running": 1.0})
        else:
            out.append(_impeded({k: float(v[i]) for k, v in secs.items()}))
    return out


# --- the case -----------------------------------------------------------------------------


def case_metric(name: str, params: Mapping[str, object]) -> tuple[str, str]:
    """(metric, why): what the case is about. Prefill and long-context cases (and any
    case of one output token) are about TTFT, decode cases about TPOT/ITL, the rest
    about end-to-end time."""
    osl = params.get("osl")
    low = name.lower()
    if isinstance(osl, (int, float)) and osl <= 1:
        return "ttft", "one output token: the request is its prefill"
    if low.startswith(("prefill", "long_context")):
        return "ttft", "a prefill / long-context case"
    if "decode" in low:
        return "itl", "a decode case"
    return "e2e", "neither a prefill nor a decode case"


#: Why a decode case's ledger is about end-to-end time: each response arrived in one read
#: (a proxy that buffers whole responses), so no time lies between its tokens' reads and
#: TPOT/ITL cannot say where the case's time went; the wait for that one read can.
NO_DECODE_TIME = ("a decode case whose every response arrived in one read (no time between "
                  "its tokens' reads): its end-to-end time")


@dataclass(frozen=True)
class CaseLedger:
    case_id: str
    metric: str  # "ttft" | "itl" | "e2e"
    metric_why: str
    requests: tuple[RequestLedger, ...]
    clocks: ServerClocks = ServerClocks()
    has_run_state: bool = False
    stalled_window_frac: float | None = None
    #: the share of the window with the server stalled while any of the case's requests
    #: was in flight (dispatch to last byte): a stall the requests waited out, whatever
    #: share of the case's metric (a median, a per-request mean) it shows in
    stalled_inflight_frac: float | None = None
    states_seen: tuple[tuple[str, float], ...] = ()
    merged: tuple[str, ...] = field(default=())
    #: the run states the stalls were classified with (for the timeline picture)
    states: RunStates | None = field(default=None, compare=False, repr=False)
    #: the case's delivery: its evidence and pattern (analysis/delivery.py)
    delivery: CaseDelivery | None = field(default=None, compare=False)
    #: (source, requests) of the engine's own per-request clocks the ledger used
    engine_sources: tuple[tuple[str, int], ...] = ()

    def of_requests(self, ids: Collection[str]) -> CaseLedger:
        """The same case's ledger over the requests ``ids`` alone (one engine's, where
        the path ends at several): its shares are of those requests' time."""
        return replace(self, requests=tuple(r for r in self.requests if r.request_id in ids))

    def delivered_gaps(self) -> dict[str, tuple[float, ...]]:
        """Each request's delivery part per gap between its token events (for the
        interference analysis, whose stalls are the server's)."""
        return {r.request_id: r.delivery.gap_ms for r in self.requests
                if r.delivery is not None and any(r.delivery.gap_ms)}

    @property
    def n(self) -> int:
        return len(self.requests)

    def _total(self, seg: str) -> float:
        return sum({"ttft": r.ttft_ms, "itl": r.decode_ms, "e2e": r.wall_ms}[seg]
                   for r in self.requests)

    def shares(self, seg: str) -> tuple[tuple[str, float], ...]:
        """Each part's share of the segment's time over the case (ratio of sums)."""
        total = self._total(seg)
        if total <= 0:
            return ()
        return tuple((p, sum(r.part(p) for r in self.requests) / total) for p in METRICS[seg])

    def mean_ms(self, seg: str) -> float | None:
        return self._total(seg) / self.n if self.n else None

    def ms_per_token(self) -> float | None:
        toks = sum(r.n_tokens for r in self.requests)
        return self._total("itl") / toks if toks else None

    def residual_frac(self, seg: str | None = None) -> float | None:
        """|residual| over the segment's time (each residual part's magnitude: an over-
        claim in TTFT does not cancel an unexplained stall)."""
        seg = seg or self.metric
        total = self._total(seg)
        if not self.n or total <= 0:
            return None
        names = [p for p in RESIDUAL_PARTS if p in METRICS[seg]]
        return sum(abs(r.part(p)) for r in self.requests for p in names) / total

    def residual_ms(self, seg: str | None = None) -> float | None:
        """The same residual per request (per output token for ``itl``)."""
        seg = seg or self.metric
        frac = self.residual_frac(seg)
        base = self.ms_per_token() if seg == "itl" else self.mean_ms(seg)
        return None if frac is None or base is None else frac * base

    def residual_part(self, seg: str | None = None) -> str:
        seg = seg or self.metric
        names = [p for p in RESIDUAL_PARTS if p in METRICS[seg]]
        sums = {p: sum(abs(r.part(p)) for r in self.requests) for p in names}
        if not sums or max(sums.values()) <= 0:
            return ""
        top = max(sums, key=lambda p: sums[p])
        if top == "residual_decode":
            return ("decode stalls no run-state sample covers" if not self.has_run_state
                    else "decode stalls outside the run-state samples")
        return "the server's clocks claim more of TTFT than the client saw"

    def share_of(self, parts: Sequence[str], seg: str | None = None) -> float | None:
        seg = seg or self.metric
        sh = dict(self.shares(seg))
        if not sh:
            return None
        return sum(sh.get(p, 0.0) for p in parts)

    def cause_shares(self, seg: str | None = None) -> tuple[tuple[str, float], ...]:
        """Each ``group:state`` cause's share of the segment's time over the case (ratio
        of sums, like :meth:`shares`; they sum to 100%), largest first."""
        seg = seg or self.metric
        total = self._total(seg)
        if total <= 0:
            return ()
        keep = SEGMENTS[seg]
        out: dict[str, float] = {}
        for r in self.requests:
            for sg, c, ms in r.causes:
                if sg in keep:
                    out[c] = out.get(c, 0.0) + ms
        return tuple(sorted(((c, v / total) for c, v in out.items() if v),
                            key=lambda kv: (-kv[1], kv[0])))

    def level1(self, seg: str | None = None) -> tuple[tuple[str, float], ...]:
        """The level-1 split of the segment's time (``LEVEL1`` order): sums to 100%."""
        shares = self.cause_shares(seg)
        if not shares:
            return ()
        out = dict.fromkeys(LEVEL1, 0.0)
        for c, v in shares:
            out[level1_of(c)] += v
        return tuple(out.items())

    def weights(self) -> tuple[tuple[str, float], ...]:
        """Class-like names and their share of the case's metric, by cause
        (:func:`weight_of`): the verdict's weights say where the time went, as its lead
        does, not which clock ran (a decode held by its quota weighs ``cpu_throttled``)."""
        out: dict[str, float] = {}
        for c, s in self.cause_shares():
            out[weight_of(c)] = out.get(weight_of(c), 0.0) + s
        return tuple((k, round(v, 4)) for k, v in sorted(out.items()))

    def clock_error_ms(self) -> float:
        return max((r.clock_error_ms for r in self.requests), default=0.0)

    def prefill_known(self) -> bool:
        return not any("prefill in before_server" in m for r in self.requests for m in r.merged)

    def queue_split(self) -> bool:
        """The server's queue told from the way there: a queue clock (the engine's, or
        its waiting count), or the path's floor over several requests."""
        return self.clocks.queue_ms is not None or self.clocks.path_floor_ms is not None

    def median_share(self, part: str) -> float | None:
        """The median request's share of its TTFT in ``part``."""
        xs = [r.part(part) / r.ttft_ms for r in self.requests if r.ttft_ms > 0]
        return statistics.median(xs) if xs else None

    def median_ms(self, part: str) -> float | None:
        """The median request's milliseconds in ``part``."""
        xs = [r.part(part) for r in self.requests if r.ttft_ms > 0]  # median_share's
        return statistics.median(xs) if xs else None

    def signals(self) -> dict[str, Any]:
        """The classifier's ledger inputs (rules.WindowSignals fields)."""
        if not self.n:
            return {}
        ttft = dict(self.shares("ttft"))
        out: dict[str, object] = dict(
            ledger_metric=self.metric,
            ledger_shares=self.weights(),
            ledger_residual_frac=_rn(self.residual_frac()),
            ledger_residual_ms=_rn(self.residual_ms()),
            ledger_residual_part=self.residual_part(),
            queue_split=self.queue_split(),
        )
        if ttft and self.prefill_known():
            # the median request's shares of its TTFT, as the rules read them (the table's
            # shares are ratios of sums, which a few long TTFTs dominate)
            out["outside_server_frac"] = _rn(self.median_share("before_server"))
            out["before_server_ms"] = _rn(self.median_ms("before_server"))
            out["server_queue_frac"] = _rn(self.median_share(
                "server_queue" if self.queue_split() else "before_server"))
        causes = self.cause_shares()
        if causes:
            out["ledger_causes"] = tuple((c, round(v, 4)) for c, v in causes)
            out["ledger_level1"] = tuple((c, round(v, 4)) for c, v in self.level1())
            out["ledger_run_state"] = self.has_run_state
        st = self.states
        if st is not None and st.run_cores is not None:
            out["ledger_run_cores"] = _rn(st.run_cores)
            out["ledger_runnable_cores"] = _rn(st.run_cores + (st.wait_cores or 0.0)
                                               + (st.throttled_cores or 0.0))
            out["ledger_runstate_samples"] = st.n_window
        if self.has_run_state:
            out["server_stalled_frac"] = _rn(self.stalled_share())
            out["server_stalled_window_frac"] = _rn(self.stalled_window_frac)
            out["server_stalled_inflight_frac"] = _rn(self.stalled_inflight_frac)
        dv = self.delivery
        if dv is not None and dv.evidence:
            # its share of the case's metric, by what it rests on: the server's own token
            # clock, or clumping alone (weaker)
            key = "delivery_frac" if dv.evidence == "token_clock" else "delivery_clumped_frac"
            out[key] = _rn(self.share_of(("ttft_delivery", "delivery")))
        return out

    def stalled_share(self, seg: str | None = None) -> float | None:
        """The share of the segment's time the server's threads were stopped, frozen or
        made no progress, wherever it fell: the queue, prefill, decode or the tail; None
        where the segment took no time."""
        split = dict(self.level1(seg))
        return split.get("stopped", 0.0) if split else None

    def stalled_ms(self) -> float:
        """The milliseconds the server was stalled in the requests' time, summed."""
        return sum(ms for r in self.requests for _seg, c, ms in r.causes
                   if level1_of(c) == "stopped")

    def stall_line(self) -> str:
        """The evidence of ``server_stalled`` beyond its share: gaps, states seen."""
        gaps = sum(r.n_gaps for r in self.requests)
        n_st = sum(r.n_stalls for r in self.requests)
        ms = self.stalled_ms()
        seen = ", ".join(f"{k} {v:.0%} of the window" for k, v in self.states_seen) or "none"
        win = ("" if self.stalled_window_frac is None
               else f"; stalled {self.stalled_window_frac:.1%} of the window")
        if self.stalled_inflight_frac is not None and self.stalled_window_frac:
            win += f" ({self.stalled_inflight_frac:.1%} with requests in flight)"
        who = ""
        st = self.states
        if st is not None and st.stall_threads:
            th = dict(st.stall_threads)
            frozen = th.pop("frozen cgroup", 0.0)
            n = th.pop("threads", None)
            who = ("; the threads while stalled: " + (f"{n:.3g}, " if n is not None else "")
                   + ", ".join(f"{v:.3g} {k}" for k, v in th.items())
                   + (f", the cgroup frozen {frozen:.0%} of that time" if frozen else ""))
        return (f"server stalled {ms / max(self.n, 1):.1f} ms per request "
                f"({self.stalled_share() or 0.0:.1%} of "
                f"{METRIC_LABELS[self.metric]}); {n_st} of {gaps} decode gaps were stalls"
                f"{win}; state seen: {seen}{who}")


def _rn(x: float | None) -> float | None:
    return None if x is None else round(float(x), 4)


def _stalled_in_flight(records: Sequence[RequestRecord], states: RunStates,
                       anchor: ClockAnchor | None, window_ns: tuple[int, int]) -> float | None:
    """The share of the window (of what the run-state samples cover of it) with the
    server stalled while at least one request was in flight, dispatch to last byte: the
    union of the requests' spans, so a stall that several requests waited out at once
    counts once. None where the records cannot be put on the harness clock."""
    if anchor is None:
        return None
    spans = []
    for r in records:
        ends = [e.t_ns for e in r.events] + [x for x in (r.done_ns,) if x is not None]
        if ends:
            spans.append((max(window_ns[0], anchor.to_wall_ns(r.dispatched_ns)),
                          min(window_ns[1], anchor.to_wall_ns(max(ends)))))
    _, covered = states.over(*window_ns)
    if covered <= 0:
        return None
    stalled = 0.0
    lo = hi = None
    for a, b in sorted(x for x in spans if x[1] > x[0]):
        if hi is not None and a <= hi:
            hi = max(hi, b)
            continue
        if lo is not None and hi is not None:
            stalled += states.over(lo, hi)[0]["stalled"]
        lo, hi = a, b
    if lo is not None and hi is not None:
        stalled += states.over(lo, hi)[0]["stalled"]
    return min(1.0, stalled / covered)


def server_clocks(
    hw: Sequence[HwStat], waiting_mean: float | None, n_requests: int, window_s: float | None,
) -> ServerClocks:
    """The case's queue (and prefill) clocks: the engine's own histograms where they
    grew (vLLM, SGLang: ``queue_time_seconds``, ``prefill_time_seconds``), else the
    waiting count by Little's law (mean queue time = mean waiting / arrival rate; John
    D. C. Little, "A Proof for the Queuing Formula L = lambda W", Operations Research
    9(3), 1961)."""
    def mean_of(name: str) -> float | None:
        s = [r.delta for r in hw if getattr(r, "source", "") == "prom"
             and r.metric == f"{name}_sum" and r.delta is not None]
        c = [r.delta for r in hw if getattr(r, "source", "") == "prom"
             and r.metric == f"{name}_count" and r.delta is not None]
        if not s or not c or sum(c) <= 0:
            return None
        return sum(s) / sum(c) * 1e3

    queue, qsrc = mean_of("queue_time_seconds"), "the engine's queue_time_seconds histogram"
    prefill, psrc = mean_of("prefill_time_seconds"), "the engine's prefill_time_seconds histogram"
    if queue is None and waiting_mean is not None and n_requests and window_s:
        queue = waiting_mean / (n_requests / window_s) * 1e3
        qsrc = (f"waiting count {waiting_mean:.3g} / arrivals {n_requests / window_s:.3g}/s, "
                "Little's law")
    return ServerClocks(queue_ms=queue, queue_source=qsrc if queue is not None else "",
                        prefill_ms=prefill, prefill_source=psrc if prefill is not None else "")


def case_ledger(
    case_id: str,
    name: str,
    params: Mapping[str, object],
    records: Sequence[RequestRecord],
    *,
    clocks: ServerClocks = ServerClocks(),
    states: RunStates | None = None,
    anchor: ClockAnchor | None = None,
    clock_error_ms: float | None = None,
    window_ns: tuple[int, int] | None = None,
    client_late: bool = False,
    client_lag_max_ms: float | None = None,
) -> CaseLedger:
    """The ledger of a case's measured, successful requests. ``window_ns``: the case's
    window on the harness clock, for the stalled share of the window itself;
    ``client_late``: the client's self-check says it fell behind, ``client_lag_max_ms``:
    its worst loop lag (:func:`request_ledger`)."""
    metric, why = case_metric(name, params)
    measured = [r for r in records if r.phase == "measured" and r.ok]
    if clocks.path_floor_ms is None and len(measured) >= 2:
        first_pass = [request_ledger(r, clocks=clocks, clock_error_ms=clock_error_ms,
                                     client_late=client_late,
                                     client_lag_max_ms=client_lag_max_ms) for r in measured]
        pre = [led.part("before_server") for led in first_pass if led is not None]
        if len(pre) >= 2:
            clocks = replace(clocks, path_floor_ms=min(pre))
    reqs = tuple(
        led for rec in records if rec.phase == "measured" and rec.ok
        if (led := request_ledger(rec, clocks=clocks, states=states, anchor=anchor,
                                  clock_error_ms=clock_error_ms,
                                  client_late=client_late,
                                  client_lag_max_ms=client_lag_max_ms)) is not None
    )
    if metric == "itl" and reqs and not any(r.decode_ms > 0 for r in reqs):
        metric, why = "e2e", NO_DECODE_TIME
    win = inflight = None
    if states is not None and window_ns is not None:
        win = states.share(window_ns[0], window_ns[1], "stalled")
        if win is not None:
            inflight = _stalled_in_flight(measured, states, anchor, window_ns)
    merged = tuple(sorted({m for r in reqs for m in r.merged}))
    dv = case_delivery([r.delivery for r in reqs if r.delivery is not None])
    sources = Counter(r.engine.source for r in measured if r.engine is not None)
    return CaseLedger(case_id=case_id, metric=metric, metric_why=why, requests=reqs,
                      clocks=clocks, has_run_state=states is not None,
                      stalled_window_frac=win, stalled_inflight_frac=inflight,
                      states_seen=states.seen if states else (),
                      merged=merged, states=states, delivery=dv,
                      engine_sources=tuple(sorted(sources.items())))

"""The serving rules: queueing, KV-cache capacity, prefill-decode interference, time
outside the server, the client itself."""

from __future__ import annotations

from strata_plugin.analysis.rules.outcome import Outcome, RuleCheck, signal_margin
from strata_plugin.analysis.rules.traces import TRACE_LEDGER, TRACE_SERVER
from strata_plugin.analysis.rules.window import WindowSignals


def rule_queueing(s: WindowSignals) -> Outcome:
    """Requests waited in the server's own queue.

    The server's waiting count decides where it is measured: TTFT outside prefill
    (``server_queue_frac``, seen from the client) grows for any delay between client and
    server as well, so alone it only decides where the server reports no queue. The
    engine's own queue time over its TTFT (``engine_queue_frac``, vLLM's histograms) is
    the server's clock and decides alone.
    """
    r = RuleCheck("queueing", s)
    if s.waiting_mean is None and s.server_queue_frac is None and s.engine_queue_frac is None:
        r.need("waiting_mean")
        return r.unassessable(TRACE_SERVER)
    margins = []
    queued = s.waiting_mean is not None and r.cmp(
        "waiting_mean", ">=", "waiting_requests_mean"
    )
    if queued:
        margins.append(signal_margin(s, "waiting_mean", "waiting_requests_mean"))
    # The engine's own clock of its queue (its histograms): no client delay in it.
    if s.engine_queue_frac is not None and r.cmp("engine_queue_frac", ">=",
                                                  "server_queue_frac"):
        margins.append(signal_margin(s, "engine_queue_frac", "server_queue_frac"))
    if s.server_queue_frac is not None and r.cmp("server_queue_frac", ">=", "server_queue_frac"):
        if queued or s.waiting_mean is None:
            margins.append(signal_margin(s, "server_queue_frac", "server_queue_frac"))
    return r.fire(*margins) if margins else r.o


def rule_outside_server(s: WindowSignals) -> Outcome:
    """Time outside the server: on the way there, or on the way back.

    On the way there (network, a proxy, the HTTP front end): a share of TTFT from the
    time ledger, and at least ``outside_server_min_ms`` of it: a short TTFT (a 16-token
    prompt, 20 ms) is a tenth front end on a direct connection, which no path explains.
    Where the ledger could not take the server's queue out of it (no queue clock, no
    waiting count), it needs the waiting count to be low to tell the two apart.

    On the way back (delivery: tokens the server made at its pace, held and handed over
    late and in clumps, as a buffering proxy does): the ledger's delivery share of the
    case's metric past ``delivery_frac``. Against the server's own token clock it is
    evidence in full; inferred from clumping alone it counts half (a weaker margin).
    """
    r = RuleCheck("outside_server", s)
    margins = []
    if s.delivery_frac is not None:
        if r.cmp("delivery_frac", ">=", "delivery_frac"):
            margins.append(signal_margin(s, "delivery_frac", "delivery_frac"))
    elif s.delivery_clumped_frac is not None and r.cmp("delivery_clumped_frac", ">=",
                                                       "delivery_frac"):
        margins.append(0.5 * signal_margin(s, "delivery_clumped_frac", "delivery_frac"))
    if not r.need("outside_server_frac", "before_server_ms"):
        if margins:
            return r.fire(*margins)
        return r.unassessable("llama.cpp timings (prompt_ms) or the engine's prefill clock")
    share = r.cmp("outside_server_frac", ">=", "outside_server_frac")
    floor = r.cmp("before_server_ms", ">=", "outside_server_min_ms")
    if share and floor:
        if s.queue_split:
            margins.append(signal_margin(s, "outside_server_frac", "outside_server_frac"))
        elif not r.need("waiting_mean"):
            if not margins:
                return r.unassessable(TRACE_SERVER)
        elif r.cmp("waiting_mean", "<", "waiting_requests_mean"):
            margins.append(signal_margin(s, "outside_server_frac", "outside_server_frac"))
    return r.fire(*margins) if margins else r.o


def rule_kv_cache(s: WindowSignals) -> Outcome:
    r = RuleCheck("kv_cache_capacity", s)
    if s.kv_usage_max is None and s.preemptions is None:
        r.need("kv_usage_max")
        return r.unassessable(TRACE_SERVER)
    margins = []
    if s.kv_usage_max is not None and r.cmp("kv_usage_max", ">=", "kv_usage_high"):
        margins.append(max(0.5, signal_margin(s, "kv_usage_max", "kv_usage_high")))
    if s.preemptions is not None and r.cmp("preemptions", ">", "preemptions_max"):
        margins.append(1.0)
    return r.fire(*margins) if margins else r.o


def rule_interference(s: WindowSignals) -> Outcome:
    """Decode streams stalled while a prefill was in flight.

    A treatment of an A/B group is judged against its control: its stall time with a
    prefill in flight must be a multiple of the control's and its tail pace must rise.
    Or within its own window: decode slowed by a factor while the injected prefill was
    in flight, against its pace outside it. That comparison is immune to what the host
    did between repetitions minutes apart (a control run while another tenant held a
    core had its own tail 8x slower, and hid a treatment's stalls from the first test).
    A case without a control must show that its stalls coincide with prefills: a stall
    with no prefill in flight (a busy host, a slow client) is not interference.
    """
    r = RuleCheck("prefill_decode_interference", s)
    if (s.concurrency or 1) < 2:
        return r.o  # one request at a time: no prompt can arrive mid-decode
    if not r.need("prefill_stall_frac", "prefill_stall_share"):
        return r.unassessable("per-request token events (requests.jsonl events)")
    frac = r.cmp("prefill_stall_frac", ">=", "prefill_stall_frac")
    if s.ab_prefill_stall_ratio is not None:
        ratio = r.cmp("ab_prefill_stall_ratio", ">=", "ab_prefill_stall_ratio")
        tail = s.ab_tail_pace_rise is not None and r.cmp(
            "ab_tail_pace_rise", ">=", "ab_tail_pace_rise"
        )
        if frac and ratio and tail:
            return r.fire(
                signal_margin(s, "prefill_stall_frac", "prefill_stall_frac"),
                signal_margin(s, "ab_prefill_stall_ratio", "ab_prefill_stall_ratio"),
                signal_margin(s, "ab_tail_pace_rise", "ab_tail_pace_rise"),
            )
        pace = s.injected_pace_factor is not None and r.cmp(
            "injected_pace_factor", ">=", "injected_pace_factor"
        )
        if frac and pace:
            return r.fire(
                signal_margin(s, "prefill_stall_frac", "prefill_stall_frac"),
                signal_margin(s, "injected_pace_factor", "injected_pace_factor"),
            )
        return r.o
    share = r.cmp("prefill_stall_share", ">=", "prefill_stall_share")
    if frac and share:
        return r.fire(
            signal_margin(s, "prefill_stall_frac", "prefill_stall_frac"),
            signal_margin(s, "prefill_stall_share", "prefill_stall_share"),
        )
    return r.o


def rule_client_bound(s: WindowSignals) -> Outcome:
    r = RuleCheck("client_bound", s)
    if not r.need("client_bound"):
        return r.unassessable("the load generator's self-check (cases.jsonl client_bound)")
    if r.cmp("client_bound", "==", "client_bound", value=1.0 if s.client_bound else 0.0):
        return r.fire(1.0)
    return r.o



def rule_unexplained(s: WindowSignals) -> Outcome:
    """The time ledger does not close: the residual (what no clock or server state
    explains) is a large share of the case's metric. A window with nothing past
    threshold is clear only with it measured and under its bound."""
    r = RuleCheck("unexplained", s)
    if not r.need("ledger_residual_frac"):
        return r.unassessable(TRACE_LEDGER)
    if r.cmp("ledger_residual_frac", ">=", "ledger_residual_max"):
        return r.fire(signal_margin(s, "ledger_residual_frac", "ledger_residual_max"))
    return r.o

"""The time ledger on the embedded target: a clean decode case closes, latency in front of
the server is ``outside_server``, a server frozen a third of the time is
``server_stalled``, and neither is ``headroom`` (issue 23, "Done when").

One server (the local profile's ``default``), the decode case ``decode_1k_1k_c32`` as
the profile scales it (2K -> 32 input tokens, 64 output tokens, C=4), with 8 measured
requests per case to keep the suite to minutes on 2 cores. Arms, in order: clean three
times; the client pointed at a loopback relay adding 50 ms each way
(testing/relay.LatencyProxy); the server's process tree frozen 200 ms of every 600 ms
through the cgroup freezer (testing/pauses.FreezerPause). Each arm's figures (verdict,
the ledger's residual and the shares that decide) are printed and written to
``<run>/ledger_faults.json``; docs/validation.md, "Time ledger", quotes them.

    pytest cases/test_ledger_faults.py -m fault
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from cases import matrix
from strata_plugin.analysis.thresholds import value
from strata_plugin.report import summarize_case
from strata_plugin.testing import faults
from strata_plugin.testing.pauses import FreezerPause
from strata_plugin.testing.relay import LatencyProxy

WORKLOAD = replace(matrix.DECODE_1K_1K_C32, requests=8)
DELAY_MS = 50.0
PAUSE_MS, PERIOD_MS = 200.0, 600.0


def _arm(strata, sess, case_id: str, figures: dict) -> object:
    strata.run(WORKLOAD, case_id=case_id, extra={"ledger_arm": case_id})
    a = summarize_case(sess.run_dir, case_id)
    led = a.ledger
    assert led is not None and led.n
    ttft = dict(led.shares("ttft"))
    metric = dict(led.shares(led.metric))
    figures[case_id] = {
        "verdict": a.verdict.summary(), "classes": list(a.verdict.past_threshold),
        "inconclusive": a.verdict.inconclusive, "metric": led.metric,
        "residual_frac": led.residual_frac(), "residual_ms": led.residual_ms(),
        "before_server_share_of_ttft": ttft.get("before_server"),
        "stalled_share_of_metric": led.share_of(("ttft_stalled", "stall_stalled")),
        "stalled_window_frac": led.stalled_window_frac,
        "ttft_mean_ms": led.mean_ms("ttft"), "ms_per_token": led.ms_per_token(),
        "shares_of_metric": {k: round(v, 4) for k, v in metric.items() if abs(v) >= 0.001},
        "has_run_state": led.has_run_state,
        # what the rules read: the median request's share of its TTFT on the way there
        "outside_server_frac": a.signals.outside_server_frac,
        "server_stalled_frac": a.signals.server_stalled_frac,
    }
    print(case_id, json.dumps(figures[case_id], sort_keys=True))
    return a


@pytest.mark.fault
@pytest.mark.strata_configs("default", optional=True)
def test_the_ledger_closes_clean_and_names_the_faults_it_was_not_tuned_on(
        strata, strata_server, strata_session):
    sess, server = strata_session, strata_server
    figures: dict = {}
    try:
        clean = []
        for rep in range(3):
            faults.wait_quiet(server.pid, max_wait_s=15)
            clean.append(_arm(strata, sess, f"ledger/clean/{rep}", figures))

        base = strata.setup
        with LatencyProxy(base.base_url, delay_ms=DELAY_MS) as proxy:
            strata.setup = replace(base, base_url=proxy.url)
            try:
                latency = _arm(strata, sess, "ledger/latency_50ms", figures)
            finally:
                strata.setup = base

        with FreezerPause(server.pid, pause_ms=PAUSE_MS, period_ms=PERIOD_MS):
            frozen = _arm(strata, sess, "ledger/freezer_third", figures)
    finally:
        (sess.run_dir / "ledger_faults.json").write_text(
            json.dumps(figures, indent=1, sort_keys=True) + "\n")

    bound = value("ledger_residual_max")
    for a in clean:  # closes, and the resource verdict stands (no ledger class named)
        assert a.ledger.residual_frac() < bound, figures[a.case_id]
        assert not a.verdict.inconclusive, figures[a.case_id]
        assert not {"unexplained", "server_stalled", "outside_server"} & set(
            a.verdict.past_threshold), figures[a.case_id]
    assert "outside_server" in latency.verdict.classes, figures["ledger/latency_50ms"]
    assert any(e.metric == "outside_server_frac" and e.met for e in latency.verdict.evidence)
    assert "server_stalled" in frozen.verdict.classes, figures["ledger/freezer_third"]
    for a in (latency, frozen):
        assert "headroom" not in a.verdict.classes

"""Capacity sweep: saturation from the requests, knee and capacity at an SLO, a sweep
against a scripted single-slot server of known capacity, and the report's section."""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

import pytest

from strata_plugin import CapacitySweep, Slo, Workload
from strata_plugin.analysis.capacity import (
    SweepStep,
    capacity_at_slo,
    knee,
    next_rate,
    parse_slo,
    step_figures,
)
from strata_plugin.formats.records import RequestRecord, TokenEvent, Usage
from tests.sse_script_server import Reply, Seen, sse

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
MS = 1_000_000


def rec(i: int, arrive_ms: float, start_ms: float, service_ms: float, n: int = 4
        ) -> RequestRecord:
    """A request scheduled at ``arrive_ms`` whose first token comes after it waited until
    ``start_ms`` and a quarter of its service time."""
    a = int(arrive_ms * MS)
    first = start_ms + service_ms / 4
    step = (service_ms * 3 / 4) / max(n - 1, 1)
    events = tuple(TokenEvent(int((first + k * step) * MS), 1) for k in range(n))
    return RequestRecord(request_id=f"s/measured/{i}", case_id="s", phase="measured",
                         api="llamacpp", scheduled_ns=a, dispatched_ns=a, first_byte_ns=a + MS,
                         events=events, done_ns=events[-1].t_ns + 1,
                         usage=Usage(completion_tokens=n, source="usage"))


def fifo(rate: float, service_ms: float, n: int = 30) -> list[RequestRecord]:
    """A single-slot FIFO server fed at a fixed rate."""
    out, free = [], 0.0
    for i in range(n):
        arrive = i * 1000.0 / rate
        start = max(arrive, free)
        free = start + service_ms
        out.append(rec(i, arrive, start, service_ms))
    return out


def test_below_capacity_follows_and_above_saturates():
    slo = Slo(ttft_ms=100)
    below = step_figures(fifo(5.0, 100.0), 5.0, slo)  # capacity 10/s
    assert not below.saturated and below.follow == pytest.approx(1.0, abs=0.05)
    assert below.goodput_fraction == 1.0
    above = step_figures(fifo(15.0, 100.0), 15.0, slo)
    assert above.saturated and "kept up with 0.6" in above.reason
    assert above.follow == pytest.approx(10 / 15, abs=0.03)
    assert above.achieved_rate < 11 and above.ttft_growth > 4
    assert above.goodput_fraction < 0.2


@pytest.mark.parametrize("capacity, saturated", [(8.6, False), (8.4, True)])
def test_the_follow_rule_at_its_boundary(capacity, saturated):
    # Arrivals at 10/s into a server that completes 8.6/s or 8.4/s: follow 0.86 or 0.84.
    step = step_figures(fifo(10.0, 1000.0 / capacity, n=60), 10.0, None)
    assert step.follow == pytest.approx(capacity / 10, abs=0.005)
    assert step.saturated is saturated


def _step(rate: float, sat: bool, good: float) -> SweepStep:
    return SweepStep(rate, rate, 1.0, 1.0, 10, 10, 1, 1, 1, 1, 1, 1, good, good * rate, sat,
                     "x" if sat else "")


def test_knee_capacity_and_next_rate():
    steps = [_step(1, False, 1.0), _step(2, False, 0.95), _step(4, True, 0.5)]
    assert knee(steps).offered_rate == 2
    assert capacity_at_slo(steps, 0.9).offered_rate == 2
    assert capacity_at_slo(steps, 0.99).offered_rate == 1
    assert next_rate(steps, factor=2) == 3  # halfway between the knee and 4
    assert next_rate(steps[:2], factor=2) == 4  # still rising
    assert next_rate([_step(1, True, 0.0)], factor=2) == 0.5  # even the lowest saturates
    assert knee([_step(1, True, 0.0)]) is None and knee(steps[:2]) is None


def test_slo_text_round_trip_and_errors():
    slo = Slo(ttft_ms=500, tpot_ms=50)
    assert parse_slo(slo.describe()) == slo
    with pytest.raises(ValueError, match="expected name<=value"):
        parse_slo("ttft<500")
    with pytest.raises(ValueError, match="needs an SLO"):
        CapacitySweep(Workload("w", isl=4, osl=2), Slo())


class SingleSlot:
    """A llama.cpp /completion server that serves one request at a time (FIFO): its
    capacity is 1 / service_s requests per second."""

    def __init__(self, service_s: float) -> None:
        self.service_s = service_s
        self.free_at = 0.0
        self.lock = threading.Lock()

    def __call__(self, seen: Seen) -> Reply:
        if seen.method == "GET":
            return Reply([(0.0, b"ok")], framing="length", content_type="text/plain")
        now = seen.received_ns / 1e9
        with self.lock:
            start = max(now, self.free_at)
            self.free_at = start + self.service_s
        body = seen.json
        n = body["n_predict"]
        gap = self.service_s / n
        items = [((start - now) + gap if i == 0 else gap,
                  sse({"content": "a", "tokens": [400 + i], "stop": False}))
                 for i in range(n)]
        items.append((0.0, sse({"content": "", "stop": True, "stop_type": "limit",
                                "tokens_evaluated": len(body["prompt"]),
                                "tokens_predicted": n,
                                "timings": {"prompt_n": len(body["prompt"]), "prompt_ms": 1.0,
                                            "predicted_n": n, "predicted_ms": 2.0}})))
        return Reply(items)


CASE = """
from strata_plugin import CapacitySweep, Slo, Workload

def test_capacity(strata):
    r = strata.sweep(CapacitySweep(Workload("cap", isl=8, osl=4), Slo(ttft_ms=250),
                                   start_rate=2.0, factor=2.0, step_s=3.0, refine=2),
                     case_id="cap")
    print("SWEEP", r.summary())
    print("STEPS", [(s.offered_rate, s.saturated) for s in r.steps])
    assert r.knee is not None and r.capacity is not None
"""


@pytest.mark.integration
def test_sweep_finds_the_scripted_capacity_and_reports_it(pytester, monkeypatch):
    from tests.sse_script_server import ScriptServer

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeini(f"[pytest]\nstrata_reports_dir = {pytester.path / 'reports'}\n")
    pytester.makepyfile(test_cases=CASE)
    server = SingleSlot(0.1)  # capacity 10 requests/s
    t0 = time.monotonic()
    with ScriptServer(server) as srv:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s",
                                               f"--strata-server-url={srv.url}",
                                               "--strata-run-id=s1")
    took = time.monotonic() - t0
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    steps = ast.literal_eval(next(x for x in out.splitlines() if x.startswith("STEPS"))[6:])
    rates = [r for r, _ in steps]
    assert rates[:3] == [2.0, 4.0, 8.0]  # rising by the factor
    sat = {r: s for r, s in steps}
    assert not sat[2.0] and not sat[4.0]
    assert any(s for _, s in steps)
    first_sat = min(r for r, s in steps if s)
    assert 8.0 <= first_sat <= 16.0  # the server's capacity is 10/s
    knee_rate = max(r for r, s in steps if not s and r < first_sat)
    assert 4.0 <= knee_rate <= 12.0
    run = pytester.path / "reports" / "s1"
    text = (run / "report.md").read_text()
    sec = text[text.index("## Capacity"):]
    sec = sec[:sec.index("\n## ", 3)]  # this section alone: the roofline's may say "not found"
    assert "### Sweep `cap`" in sec and "**Knee: " in sec and "not found" not in sec
    assert "SLO ttft_ms<=250" in sec
    assert "(plots/capacity-cap.png)" in sec
    png = (run / "plots" / "capacity-cap.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert took < 200, took

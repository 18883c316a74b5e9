"""run_slots never waits forever: a request the loop loses is recorded at its deadline.

The loop ends every request itself (a record, a timeout), so only a client bug can leave
one without a record, as a malformed event did on d626c9b (``run_load`` waited forever).
Here the bug is made on purpose: a StreamMux subclass (test-only, it says so) that takes
some requests and never ends them. Their deadline is ``request_bound_s`` + slack after
their start; they must be recorded then, not before, and their slots must go on to the
next requests, which a real server answers.
"""

from __future__ import annotations

import time

import pytest
import requests

from strata_plugin.load.client import RequestSpec, Timeouts
from strata_plugin.load.client import mux as mux_module
from strata_plugin.load.client.attempt import Attempt
from strata_plugin.load.client.mux import StreamMux
from strata_plugin.load.client.slots import EXTRA_EVENTS, request_bound_s, run_slots
from tests.sse_script_server import Reply, ScriptServer, sse, within

TOKEN = sse({"content": "a", "tokens": [1], "stop": False})
END = sse({"content": "", "stop": True, "stop_type": "limit", "tokens_predicted": 1})
TIMEOUTS = Timeouts(connect_s=0.1, read_s=0.2, total_s=0.3)
SLACK_S = 0.5
#: The bound's error-body read (5 s in the product) is shortened here, so that the bound
#: ends with the 1 s drain instead and a lost request's deadline comes after 2.2 s, not
#: 6 s; ``request_bound_s`` still computes it, and test_request_bound_follows_the_timeouts
#: checks the product's 5 s.
ERROR_BODY_S = 0.5


class LosingMux(StreamMux):
    """A loop with a bug, made for this test: it accepts some requests and drops them."""

    def __init__(self, lose: set[str]) -> None:
        super().__init__()
        self.lose = lose

    def submit(self, a, on_done, *, at_ns=None, on_start=None) -> bool:  # type: ignore[override]
        if a.spec.request_id in self.lose:
            return True  # taken, never ended: on_done is never called
        return super().submit(a, on_done, at_ns=at_ns, on_start=on_start)


def test_request_bound_follows_the_timeouts() -> None:
    # 2 connects + the head wait + total_s + the 5 s error-body read
    assert request_bound_s(Timeouts(connect_s=1, read_s=1, total_s=3), 3) == 2 + 1 + 3 + 5
    no_total = Timeouts(connect_s=1, read_s=2)
    assert request_bound_s(no_total, 10) == 2 + 2 + 2 * (10 + EXTRA_EVENTS) + 5


@pytest.mark.integration  # waits out real seconds (>= 2 s on a quiet host)
def test_a_lost_request_is_recorded_at_its_deadline_and_frees_its_slot(monkeypatch) -> None:
    monkeypatch.setattr(mux_module, "ERROR_BODY_S", ERROR_BODY_S)
    spec = [RequestSpec(f"r{i}", "c", "measured", max_tokens=1, prompt="p") for i in range(4)]
    deadline_s = request_bound_s(TIMEOUTS, 1) + SLACK_S
    seen: dict[str, float] = {}
    with ScriptServer(Reply([(0.001, TOKEN), (0.001, END)])) as srv, \
            requests.Session() as s, LosingMux({"r0", "r1"}) as mux:
        work = [(Attempt(s, srv.url, "llamacpp", sp, 0, TIMEOUTS, None), None) for sp in spec]
        t0 = time.monotonic()

        def on_record(_: int, rec) -> None:
            seen[rec.request_id] = time.monotonic() - t0

        recs = within(deadline_s + 10, lambda: run_slots(mux, work, 2, on_record=on_record,
                                                         slack_s=SLACK_S))
        took = time.monotonic() - t0
    assert [r.request_id for r in recs] == ["r0", "r1", "r2", "r3"]  # one each, in order
    by_id = {r.request_id: r for r in recs}
    for lost in ("r0", "r1"):
        err = by_id[lost].error
        assert err is not None and err.cls == "client" and "deadline" in err.message
        assert f"{request_bound_s(TIMEOUTS, 1):g} s" in err.message
        # not before the deadline, and within one caller tick (0.25 s) and a margin after it
        # (a loaded host's pause, a 1 s garbage-collector pass: tests/own_cpu.py)
        assert deadline_s <= seen[lost] <= deadline_s + 2.0
    for ok in ("r2", "r3"):  # the freed slots ran the next requests
        assert by_id[ok].ok, by_id[ok].error
        assert seen[ok] >= deadline_s
    assert took <= deadline_s + 3.0


@pytest.mark.integration  # 3.0 s of real waiting on the quiet VM
def test_mux_send_streaming_gives_up_on_a_lost_request_at_its_deadline(monkeypatch) -> None:
    monkeypatch.setattr(mux_module, "DEADLINE_SLACK_S", SLACK_S)
    monkeypatch.setattr(mux_module, "ERROR_BODY_S", ERROR_BODY_S)
    deadline_s = request_bound_s(TIMEOUTS, 1) + SLACK_S
    spec = RequestSpec("r0", "c", "measured", max_tokens=1, prompt="p")
    with ScriptServer(Reply([(0.001, TOKEN), (0.001, END)])) as srv, \
            requests.Session() as s, LosingMux({"r0"}) as mux:
        t0 = time.monotonic()
        rec = within(deadline_s + 10, lambda: mux.send_streaming(
            s, srv.url, "llamacpp", spec, scheduled_ns=time.monotonic_ns(), timeouts=TIMEOUTS))
        took = time.monotonic() - t0
    assert rec.error is not None and rec.error.cls == "client" and "deadline" in rec.error.message
    assert deadline_s <= took <= deadline_s + 2.5  # it looks once a second; a pause's room

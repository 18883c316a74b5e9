"""A tracefs capture leaves nothing behind, on every way out (real tracefs, as root).

After each exit path (normal end, exception, Ctrl-C, SIGTERM, and SIGKILL followed by the
next capture) the test reads tracefs itself: no ``instances/strata-*`` of that process is
left, and the global buffer's event switches and ``tracing_on`` are as they were before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import default_signals
import pytest

from strata_plugin.run import tracing

ROOT = tracing.tracefs_root()
pytestmark = [pytest.mark.root, pytest.mark.skipif(
    ROOT is None or os.geteuid() != 0,
    reason="needs root and tracefs (tracing.availability says which is missing)")]
EVENTS = tracing.TRACE_SETS["sched"]


def global_state() -> tuple[str, str]:
    """What Strata must never change: the global buffer's enabled events and switch."""
    assert ROOT is not None
    return (ROOT / "set_event").read_text(), (ROOT / "tracing_on").read_text()


def mine(pid: int) -> list[str]:
    return [n for n in tracing.strata_instances(ROOT) if n.startswith(f"strata-{pid}-")]


def test_normal_end_saves_the_trace_and_removes_the_instance(tmp_path: Path):
    before = global_state()
    cap = tracing.TraceCapture(EVENTS, tmp_path / "t.txt")
    with cap:
        assert mine(os.getpid()) == [cap.name]
        assert (ROOT / "instances" / cap.name / "events/sched/sched_switch/enable") \
            .read_text().strip() == "1"
        assert (ROOT / "instances" / cap.name / "trace_clock").read_text().count("[mono]") == 1
        t0 = time.monotonic_ns()
        time.sleep(0.2)
        t1 = time.monotonic_ns()
    assert mine(os.getpid()) == []
    assert global_state() == before
    res = cap.result
    assert res is not None and res.start_mono_ns < t0 and res.end_mono_ns > t1
    from strata_plugin.analysis.traces.ftrace_text import parse

    evs = [e for e in parse(res.path.read_text().splitlines()) if e.event == "sched_switch"]
    assert evs, "no sched_switch in 0.2 s"
    # the instance clock is CLOCK_MONOTONIC: its events fall inside the capture's span
    assert res.start_mono_ns <= evs[0].t_ns and evs[-1].t_ns <= res.end_mono_ns
    assert cap.stop() is res  # idempotent


def test_an_exception_removes_the_instance(tmp_path: Path):
    before = global_state()
    with pytest.raises(RuntimeError, match="boom"), \
            tracing.TraceCapture(EVENTS, tmp_path / "t.txt"):
        assert mine(os.getpid())
        raise RuntimeError("boom")
    assert mine(os.getpid()) == []
    assert global_state() == before
    assert not (tmp_path / "t.txt").exists()


CHILD = """
import sys, time
from pathlib import Path
from strata_plugin.run import tracing
cap = tracing.TraceCapture(tracing.TRACE_SETS["sched"], Path(sys.argv[1]))
try:
    with cap:
        print("ready", cap.name, flush=True)
        time.sleep(60)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    raise SystemExit(3)
"""


def _child(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "t.txt")],
                         stdout=subprocess.PIPE, text=True, preexec_fn=default_signals.restore)
    assert p.stdout is not None
    line = p.stdout.readline().split()
    assert line[0] == "ready", line
    assert mine(p.pid) == [line[1]]
    return p, line[1]


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 3), (signal.SIGTERM, 3)])
def test_ctrl_c_and_sigterm_remove_the_instance(tmp_path: Path, sig: int, code: int):
    before = global_state()
    p, _name = _child(tmp_path)
    try:
        p.send_signal(sig)
        assert p.wait(20) == code
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert mine(p.pid) == []
    assert global_state() == before


def test_sigkill_leaves_an_instance_the_next_capture_removes(tmp_path: Path):
    before = global_state()
    p, name = _child(tmp_path)
    p.kill()
    p.wait(20)
    assert mine(p.pid) == [name]  # SIGKILL cannot be caught: it is left ...
    with tracing.TraceCapture(EVENTS, tmp_path / "next.txt"):
        assert mine(p.pid) == []  # ... until the next capture sweeps it
    assert mine(os.getpid()) == []
    assert global_state() == before


def test_unavailable_names_what_is_missing():
    av = tracing.availability(("nosuch/event_for_strata",))
    assert not av.ok and "nosuch/event_for_strata" in av.reason
    with pytest.raises(tracing.TraceUnavailable, match="nosuch/event_for_strata"):
        tracing.TraceCapture(("nosuch/event_for_strata",), Path("/nonexistent")).start()
    assert mine(os.getpid()) == []

"""An engine's end seen for what it was, and the engine that took its port followed.

Real processes throughout: children that exit with a code or are killed by a signal (their
parent knows how), a grandchild that vanishes (only "gone" is known), a process that
listens on a port (the new engine), and a /proc stat file whose start time changed (the
PID given to a newer process, which cannot be staged with a real PID on demand).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata_plugin.agent import lifetime
from strata_plugin.agent.targets import ProcessTargets
from strata_plugin.analysis.failures import engine_outages
from strata_plugin.analysis.thresholds import value
from strata_plugin.formats.engine_events import (
    ENGINE_EXIT,
    ENGINE_NEW,
    EngineEvent,
    engine_events,
    from_marker,
)
from strata_plugin.formats.records import ClockAnchor, RequestError, RequestRecord
from strata_plugin.formats.typed import FormatError
from strata_plugin.formats.windows import Marker
from strata_plugin.run.engine_lifetime import EngineWatch, PortListener, url_port

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def _wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while lifetime.start_ticks(pid) is not None:
        assert time.monotonic() < deadline, f"pid {pid} still runs"
        time.sleep(0.02)


# --- how a process ended -----------------------------------------------------------------

def test_a_childs_exit_code_and_the_signal_that_killed_it_are_told_apart():
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    _, status = os.waitpid(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    assert lifetime.describe_wait_status(status) == "exit code 3"
    assert lifetime.describe_returncode(p.returncode) == "exit code 3"
    k = subprocess.Popen(SLEEP)
    k.kill()
    _, status = os.waitpid(k.pid, 0)
    k.returncode = os.waitstatus_to_exitcode(status)
    assert lifetime.describe_wait_status(status) == "signal SIGKILL"
    assert lifetime.describe_returncode(k.returncode) == "signal SIGKILL"
    assert lifetime.describe_returncode(0) == "exit code 0"


def test_a_process_that_ended_is_gone_even_before_it_is_reaped():
    p = subprocess.Popen(SLEEP)
    try:
        life = lifetime.Life.observe(p.pid)
        assert life is not None and life.ended() is None  # runs: not ended
        p.kill()
        deadline = time.monotonic() + 10
        while life.ended() is None:  # a zombie until waited for: ended all the same
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert life.ended() == lifetime.GONE
        assert (Path("/proc") / str(p.pid)).exists()  # still a zombie: not reaped yet
    finally:
        p.kill()
        p.wait()
    assert life.ended() == lifetime.GONE  # reaped: no /proc entry at all
    assert lifetime.Life.observe(p.pid) is None


def _stat(proc: Path, pid: int, start: int, state: str = "S") -> None:
    rest = " ".join(["1"] * 16)  # fields 4..19
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "stat").write_text(
        f"{pid} (engine (x)) {state} {rest} 1 0 {start} 100 200 more\n")


def test_a_pid_given_to_a_newer_process_is_not_the_engine_any_more(tmp_path):
    _stat(tmp_path, 4242, start=1000)
    life = lifetime.Life.observe(4242, str(tmp_path))
    assert life == lifetime.Life(4242, 1000)
    assert life.ended(str(tmp_path)) is None
    _stat(tmp_path, 4242, start=1001)  # one tick later: another process
    assert life.ended(str(tmp_path)) == lifetime.REUSED
    _stat(tmp_path, 4242, start=1000, state="Z")
    assert life.ended(str(tmp_path)) == lifetime.GONE


def test_the_agents_targets_drop_an_engine_that_ended():
    p = subprocess.Popen(SLEEP)
    try:
        t = ProcessTargets(pids=[p.pid], rescan_s=0)
        t.refresh(force=True)
        assert t.roots == (p.pid,) and p.pid in t.tree and not t.ended
        p.kill()
        p.wait()
        assert t.refresh(force=True) is True
        assert t.roots == () and t.tree == () and t.ended == {p.pid: lifetime.GONE}
    finally:
        p.kill()
        p.wait()


# --- the watch -----------------------------------------------------------------------------

class Log:
    def __init__(self) -> None:
        self.recorded: list[EngineEvent] = []
        self.retargeted: list[list[int]] = []


def _watch(pids, port, listener, child=None) -> tuple[EngineWatch, Log]:
    log = Log()
    w = EngineWatch(pids, port, record=log.recorded.append, retarget=log.retargeted.append,
                    find_listener=listener, child=child)
    return w, log


@pytest.mark.parametrize("end, how", [("kill", "signal SIGKILL"), ("exit", "exit code 3")])
def test_the_watch_says_how_strata_s_own_child_ended(end, how):
    argv = SLEEP if end == "kill" else [sys.executable, "-c",
                                        "import sys, time; time.sleep(0.2); sys.exit(3)"]
    p = subprocess.Popen(argv)
    try:
        w, log = _watch([p.pid], 8080, lambda: None, child=p)
        assert w.poll_once() == [] and w.following == [p.pid]
        if end == "kill":
            p.kill()
        p.wait(10)
        (ev,) = w.poll_once()
        assert (ev.kind, ev.pid, ev.port, ev.how) == (ENGINE_EXIT, p.pid, 8080, how)
        assert log.recorded == [ev] and w.following == [] and not log.retargeted
        assert w.poll_once() == []  # said once; nothing listens: nothing new
    finally:
        p.kill()
        p.wait()


def test_an_engine_strata_did_not_start_is_gone_and_the_new_listener_followed():
    # the engine: a grandchild (its parent, a shell, is not Strata), then a new process
    # listening on the same port, as a supervisor would start it
    sh = subprocess.run(["sh", "-c", '"$0" -c "$1" >/dev/null 2>&1 & echo $!', *SLEEP[0:1],
                         SLEEP[2]], capture_output=True, text=True, check=True)
    engine = int(sh.stdout.strip())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    new = None
    try:
        w, log = _watch([engine], port, PortListener(port))
        assert w.poll_once() == []
        os.kill(engine, signal.SIGKILL)
        _wait_gone(engine)
        (died,) = w.poll_once()
        assert (died.kind, died.pid, died.how) == (ENGINE_EXIT, engine, "gone")
        # it died after the look that saw it alive, before the one that saw it gone
        assert died.since_ns is not None and died.after_ns == died.since_ns < died.wall_ns
        assert w.poll_once() == []  # nobody listens yet: nothing new, nothing retargeted
        new = subprocess.Popen([sys.executable, "-c", (
            "import socket, sys, time\n"
            f"s = socket.create_server(('127.0.0.1', {port}))\n"
            "print('up', flush=True)\ntime.sleep(60)")], stdout=subprocess.PIPE, text=True)
        assert new.stdout is not None and new.stdout.readline() == "up\n"
        (took,) = w.poll_once()
        assert (took.kind, took.pid, took.port, took.how) == (ENGINE_NEW, new.pid, port,
                                                              "listens")
        assert took.wall_ns >= died.wall_ns
        assert log.retargeted == [[new.pid]] and w.following == [new.pid]
        assert log.recorded == [died, took]
    finally:
        with_suppress_kill(engine)
        if new is not None:
            new.kill()
            new.wait()


def with_suppress_kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_record_that_fails_stops_nothing_and_the_watch_stops_when_asked():
    p = subprocess.Popen(SLEEP)
    try:
        def broken(ev: EngineEvent) -> None:
            raise OSError("disk full")
        w = EngineWatch([p.pid], 1, record=broken, retarget=lambda pids: None,
                        find_listener=lambda: None, child=p, poll_s=0.01).start()
        p.kill()
        p.wait()
        deadline = time.monotonic() + 10
        while not (w.events and w.errors):  # the event is kept, then recorded
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert w.events[0].how == "signal SIGKILL"
        assert w.errors and "disk full" in w.errors[0]
        w.stop(timeout_s=5)
        assert w._thread is not None and not w._thread.is_alive()
    finally:
        p.kill()
        p.wait()


def test_the_url_s_port():
    assert url_port("http://127.0.0.1:8080") == 8080
    assert url_port("https://host.example") == 443
    assert url_port("http://host.example/x") == 80


# --- the format ----------------------------------------------------------------------------

def test_an_engine_event_is_a_markers_row_and_back():
    ev = EngineEvent(ENGINE_EXIT, 1234, 8080, "signal SIGKILL", 5_000, since_ns=4_000)
    m = Marker("event", ev.marker_name, "", 4_000, 5_000)  # from the last look to this one
    assert m.name == "engine_exit pid=1234 port=8080 how=signal SIGKILL"
    assert from_marker(m) == ev
    assert from_marker(Marker("event", "inject:x", "c", 1, 1)) is None
    assert engine_events([m, Marker("case", "engine_exit", "c", 0, 9)]) == [ev]
    with pytest.raises(FormatError, match="is not an engine event"):
        from_marker(Marker("event", "engine_exit pid=x", "", 1, 1))
    with pytest.raises(ValueError, match="one non-empty line"):
        EngineEvent(ENGINE_NEW, 1, 1, "", 0)


# --- the failed requests tied to a death ---------------------------------------------------

ANCHOR = ClockAnchor(mono_ns=0, wall_ns=0)  # records' monotonic ns read as wall ns
S = 1_000_000_000
REFUSED = RequestError("connect", "connection refused")


def _rec(i: int, end_ns: int, ok: bool, first_byte_ns: int | None = None) -> RequestRecord:
    return RequestRecord(request_id=f"c/measured/{i}", case_id="c", phase="measured",
                         api="completions", scheduled_ns=0, dispatched_ns=end_ns - S // 10,
                         first_byte_ns=first_byte_ns, done_ns=end_ns,
                         error=None if ok else REFUSED)


def test_failed_requests_are_tied_to_the_death_within_the_margin_and_not_past_it():
    margin = value("engine_outage_margin_s")
    assert margin == 0.5
    m, ms = int(margin * S), S // 1000
    died, new = 10 * S, 11 * S
    events = [EngineEvent(ENGINE_EXIT, 100, 8080, "signal SIGKILL", died),
              EngineEvent(ENGINE_NEW, 101, 8080, "listens", new)]
    answer = 12 * S  # the first request answered after the death
    recs = [
        _rec(0, died - m - ms, False),  # just before the margin: not tied
        _rec(1, died - m + ms, False),  # just inside it: tied
        _rec(2, died + S // 2, False),  # refused while nobody listened: tied
        _rec(3, answer + m - ms, False),  # just inside the margin after the answer: tied
        _rec(4, answer + m + ms, False),  # just past it: not tied
        _rec(5, answer + S, True, first_byte_ns=answer),
        _rec(6, died - 2 * S, True, first_byte_ns=died - 3 * S),  # answered before: no
    ]
    (o,) = engine_outages(events, recs, ANCHOR)
    assert o.first_answer_wall_ns == answer and o.tied_failed == 3
    line = o.line("adhoc", died - 4_200 * ms)
    assert line == ("the engine (pid 100) died 4.2 s into case `adhoc`: killed by SIGKILL; "
                    "pid 101 took over port 8080 1.0 s later; 3 failed requests tied to it "
                    "(ended between its death and the new engine's first answer, ±0.5 s: "
                    "engine_outage_margin_s)")


def test_a_late_watch_widens_the_window_back_to_its_last_look():
    # the watch looked at 8 s (alive) and next at 10 s (gone): a failure at 7.6 s is
    # inside the margin of the death's earliest time, one at 7.4 s is not
    m, ms = int(value("engine_outage_margin_s") * S), S // 1000
    events = [EngineEvent(ENGINE_EXIT, 100, 8080, "gone", 10 * S, since_ns=8 * S)]
    recs = [_rec(0, 8 * S - m + ms, False), _rec(1, 8 * S - m - ms, False)]
    (o,) = engine_outages(events, recs, ANCHOR)
    assert o.tied_failed == 1


def test_a_death_nobody_took_over_ties_every_later_failure_and_says_so():
    events = [EngineEvent(ENGINE_EXIT, 7, 0, "exit code 3", 10 * S)]
    recs = [_rec(0, 9 * S, False), _rec(1, 30 * S, False), _rec(2, 40 * S, False)]
    (o,) = engine_outages(events, recs, ANCHOR)
    assert o.new is None and o.first_answer_wall_ns is None and o.tied_failed == 2
    assert o.line().startswith("the engine (pid 7) died: exited with code 3; no engine "
                               "took over its port; 2 failed requests tied to it (ended "
                               "between its death and the run's end")
    (blind,) = engine_outages(events, recs, None)
    assert blind.tied_failed is None and "cannot be placed" in blind.line()


# --- the run's watch: markers.csv, and Strata's own stop ---------------------------------

def _fleet_and_server(tmp_path: Path, p: subprocess.Popen):
    from types import SimpleNamespace

    from strata_plugin.configure.profile import TelemetrySpec
    from strata_plugin.run.agents import AgentFleet
    from strata_plugin.run.run_folder import RunRecorder

    rec = RunRecorder(tmp_path, ClockAnchor.now(), {})
    fleet = AgentFleet((), TelemetrySpec(), tmp_path, rec)
    server = SimpleNamespace(pid=p.pid, proc=p, base_url="http://127.0.0.1:1", block_key="b")
    return fleet, rec, server


def test_a_launched_engine_killed_is_a_markers_row_with_its_signal(tmp_path):
    from strata_plugin.formats.windows import read_markers

    p = subprocess.Popen(SLEEP)
    fleet, rec, server = _fleet_and_server(tmp_path, p)
    try:
        fleet.watch(server)
        p.kill()
        deadline = time.monotonic() + 10
        while not fleet.watches["b"].events:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        fleet.stop_watch("b")
        (ev,) = engine_events(read_markers(tmp_path / "markers.csv"))
        assert (ev.kind, ev.pid, ev.port, ev.how) == (ENGINE_EXIT, p.pid, 1, "signal SIGKILL")
        assert ev.after_ns <= ev.wall_ns
    finally:
        p.kill()
        p.wait()
        rec.close()


def test_strata_stopping_its_own_engine_is_no_death(tmp_path):
    p = subprocess.Popen(SLEEP)
    fleet, rec, server = _fleet_and_server(tmp_path, p)
    try:
        fleet.watch(server)
        w = fleet.watches["b"]
        fleet.stop_watch("b")  # what Deployment.stop_server does before it stops the server
        p.terminate()
        p.wait()
        time.sleep(3 * w.poll_s)  # a watch still running would have seen the end by now
        assert w.events == [] and not (tmp_path / "markers.csv").exists()
    finally:
        p.kill()
        p.wait()
        rec.close()

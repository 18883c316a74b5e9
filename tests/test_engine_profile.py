"""The engine's own profile (run/engine_profile.py, analysis/traces/engine_profile.py):
perf's CPU samples of a real process over exactly one window, on the harness's clock,
merged into the run's timeline; a capture that fails is said and costs nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bundle_factory import CaseSpec, RunSpec, make_run
from test_trace_events import format_problems

from strata_plugin.analysis.case_summary import analyze_run
from strata_plugin.analysis.traces import engine_profile as ep
from strata_plugin.formats.windows import read_markers
from strata_plugin.report import trace_events as te
from strata_plugin.run import engine_profile as cap

# The child spins for SPIN_CPU_S of its own CPU time once told to, then reports the
# monotonic bounds of that spin and sleeps until killed: all its CPU time in the window
# is the spin, so every sample must lie inside the bounds it reports.
CHILD = r"""
import os, sys, time
sys.stdin.readline()
a = time.monotonic_ns(); c0 = time.thread_time()
while time.thread_time() - c0 < float(sys.argv[1]):
    pass
b = time.monotonic_ns(); cpu = time.thread_time() - c0
print(a, b, cpu, os.getpid(), flush=True)
time.sleep(600)
"""
SPIN_CPU_S = 0.4


def _needs_perf() -> None:
    why = cap.perf_unavailable()
    if why:
        pytest.fail(f"this test needs perf: {why}")


def _spin(out: Path) -> tuple[dict, tuple[int, int, float, int]]:
    """A child sampled over a window holding its spin: (meta, (a, b, cpu_s, pid))."""
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(SPIN_CPU_S)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        with cap.PerfCapture((p.pid,), out, case_id="spin") as c:
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("go\n")
            p.stdin.flush()
            a, b, cpu, pid = p.stdout.readline().split()
        meta = c.meta
    finally:
        p.kill()
        p.wait()
    return meta, (int(a), int(b), float(cpu), int(pid))


@pytest.fixture(scope="module")
def spun(tmp_path_factory):
    _needs_perf()
    out = tmp_path_factory.mktemp("engine") / "spin"
    return out, *_spin(out)


def test_samples_of_a_busy_process_lie_inside_its_spin_and_the_window(spun):
    out, meta, (a, b, cpu, pid) = spun
    assert meta["problem"] == "" and meta["kind"] == cap.KIND
    assert meta["start_mono_ns"] <= a < b <= meta["end_mono_ns"]
    text = (out / "samples.txt").read_text().splitlines()
    # unclipped: every sample perf wrote, read without the window
    events, kept, outside = ep.parse_perf_script(text, 1003.0)
    xs = [e for e in events if e["ph"] == "X"]
    assert outside == 0 and kept == len(xs)
    assert {e["pid"] for e in xs} == {pid}
    # samples come at 997 Hz of the thread's CPU time: the spin's CPU time gives their
    # count (the timer's first period may start before the spin: one sample either way)
    assert abs(len(xs) - cpu * cap.FREQ_HZ) <= 0.1 * cpu * cap.FREQ_HZ + 2, (len(xs), cpu)
    # every sample inside the spin (a sample is stamped when the timer fires, so at most
    # one period after the last instruction of the spin it counts)
    period_ns = 1e9 / cap.FREQ_HZ
    ts_ns = [e["ts"] * 1000 for e in xs]
    assert min(ts_ns) >= a and max(ts_ns) <= b + 2 * period_ns, (a, b, min(ts_ns), max(ts_ns))


def test_the_clock_relation_is_measured_with_its_error(spun):
    _, meta, _ = spun
    rel = meta["clock_relation"]
    now = time.time_ns() - time.monotonic_ns()
    # the wall clock's offset from monotonic, to within its stated error and the
    # seconds since (an NTP slew is 500 ppm at most)
    assert abs(rel["wall_minus_mono_ns"] - now) <= rel["error_ns"] + 5_000_000
    assert 0 <= rel["error_ns"] < 1_000_000  # a bracket of three clock reads: microseconds


def test_the_samples_are_valid_trace_events_and_land_on_the_run_timeline(spun, tmp_path):
    out, meta, (a, b, _, _pid) = spun
    run = make_run(tmp_path, RunSpec(cases=[CaseSpec("c1")]))
    dest = run / "traces" / "engine" / "c1"
    dest.mkdir(parents=True)
    for f in ("samples.txt", "meta.json"):
        (dest / f).write_bytes((out / f).read_bytes())
    # the fabricated run lies at another time: its measured window stands for the
    # capture's, the relation moved to match (as a capture in that run would have had)
    win = next(m for m in read_markers(run / "markers.csv")
               if m.kind == "measured" and m.case_id == "c1")
    m = json.loads((dest / "meta.json").read_text())
    rel = win.start_wall_ns - m["start_mono_ns"]
    m["case_id"], m["clock_relation"]["wall_minus_mono_ns"] = "c1", rel
    (dest / "meta.json").write_text(json.dumps(m))
    ra = analyze_run(run)
    written = te.write_all(ra, run)
    assert written.problem == ""
    trace = json.loads((run / "timeline" / "run.json").read_text())
    assert format_problems(trace) == []
    origin = trace["metadata"]["origin_wall_ns"]
    xs = [e for e in trace["traceEvents"] if e.get("cat") == "perf"]
    assert xs and all(e["pid"] >= te.ENGINE_PID0 for e in xs)
    # each sample at its monotonic time + the measured relation, from the run's start
    lo, hi = (a + rel - origin) / 1000, (b + rel - origin) / 1000 + 2 * 1e6 / cap.FREQ_HZ
    assert all(lo - 0.001 <= e["ts"] <= hi for e in xs), (lo, hi, xs[0]["ts"], xs[-1]["ts"])
    # and inside the case's measured window as the markers track draws it
    assert (win.start_wall_ns - origin) / 1000 <= min(e["ts"] for e in xs)
    eng = trace["metadata"]["engine_traces"]
    assert len(eng) == 1 and eng[0]["error_us"] == meta["clock_relation"]["error_ns"] / 1000
    case = json.loads((run / "timeline" / written.cases["c1"][0]).read_text())
    assert format_problems(case) == []
    assert sum(e.get("cat") == "perf" for e in case["traceEvents"]) == len(xs)
    line = written.case_line("c1")
    assert line is not None and cap.KIND in line and "traces/engine/c1" in line
    # the command writes the case's file with the same samples at the same times
    from strata_plugin.__main__ import main as strata_main

    assert strata_main(["timeline", str(run), "--case", "c1", "-o", str(tmp_path / "c.json")]) == 0
    again = json.loads((tmp_path / "c.json").read_text())
    assert ([e["ts"] for e in again["traceEvents"] if e.get("cat") == "perf"]
            == [e["ts"] for e in case["traceEvents"] if e.get("cat") == "perf"])


def test_perf_missing_is_said_plainly(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cap.perf_unavailable().startswith("perf is not installed")
    with pytest.raises(cap.ProfileUnavailable, match="perf is not installed"):
        cap.PerfCapture((os.getpid(),), tmp_path / "x").start()


def test_perf_that_cannot_attach_fails_the_start_with_perfs_words(tmp_path):
    _needs_perf()
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # a process that no longer exists
    with pytest.raises(cap.ProfileUnavailable, match="perf did not answer 'enable'"):
        cap.PerfCapture((p.pid,), tmp_path / "gone", timeout_s=5).start()


def test_a_failed_capture_is_said_in_the_report_and_the_timeline_stands(tmp_path):
    run = make_run(tmp_path, RunSpec(cases=[CaseSpec("c1"), CaseSpec("c2")]))
    cap.unavailable_meta(run / "traces" / "engine" / "c1", "c1", "perf is not installed")
    bad = run / "traces" / "engine" / "c2"
    bad.mkdir(parents=True)
    (bad / "samples.txt").write_text("garbage line\n")
    (bad / "meta.json").write_text(json.dumps({
        "kind": cap.KIND, "case_id": "c2", "files": ["samples.txt"], "problem": "",
        "clock_relation": {"wall_minus_mono_ns": 0, "error_ns": 1, "method": "m"}}))
    written = te.write_all(analyze_run(run), run)
    assert written.problem == "" and set(written.cases) == {"c1", "c2"}
    one, two = written.case_line("c1"), written.case_line("c2")
    assert one is not None and "not taken: perf is not installed" in one
    assert two is not None and "samples.txt line 1: not a perf sample" in two
    trace = json.loads((run / "timeline" / "run.json").read_text())
    assert format_problems(trace) == [] and trace["metadata"]["engine_traces"] == []


def test_jittered_samples_never_overlap_on_a_thread():
    # two samples 0.9 periods apart: the first is cut at the second, the last keeps a period
    lines = ["  llama-server 10/11  5.000000000:  7f00 ggml_vec_dot_f16 (/lib/libggml.so)",
             "  llama-server 10/11  5.000900000:  7f01 op(int, float) (/lib/libggml.so)",
             "  llama-server 10/12  5.000100000:  7f02 [unknown] ([kernel.kallsyms])"]
    events, kept, outside = ep.parse_perf_script(lines, 1000.0, (5_000_000_000, 5_000_900_000))
    xs = {(e["tid"], e["name"]): e for e in events if e["ph"] == "X"}
    assert (kept, outside) == (3, 0)
    c = ep.EngineCapture("c", cap.KIND, Path("/r/traces/engine/c"), 0, 1, 0, 1000, "m",
                         (*events, events[0]), samples=4)
    assert c.top(1) == [("ggml_vec_dot_f16", 0.5)]  # 2 of 4 samples; ties by name
    assert "Most samples in: `ggml_vec_dot_f16` 50%, `[unknown]` 25%" in c.line(Path("/r"))
    assert xs[(11, "ggml_vec_dot_f16")]["dur"] == 900.0
    assert xs[(11, "op(int, float)")]["dur"] == 1000.0
    assert xs[(12, "[unknown]")]["args"]["dso"] == "[kernel.kallsyms]"
    # one ns past the window's end: dropped and counted
    _, kept, outside = ep.parse_perf_script(lines, 1000.0, (5_000_000_000, 5_000_899_999))
    assert (kept, outside) == (2, 1)


def test_the_round_asks_for_the_engine_profile_only_between_two_causes_inside_it():
    from strata_plugin.analysis.rules import Verdict
    from strata_plugin.analysis.traces import settle

    def v(*classes):
        return Verdict(classes=classes, evidence=(), confidence=0.4, inconclusive=True,
                       finer_trace=(), missing_signals=())

    assert "engine" not in settle.traces_for(v("gpu_compute", "queueing"))  # one inside
    assert settle.traces_for(v("gpu_compute", "gpu_pcie_copy")) == ("sched", "block", "engine")
    assert settle.traces_for(v("cpu_compute", "host_cpu_launch")) == ("sched", "engine")
    assert "engine" in settle.ALL_TRACES  # a case named in --strata-escalate gets it


def _busy_child() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


@pytest.mark.parametrize("named", [True, False])
def test_a_case_named_for_the_engine_profile_gets_a_repetition_with_it_and_no_other(
        tmp_path, named):
    """--strata-engine-profile as the round takes it: the named case is repeated with the
    engine's profile alone (no kernel trace); a case not named is not repeated."""
    from sse_script_server import ScriptServer
    from test_plugin import llama_reply

    from strata_plugin.load.case_runner import CaseSetup
    from strata_plugin.load.client import Timeouts
    from strata_plugin.load.workload import TokenSpace, Workload
    from strata_plugin.run.diagnostic_round import DiagnosticRunner

    _needs_perf()
    busy = _busy_child()  # stands for the engine's process: CPU samples all through
    try:
        with ScriptServer(llama_reply) as srv:
            setup = CaseSetup(srv.url, "llamacpp", "x", TokenSpace(300, 1000),
                              Timeouts(read_s=10))
            runner = DiagnosticRunner(setup, record=lambda r: None, mark=lambda *a: None,
                                      add_case=lambda c: None, escalate=(), run_dir=tmp_path,
                                      server_pid=busy.pid, settle_s=0.0,
                                      engine_profile=("d" if named else "other",))
            runner.run(Workload("d", isl=8, osl=6, requests=3), case_id="c1", scale=False)
    finally:
        busy.kill()
        busy.wait()
    if not named:
        assert runner.diagnostics == [] and not (tmp_path / "traces").exists()
        return
    [traced] = runner.diagnostics
    meta = json.loads((tmp_path / "traces" / "c1~traced" / "meta.json").read_text())
    assert meta["traces"] == ["engine"] and meta["captured"] == []
    assert meta["engine_profile"] == "traces/engine/c1~traced"
    got = ep.read_capture(tmp_path / "traces" / "engine" / "c1~traced")
    assert got.problem == "" and got.samples > 0 and got.outside == 0
    assert {e["pid"] for e in got.events if e["ph"] == "X"} == {busy.pid}
    assert got.start_mono_ns is not None and got.end_mono_ns is not None
    assert got.start_mono_ns <= traced.window_ns[0] <= traced.window_ns[1] <= got.end_mono_ns


def test_attached_by_url_the_engine_profile_says_why_not(tmp_path):
    with cap.profile_window(tmp_path, "c1", None) as meta:
        pass
    assert "PID is not known" in meta["problem"]
    got = ep.read_capture(tmp_path / "traces" / "engine" / "c1")
    assert got.problem == meta["problem"] and got.events == ()
    assert "not taken: the server's PID is not known" in got.line(tmp_path)


def test_an_engine_that_exits_inside_the_window_keeps_its_samples_and_says_so(tmp_path):
    _needs_perf()
    p = subprocess.Popen([sys.executable, "-c", "import sys, time\nsys.stdin.readline()\n"
                          "t = time.thread_time()\nwhile time.thread_time() - t < 0.1: pass"],
                         stdin=subprocess.PIPE)
    c = cap.PerfCapture((p.pid,), tmp_path / "x").start()
    assert p.stdin is not None
    p.stdin.write(b"go\n")
    p.stdin.close()
    p.wait()
    deadline = time.monotonic() + 10
    while c.proc is not None and c.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # perf ends once its last target has
    meta = c.stop()
    assert meta["problem"] == "" and "sampled processes exited" in meta["ended_early"]
    got = ep.read_capture(tmp_path / "x")
    assert got.problem == "" and got.samples >= 50  # 0.1 s of CPU at 997 Hz: ~100


@pytest.mark.parametrize("status", [200, 404])
def test_on_vllm_the_servers_own_profiler_is_asked_and_its_answer_said(tmp_path, status):
    """Attached to a vLLM: /start_profile before the window, /stop_profile after it; a
    server without a profiler (404) is said to have none, and perf's samples stand."""
    from sse_script_server import Reply, ScriptServer

    _needs_perf()
    busy = _busy_child()
    reply = Reply([(0.0, b"")], status=status, framing="length", content_type="text/plain")
    try:
        with ScriptServer(reply) as srv:
            with cap.profile_window(tmp_path, "c/1", busy.pid, engine="vllm",
                                    base_url=srv.url) as meta:
                time.sleep(0.3)
    finally:
        busy.kill()
        busy.wait()
    assert [s.path for s in srv.seen] == (["/start_profile", "/stop_profile"] if status == 200
                                          else ["/start_profile"])
    assert json.loads(srv.seen[0].body) == {"profile_prefix": "c__1"}
    got = ep.read_capture(tmp_path / "traces" / "engine" / "c__1")
    assert got.problem == "" and got.samples > 0 and meta["engine_profiler"]["engine"] == "vllm"
    line = got.line(tmp_path)
    if status == 200:
        assert "The server's own profiler (vllm): started and stopped over the window" in line
    else:
        assert ("The server's own profiler (vllm): not taken: the server has no profiler: "
                "POST /start_profile answered 404") in line

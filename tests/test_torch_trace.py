"""The server's own torch profiler trace (run/engine_http_profile.py, run/engine_profile.py,
analysis/traces/torch_trace.py): a launched vLLM is given the profiler, the window's files
are collected into the case's folder, read within a bound, put on the wall clock with
the error stated, and merged into the timeline; a trace that cannot be read is said and
loses nothing else. The live check on the real vLLM CPU server: tests/test_vllm_torch_profile.py.

The trace files here are written by the tests in torch's chrome-trace format, with the
fields and values a vLLM 0.32 CPU worker wrote (profiled on this project's vLLM CPU
server: ``probe_rank0.<ns>.pt.trace.json.gz``, 2026-12-07)."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from bundle_factory import CaseSpec, RunSpec, make_run
from sse_script_server import Reply, ScriptServer
from test_trace_events import format_problems
from vllm_env import vllm_python

from strata_plugin.analysis.case_summary import analyze_run
from strata_plugin.analysis.traces import engine_profile as ep
from strata_plugin.analysis.traces import torch_trace as tt
from strata_plugin.configure.profile import StrataConfig, load_profile, packaged_profiles
from strata_plugin.formats.windows import read_markers
from strata_plugin.report import trace_events as te
from strata_plugin.run import engine_http_profile as hp
from strata_plugin.run import engine_profile as cap
from strata_plugin.run.deployment import Deployment, PreflightFailed

ROOT = Path(__file__).resolve().parents[1]
#: vLLM's own rule for a profile_prefix (vllm/config/profiler.py: validate_profile_prefix)
VLLM_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: baseTimeNanoseconds as the real trace had it: a whole second, ~67 days before its ts
BASE_NS = 1_790_857_026_000_000_000


def torch_trace(base_ns: int, span_us: tuple[float, float],
                ops: list[tuple[str, str, float, float]], pid: int = 14685) -> dict:
    """A torch chrome trace as the vLLM CPU worker writes it: metadata events, the
    profiler's own span ('Trace', pid 'Spans'), instants, ops (name, cat, ts, dur) in
    µs from ``base_ns``."""
    meta_ts = span_us[0] + 400.535
    ev: list[dict] = [
        {"ph": "M", "name": "process_name", "ts": meta_ts, "pid": pid, "tid": 0,
         "args": {"name": "VLLM::Worker"}},
        {"ph": "M", "name": "process_labels", "ts": meta_ts, "pid": pid, "tid": 0,
         "args": {"labels": "CPU"}},
        {"ph": "M", "name": "thread_name", "ts": meta_ts, "pid": pid, "tid": pid,
         "args": {"name": f"thread {pid} (VLLM::Worker)"}},
    ]
    for k, (name, cat, ts, dur) in enumerate(ops):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": pid, "ts": ts,
                   "dur": dur, "args": {"External id": k + 1, "Record function id": 0,
                                        "Ev Idx": k}})
    ev += [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
         "tid": "PyTorch Profiler", "ts": span_us[0], "dur": span_us[1] - span_us[0],
         "args": {"Op count": 0}},
        {"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces",
         "tid": "Trace PyTorch Profiler", "ts": span_us[0]},
        {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "",
         "ts": span_us[1] + 3.5},
    ]
    return {"schemaVersion": 1, "trace_id": "E255B56F66CF4C478ED09DC7F684993F",
            "with_stack": 0, "vllm_version_tuple": ["0", "32", "0"],
            "vllm_version": "0.32.0", "host_name": "vm", "displayTimeUnit": "ms",
            "baseTimeNanoseconds": base_ns, "traceEvents": ev,
            "traceName": "/tmp/tmp9_kkypag.json"}


def write_gz(path: Path, trace: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    return path


def us_from_base(wall_ns: int) -> float:
    return (wall_ns - BASE_NS) / 1000.0


# A window on Strata's wall clock: /start_profile sent at S0, answered at S1;
# /stop_profile sent at E0, answered at E1 (the stop writes the trace: seconds later).
S0 = 1_796_680_537_858_465_831
S1 = S0 + 11_617_439
E0 = S0 + 163_589_723
E1 = E0 + 5_904_418_089
T0 = S0 + 6_008_175  # the profiler's own start, between S0 and S1
T1 = E0 + 2_981_685  # its stop, between E0 and E1
PREFILL = (S0 + 20_000_000, 41_250_000)  # (wall start, duration ns) of a prefill step


def _ops() -> list[tuple[str, str, float, float]]:
    a, d = PREFILL
    return [("execute_context_1(200)_generation_0(0)", "user_annotation", us_from_base(a),
             d / 1000),
            ("aten::linear", "cpu_op", us_from_base(a + 1_000_000), 512.25),
            ("execute_context_0(0)_generation_1(1)", "user_annotation",
             us_from_base(a + d + 500_000), 9_000.0)]


def test_a_torch_trace_is_placed_on_the_wall_clock_by_its_base_in_ns_and_ts_in_us(tmp_path):
    """ts is µs from baseTimeNanoseconds (ns since the epoch): the prefill op lands at its
    wall time to the ns; read as ns, or the base as µs, it would land 67 days or 55
    years away."""
    p = write_gz(tmp_path / "probe_rank0.1796680538158030650.pt.trace.json.gz",
                 torch_trace(BASE_NS, (us_from_base(T0), us_from_base(T1)), _ops()))
    base, events = tt.read_file(p, p.name)
    assert base == BASE_NS
    pre = next(e for e in events if e["name"].startswith("execute_context_1"))
    assert base + round(pre["ts"] * 1000) == PREFILL[0]
    got = tt.relate(base, events, [S0, S1], [E0, E1])
    assert got["ops"] == 3 and got["outside"] == 0 and got["correction_ns"] == 0
    # the start allows [T0 - S1, T0 - S0], the stop [T1 - E1, T1 - E0], the ops
    # [last - E1, first - S0]: the intersection is [T0 - S1, T1 - E0]
    assert got["offset_bounds_ns"] == (T0 - S1, T1 - E0)
    assert got["error_ns"] == max(S1 - T0, T1 - E0) == 5_609_264
    assert got["span_ns"][0] == PREFILL[0]


def test_the_profilers_start_just_before_stratas_send_is_corrected_and_at_it_is_not():
    """The profiler cannot start before /start_profile was sent: a span starting 1 µs
    before it says the trace's clock is ahead, and is corrected by the middle of what
    the stamps allow; starting exactly at the send, zero is allowed and nothing moves."""
    ops = [("aten::mm", "cpu_op", us_from_base(S0 + 2_000_000), 10.0)]
    for t0, corrected in ((S0, False), (S0 - 1_000, True)):
        tr = torch_trace(BASE_NS, (us_from_base(t0), us_from_base(T1)), ops)
        got = tt.relate(BASE_NS, tuple(tr["traceEvents"]), [S0, S1], [E0, E1])
        lo, hi = got["offset_bounds_ns"]
        assert hi == t0 - S0
        if corrected:
            assert got["correction_ns"] == (lo + hi) // 2 < 0
            assert got["error_ns"] == (hi - lo + 1) // 2
        else:
            assert got["correction_ns"] == 0 and got["error_ns"] == S1 - S0


def test_stamps_that_contradict_the_trace_are_said_not_corrected():
    # the profiler's span starts after /start_profile was answered and stops before the
    # stop was sent, by more than the round trips allow: no offset fits both
    tr = torch_trace(BASE_NS, (us_from_base(S1 + 50_000_000), us_from_base(E0 - 90_000_000)),
                     [])
    got = tt.relate(BASE_NS, tuple(tr["traceEvents"]), [S0, S1], [E0, E1])
    assert "disagree by" in got["clock_note"] and "error_ns" not in got


def _case_capture(run: Path, case_id: str, traces: dict[str, bytes], said: dict) -> Path:
    """A case's capture folder as run/engine_profile.py leaves it on a host without perf:
    meta.json with perf's problem and the server profiler's account, the torch files."""
    d = run / "traces" / "engine" / case_id
    for name, raw in traces.items():
        (d / "torch").mkdir(parents=True, exist_ok=True)
        (d / "torch" / name).write_bytes(raw)
    cap.unavailable_meta(d, case_id, "perf is not installed")
    meta = json.loads((d / "meta.json").read_text())
    meta["engine_profiler"] = {"engine": "vllm", "what": hp.KIND, "started": "yes",
                               "files": [f"torch/{n}" for n in traces], **said}
    (d / "meta.json").write_text(json.dumps(meta))
    return d


def _one_case_run(tmp_path: Path) -> tuple[Path, int, int]:
    """A recorded run of one case, ``c1``, and its measured window's start and end (wall
    ns), which a capture's traces and stamps are placed against."""
    run = make_run(tmp_path, RunSpec(cases=[CaseSpec("c1")]))
    win = next(m for m in read_markers(run / "markers.csv")
               if m.kind == "measured" and m.case_id == "c1")
    return run, win.start_wall_ns, win.end_wall_ns


def test_the_torch_ops_are_on_the_timeline_beside_the_requests_and_the_report_says_so(
        tmp_path):
    run, s0, e1 = _one_case_run(tmp_path)
    a = s0 + 30_000_000
    tr = torch_trace(BASE_NS, (us_from_base(s0 + 4_000_000), us_from_base(e1 - 100_000_000)),
                     [("execute_context_1(128)_generation_0(0)", "user_annotation",
                       us_from_base(a), 25_000.0)])
    _case_capture(run, "c1", {"c1_rank0.1.pt.trace.json.gz": gzip.compress(
        json.dumps(tr).encode())}, {"start_wall_ns": [s0, s0 + 8_000_000],
                                    "stop_wall_ns": [e1 - 200_000_000, e1]})
    written = te.write_all(analyze_run(run), run)
    assert written.problem == ""
    trace = json.loads((run / "timeline" / written.cases["c1"][0]).read_text())
    assert format_problems(trace) == []
    origin = trace["metadata"]["origin_wall_ns"]
    pre = [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    assert [e["ts"] for e in pre] == [(a - origin) / 1000]
    assert pre[0]["pid"] >= te.ENGINE_PID0 and pre[0]["dur"] == 25_000.0
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names[pre[0]["pid"]] == ("engine torch profiler (c1): c1_rank0.1.pt.trace.json.gz: "
                                    "VLLM::Worker")
    (eng,) = trace["metadata"]["engine_traces"]
    assert eng["error_us"] == 4_000.0 and "baseTimeNanoseconds" in eng["method"]
    line = written.case_line("c1")
    assert line is not None and "not taken: perf is not installed" in line
    assert ("`torch/c1_rank0.1.pt.trace.json.gz`: 1 ops on the timeline, clock error ±4.0 ms"
            "; most of the ops' own time in `execute_context_1(128)_generation_0(0)` 100%"
            in line)


def test_a_requests_file_holds_the_engines_ops_of_its_span_and_cuts_the_profilers_span(
        tmp_path):
    """One request's file: the engine's ops during the request are there, an op of the
    window outside the request's span is not, and the profiler's own span (the whole
    window) is cut to the file's span with its whole span said: a viewer opens a file
    on what its slices cover, and the window's span would open it zoomed out."""
    from strata_plugin.__main__ import main as strata_main

    run, s0, e1 = _one_case_run(tmp_path)
    ra = analyze_run(run)
    req = next(s for s in te.request_spans(ra.bundle)[0] if s.case_id == "c1"
               and s.request_id.startswith("c1/measured/"))
    inside, outside = req.start_ns + 1_000_000, e1 - 150_000_000
    assert not te.request_scope(ra.bundle, req.request_id).overlaps(outside, outside + 1)
    tr = torch_trace(BASE_NS, (us_from_base(s0 + 4_000_000), us_from_base(e1 - 100_000_000)),
                     [("aten::mm", "cpu_op", us_from_base(inside), 100.0),
                      ("aten::add", "cpu_op", us_from_base(outside), 100.0)])
    _case_capture(run, "c1", {"c1_rank0.1.pt.trace.json.gz": gzip.compress(
        json.dumps(tr).encode())}, {"start_wall_ns": [s0, s0 + 8_000_000],
                                    "stop_wall_ns": [e1 - 200_000_000, e1]})
    out = tmp_path / "one.json"
    assert strata_main(["timeline", str(run), "--request", req.request_id, "-o",
                        str(out)]) == 0
    one = json.loads(out.read_text())
    assert format_problems(one) == []
    lo, hi = one["metadata"]["span_us"]
    ops = {e["name"] for e in one["traceEvents"] if e.get("cat") == "cpu_op"}
    assert ops == {"aten::mm"}
    (span,) = [e for e in one["traceEvents"] if e.get("cat") == tt.PROFILER_SPAN_CAT]
    whole = span["args"]["whole_span_ms"]  # the window's, beyond the request's end
    assert whole[1] * 1000 > hi and span["ts"] + span["dur"] == pytest.approx(hi, abs=0.002)
    assert span["ts"] == pytest.approx(max(lo, whole[0] * 1000), abs=0.002)


def test_what_the_trace_showed_is_each_ops_own_time_not_its_childrens():
    """Nested ops (as torch's are): a parent's own time is its duration less its
    children's, so the op that did the work leads, not the one that holds it."""
    def op(name: str, ts: float, dur: float, tid: int = 1) -> dict:
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 7, "tid": tid, "ts": ts,
                "dur": dur}

    events = [op("aten::linear", 0.0, 10.0), op("aten::addmm", 1.0, 6.0),
              op("aten::mm_kernel", 2.0, 2.0), op("aten::add", 12.0, 3.0),
              op("aten::softmax", 0.0, 5.0, tid=2),
              {"ph": "X", "cat": tt.PROFILER_SPAN_CAT, "name": "PyTorch Profiler (0)",
               "pid": "Spans", "tid": "PyTorch Profiler", "ts": 0.0, "dur": 100.0}]
    # own: linear 10-6 = 4, addmm 6-2 = 4, mm_kernel 2, add 3, softmax 5: 18 in all
    assert tt.self_time_top(events) == (("aten::softmax", 5 / 18), ("aten::addmm", 4 / 18),
                                        ("aten::linear", 4 / 18))
    assert tt.self_time_top([]) == ()
    # SGLang's idle stage is its wait for work: its own time is no op's, its children's are
    idle = [{**op("scheduler.idle", 20.0, 200.0), "cat": "user_annotation"},
            op("aten::copy_", 21.0, 2.0)]
    assert tt.self_time_top(events + idle)[0] == ("aten::softmax", 5 / 20)
    assert tt.self_time_top(idle) == (("aten::copy_", 1.0),)


def test_malformed_huge_and_missing_traces_are_said_and_the_good_one_stands(
        tmp_path, monkeypatch):
    run, s0, e1 = _one_case_run(tmp_path)
    good = gzip.compress(json.dumps(torch_trace(
        BASE_NS, (us_from_base(s0 + 1_000), us_from_base(e1 - 1_000)),
        [("aten::mm", "cpu_op", us_from_base(s0 + 5_000_000), 10.0)])).encode())
    no_base = torch_trace(BASE_NS, (0.0, 1.0), [])
    del no_base["baseTimeNanoseconds"]
    bad_dur = torch_trace(BASE_NS, (0.0, 1.0), [("aten::mm", "cpu_op", 5.0, -1.0)])
    files = {"a_good.1.pt.trace.json.gz": good,
             "b_text.2.pt.trace.json.gz": b"not gzip at all",
             "c_cut.3.pt.trace.json.gz": good[: len(good) // 2],
             "d_nobase.4.pt.trace.json.gz": gzip.compress(json.dumps(no_base).encode()),
             "e_dur.5.pt.trace.json.gz": gzip.compress(json.dumps(bad_dur).encode())}
    d = _case_capture(run, "c1", files, {"start_wall_ns": [s0, s0 + 2_000],
                                         "stop_wall_ns": [e1 - 2_000, e1]})
    meta = json.loads((d / "meta.json").read_text())
    meta["engine_profiler"]["files"].append("torch/f_gone.6.pt.trace.json.gz")
    (d / "meta.json").write_text(json.dumps(meta))
    got = {Path(t.file).name: t for t in ep.read_capture(d).torch}
    assert got["a_good.1.pt.trace.json.gz"].problem == ""
    assert "not gzip" in got["b_text.2.pt.trace.json.gz"].problem
    assert "the gzip stream ends early" in got["c_cut.3.pt.trace.json.gz"].problem
    assert "no baseTimeNanoseconds" in got["d_nobase.4.pt.trace.json.gz"].problem
    assert "no ts or no duration >= 0" in got["e_dur.5.pt.trace.json.gz"].problem
    assert "cannot be read (No such file" in got["f_gone.6.pt.trace.json.gz"].problem
    written = te.write_all(analyze_run(run), run)
    trace = json.loads((run / "timeline" / written.cases["c1"][0]).read_text())
    assert format_problems(trace) == []
    assert [e["name"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op"] == ["aten::mm"]
    assert len(trace["metadata"]["engine_traces"]) == 1
    assert any(e["ph"] == "X" and e["pid"] == te.CLIENT_PID  # the requests stand beside it
               for e in trace["traceEvents"])
    line = written.case_line("c1")
    assert line is not None and "`torch/b_text.2.pt.trace.json.gz` not merged: " in line


def test_a_trace_past_the_bound_is_refused_by_name_and_one_at_it_is_read(
        tmp_path, monkeypatch):
    raw = json.dumps(torch_trace(BASE_NS, (0.0, 1.0), [("aten::mm", "cpu_op", 5.0, 1.0)]))
    p = tmp_path / "x.1.pt.trace.json.gz"
    p.write_bytes(gzip.compress(raw.encode()))
    monkeypatch.setattr(tt, "TORCH_TRACE_BYTES_MAX", len(raw))
    assert tt.read_file(p, p.name)[0] == BASE_NS
    monkeypatch.setattr(tt, "TORCH_TRACE_BYTES_MAX", len(raw) - 1)
    with pytest.raises(tt.TorchTraceError, match=r"more than TORCH_TRACE_BYTES_MAX \("
                                                 f"{len(raw) - 1} bytes\\) of JSON once "
                                                 "gunzipped"):
        tt.read_file(p, p.name)
    plain = tmp_path / "y.1.pt.trace.json"  # not gzipped: the file's own size is held
    plain.write_text(raw)
    with pytest.raises(tt.TorchTraceError, match="past TORCH_TRACE_BYTES_MAX"):
        tt.read_file(plain, plain.name)


@pytest.mark.parametrize("case_id", [
    "cases/test_x.py::test_decode[default]~traced", "c/1", "~odd", "é-case",
    "cases/" + "a" * 200 + "::t[x]~traced"])
def test_the_profile_prefix_is_one_vllm_accepts_and_stays_unique(case_id):
    got = hp.profile_prefix(case_id)
    assert VLLM_PREFIX.match(got), got
    assert hp.profile_prefix(case_id + "x") != got


@pytest.mark.vllm
@pytest.mark.integration  # imports vLLM: several seconds
def test_the_prefixes_are_accepted_by_the_installed_vllms_own_check():
    py = vllm_python()
    ids = ["cases/test_x.py::test_decode[default]~traced", "~odd", "a" * 300]
    code = ("import sys; from vllm.config.profiler import validate_profile_prefix as v\n"
            "for p in sys.argv[1:]: v(p)\n"
            "try:\n    v('cases/x::y')\nexcept ValueError:\n    print('refused')")
    out = subprocess.run([str(py), "-c", code, *map(hp.profile_prefix, ids)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "refused"  # the raw case id would have been


def test_only_the_windows_own_new_files_are_collected(tmp_path):
    srv, dest = tmp_path / "srv", tmp_path / "case" / "torch"
    srv.mkdir()
    (srv / "c1_rank0.1.pt.trace.json.gz").write_bytes(b"earlier window")
    before = hp.listing(srv)
    for n in ("c1_rank0.2.pt.trace.json.gz", "c1_rank0.profiler_out.txt",
              "c10_rank0.3.pt.trace.json.gz", "c1_rank0.4.tmp"):
        (srv / n).write_bytes(b"x")
    got = hp.collect(srv, before, "c1", dest)
    assert got == ["c1_rank0.2.pt.trace.json.gz", "c1_rank0.profiler_out.txt"]
    assert sorted(p.name for p in dest.iterdir()) == sorted(got)
    assert sorted(p.name for p in srv.iterdir()) == [
        "c10_rank0.3.pt.trace.json.gz", "c1_rank0.1.pt.trace.json.gz", "c1_rank0.4.tmp"]


def _config(tmp_path: Path, profile: Path, **kw) -> StrataConfig:
    return StrataConfig(load_profile(profile), tmp_path, "r", "", False, None, 10.0, tmp_path,
                        **kw)


@pytest.mark.parametrize("profile, kw, expected", [
    (packaged_profiles()["vllm-cpu"], {"engine_profile": ("decode",)}, True),
    (packaged_profiles()["vllm-cpu"], {"escalate": ("auto",)}, True),
    (packaged_profiles()["vllm-cpu"], {}, False),
    (packaged_profiles()["local"], {"engine_profile": ("decode",)}, False),
    (ROOT / "fixtures" / "profiles" / "vllm-1gpu-docker.toml", {"engine_profile": ("d",)},
     True),
    (ROOT / "fixtures" / "profiles" / "vllm-1gpu-docker.toml", {}, False),
])
def test_a_launched_vllm_carries_the_profiler_where_the_run_may_take_it(
        tmp_path, profile, kw, expected):
    cfg = _config(tmp_path, profile, **kw)
    run_dir = tmp_path / "run"
    dep = Deployment(cfg, run_dir, recorder=None, fleet=None, add_reason=lambda *a: None)
    argv = dep.launch_spec(cfg.profile.server.configs[0].config_id, "default").argv
    flags = [i for i, a in enumerate(argv) if a == "--profiler-config"]
    if not expected:
        assert flags == []
        return
    (i,) = flags
    conf = json.loads(argv[i + 1])
    where = run_dir.resolve() / "traces" / "engine" / "_server" / "default"
    assert conf["profiler"] == "torch" and conf["torch_profiler_dir"] == str(where)
    assert where.is_dir() and argv[i:] == ("--profiler-config", argv[i + 1])


def test_the_windows_files_are_moved_into_the_case_and_its_stamps_kept(tmp_path):
    """Against a scripted server answering /start_profile and /stop_profile: the file
    written in the window under the case's prefix is moved into the case's torch/, the
    four wall stamps bracket the window, and the reader places its ops."""
    srv = tmp_path / "run" / "traces" / "engine" / "_server" / "default"
    srv.mkdir(parents=True)
    reply = Reply([(0.0, b"")], status=200, framing="length", content_type="text/plain")
    case = "cases/t.py::test_a[default]~traced"
    prefix = hp.profile_prefix(case)
    with ScriptServer(reply) as s, cap.profile_window(
            tmp_path / "run", case, None, engine="vllm", base_url=s.url,
            torch_dir=srv) as meta:
        now = time.time_ns()
        write_gz(srv / f"{prefix}_rank0.{now}.pt.trace.json.gz", torch_trace(
            BASE_NS, (us_from_base(now - 1_000), us_from_base(now)),
            [("aten::mm", "cpu_op", us_from_base(now - 500), 1.0)]))
    assert json.loads(s.seen[0].body) == {"profile_prefix": prefix}
    said = meta["engine_profiler"]
    assert "problem" not in said and said["files"] == [
        f"torch/{prefix}_rank0.{now}.pt.trace.json.gz"]
    (s0, s1), (e0, e1) = said["start_wall_ns"], said["stop_wall_ns"]
    assert s0 <= s1 <= now <= e0 <= e1
    assert list(srv.iterdir()) == []
    got = ep.read_capture(cap.engine_dir(tmp_path / "run", case))
    (t,) = got.torch
    assert t.problem == "" and t.ops == 1 and t.outside == 0
    assert "moved into torch/" in got.line(tmp_path / "run")


def test_a_stop_that_leaves_no_trace_is_said(tmp_path):
    srv = tmp_path / "srv"
    srv.mkdir()
    reply = Reply([(0.0, b"")], status=200, framing="length", content_type="text/plain")
    with ScriptServer(reply) as s, cap.profile_window(
            tmp_path / "run", "c1", None, engine="vllm", base_url=s.url,
            torch_dir=srv) as meta:
        pass
    assert meta["engine_profiler"]["problem"] == (
        f"the server answered /stop_profile but wrote no trace named c1_*.pt.trace.json.gz "
        f"into {srv}")


# --- SGLang's own profiler and a containerised vLLM's ------------------------------------

#: SGLang's name for a window's trace (its scheduler, profiler_manager.py: stop):
#: ``<profile_prefix>-<profile_id>-TP-<rank>.trace.json.gz``, the id a time.time() string.
def sglang_name(prefix: str, profile_id: str = "1796690448.5493355", rank: int = 0) -> str:
    return f"{prefix}-{profile_id}-TP-{rank}.trace.json.gz"


def test_sglangs_files_of_the_window_are_collected_by_its_own_names(tmp_path):
    srv, dest = tmp_path / "srv", tmp_path / "case" / "torch"
    srv.mkdir()
    (srv / sglang_name("c1", "1.5")).write_bytes(b"earlier window")
    before = hp.listing(srv)
    for n in (sglang_name("c1", "2.5"), sglang_name("c1", "2.5", rank=1),
              sglang_name("c10", "2.5"), "c1-2.5-TP-0-memory.pickle"):
        (srv / n).write_bytes(b"x")
    got = hp.collect(srv, before, "c1", dest)
    assert got == [sglang_name("c1", "2.5"), sglang_name("c1", "2.5", rank=1)]
    assert sorted(p.name for p in srv.iterdir()) == sorted(
        [sglang_name("c1", "1.5"), sglang_name("c10", "2.5"), "c1-2.5-TP-0-memory.pickle"])


def _scripted_reply() -> Reply:
    return Reply([(0.0, b"")], status=200, framing="length", content_type="text/plain")


def test_a_launched_sglangs_window_trace_is_asked_into_the_run_and_moved_into_the_case(
        tmp_path):
    """Against a scripted server: the start names the run's server folder as output_dir
    (SGLang writes where the body says), the file the window wrote there under SGLang's
    name is moved into the case's torch/, and the reader and the report take it."""
    srv = hp.server_trace_dir(tmp_path / "run", "default")
    srv.mkdir(parents=True)
    case = "cases/t.py::test_a[default]~traced"
    prefix = hp.profile_prefix(case)
    with ScriptServer(_scripted_reply()) as s, cap.profile_window(
            tmp_path / "run", case, None, engine="sglang", base_url=s.url,
            torch_dir=srv) as meta:
        now = time.time_ns()
        write_gz(srv / sglang_name(prefix), torch_trace(
            BASE_NS, (us_from_base(now - 1_000), us_from_base(now)),
            [("step[EXTEND bs=1 toks=200]", "user_annotation", us_from_base(now - 500),
              1.0)]))
    body = json.loads(s.seen[0].body)
    assert (body["output_dir"], body["profile_prefix"]) == (str(srv), prefix)
    said = meta["engine_profiler"]
    assert "problem" not in said and said["files"] == [f"torch/{sglang_name(prefix)}"]
    assert list(srv.iterdir()) == []
    got = ep.read_capture(cap.engine_dir(tmp_path / "run", case))
    (t,) = got.torch
    assert t.problem == "" and t.ops == 1 and t.outside == 0
    line = got.line(tmp_path / "run")
    assert "(sglang): started and stopped over the window; yes: its files moved into torch/" \
        in line and f"`torch/{sglang_name(prefix)}`: 1 ops on the timeline" in line


def test_an_sglang_stop_that_leaves_no_trace_names_sglangs_file_name(tmp_path):
    srv = tmp_path / "srv"
    srv.mkdir()
    (srv / "c1_rank0.1.pt.trace.json.gz").write_bytes(b"a vLLM name: not SGLang's")
    with ScriptServer(_scripted_reply()) as s, cap.profile_window(
            tmp_path / "run", "c1", None, engine="sglang", base_url=s.url,
            torch_dir=srv) as meta:
        (srv / "c1.trace.json.gz").write_bytes(b"no '-' after the prefix: another case's")
    assert meta["engine_profiler"]["problem"] == (
        f"the server answered /stop_profile but wrote no trace named c1-*-TP-*.trace.json.gz "
        f"into {srv}")


def test_an_attached_sglang_is_said_to_write_where_its_own_setting_says(tmp_path):
    with ScriptServer(_scripted_reply()) as s, cap.profile_window(
            tmp_path / "run", "c1", None, engine="sglang", base_url=s.url) as meta:
        pass
    said = meta["engine_profiler"]
    assert "output_dir" not in json.loads(s.seen[0].body) and "problem" not in said
    assert said["started"] == ("yes: its files are written where the server's "
                               "SGLANG_TORCH_PROFILER_DIR says (/tmp without it), on the "
                               "server's host")


def test_the_timeline_takes_an_sglang_trace_by_its_name(tmp_path):
    run, s0, e1 = _one_case_run(tmp_path)
    a = s0 + 30_000_000
    tr = torch_trace(BASE_NS, (us_from_base(s0 + 4_000_000), us_from_base(e1 - 100_000_000)),
                     [("step[EXTEND bs=1 toks=128]", "user_annotation", us_from_base(a),
                       25_000.0)])
    name = sglang_name("c1")
    _case_capture(run, "c1", {name: gzip.compress(json.dumps(tr).encode())},
                  {"engine": "sglang", "start_wall_ns": [s0, s0 + 8_000_000],
                   "stop_wall_ns": [e1 - 200_000_000, e1]})
    written = te.write_all(analyze_run(run), run)
    assert written.problem == ""
    trace = json.loads((run / "timeline" / written.cases["c1"][0]).read_text())
    pre = [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    assert [e["ts"] for e in pre] == [(a - trace["metadata"]["origin_wall_ns"]) / 1000]
    (eng,) = trace["metadata"]["engine_traces"]
    assert name in eng["name"] and eng["error_us"] == 4_000.0


@pytest.mark.parametrize("kw", [{"engine_profile": ("d",)}, {"escalate": ("auto",)}, {}])
def test_a_launched_sglang_gets_its_folder_and_no_flag(tmp_path, kw):
    cfg = _config(tmp_path, packaged_profiles()["sglang-cpu"], **kw)
    dep = Deployment(cfg, tmp_path / "run", recorder=None, fleet=None,
                     add_reason=lambda *a: None)
    conf = cfg.profile.server.configs[0]
    argv = dep.launch_spec(conf.config_id, "default").argv
    assert "--profiler-config" not in argv and len(argv) == len(conf.argv)
    assert hp.server_trace_dir(tmp_path / "run", "default").is_dir() is bool(kw)


def test_a_containerised_vllm_mounts_the_flags_folder_at_the_same_path(tmp_path):
    """The flag's folder is the run's: mounted read-write at its own absolute path, it is
    the same folder for the server in the container and for the collector outside."""
    profile = ROOT / "fixtures" / "profiles" / "vllm-1gpu-docker.toml"
    cfg = _config(tmp_path, profile, engine_profile=("d",))
    dep = Deployment(cfg, tmp_path / "run", recorder=None, fleet=None,
                     add_reason=lambda *a: None)
    spec = dep.launch_spec(cfg.profile.server.configs[0].config_id, "default")
    argv = list(spec.argv)
    assert spec.container is not None and argv[:2] == ["docker", "run"]
    where = str(hp.server_trace_dir(tmp_path / "run", "default"))
    image = argv.index("vllm/vllm-openai:v0.11.0")
    mounts = [argv[i + 1] for i in range(image) if argv[i] == "-v"]
    assert mounts == [f"{Path.home()}/.cache/huggingface:/root/.cache/huggingface",
                      f"{where}:{where}:rw"]
    conf = json.loads(argv[argv.index("--profiler-config") + 1])
    assert argv.index("--profiler-config") > image and conf["torch_profiler_dir"] == where


def test_a_run_folder_a_container_cannot_mount_is_refused_in_words(tmp_path):
    profile = ROOT / "fixtures" / "profiles" / "vllm-1gpu-docker.toml"
    cfg = _config(tmp_path, profile, engine_profile=("d",))
    dep = Deployment(cfg, tmp_path / "a:b", recorder=None, fleet=None,
                     add_reason=lambda *a: None)
    with pytest.raises(PreflightFailed, match="the run folder's path holds a ':'"):
        dep.launch_spec(cfg.profile.server.configs[0].config_id, "default")

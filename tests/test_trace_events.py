"""The run's timeline as a trace-event file (report/trace_events.py, docs/timeline.md).

Each check holds the file to what it is made from, read here straight from the raw
files (requests.jsonl, markers.csv, a node's sample CSV and the manifest's clock
offsets), not through the module's own readers: the format itself, the requests'
times, the samples' values, the markers. Then the size bound on a long run, the
report's line per case, a timeline that fails costing only itself, the command's plain
errors, the merge of an engine's own trace, and a recorded run (no timeline when it was
made) getting one.
"""

from __future__ import annotations

import csv
import errno
import itertools
import json
import math
import os
import tarfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from bundle_factory import CaseSpec, RunSpec, S, cpu_run, make_run

from strata_plugin.__main__ import main as strata_main
from strata_plugin.analysis import case_summary
from strata_plugin.analysis.case_summary import analyze_run
from strata_plugin.analysis.clocks import node_clocks
from strata_plugin.formats.windows import Marker, read_markers, write_markers
from strata_plugin.report import trace_events as te
from strata_plugin.report import write_report

HERE = Path(__file__).resolve().parent

# --- the format, checked on its own terms -------------------------------------------------

#: The keys each phase must carry (Trace Event Format: "X" complete, "i" instant, "C"
#: counter, "M" metadata).
REQUIRED = {"X": ("name", "pid", "tid", "ts", "dur"), "i": ("name", "pid", "tid", "ts", "s"),
            "C": ("name", "pid", "ts", "args"), "M": ("name", "pid", "args")}
METADATA_NAMES = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def _num(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def format_problems(trace: dict) -> list[str]:
    """What makes ``trace`` not a valid trace-event JSON object, or not one both viewers
    draw as meant: [] when it is."""
    out: list[str] = []
    if set(trace) < {"traceEvents"} or not isinstance(trace.get("traceEvents"), list):
        return ["no traceEvents list"]
    if trace.get("displayTimeUnit") not in ("ms", "ns"):
        out.append(f"displayTimeUnit {trace.get('displayTimeUnit')!r}")
    procs, threads = set(), set()
    used_p, used_t = set(), set()
    slices: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    open_b: dict[tuple[int, int], int] = defaultdict(int)
    for n, e in enumerate(trace["traceEvents"]):
        ph = e.get("ph")
        if ph not in REQUIRED and ph not in ("B", "E"):
            out.append(f"{n}: phase {ph!r}")
            continue
        for k in REQUIRED.get(ph, ("pid", "tid", "ts")):
            if k not in e:
                out.append(f"{n}: {ph} without {k}")
        if not isinstance(e.get("pid"), int) or ("tid" in e and not isinstance(e["tid"], int)):
            out.append(f"{n}: pid/tid not integers: {e.get('pid')!r} {e.get('tid')!r}")
        if ph == "M":
            if e["name"] not in METADATA_NAMES:
                out.append(f"{n}: metadata {e['name']!r}")
            if e["name"] == "process_name":
                procs.add(e["pid"])
            if e["name"] == "thread_name":
                threads.add((e["pid"], e["tid"]))
            continue
        if not _num(e.get("ts")):
            out.append(f"{n}: ts {e.get('ts')!r}")
            continue
        used_p.add(e["pid"])
        if ph == "X":
            if not _num(e.get("dur")) or e["dur"] < 0:
                out.append(f"{n}: dur {e.get('dur')!r}")
                continue
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
        if ph in ("X", "i", "B", "E"):
            used_t.add((e["pid"], e["tid"]))
        if ph == "i" and e["s"] not in ("t", "p", "g"):
            out.append(f"{n}: instant scope {e['s']!r}")
        if ph == "C" and not (e["args"] and all(_num(v) for v in e["args"].values())):
            out.append(f"{n}: counter args {e['args']!r}")
        if ph == "B":
            open_b[(e["pid"], e["tid"])] += 1
        if ph == "E":
            open_b[(e["pid"], e["tid"])] -= 1
            if open_b[(e["pid"], e["tid"])] < 0:
                out.append(f"{n}: E without B")
    out += [f"B/E unbalanced on {k}" for k, v in open_b.items() if v]
    out += [f"process {p} has no name" for p in sorted(used_p - procs)]
    out += [f"thread {t} has no name" for t in sorted(used_t - threads)]
    # slices on one thread nest or follow each other: a partial overlap is drawn wrong
    for key, xs in slices.items():
        stack: list[tuple[float, float, str]] = []
        for a, b, name in sorted(xs, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1][1] <= a + 1e-3:
                stack.pop()
            if stack and b > stack[-1][1] + 1e-3:
                out.append(f"{key}: {name} [{a}, {b}] overlaps {stack[-1][2]} "
                           f"[{stack[-1][0]}, {stack[-1][1]}] without nesting")
                break
            stack.append((a, b, name))
    return out


def frozen_run(root: Path, **kw) -> Path:
    """A fabricated run with the runstate collector and a case whose server is frozen
    part of the time (its decode stalls), besides an idle and a CPU-bound case; two
    injections that overlap in the CPU-bound case (events markers)."""
    cases = [
        CaseSpec("light", behaviour=dict(server_cores=0.6)),
        CaseSpec("cpu_bound", concurrency=4, n_requests=8,
                 behaviour=dict(server_cores=3.9, running=4, waiting=2)),
        CaseSpec("frozen", osl=64, n_requests=4,
                 behaviour=dict(server_cores=1.0, frozen_frac=0.3)),
    ]
    kw.setdefault("runstate_s", 0.02)
    kw.setdefault("nodes", 2)
    run = make_run(root, RunSpec(cases=cases, **kw))
    markers = read_markers(run / "markers.csv")
    m = next(m for m in markers if m.kind == "measured" and m.case_id == "cpu_bound")
    s = m.start_wall_ns
    markers += [Marker("event", "inject:prefill", "cpu_bound", s + S, s + 3 * S),
                Marker("event", "inject:cpu_hog", "cpu_bound", s + 2 * S, s + 4 * S)]
    write_markers(run / "markers.csv", markers)
    return run


@pytest.fixture(scope="module")
def fabricated(tmp_path_factory) -> tuple[Path, dict]:
    run = frozen_run(tmp_path_factory.mktemp("tl"))
    written = te.write_all(analyze_run(run), run)
    assert written.problem == ""
    return run, json.loads((run / "timeline" / "run.json").read_text())


def _origin(run: Path) -> int:
    with (run / "markers.csv").open() as fh:
        return next(int(r["start_wall_ns"]) for r in csv.DictReader(fh) if r["kind"] == "run")


def _us(ns: int) -> float:
    return ns / 1000.0


def test_the_file_holds_the_trace_event_format(fabricated):
    run, trace = fabricated
    assert format_problems(trace) == []
    assert json.loads(json.dumps(trace, allow_nan=False)) == trace
    kinds = {e["ph"] for e in trace["traceEvents"]}
    assert kinds == {"X", "i", "C", "M"}
    meta = trace["metadata"]
    assert meta["origin_wall_ns"] == _origin(run)
    assert "microseconds from origin_wall_ns" in meta["clock"]
    for f in sorted((run / "timeline").glob("*.json")):
        assert format_problems(json.loads(f.read_text())) == [], f.name


def test_the_checker_finds_what_it_checks():
    """The format check above fails on each fault it looks for: without this, a check
    that passes everything would pass the timeline too."""
    ok = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "p"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "t"}},
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0.0, "dur": 10.0},
        {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 2.0, "dur": 8.0},
    ], "displayTimeUnit": "ms"}
    assert format_problems(ok) == []
    bad = json.loads(json.dumps(ok))
    bad["traceEvents"][3]["dur"] = 8.5  # ends past its parent: not nested
    assert "without nesting" in format_problems(bad)[0]
    bad = json.loads(json.dumps(ok))
    bad["traceEvents"][2]["tid"] = 2  # a thread without a name
    assert format_problems(bad) == ["thread (1, 2) has no name"]
    bad = json.loads(json.dumps(ok))
    del bad["traceEvents"][3]["dur"]
    assert format_problems(bad) == ["3: X without dur", "3: dur None"]
    bad = json.loads(json.dumps(ok))
    bad["traceEvents"].append({"ph": "B", "name": "c", "pid": 1, "tid": 1, "ts": 20.0})
    assert format_problems(bad) == ["B/E unbalanced on (1, 1)"]


def test_every_request_slice_equals_its_records_times(fabricated):
    run, trace = fabricated
    origin = _origin(run)
    anchor = json.loads((run / "manifest.json").read_text())["clock_anchor"]
    shift = anchor["wall_ns"] - anchor["mono_ns"]
    slices = {e["args"]["request_id"]: e for e in trace["traceEvents"]
              if e["ph"] == "X" and e["pid"] == te.CLIENT_PID and e.get("cat") == "request"
              and e["name"] != "TTFT"}
    ttft = {(e["tid"], e["ts"]): e for e in trace["traceEvents"]
            if e["ph"] == "X" and e["pid"] == te.CLIENT_PID and e["name"] == "TTFT"}
    tokens = {(e["tid"], e["ts"]) for e in trace["traceEvents"]
              if e["ph"] == "i" and e["pid"] == te.CLIENT_PID}
    recs = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    assert len(slices) == len(recs) == 20
    for r in recs:
        e = slices[r["request_id"]]
        start = r["dispatched_ns"] + shift - origin
        end = max(r["done_ns"], *(x["t_ns"] for x in r["events"])) + shift - origin
        assert e["ts"] == pytest.approx(_us(start), abs=1e-3), r["request_id"]
        assert e["dur"] == pytest.approx(_us(end - start), abs=2e-3), r["request_id"]
        first = min(x["t_ns"] for x in r["events"] if x["n_tokens"] > 0) + shift - origin
        t = ttft[(e["tid"], e["ts"])]
        assert t["dur"] == pytest.approx(_us(first - start), abs=2e-3)
        for x in r["events"]:  # every token's arrival, at its time, on its stream
            assert (e["tid"], round(_us(x["t_ns"] + shift - origin), 3)) in tokens
    # streams: no two requests on one lane overlap, and there are no more lanes than
    # the most requests in flight at once (the C=4 case's four, or more where the frozen
    # case's requests outlast their slots)
    by_lane = defaultdict(list)
    for e in slices.values():
        by_lane[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for xs in by_lane.values():
        xs.sort()
        assert all(b[0] >= a[1] for a, b in itertools.pairwise(xs))
    edges = sorted([(a, 1) for xs in by_lane.values() for a, _ in xs]
                   + [(b, -1) for xs in by_lane.values() for _, b in xs])
    most = max(np.cumsum([d for _, d in edges]))
    assert len(by_lane) == most >= 4


def _raw_series(run: Path, node: str, source: str, metric: str, device: str = ""
                ) -> tuple[np.ndarray, np.ndarray, str]:
    """A series as the agent wrote it, moved to the harness clock by the manifest's
    offsets: (harness ns, values, kind)."""
    rows = []
    with (run / "nodes" / node / "samples" / f"{source}.csv").open() as fh:
        for r in csv.DictReader(fh):
            if r["metric"] == metric and r["device"] == device:
                rows.append((int(r["wall_ns"]), float(r["value"]), r["kind"]))
    clock = node_clocks(json.loads((run / "manifest.json").read_text()))[node]
    t = clock.to_harness(np.array([x[0] for x in rows], np.int64))
    return t, np.array([x[1] for x in rows]), rows[0][2]


def _track(trace: dict, node: str, name: str) -> list[tuple[float, float]]:
    pid = next(e["pid"] for e in trace["traceEvents"] if e["ph"] == "M"
               and e["name"] == "process_name" and e["args"]["name"] == f"node {node}")
    return [(e["ts"], next(iter(e["args"].values()))) for e in trace["traceEvents"]
            if e["ph"] == "C" and e["pid"] == pid and e["name"] == name]


def test_counter_values_equal_the_samples(fabricated):
    """A gauge's points are its samples (less a repeat of the one before); a counter's
    are its rate between two samples. On node1, whose clock is 3 ms behind and drifts:
    the points sit at the harness times, not the node's."""
    run, trace = fabricated
    origin = _origin(run)
    t, v, kind = _raw_series(run, "node1", "mem", "mem_available_bytes")
    assert kind == "gauge"
    keep = np.r_[True, v[1:] != v[:-1]]
    want = [(round(_us(int(a) - origin), 3), float(b)) for a, b in zip(t[keep], v[keep],
                                                                        strict=True)]
    assert _track(trace, "node1", "mem.mem_available_bytes") == want
    t, v, kind = _raw_series(run, "node0", "cpu", "busy_s")
    assert kind == "counter"
    rate = np.diff(v) / (np.diff(t) / 1e9)
    got = _track(trace, "node0", "cpu.busy_s")
    keep = np.r_[True, rate[1:] != rate[:-1]]
    assert [x for x, _ in got] == [round(_us(int(a) - origin), 3) for a in t[:-1][keep]]
    assert np.allclose([y for _, y in got], rate[keep], rtol=1e-9)
    # every sampled series of every node has its track
    names = {(e["pid"], e["name"]) for e in trace["traceEvents"] if e["ph"] == "C"}
    for node in ("node0", "node1"):
        for f in (run / "nodes" / node / "samples").glob("*.csv"):
            with f.open() as fh:
                metrics = {(r["device"], r["metric"]) for r in csv.DictReader(fh)}
            assert len(metrics) <= len([1 for _, n in names if n.startswith(f.stem + ".")])


def test_markers_equal_markers_csv(fabricated):
    run, trace = fabricated
    origin = _origin(run)
    got = {(e["args"]["kind"], e["args"]["name"], e["ts"], e["dur"])
           for e in trace["traceEvents"] if e["ph"] == "X" and e.get("cat") == "marker"}
    with (run / "markers.csv").open() as fh:
        want = {(r["kind"], r["name"], round(_us(int(r["start_wall_ns"]) - origin), 3),
                 round(_us(int(r["end_wall_ns"]) - int(r["start_wall_ns"])), 3))
                for r in csv.DictReader(fh) if r["kind"] != "request"}
    assert got == want
    assert {k for k, *_ in want} == {"run", "baseline", "cooldown", "case", "warmup",
                                     "measured", "event"}
    # the two injections overlap: each on a lane of its own, so neither hides the other
    lanes = {e["name"]: e["tid"] for e in trace["traceEvents"] if e.get("cat") == "marker"
             and e["args"]["kind"] == "event"}
    assert lanes == {"inject:prefill": te.EVENTS_TID, "inject:cpu_hog": te.EVENTS_TID + 1}


def test_the_ledger_verdicts_and_run_state_are_on_the_same_clock(fabricated):
    _, trace = fabricated
    ev = trace["traceEvents"]
    client = {e["args"]["request_id"]: e for e in ev if e["ph"] == "X"
              and e["pid"] == te.CLIENT_PID and e.get("cat") == "request" and e["name"] != "TTFT"}
    ledger_ttft = [e for e in ev if e["pid"] == te.LEDGER_PID and e["name"] == "TTFT"]
    assert len(ledger_ttft) == sum(1 for k in client if "/measured/" in k)
    for e in ledger_ttft:  # the ledger's TTFT starts at its request's dispatch
        c = client[e["args"]["request_id"]]
        assert (e["ts"], e["tid"]) == (c["ts"], c["tid"])
    stalls = [e for e in ev if e["pid"] == te.LEDGER_PID and e["name"].startswith("stall: ")]
    assert stalls and {e["name"] for e in stalls} >= {"stall: stalled"}
    verdicts = {e["args"]["case_id"]: e for e in ev if e.get("cat") == "verdict"}
    assert set(verdicts) == {"light", "cpu_bound", "frozen"}
    measured = {e["args"]["case_id"]: e for e in ev if e.get("cat") == "marker"
                and e["args"]["kind"] == "measured"}
    for cid, e in verdicts.items():  # over the case's window, with its evidence
        assert (e["ts"], e["dur"]) == (measured[cid]["ts"], measured[cid]["dur"])
        assert e["args"]["evidence"] and e["name"] == f"verdict: {e['args']['summary']}"
    assert verdicts["cpu_bound"]["args"]["summary"].startswith("cpu_compute")
    states = [e for e in ev if e.get("cat") == "runstate"]
    frozen = measured["frozen"]
    inside = [e for e in states if e["args"]["case_id"] == "frozen"]
    assert {e["name"] for e in inside} >= {"stalled", "running"}
    assert min(e["ts"] for e in inside) <= frozen["ts"] + 20_000  # within a grid step
    for e in states:  # each case's states on its own window only: cases never share one
        w = measured[e["args"]["case_id"]]
        assert w["ts"] <= e["ts"] and e["ts"] + e["dur"] <= w["ts"] + w["dur"] + 1e-3
    assert trace["metadata"]["verdicts"]["frozen"] == verdicts["frozen"]["args"]


# --- the size bound ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [te.MAX_POINTS_PER_SERIES, te.MAX_POINTS_PER_SERIES + 1])
def test_downsampling_starts_just_past_the_bound_and_keeps_the_peaks(n):
    v = np.sin(np.arange(n) / 7.0)
    v[n // 3] = 5.0
    v[2 * n // 3] = -5.0
    idx = te.downsample_index(v, te.MAX_POINTS_PER_SERIES)
    if n <= te.MAX_POINTS_PER_SERIES:
        assert idx == list(range(n))
    else:
        assert len(idx) <= te.MAX_POINTS_PER_SERIES and idx == sorted(set(idx))
        assert {n // 3, 2 * n // 3} <= set(idx)


def test_the_size_bound_holds_on_a_long_run(tmp_path, monkeypatch):
    """A 10-minute case sampled every 0.5 s: over MAX_POINTS_PER_SERIES points a series.
    Every track of the whole run's file is within it, its peak kept, and the metadata
    names what was cut; the case's own file, the same. Token instants are within their
    bound too (lowered here, so the bound is passed)."""
    monkeypatch.setattr(te, "MAX_TOKEN_INSTANTS", 150)
    spec = CaseSpec("long", osl=64, n_requests=8, duration_s=600.0,
                    behaviour=dict(server_cores=1.5))
    run = make_run(tmp_path, RunSpec(cases=[spec], interval_s=0.5, baseline_s=1.0,
                                     cooldown_s=1.0))
    assert te.write_all(analyze_run(run), run).problem == ""
    for name in ("run.json", "case-long.json"):
        trace = json.loads((run / "timeline" / name).read_text())
        assert format_problems(trace) == []
        per = defaultdict(list)
        for e in trace["traceEvents"]:
            if e["ph"] == "C":
                per[(e["pid"], e["name"])].append(e["args"])
        assert max(len(x) for x in per.values()) <= te.MAX_POINTS_PER_SERIES
        cut = {d["series"]: d for d in trace["metadata"]["downsampled"]}
        assert "cpu.busy_s" in cut and cut["cpu.busy_s"]["of"] > te.MAX_POINTS_PER_SERIES
        assert cut["cpu.busy_s"]["kept"] == len(per[(te.NODE_PID0, "cpu.busy_s")])
        t, v, _ = _raw_series(run, "node0", "cpu", "busy_s")
        rate = np.diff(v) / (np.diff(t) / 1e9)
        got = [a["per_s"] for a in per[(te.NODE_PID0, "cpu.busy_s")]]
        assert max(got) == pytest.approx(rate.max()) and min(got) == pytest.approx(rate.min())
        tokens = sum(1 for e in trace["traceEvents"] if e["ph"] == "i")
        assert 0 < tokens <= 150
        assert any(n.startswith(f"token arrivals: {tokens} of 512") for n in
                   trace["metadata"]["notes"])


# --- the report, and a timeline that fails ------------------------------------------------


def test_each_case_in_report_md_names_its_slice(fabricated, tmp_path):
    run = frozen_run(tmp_path)
    text = write_report(run, plots=False).read_text()
    origin = _origin(run)
    for cid in ("light", "cpu_bound", "frozen"):
        line = next(x for x in text.splitlines() if f"`timeline/case-{cid}.json`" in x)
        a, b = (float(x) for x in line.split("`, ")[1].split(" s of")[0].split(" s to "))
        trace = json.loads((run / "timeline" / f"case-{cid}.json").read_text())
        assert trace["metadata"]["span_us"] == pytest.approx([a * 1e6, b * 1e6], abs=1e3)
        with (run / "markers.csv").open() as fh:  # the case's span, a second either side
            marks = [r for r in csv.DictReader(fh) if r["case_id"] == cid
                     and r["kind"] == "case"]
        assert a == pytest.approx((int(marks[0]["start_wall_ns"]) - origin) / 1e9 - 1, abs=1e-3)
        assert b == pytest.approx((int(marks[0]["end_wall_ns"]) - origin) / 1e9 + 1, abs=1e-3)


def test_a_timeline_that_fails_costs_only_itself(tmp_path, monkeypatch):
    run = cpu_run(tmp_path)

    def broken(ra, out):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(te, "_write_all", broken)
    text = write_report(run, plots=False).read_text()
    assert "timeline not written: PermissionError: [Errno 13] Permission denied" in text
    assert text.count("Trace not written: PermissionError") == 4  # each case says it
    assert "#### Verdict" in text and (run / "summary.json").exists()


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_full_disk_under_the_timeline_fails_the_report(tmp_path, monkeypatch, err):
    """No room is the run's failure, not the timeline's: every later file would fail too."""
    run = cpu_run(tmp_path)

    def full(ra, out):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(te, "_write_all", full)
    with pytest.raises(OSError) as got:
        write_report(run, plots=False)
    assert got.value.errno == err


def test_an_old_run_without_a_clock_anchor_gets_a_timeline(tmp_path):
    """A run folder from before the clock anchor: its requests are placed by their
    request markers, at the markers' times."""
    run = cpu_run(tmp_path)
    m = json.loads((run / "manifest.json").read_text())
    del m["clock_anchor"]
    (run / "manifest.json").write_text(json.dumps(m))
    assert te.write_all(analyze_run(run), run).problem == ""
    trace = json.loads((run / "timeline" / "run.json").read_text())
    assert format_problems(trace) == []
    origin = _origin(run)
    with (run / "markers.csv").open() as fh:
        want = {r["name"]: round(_us(int(r["start_wall_ns"]) - origin), 3)
                for r in csv.DictReader(fh) if r["kind"] == "request"}
    got = {e["args"]["request_id"]: e["ts"] for e in trace["traceEvents"]
           if e.get("cat") == "request" and e["name"] != "TTFT"}
    assert got == want
    assert "no clock anchor" in " ".join(trace["metadata"]["notes"])


# --- the command ---------------------------------------------------------------------------


@pytest.fixture()
def no_analysis(monkeypatch):
    """The command's errors come before any analysis: analysing fails the test."""
    def refuse(*a, **k):
        raise AssertionError("analysed the run before checking the arguments")

    monkeypatch.setattr(case_summary, "analyze_run", refuse)


def test_the_command_says_plainly_there_is_no_run_folder(tmp_path, capsys, no_analysis):
    assert strata_main(["timeline", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'nope'} is not a run folder "
                                       "(no manifest.json)\n")


def test_the_command_names_an_unknown_case_and_the_cases_there(tmp_path, capsys, no_analysis):
    run = cpu_run(tmp_path)
    assert strata_main(["timeline", str(run), "--case", "nope"]) == 2
    assert capsys.readouterr().err == (f"error: no case 'nope' in {run.name}; its cases: "
                                       "ab_control, ab_treatment, cpu_bound, light\n")
    assert strata_main(["timeline", str(run), "--case", "ab_"]) == 2
    assert "names 2 cases" in capsys.readouterr().err
    assert strata_main(["timeline", str(run), "--case", "light", "--request", "99"]) == 2
    assert capsys.readouterr().err.startswith("error: no request '99' in case 'light'")
    assert strata_main(["timeline", str(run), "--request", "3"]) == 2
    assert "(a number needs --case)" in capsys.readouterr().err
    assert not (run / "timeline").exists()


def test_the_command_writes_one_case_or_one_request(tmp_path, capsys):
    run = cpu_run(tmp_path)
    assert strata_main(["timeline", str(run), "--case", "cpu_b"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path == run / "timeline" / "case-cpu_bound.json"
    case = json.loads(path.read_text())
    assert format_problems(case) == [] and case["metadata"]["scope"] == "case cpu_bound"
    ids = {e["args"]["case_id"] for e in case["traceEvents"] if e.get("cat") == "request"
           and e["name"] != "TTFT"}
    assert ids == {"cpu_bound"}
    out = tmp_path / "one.json"
    assert strata_main(["timeline", str(run), "--case", "light", "--request", "3",
                        "-o", str(out)]) == 0
    one = json.loads(out.read_text())
    assert format_problems(one) == []
    reqs = {e["args"].get("request_id") for e in one["traceEvents"]
            if e["pid"] in (te.CLIENT_PID, te.LEDGER_PID) and e["ph"] == "X"}
    assert reqs <= {"light/measured/3", None} and "light/measured/3" in reqs
    assert any(e["ph"] == "C" for e in one["traceEvents"])  # the host around it
    # the markers and verdicts cut to the request's span (a viewer opens on what the
    # slices cover): the run's marker, whole, would open it zoomed out to the whole run
    marks = [e for e in one["traceEvents"] if e.get("cat") in ("marker", "verdict")]
    lo = min(e["ts"] for e in one["traceEvents"] if e.get("cat") == "request")
    hi = max(e["ts"] + e["dur"] for e in one["traceEvents"] if e.get("cat") == "request")
    margin = max((hi - lo) / 10, 100_000.0) + 1.0  # request_scope's margin, in us
    assert marks and all(lo - margin <= e["ts"] and e["ts"] + e["dur"] <= hi + margin
                         for e in marks), marks
    # and the counters: the value held at the span's start placed there, none outside
    counts = [e["ts"] for e in one["traceEvents"] if e["ph"] == "C"]
    assert lo - margin <= min(counts) and max(counts) <= hi + margin, (min(counts), max(counts))
    run_mark = next(e for e in marks if e["args"].get("kind") == "run")
    whole = run_mark["args"]["whole_span_ms"]
    assert (whole[1] - whole[0]) * 1000 > 10 * run_mark["dur"]  # the run, far longer


# --- an engine's own trace ----------------------------------------------------------------


def test_an_engine_trace_is_merged_on_the_runs_clock(fabricated):
    run, _ = fabricated
    ra = analyze_run(run)
    torch_like = (
        {"ph": "M", "name": "process_name", "pid": 4242, "args": {"name": "python"}},
        {"ph": "X", "name": "aten::mm", "pid": 4242, "tid": 7, "ts": 1000.0, "dur": 250.0,
         "cat": "cpu_op"},
        {"ph": "X", "name": "gpu_kernel", "pid": 0, "tid": 3, "ts": 1100.0, "dur": 50.0},
        {"ph": "M", "name": "thread_name", "pid": 4242, "tid": 7, "args": {"name": "main"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 3, "args": {"name": "stream 7"}},
    )
    eng = te.EngineTrace("vllm torch profiler", torch_like, offset_us=5_000_000.0,
                         method="test", error_us=120.0)
    trace = te.build(ra, engine=[eng])
    assert format_problems(trace) == []
    mm = next(e for e in trace["traceEvents"] if e["name"] == "aten::mm")
    assert (mm["ts"], mm["dur"], mm["pid"]) == (5_001_000.0, 250.0, te.ENGINE_PID0)
    kernel = next(e for e in trace["traceEvents"] if e["name"] == "gpu_kernel")
    assert kernel["pid"] == te.ENGINE_PID0 + 1 and kernel["ts"] == 5_001_100.0
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names[te.ENGINE_PID0] == "vllm torch profiler: python"
    assert names[te.ENGINE_PID0 + 1] == "vllm torch profiler"
    assert trace["metadata"]["engine_traces"] == [
        {"name": "vllm torch profiler", "offset_us": 5_000_000.0, "method": "test",
         "error_us": 120.0, "events": 6}]
    with pytest.raises(te.TimelineError, match="event 1 has a ts that is not a number"):
        te.engine_events(te.EngineTrace("x", ({"ph": "M", "name": "n", "pid": 1},
                                              {"ph": "X", "ts": "soon"}), 0.0))
    with pytest.raises(te.TimelineError, match="event 0 is not a trace event"):
        te.engine_events(te.EngineTrace("x", ([1, 2],), 0.0))  # type: ignore[arg-type]


# --- a recorded run ------------------------------------------------------------------------


@pytest.mark.integration
def test_a_recorded_run_gets_a_timeline_per_case(tmp_path):
    """The recorded smoke run (tests/data/runs, made before timelines existed): the
    whole run's file holds the format, every request, and each case's file its own."""
    with tarfile.open(HERE / "data" / "runs" / "smoke.tar.xz") as t:
        t.extractall(tmp_path, filter="data")
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert not (run / "timeline").exists()
    ra = analyze_run(run)
    written = te.write_all(ra, run)
    assert written.problem == ""
    trace = json.loads((run / "timeline" / "run.json").read_text())
    assert format_problems(trace) == []
    n_records = sum(1 for _ in (run / "requests.jsonl").open())
    assert sum(1 for e in trace["traceEvents"] if e.get("cat") == "request"
               and e["name"] != "TTFT") == n_records
    windows = [a.case_id for a in ra.analyses if a.window is not None]
    assert sorted(written.cases) == sorted(windows) and len(windows) > 10
    for name, _, _ in written.cases.values():
        assert format_problems(json.loads((run / "timeline" / name).read_text())) == []


def test_a_requests_file_cuts_the_injections_around_it_to_its_span(tmp_path):
    """The events markers (injections) that reach beyond a request's file are cut to its
    span as the other markers are, their whole span said: a fault injected over the whole
    case would otherwise open the request's file zoomed out to it."""
    run = frozen_run(tmp_path)
    ra = analyze_run(run)
    events = [m for m in ra.bundle.markers if m.kind == "event"]
    scopes = [te.request_scope(ra.bundle, s.request_id)
              for s in te.request_spans(ra.bundle)[0] if s.case_id == "cpu_bound"]
    req = next(c for c in scopes for m in events
               if c.overlaps(m.start_wall_ns, m.end_wall_ns)
               and c.clip(m.start_wall_ns, m.end_wall_ns) != (m.start_wall_ns, m.end_wall_ns))
    out = tmp_path / "one.json"
    assert req.request_id is not None
    assert strata_main(["timeline", str(run), "--request", req.request_id, "-o", str(out)]) == 0
    one = json.loads(out.read_text())
    lo, hi = one["metadata"]["span_us"]
    cut = [e for e in one["traceEvents"] if e.get("cat") == "marker"
           and e["args"].get("kind") == "event"]
    assert cut and all(lo - 0.002 <= e["ts"] and e["ts"] + e["dur"] <= hi + 0.002
                       for e in cut), (lo, hi, cut)
    assert any("whole_span_ms" in e["args"] for e in cut)

"""Trace readers on recorded trace text (tests/data/traces/, scripts/record_trace_fixtures.py).

The recordings are real captures on the 2-core development VM through run/tracing.py:
the embedded llama-server decoding for two client threads, alone (``sched-clean``: the
machine was shared, so other users' processes were on the CPUs too), with two CpuHogs
pinned to its cores (``sched-hogs``), and with PageOut evicting its private model copy
every 0.25 s (``block-pageout``).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from strata_plugin.analysis.rules import Verdict
from strata_plugin.analysis.traces import blockio, ftrace_text, sched, settle, sockets
from strata_plugin.analysis.traces.blockio import BlockReport, FileIO, Latency
from strata_plugin.analysis.traces.sched import SchedReport, ThreadSched

DATA = Path(__file__).parent / "data" / "traces"
HOG_PIDS = {"25716", "25717"}  # the CpuHogs of the sched-hogs recording (its trace names them)


def load(name: str) -> tuple[list[str], dict]:
    d = DATA / name
    with gzip.open(d / "trace.txt.gz", "rt") as fh:
        lines = fh.readlines()
    return lines, json.loads((d / "meta.json").read_text())


def test_a_trace_line_parses_with_and_without_the_tgid_column():
    a = ftrace_text.parse_line(
        "    llama-server-23311   (  23302) [001] d..2.  1616.896068: sched_switch: "
        "prev_comm=llama-server prev_pid=23311 prev_prio=120 prev_state=S ==> "
        "next_comm=llama server next_pid=23315 next_prio=120")
    b = ftrace_text.parse_line("  kworker/u4:2-123 [000] .....  12.000000001: block_rq_issue: x")
    assert a is not None and b is not None
    assert (a.tid, a.tgid, a.cpu, a.t_ns, a.event) == (23311, 23302, 1, 1616896068000,
                                                       "sched_switch")
    assert (b.comm, b.tid, b.tgid, b.t_ns) == ("kworker/u4:2", 123, None, 12000000001)
    assert ftrace_text.parse_line("# tracer: nop") is None


def test_sched_accounts_every_server_thread_second_in_the_window():
    lines, meta = load("sched-hogs")
    r = sched.read(lines, meta, tuple(meta["window_ns"]))
    busy = [t for t in r.threads if t.run_s + t.wait_s > 0.5]
    assert len(busy) == 2, r.table()  # -t 2: two compute threads
    for t in r.threads:  # each thread's states add up to the window (it existed throughout)
        total = t.run_s + t.wait_s + t.sleep_s + t.blocked_s
        assert total == pytest.approx(r.window_s, abs=0.01) or total < 0.01, t
    # the CPU time on the server's two CPUs adds up to two CPUs over the window
    assert sum(s for _, s in r.cpu_by_category) == pytest.approx(2 * r.window_s, rel=0.01)
    # the displacement is a split of the wait: it sums to the waiting time
    assert sum(s for _, s in r.displaced_by) == pytest.approx(r.wait_s, rel=0.02)


def test_sched_names_the_hogs_as_who_ran_while_the_server_waited():
    lines, meta = load("sched-hogs")
    r = sched.read(lines, meta, tuple(meta["window_ns"]))
    hogs = sum(s for k, s in r.displaced_top if k.split("(")[-1].rstrip(")") in HOG_PIDS)
    assert hogs >= 0.25 * r.wait_s, r.displaced_top
    assert r.displaced_share("other") > 0.5
    d = settle.decide_sched(r)
    assert d.decided == "cpu_contention", d.why
    assert "python (2571" in d.why


def test_sched_clips_to_the_window():
    lines, meta = load("sched-clean")
    w0, w1 = meta["window_ns"]
    half = sched.read(lines, meta, (w0, w0 + (w1 - w0) // 2))
    full = sched.read(lines, meta, (w0, w1))
    assert half.window_s == pytest.approx(full.window_s / 2, rel=1e-6)
    assert 0.3 * full.run_s < half.run_s < 0.7 * full.run_s


def test_block_attributes_the_paged_out_model_with_a_latency_distribution():
    lines, meta = load("block-pageout")
    r = blockio.read(lines, meta, tuple(meta["window_ns"]))
    top = r.top
    assert top is not None and top.path.endswith("model.gguf")
    assert top.read_in_bytes > 10e6  # 25 MB model, paged out every 0.25 s
    assert top.requests >= 10 and top.latency is not None
    assert 0 < top.latency.p50_ms <= top.latency.p99_ms <= top.latency.max_ms
    # requests placed in the model's extents carry (nearly) all the bytes read for it
    assert top.request_bytes >= 0.9 * top.read_in_bytes
    d = settle.decide_block(r)
    assert d.decided == "io_page_faults" and "model.gguf" in d.why


def test_block_without_extents_says_why_and_counts_the_requests_as_other():
    lines, meta = load("block-pageout")
    for f in meta["files"]:
        f["extents"], f["extents_error"] = [], "FIEMAP not supported here (test)"
    r = blockio.read(lines, meta, tuple(meta["window_ns"]))
    assert any("FIEMAP not supported" in n for n in r.notes)
    assert r.file(blockio.OTHER) is not None and r.file(blockio.OTHER).requests == r.reads


# --- the decisions at their thresholds ---------------------------------------------------------


def _sched(run: float, wait: float, displaced: dict[str, float], window: float = 1.0,
           cpus: int = 2) -> SchedReport:
    threads = tuple(ThreadSched(100 + i, "srv", run / cpus, wait / cpus, 0.0, 0.0, 1, 0)
                    for i in range(cpus))
    return SchedReport(window, tuple(range(cpus)), threads, tuple(displaced.items()), (),
                       (), 10)


@pytest.mark.parametrize("other,expect", [(0.49, "cpu_compute"), (0.51, "cpu_contention")])
def test_the_other_share_decides_between_compute_and_contention(other, expect):
    wait = 0.5  # well past runq_delay_per_cpu_s (0.1 s per s on CPU)
    r = _sched(1.0, wait, {"server": wait * (1 - other), "other": wait * other})
    assert settle.decide_sched(r).decided == expect


@pytest.mark.parametrize("wait,expect", [(0.099, None), (0.101, "cpu_contention")])
def test_the_wait_threshold_decides_whether_anyone_waited(wait, expect):
    r = _sched(1.0, wait, {"other": wait})  # 0.5 cores of 2: not busy enough for compute
    assert settle.decide_sched(r).decided == expect


@pytest.mark.parametrize("cores,expect", [(1.69, None), (1.71, "cpu_compute")])
def test_a_busy_server_that_does_not_wait_is_compute(cores, expect):
    r = _sched(cores, 0.0, {}, cpus=2)  # 0.85 x 2 usable CPUs = 1.7
    assert settle.decide_sched(r).decided == expect


@pytest.mark.parametrize("mb,expect", [(3.9, None), (4.1, "io_page_faults")])
def test_block_decision_at_the_read_bytes_threshold(mb, expect):
    f = FileIO("/m/model.gguf", 3, int(mb * 1e6), 4, int(mb * 1e6), Latency(4, 1, 2, 3, 3), ())
    assert settle.decide_block(BlockReport(1.0, (f,), 4, f.request_bytes, None, 0)).decided \
        == expect


def _verdict(classes, inconclusive=False, also=()) -> Verdict:
    return Verdict(classes=tuple(classes), evidence=(), confidence=0.4,
                   inconclusive=inconclusive, finer_trace=("sched",) if inconclusive else (),
                   missing_signals=(), also_flagged=tuple(also))


def test_an_inconclusive_cpu_pair_is_settled_by_the_sched_trace_and_says_so():
    before = _verdict(("cpu_compute", "cpu_contention"), inconclusive=True)
    r = _sched(1.0, 0.6, {"other": 0.5, "server": 0.1})
    s = settle.settle(before, (settle.decide_sched(r),), case_id="c")
    assert s.after.classes == ("cpu_contention",) and not s.after.inconclusive
    assert s.settled_by == ("sched",) and s.changed
    assert any(n.startswith("settled by the sched trace") for n in s.after.notes)
    assert any(e.metric == "trace_other_share_of_wait" and e.met for e in s.after.evidence)
    assert s.before is before


def test_a_pair_the_trace_does_not_cover_stays_inconclusive():
    before = _verdict(("cpu_compute", "io_page_faults"), inconclusive=True)
    s = settle.settle(before, (settle.decide_sched(_sched(1.9, 0.0, {})),))
    assert s.after.inconclusive and s.after.classes[0] == "cpu_compute"
    assert "not settled by the trace" in s.after.notes


def test_a_trace_that_finds_no_disk_reads_removes_io_page_faults():
    before = _verdict(("cpu_compute", "io_page_faults"), inconclusive=True)
    nothing = BlockReport(1.0, (), 0, 0, None, 0)
    s = settle.settle(before, (settle.decide_sched(_sched(1.9, 0.0, {})),
                               settle.decide_block(nothing)))
    assert s.after.classes == ("cpu_compute",) and not s.after.inconclusive
    assert s.settled_by == ("sched", "block")


def test_needs_diagnosis_and_the_traces_a_verdict_asks_for():
    assert settle.needs_diagnosis(_verdict(("cpu_compute",), also=("cpu_contention",)))
    assert settle.needs_diagnosis(_verdict((), inconclusive=True))
    assert not settle.needs_diagnosis(_verdict(("cpu_compute", "queueing")))
    assert settle.traces_for(_verdict(("io_page_faults",))) == ("block", "sched")
    assert settle.traces_for(_verdict(("queueing",))) == ("sched", "block")


def test_trace_thresholds_live_in_the_one_table_with_sources():
    from strata_plugin.analysis.thresholds import THRESHOLDS

    by_name = {t.name: t for t in THRESHOLDS}
    for name in settle.TRACE_THRESHOLD_NAMES:
        assert by_name[name].source


def test_sockets_reads_the_samples_in_the_window():
    d = DATA / "net-loopback"  # two loopback streams, 150 x 4 KiB 10 ms apart, sampled /0.25 s
    meta = json.loads((d / "meta.json").read_text())
    lines = (d / "ss.txt").read_text().splitlines()
    r = sockets.read(lines, tuple(meta["window_ns"]))
    assert r.samples == 7 and r.connections == 4  # both ends of both connections
    assert r.retransmits == 0 and r.rtt_p50_ms is not None and r.rtt_p50_ms < 1.0
    assert settle.decide_net(r).decided is None
    w0, _ = meta["window_ns"]
    assert sockets.read(lines, (w0, w0 + 1)).samples == 0


def test_sockets_counts_retransmits_per_connection_once():
    # ss -ti's retrans:<in flight>/<total>: the total is cumulative per connection
    line = ("0 1200 10.0.0.1:8000 10.0.0.2:5000 cubic rtt:{rtt}/0.5 retrans:{a}/{b} "
            "lost:{b} unacked:1")
    text = ["# t_ns=10", line.format(rtt=0.4, a=1, b=2), "# t_ns=20",
            line.format(rtt=0.6, a=0, b=3)]
    r = sockets.read(text, (0, 1_000_000_000))
    assert (r.retransmits, r.lost, r.max_send_q, r.connections) == (3, 3, 1200, 1)
    assert r.retrans_per_s == 3.0
    assert settle.decide_net(r).decided == "network"


@pytest.mark.parametrize("rtt,expect", [(4.9, None), (5.1, "network")])
def test_net_decision_at_the_rtt_threshold(rtt, expect):
    r = sockets.SocketReport(10.0, 4, 2, rtt, rtt * 2, 0, 0, 0, 0)
    assert settle.decide_net(r).decided == expect

"""Trace replay: the committed sample traces read in each public format, exact shared
prefixes, arrival times kept against a scripted server, and the real llama-server
reporting cached tokens for shared blocks."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from strata_plugin import TraceWorkload, read_trace
from strata_plugin.formats.cases import CaseLine
from strata_plugin.load.case_runner import CaseRunner, CaseSetup
from strata_plugin.load.client import Timeouts
from strata_plugin.load.generator import CLIENT_LATENESS_P99_MS
from strata_plugin.load.trace import (
    TraceError,
    answer_tokens,
    conversation_prompts,
    trace_prompt,
)
from strata_plugin.load.workload import TokenSpace
from tests.sse_script_server import Reply, ScriptServer, Seen, sse

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
HOME = str(Path.home())  # pytester moves HOME; the embedded target's cache is under the real one
TRACES = ROOT / "tests" / "data" / "traces"
SPACE = TokenSpace(300, 1000)


def test_samples_are_what_the_generator_writes(tmp_path):
    """The committed files are the generator's output, byte for byte."""
    before = {p.name: p.read_bytes() for p in TRACES.glob("*_sample.*")}
    assert len(before) == 5
    copy = tmp_path / "traces"
    copy.mkdir()
    (copy / "make_sample_traces.py").write_text((TRACES / "make_sample_traces.py").read_text())
    subprocess.run([sys.executable, str(copy / "make_sample_traces.py")], check=True)
    assert {p.name: p.read_bytes() for p in copy.glob("*_sample.*")} == before


@pytest.mark.parametrize("name, fmt, n", [
    ("mooncake_sample.jsonl", "mooncake", 16),
    ("burstgpt_sample.csv", "burstgpt", 15),  # the failed request (0 response tokens) left out
    ("azure_sample.csv", "azure", 16),
    ("strata_sample.jsonl", "strata", 16),
    ("strata_conversations_sample.jsonl", "strata", 9),
])
def test_each_format_reads_in_seconds_from_the_first_request(name, fmt, n):
    t = read_trace(TRACES / name)
    assert t.fmt == fmt and len(t.requests) == n
    assert t.requests[0].t_s == 0.0
    assert all(a.t_s <= b.t_s for a, b in zip(t.requests, t.requests[1:]))
    assert 0.5 < t.duration_s < 15.0  # ms, s and date-times all became seconds
    assert all(q.isl >= 1 and q.osl >= 1 for q in t.requests)


def test_mooncake_units_and_blocks():
    t = read_trace(TRACES / "mooncake_sample.jsonl")
    first = json.loads((TRACES / "mooncake_sample.jsonl").read_text().splitlines()[1])
    assert t.requests[1].t_s == pytest.approx(first["timestamp"] / 1000)
    assert t.requests[1].blocks == tuple(str(i) for i in first["hash_ids"])
    assert t.requests[1].block_tokens == 512


def test_azure_timestamps_keep_sub_millisecond_order():
    t = read_trace(TRACES / "azure_sample.csv")
    rows = (TRACES / "azure_sample.csv").read_text().splitlines()[1:3]
    assert rows[0].startswith("2023-11-16 18:15:46.6805900")
    assert t.requests[1].t_s == pytest.approx(46.698932 - 46.68059, abs=1e-6)


def test_shared_blocks_share_exact_tokens_and_nothing_more():
    t = read_trace(TRACES / "mooncake_sample.jsonl")
    tw = TraceWorkload(t, length_scale=0.1)  # blocks of 51 tokens
    reqs = tw.requests
    a, b = reqs[0], reqs[1]  # hash ids [0, 1, 6] and [0, 1, 7, 8]
    pa, pb = trace_prompt(a, 0, SPACE, salt="s"), trace_prompt(b, 1, SPACE, salt="s")
    assert len(pa) == a.isl and len(pb) == b.isl
    assert a.block_tokens == 51
    assert pa[:102] == pb[:102]  # two shared blocks
    assert pa[102:153] != pb[102:153]  # the third block is each request's own
    other = trace_prompt(a, 0, SPACE, salt="another run")
    assert other[:102] != pa[:102]  # a new run's salt: a cold cache again


def test_strata_prefix_groups():
    tw = TraceWorkload(read_trace(TRACES / "strata_sample.jsonl"))
    groups = {}
    for i, q in enumerate(tw.requests):
        if q.blocks:
            groups.setdefault(q.blocks, []).append(trace_prompt(q, i, SPACE)[:128])
    assert sorted(groups) == [("group:a",), ("group:b",)]
    for heads in groups.values():
        assert len(set(heads)) == 1
    assert len({h[0] for h in groups.values()}) == 2


def test_bad_traces_are_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": "x", "output_length": 3}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:1: input_length='x' is not a number"):
        read_trace(bad)
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="unknown trace columns"):
        read_trace(other)
    with pytest.raises(ValueError, match="time_scale"):
        TraceWorkload(read_trace(TRACES / "azure_sample.csv"), time_scale=0)


def test_conversation_turns_carry_the_history_exactly():
    tw = TraceWorkload(read_trace(TRACES / "strata_conversations_sample.jsonl"))
    convs = tw.conversations()
    assert sorted(convs) == ["c0", "c1", "c2"] and all(len(v) == 3 for v in convs.values())
    prompts = conversation_prompts(tw, SPACE, salt="s")
    a, b, c = convs["c1"]
    qa, qb, qc = (tw.requests[i] for i in (a, b, c))
    assert len(prompts[a]) == qa.isl
    assert len(prompts[b]) == qa.isl + qa.osl + qb.isl
    assert len(prompts[c]) == qa.isl + qa.osl + qb.isl + qb.osl + qc.isl
    assert prompts[b][: qa.isl] == prompts[a]  # turn 2 starts with turn 1's prompt
    assert prompts[b][qa.isl: qa.isl + qa.osl] == answer_tokens(qa, a, SPACE, salt="s")
    assert prompts[c][: len(prompts[b])] == prompts[b]
    assert prompts[convs["c0"][1]][:10] != prompts[b][:10]  # conversations are separate


def test_later_turns_follow_the_previous_answer_and_think_time():
    tw = TraceWorkload(read_trace(TRACES / "strata_conversations_sample.jsonl"))
    with ScriptServer(llama_reply) as srv:
        setup = CaseSetup(srv.url, "llamacpp", "c", SPACE, Timeouts(read_s=10), salt="r")
        runner = CaseRunner(setup, record=lambda r: None, mark=lambda *a: None,
                            add_case=lambda line: None)
        r = runner.replay(tw, case_id="conv")
        seen = [s for s in srv.seen if s.method == "POST"]
    assert r.problems == () and r.metrics.n_ok == 9
    by_prompt = {tuple(s.json["prompt"]): s for s in seen}
    prompts = conversation_prompts(tw, SPACE, salt="r")
    for ids in tw.conversations().values():
        for prev, cur in pairwise(ids):
            before, after = by_prompt[prompts[prev]], by_prompt[prompts[cur]]
            gap_s = (after.received_ns - before.sent_ns[-1]) / 1e9
            assert 0.3 <= gap_s < 1.0, gap_s  # after the answer, plus think_s = 0.3


def llama_reply(seen: Seen) -> Reply:
    if seen.method == "GET":
        return Reply([(0.0, b"ok")], framing="length", content_type="text/plain")
    body = seen.json
    n = body["n_predict"]
    items = [(0.003, sse({"content": "a", "tokens": [400 + i], "stop": False}))
             for i in range(n)]
    items.append((0.001, sse({"content": "", "stop": True, "stop_type": "limit",
                              "tokens_evaluated": len(body["prompt"]), "tokens_predicted": n,
                              "timings": {"prompt_n": len(body["prompt"]), "prompt_ms": 1.0,
                                          "predicted_n": n, "predicted_ms": 2.0,
                                          "cache_n": 0}})))
    return Reply(items)


def _replay_once(tw: TraceWorkload, lines: list[CaseLine]) -> str:
    """One replay against the scripted server; "" when it kept the times, else why not."""
    with ScriptServer(llama_reply) as srv:
        setup = CaseSetup(srv.url, "llamacpp", "c", SPACE, Timeouts(read_s=10), salt="r")
        runner = CaseRunner(setup, record=lambda r: None, mark=lambda *a: None,
                            add_case=lines.append)
        r = runner.replay(tw, case_id="trace")
        posts = sorted(s.received_ns for s in srv.seen if s.method == "POST")
    assert r.problems == () and r.metrics.n_ok == 15
    # Arrivals at the server follow the (halved) trace times, up to one common delay
    # (connecting, the first request's own lateness).
    got = [t / 1e9 for t in posts]
    want = [q.t_s for q in tw.requests]
    shift = sorted(g - w for g, w in zip(got, want))[len(got) // 2]
    errs = sorted(abs(g - w - shift) for g, w in zip(got, want))
    if errs[len(errs) // 2] >= 0.01 or errs[-1] >= 0.2:
        return f"arrival errors {errs}"
    # The self-check's limit is 5 ms p99; a margin, the machine being shared.
    if r.self_check.dispatch_lateness_p99_ms >= 10 * CLIENT_LATENESS_P99_MS:
        return f"self-check {r.self_check}"
    return ""


def test_replay_keeps_the_trace_times_against_a_scripted_server():
    """Up to 3 tries (as the client timing tests): a host busy with other work can make
    the client itself late, which its self-check then reports."""
    tw = TraceWorkload(read_trace(TRACES / "burstgpt_sample.csv"), time_scale=0.5)
    lines: list[CaseLine] = []
    why = []
    for _ in range(3):
        why.append(_replay_once(tw, lines))
        if not why[-1]:
            break
    assert not why[-1], f"outside the tolerance on all 3 tries: {why}"
    p = lines[-1].params
    assert (p["arrival"], p["trace_format"], p["requests"], p["time_scale"]) == (
        "trace", "burstgpt", 15, 0.5)
    assert lines[-1].headline["n_ok"] == 15


CASES = """
from pathlib import Path
from strata_plugin import TraceWorkload, Workload, read_trace

TRACE = Path({trace!r})
CONVERSATIONS = Path({conversations!r})

def test_mooncake_replay(strata):
    tw = TraceWorkload(read_trace(TRACE), length_scale=0.1, time_scale=1.0,
                       max_requests=12)
    r = strata.replay(tw, case_id="mooncake")
    assert not r.problems, r.problems
    assert not r.self_check.client_bound, r.self_check

def test_conversations(strata):
    r = strata.replay(TraceWorkload(read_trace(CONVERSATIONS)), case_id="conversations")
    assert not r.problems, r.problems

def test_cold(strata):
    r = strata.run(Workload("cold", isl=128, osl=4, concurrency=2, requests=4), scale=False)
    assert not r.problems, r.problems
"""


@pytest.mark.integration
def test_replay_on_the_embedded_target_shows_cached_prefix_tokens(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("HOME", HOME)
    pytester.makeini(f"[pytest]\nstrata_reports_dir = {pytester.path / 'reports'}\n")
    pytester.makepyfile(test_cases=CASES.format(
        trace=str(TRACES / "mooncake_sample.jsonl"),
        conversations=str(TRACES / "strata_conversations_sample.jsonl")))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--strata-run-id=t1",
                                           timeout=900)
    result.assert_outcomes(passed=3)
    run = pytester.path / "reports" / "t1"
    records = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    by_case: dict[str, list[dict]] = {}
    for rec in records:
        by_case.setdefault(rec["case_id"], []).append(rec)

    def cached(rec: dict) -> int:
        return (rec["usage"].get("cached_tokens") or (rec.get("timings") or {}).get("cache_n")
                or 0)

    trace = by_case["mooncake"]
    assert len(trace) == 12
    assert sum(cached(x) for x in trace) > 0  # shared blocks came from the cache
    assert sum(cached(x) for x in by_case["test_cases.py::test_cold[default]"]) == 0
    # In time order the three first turns come first (indices 0-2), then turns 2 and 3.
    turns = {int(x["request_id"].rsplit("/", 1)[1]): cached(x) for x in by_case["conversations"]}
    assert sorted(turns) == list(range(9))
    assert sum(turns[i] for i in range(3)) == 0  # a first turn has no history
    assert sum(turns[i] for i in range(3, 9)) > 0  # the history came from the cache
    print("CACHED", {c: [cached(x) for x in recs] for c, recs in sorted(by_case.items())})
    text = (run / "report.md").read_text()
    sec = text[text.index("## Prefix cache"):]
    row = next(x for x in sec.splitlines() if x.startswith("| `mooncake` |"))
    assert not row.endswith("| 0% |")

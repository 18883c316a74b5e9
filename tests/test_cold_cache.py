"""Cold prefixes on every engine: prompts salted per repetition, the engine's prefix
cache flushed before each cold case, and the cold prefix verified from what the
server reported (or said to be not verifiable), against a scripted OpenAI server."""

from __future__ import annotations

import json

import pytest
from sse_script_server import Reply, ScriptServer, Seen

from strata_plugin.load.cache_flush import flush_prefix_cache
from strata_plugin.load.case_runner import ABArm, CaseRunner, CaseSetup
from strata_plugin.load.client import Timeouts
from strata_plugin.load.workload import TokenSpace, Workload

W = Workload("cold", isl=16, osl=2, requests=2, seed=5)


def _server(cached: int | None, flush_status: int = 200):
    def reply(seen: Seen) -> Reply:
        if seen.path == "/reset_prefix_cache":
            return Reply([(0.0, b"")], status=flush_status, framing="length",
                         content_type="text/plain")
        body = seen.json
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": 2}
        if cached is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        chunks = [{"choices": [{"index": 0, "text": "x", "finish_reason": None}]},
                  {"choices": [{"index": 0, "text": "y", "finish_reason": "length"}]},
                  {"choices": [], "usage": usage}]
        return Reply([(0.0, f"data: {json.dumps(c)}\n\n".encode()) for c in chunks]
                     + [(0.0, b"data: [DONE]\n\n")])
    return reply


def _runner(url: str, lines: list, engine: str = "vllm", reps: dict | None = None):
    setup = CaseSetup(url, "completions", "c", TokenSpace(300, 1000), Timeouts(read_s=10),
                      salt="run1", engine=engine)
    return CaseRunner(setup, record=lambda r: None, mark=lambda *a: None,
                      add_case=lines.append, repetitions=reps)


def _prompts(srv: ScriptServer) -> list[tuple[int, ...]]:
    return [tuple(s.json["prompt"]) for s in srv.seen if s.path == "/v1/completions"]


def test_repetitions_differ_arms_pair_and_each_cold_case_flushes_first():
    lines: list = []
    with ScriptServer(_server(cached=0)) as srv:
        reps: dict = {}
        r = _runner(srv.url, lines, reps=reps)
        r.run(W, scale=False, case_id="a")
        r.run(W, scale=False, case_id="b")
        # A fresh runner of the same session (shared counters) goes on counting.
        _runner(srv.url, lines, reps=reps).run(W, scale=False, case_id="c")
        paths = [s.path for s in srv.seen]
    p = _prompts(srv)
    a, b, c = p[0:2], p[2:4], p[4:6]
    assert a != b and b != c and a != c  # no repetition reuses an earlier one's prefix
    assert a[0] != a[1]  # requests within a case differ too
    # the flush comes before each case's measured requests
    assert paths == ["/reset_prefix_cache", "/v1/completions", "/v1/completions"] * 3
    assert [line.cold_prefix for line in lines] == [
        "verified cold: 0 cached prompt tokens in 2 requests"] * 3
    assert lines[0].cache_flush == {"how": "POST /reset_prefix_cache", "ok": True,
                                       "detail": "HTTP 200"}
    assert len({line.prompt_salt for line in lines}) == 3

    lines = []
    with ScriptServer(_server(cached=0)) as srv:
        r = _runner(srv.url, lines)
        for i, arm in enumerate(("control", "treatment", "treatment", "control")):
            r.run(W, scale=False, case_id=f"m/{arm}/{i}", ab=ABArm("m", arm, i))
    p = _prompts(srv)
    c0, t0, t1, c1 = p[0:2], p[2:4], p[4:6], p[6:8]
    assert c0 == t0 and c1 == t1  # the k-th repetitions of the two arms pair
    assert c0 != c1


def test_cached_tokens_fail_the_case_and_silence_is_not_verifiable():
    lines: list = []
    with ScriptServer(_server(cached=16)) as srv:
        res = _runner(srv.url, lines).run(W, scale=False)
    assert any("16 cached prompt tokens on a cold prefix" in p for p in res.problems)
    assert lines[0].cold_prefix == "NOT cold: 32 cached prompt tokens in 2 requests"
    lines = []
    with ScriptServer(_server(cached=None)) as srv:
        res = _runner(srv.url, lines).run(W, scale=False)
    assert res.problems == ()
    assert lines[0].cold_prefix == ("cold prefix not verifiable: the server reported no "
                                       "cached-token count for 2 of 2 requests")


def test_flush_failures_are_recorded_not_raised():
    with ScriptServer(_server(cached=0, flush_status=404)) as srv:
        f = flush_prefix_cache("vllm", srv.url)
    assert not f.ok and f.detail.startswith("HTTP 404") and "VLLM_SERVER_DEV_MODE=1" in f.detail
    assert flush_prefix_cache("llamacpp", "http://127.0.0.1:9").ok
    down = flush_prefix_cache("sglang", "http://127.0.0.1:9", timeout_s=2)
    assert not down.ok and down.how == "POST /flush_cache"
    assert not flush_prefix_cache("other", "http://x").ok


@pytest.mark.integration
def test_the_report_says_cold_prefix_not_verifiable(tmp_path):
    from bundle_factory import CaseSpec, RunSpec, make_run

    from strata_plugin.report import write_report

    run = make_run(tmp_path, RunSpec(cases=[CaseSpec("quiet"), CaseSpec("loud")]))
    path = run / "cases.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for line in lines:
        line["cold_prefix"] = ("cold prefix not verifiable: the server reported no "
                               "cached-token count for 4 of 4 requests"
                               if line["case_id"] == "quiet"
                               else "verified cold: 0 cached prompt tokens in 4 requests")
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    text = write_report(run).read_text()
    limits = text.split("## Limits of this run")[1].split("\n## ")[0]
    assert "case quiet: cold prefix not verifiable" in limits
    assert "case loud" not in limits

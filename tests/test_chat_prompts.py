"""Chat with exact accounting: prompts built to the server's own templated count, checked
against its usage.prompt_tokens (the real llama-server; the real vLLM server in
tests/test_vllm_cpu.py); a server without a tokenizer endpoint runs and says "ISL not
exact"; the user's own prompts and conversations from a JSONL file."""

from __future__ import annotations

import json
import random
import re
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from strata_plugin.formats.cases import CaseLine
from strata_plugin.load.case_runner import CaseRunner, CaseSetup
from strata_plugin.load.chat_prompts import (
    ChatTooShort,
    exact_content,
    most_words,
    user_texts,
)
from strata_plugin.load.client import Timeouts
from strata_plugin.load.workload import TokenSpace, Workload
from strata_plugin.load.workload_spec import parse_workload
from tests.sse_script_server import Reply, ScriptServer, Seen, sse
from tests.test_integration_llama import llama  # noqa: F401  (the real llama-server)

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]


def _runner(url: str, engine: str, cases: list, records: list | None = None) -> CaseRunner:
    setup = CaseSetup(url, "chat", "it", TokenSpace(300, 1000), Timeouts(read_s=60),
                      salt="chat", engine=engine)
    return CaseRunner(setup, record=(records.append if records is not None else lambda r: None),
                      mark=lambda *a: None, add_case=cases.append)


# --- the search, against a counter whose rules are known -------------------------------

def _toy_count(text: str) -> int:
    """A template of 5 tokens; a word of n letters is ceil(n / 3) tokens; '.' and ' a' one."""
    n = 5
    for w in text.replace(".", " .").split():
        n += 1 if w in (".", "a") else -(-len(w) // 3)
    return n


@pytest.mark.parametrize("target", [5, 6, 7, 50, 333, 2048])
def test_the_search_hits_every_length_exactly(target):
    content, n = exact_content(_toy_count, target, random.Random(target))
    assert n == target == _toy_count(content)


def test_an_isl_shorter_than_the_template_is_a_clear_error():
    with pytest.raises(ChatTooShort, match="the chat template and prompt head alone are 5 "
                                           "tokens, more than the ISL 4"):
        exact_content(_toy_count, 4, random.Random(0))


def test_most_words_takes_few_counts():
    calls = []

    def count(k: int) -> int:
        calls.append(k)
        return 5 + 2 * k + (k % 3 == 0)

    k, n = most_words(count, 5, 2000)
    assert n <= 2000 < count(k + 1) and len(calls) <= 14, (k, n, len(calls))


# --- the real llama-server: /apply-template + /tokenize ---------------------------------

@pytest.mark.integration
def test_chat_on_llama_server_has_exact_isl_from_usage(llama):  # noqa: F811
    cases: list[CaseLine] = []
    w = Workload("chat", isl=300, osl=8, concurrency=2, requests=4, warmups=1, seed=5)
    res = _runner(llama.base_url, "llamacpp", cases).run(w, scale=False)
    assert res.problems == ()
    for r in (*res.records, *res.warmup_records):
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (300, 8)
        assert r.usage.cached_tokens == 0 and r.isl == 300
        assert sum(e.n_tokens for e in r.events) == 8
    assert cases[-1].isl_exact is True
    assert cases[-1].isl_note.startswith("exact: counted by the server's tokenizer (POST "
                                            "/apply-template + POST /tokenize")
    assert cases[-1].cold_prefix == "verified cold: 0 cached prompt tokens in 4 requests"
    # one token more is a different prompt, exact too: the check would catch a miss
    more = _runner(llama.base_url, "llamacpp", cases).run(replace(w, isl=301, requests=1,
                                                                  warmups=0), scale=False)
    assert more.problems == () and more.records[0].usage.prompt_tokens == 301


@pytest.mark.integration
def test_a_shared_chat_prefix_is_shared_and_still_exact(llama):  # noqa: F811
    records: list = []
    w = Workload("shared", isl=200, osl=2, requests=3, seed=9, prefix="shared",
                 shared_prefix_tokens=120)
    res = _runner(llama.base_url, "llamacpp", [], records).run(w, scale=False)
    assert res.problems == ()
    assert [r.usage.prompt_tokens for r in res.records] == [200, 200, 200]
    # after the first, llama.cpp served the shared head from its prompt cache
    assert all(r.usage.cached_tokens and r.usage.cached_tokens >= 100
               for r in res.records[1:]), [r.usage for r in res.records]


# --- a scripted server without a tokenizer endpoint ------------------------------------

class ChatNoTokenizer:
    """/v1/chat/completions as SSE with usage (prompt tokens: words + 3); no /tokenize,
    no /apply-template (404). Keeps every body it was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.lock = threading.Lock()

    def __call__(self, seen: Seen) -> Reply:
        if seen.method == "GET":
            return Reply([(0.0, b"ok")], framing="length", content_type="text/plain")
        if seen.path != "/v1/chat/completions":
            return Reply([(0.0, b'{"detail":"Not Found"}')], status=404, framing="length",
                         content_type="application/json")
        body = seen.json
        with self.lock:
            self.bodies.append(body)
        words = sum(len(m["content"].split()) for m in body["messages"])
        n = body["max_tokens"]
        items = [(0.001, sse({"choices": [{"index": 0, "delta": {"content": " y"}}]}))
                 for _ in range(n)]
        items.append((0.0, sse({"choices": [{"index": 0, "delta": {},
                                             "finish_reason": "length"}],
                                "usage": {"prompt_tokens": words + 3, "completion_tokens": n}})))
        items.append((0.0, sse("[DONE]")))
        return Reply(items)


PROFILE = """
name = "chat-test"
[server]
engine = "other"
api = "chat"
health_timeout_s = 30
token_id_range = [300, 1000]
[telemetry]
interval_s = 0.1
baseline_s = 0
cooldown_s = 0
collectors = ["proc"]
"""


@pytest.mark.integration
def test_chat_without_a_tokenizer_runs_and_the_report_says_isl_not_exact(pytester,
                                                                        monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("CI_NO_PROGRESS", "1")
    pytester.makeini(f"""
[pytest]
strata_profile = {pytester.path / "profile.toml"}
strata_reports_dir = {pytester.path / "reports"}
""")
    (pytester.path / "profile.toml").write_text(PROFILE)
    server = ChatNoTokenizer()
    with ScriptServer(server) as srv:
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "-p", "no:hypothesispytest", f"--strata-server-url={srv.url}",
            "--strata-workload=isl=100,osl=4,concurrency=2,requests=4", "--strata-run-id=c1")
    result.assert_outcomes(passed=1)
    run = pytester.path / "reports" / "c1"
    line = [json.loads(x) for x in (run / "cases.jsonl").read_text().splitlines()][-1]
    assert line["isl_exact"] is False
    assert line["isl_note"].startswith("ISL not exact: the server has no tokenizer endpoint")
    assert line["isl_note"].endswith("counted: min 78, median 78, max 78 over 4 requests")
    report = (run / "report.md").read_text()
    assert "ISL not exact" in report
    assert len(server.bodies) == 4
    firsts = {b["messages"][0]["content"].split()[0:3].__repr__() for b in server.bodies}
    assert len(firsts) == 4  # every request its own words: no shared prefix
    assert all(len(b["messages"][0]["content"].split()) == 75 for b in server.bodies)


# --- the user's own texts --------------------------------------------------------------

def test_the_users_prompts_and_conversations_are_sent_as_written(tmp_path):
    path = tmp_path / "mine.jsonl"
    conv = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "why?"}]
    path.write_text(json.dumps({"prompt": "tell me about tokens"}) + "\n\n"
                    + json.dumps({"messages": conv}) + "\n")
    server = ChatNoTokenizer()
    cases: list[CaseLine] = []
    w = parse_workload(f"texts={path},osl=3,requests=3")
    assert w.isl == 0 and w.texts == str(path)
    with ScriptServer(server) as srv:
        res = _runner(srv.url, "other", cases).run(w, scale=False)
    assert res.problems == ()
    sent = [b["messages"] for b in sorted(server.bodies, key=lambda b: len(b["messages"]))]
    assert sent[:2] == [[{"role": "user", "content": "tell me about tokens"}]] * 2  # 0 and 2
    assert sent[2] == conv  # round-robin: request 1 is the conversation
    assert [r.usage.prompt_tokens for r in res.records] == [7, 8, 7]
    assert cases[-1].isl_exact is False
    assert cases[-1].isl_note.startswith(f"the user's own texts ({path})")


@pytest.mark.parametrize("line, says", [
    ("not json", "line 1: not JSON"),
    ('{"text": "x"}', "line 1: expected 'prompt' (a non-empty string) or 'messages'"),
    ('{"messages": [{"role": "user"}]}', "line 1: messages[0] needs string 'role' and "
                                          "'content'"),
])
def test_a_bad_texts_file_names_the_line_and_the_key(tmp_path, line, says):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}, {says}")):
        user_texts(str(path))


def test_texts_need_isl_zero():
    with pytest.raises(ValueError, match="with texts, each prompt's length is its own: set "
                                         "isl=0"):
        Workload("t", isl=10, osl=2, texts="x.jsonl")

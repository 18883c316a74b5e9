"""Chat with exact accounting: prompts built to the server's own templated count, checked
against its usage.prompt_tokens (the real llama-server; the real vLLM server in
tests/test_vllm_cpu.py); a server without a tokenizer endpoint runs and says "ISL not
exact"; the user's own prompts and conversations from a JSONL file."""

from __future__ import annotations

import json
import math
import os
import random
import re
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_plugin.formats.cases import CaseLine
from strata_plugin.limits import CHAT_FILLER_TOKENS, CHAT_SEARCH_COUNTS
from strata_plugin.load.case_runner import CaseRunner, CaseSetup
from strata_plugin.load.chat_prompts import (
    ChatTokenizerError,
    ChatTooShort,
    exact_content,
    most_words,
    user_texts,
    words_max,
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


# --- hostile counts: the search is bounded and names the server's answer ----------------
# On 449ac52 a count that stopped growing (or was 0, a boolean, random, negative) made the
# search extrapolate at 1e-3 tokens a word: it asked for ~1000x the gap at every count
# (0.87 GB after 25 s, no request ever sent). These servers answer the probe honestly
# (find_counter takes them) and turn hostile on longer texts; a text past the word bound
# gets HTTP 413, so the old search fails here at once instead of hanging the test.

ISL = 1000


class HostileTokenizer:
    """vLLM-style ``POST /tokenize`` (messages -> count): honest (words + 3) up to 4 words,
    then ``rule(words)``; records the most words it was asked to count."""

    def __init__(self, rule, *, honest_upto: int = 4) -> None:
        self.rule = rule
        self.honest_upto = honest_upto
        self.max_words = 0
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, seen: Seen) -> Reply:
        if seen.method == "GET":
            return Reply([(0.0, b"ok")], framing="length", content_type="text/plain")
        if seen.path != "/tokenize":  # /reset_prefix_cache before a cold case; no chat
            return Reply([(0.0, b"{}")], status=404, framing="length",
                         content_type="application/json")
        words = sum(len(m["content"].split()) for m in seen.json["messages"])
        with self.lock:
            self.calls += 1
            self.max_words = max(self.max_words, words)
        if words > 10 * words_max(ISL):
            return Reply([(0.0, b'{"error":"too many words"}')], status=413,
                         framing="length", content_type="application/json")
        value = words + 3 if words <= self.honest_upto else self.rule(words)
        body = value if isinstance(value, bytes) else json.dumps({"count": value}).encode()
        return Reply([(0.0, body)], framing="length", content_type="application/json")


_RNG = random.Random(7)
HOSTILE = {
    # rule, what the error must say (the server's answer or the search's finding)
    "flat": (lambda w: min(w + 3, 50), r"the count does not reach the ISL: 2016 words count "
                                       r"50 tokens \(none, 3\)"),
    "zero": (lambda w: 0, r"\{\"count\": 0\}"),
    "boolean": (lambda w: True, r"the token count is true, not a whole number >= 0"),
    "random": (lambda w: _RNG.randrange(0, 5000), "the count falls as words are added"),
    "negative": (lambda w: -5, r"the token count is -5, not a whole number"),
    "vllm -10^9": (lambda w: -10**9, r"the token count is -1000000000, not a whole"),
    "a string": (lambda w: "12", r"the token count is \"12\""),
    "a float": (lambda w: 12.5, r"the token count is 12.5"),
    "decreasing": (lambda w: 10**6 - w, "the count falls as words are added"),
    "no count": (lambda w: b'{"tokens": "many"}', "no token count in the answer"),
}


@pytest.mark.parametrize("mode", list(HOSTILE))
def test_a_hostile_count_fails_the_prompt_at_once_naming_the_answer(mode):
    import tracemalloc

    from strata_plugin.load.chat_prompts import ChatPrompter, ChatTokenizerError, find_counter

    rule, says = HOSTILE[mode]
    server = HostileTokenizer(rule)
    with ScriptServer(server) as srv:
        counter, how = find_counter(srv.url, "vllm")
        assert counter is not None, how  # the probe was answered honestly
        tracemalloc.start()
        t0 = time.monotonic()
        with pytest.raises(ChatTokenizerError) as err:
            ChatPrompter(counter, how).prompt(ISL, "0:0:x")
        elapsed = time.monotonic() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    msg = str(err.value)
    assert msg.startswith(f"a chat prompt of ISL {ISL} cannot be built to the server's count")
    assert re.search(says, msg), msg
    assert f"at {srv.url})" in msg  # whose count: the endpoint and where
    # the calls are the bound; the time only refuses a search that ran on (a busy host's
    # pause is not one)
    assert elapsed < 5.0 and server.calls <= 2 + CHAT_SEARCH_COUNTS, (elapsed, server.calls)
    assert server.max_words <= words_max(ISL)  # never past the word bound
    assert peak < 8 << 20, peak  # memory bounded: a few MB at most for ISL 1000


def test_the_whole_case_fails_in_seconds_before_any_request():
    """Through the case runner, as a run meets it: no chat request is ever sent."""
    from strata_plugin.load.chat_prompts import ChatTokenizerError

    server = HostileTokenizer(lambda w: 0)
    with ScriptServer(server) as srv:
        t0 = time.monotonic()
        with pytest.raises(ChatTokenizerError, match="the count falls as words are added"):
            _runner(srv.url, "vllm", []).run(Workload("c", isl=ISL, osl=4, requests=2),
                                             scale=False)
        assert time.monotonic() - t0 < 3.0
        assert not [s for s in srv.seen if s.path == "/v1/chat/completions"]


@pytest.mark.parametrize("words_per_token, ok", [(2.0, True), (2.2, False)])
def test_the_word_bound_holds_two_words_a_token_and_refuses_more(words_per_token, ok):
    """CHAT_WORDS_PER_TOKEN = 2: a vocabulary of two words a token is served exactly; at
    2.2 the ISL needs more words than the bound and the search says so."""
    def count(k: int) -> int:
        return 3 + math.floor(k / words_per_token)

    if ok:
        k, n = most_words(count, 3, ISL)
        assert n == ISL and k <= words_max(ISL)
    else:
        with pytest.raises(ChatTokenizerError, match=f"a prompt of {ISL} tokens may hold at "
                                                     f"most {words_max(ISL)} words"):
            most_words(count, 3, ISL)


@pytest.mark.parametrize("gap, ok", [(CHAT_FILLER_TOKENS, True), (CHAT_FILLER_TOKENS + 1,
                                                                   False)])
def test_fillers_close_a_gap_of_the_bound_and_no_more(gap, ok):
    """Words of 16 tokens each and fillers of one: the target 5 + 16 x 10 + gap leaves the
    fillers ``gap`` tokens to close after ten words."""
    from strata_plugin.load.chat_prompts import WORDS

    def count(text: str) -> int:  # a list word is 16 tokens, each filler character one
        n = 5
        for w in text.split():
            core = w.rstrip(".,!?;")
            n += 16 + len(w) - len(core) if core in WORDS else len(w)
        return n

    target = 5 + 16 * 10 + gap
    if ok:
        content, n = exact_content(count, target, random.Random(1))
        assert n == target == count(content)
    else:
        with pytest.raises(ChatTokenizerError, match=f"a gap of {gap} is more than fillers "
                                                     "may close"):
            exact_content(count, target, random.Random(1))


@pytest.mark.parametrize("extra, ok", [(0, True), (1, False)])
def test_an_answer_past_the_byte_bound_is_refused(monkeypatch, extra, ok):
    """CHAT_ANSWER_BYTES_MAX, at a small value: an answer of exactly the bound is read, a
    byte more is refused (an endless answer is read no further)."""
    from strata_plugin.load import chat_prompts
    from strata_plugin.load.chat_prompts import ChatTokenizerError, ServerCounter

    answer = b'{"count": 7}'
    answer += b" " * (200 - len(answer))
    monkeypatch.setattr(chat_prompts, "CHAT_ANSWER_BYTES_MAX", 200 - 1 + ok)
    with ScriptServer(Reply([(0.0, answer + b" " * extra)], framing="length",
                            content_type="application/json")) as srv:
        c = ServerCounter(srv.url, "vllm")
        if ok and not extra:
            assert c.count((("user", "x"),)) == 7
        else:
            with pytest.raises(ChatTokenizerError, match="the answer is longer than"):
                c.count((("user", "x"),))


def test_ctrl_c_is_answered_within_a_second_while_the_server_holds_a_count(
        sigint_as_at_a_terminal):
    """Every wait of the search is a socket read: SIGINT interrupts it at once (on 449ac52
    a join of billions of words held Ctrl-C for up to 10 s)."""
    import signal

    from strata_plugin.load.chat_prompts import ChatPrompter, find_counter

    def reply(seen: Seen) -> Reply:
        words = sum(len(m["content"].split()) for m in seen.json["messages"])
        return Reply([(0.0, json.dumps({"count": words + 3}).encode())], framing="length",
                     content_type="application/json", head_delay_s=0 if words <= 4 else 30)

    with ScriptServer(reply) as srv:
        counter, how = find_counter(srv.url, "vllm")
        assert counter is not None
        sent: list[float] = []

        def ctrl_c() -> None:
            sent.append(time.monotonic())  # stamped where the signal is sent
            os.kill(os.getpid(), signal.SIGINT)

        timer = threading.Timer(0.5, ctrl_c)
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                ChatPrompter(counter, how).prompt(ISL, "0:0:x")
        finally:
            timer.cancel()
        answered = time.monotonic()
    assert len(sent) == 1 and 0 <= answered - sent[0] < 1.0, (sent, answered)


# The search's bounds hold whatever the server answers: hypothesis draws the answers.

@settings(derandomize=True, database=None, deadline=None, max_examples=300)
@given(answers=st.lists(st.integers(0, 4000), min_size=1, max_size=80),
       target=st.integers(1, 3000))
def test_any_answers_end_the_search_within_its_bounds(answers, target):
    """Arbitrary (hostile) counts: the search returns a word count whose count is at most
    the target, or raises ChatTokenizerError; it never asks past words_max(target) nor
    more than CHAT_SEARCH_COUNTS counts."""
    from strata_plugin.load.chat_prompts import ChatTokenizerError

    asked: list[int] = []

    def count(k: int) -> int:
        asked.append(k)
        return answers[min(len(asked), len(answers)) - 1]

    base = 0
    try:
        k, n = most_words(count, base, target)
        assert n <= target and 0 <= k <= words_max(target)
    except ChatTokenizerError:
        pass
    assert len(asked) <= CHAT_SEARCH_COUNTS
    assert all(0 < k <= words_max(target) for k in asked)


@settings(derandomize=True, database=None, deadline=None, max_examples=200)
@given(costs=st.lists(st.integers(1, 3), min_size=64, max_size=64),
       target=st.integers(1, 1 << 20))
def test_honest_counts_of_one_to_three_tokens_a_word_always_land(costs, target):
    """A vocabulary where each word is 1 to 3 tokens (the list's words in any BPE): the
    search lands within CHAT_SEARCH_COUNTS counts for every ISL up to MAX_ISL."""
    base = 5
    prefix = [0]
    n_asked = [0]

    def count(k: int) -> int:
        n_asked[0] += 1
        full, part = divmod(k, len(costs))
        while len(prefix) <= len(costs):
            prefix.append(prefix[-1] + costs[len(prefix) - 1])
        return base + full * prefix[-1] + prefix[part]

    if target < base:
        return
    k, n = most_words(count, base, target)
    assert n <= target < count(k + 1) or n == target
    assert n_asked[0] <= CHAT_SEARCH_COUNTS + 1

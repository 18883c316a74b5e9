"""Chat prompts whose templated length is exact, counted by the server's own tokenizer.

The chat API takes text, and the server wraps it in its chat template (role markers,
a BOS, the assistant's opening), so the input length is not the text's length. Where the
server can count a conversation as it will run it, the prompt is built to that count:

* vLLM (and servers that copy its API; tried for SGLang too, whose ``/tokenize`` counts a
  conversation only where it takes ``messages``): ``POST /tokenize`` with ``messages``
  and ``add_generation_prompt`` returns ``count``, the templated length (vLLM's
  OpenAI-compatible server, "Tokenizer API");
* llama.cpp: ``POST /apply-template`` gives the templated text and ``POST /tokenize``
  with ``add_special`` counts it as a chat completion does (llama.cpp
  tools/server/README.md, "POST /apply-template", "POST /tokenize").

The content is words drawn from a seeded generator (a request's own, so no two requests
share a prefix), as many as the count allows, then short fillers that add one token
each, until the server's count is the ISL exactly; the server's ``usage.prompt_tokens``
is checked against it as for token-ID prompts. Where the server has neither endpoint
the prompt is an estimate (:data:`WORDS_PER_TOKEN` words per token) and the case says
"ISL not exact": its input lengths are the server's counts from usage.

The server's answers are input like any other, and a count that is not a whole number
>= 0, that falls as words are added, or that stops growing before the ISL fails the
prompt at once with a :class:`ChatTokenizerError` naming the answer. The search is
bounded (strata_plugin/limits.py): at most ``CHAT_WORDS_PER_TOKEN`` words per token of
the ISL, ``CHAT_SEARCH_COUNTS`` counts for the words, ``CHAT_FILLER_TOKENS`` tokens of
fillers, and ``CHAT_ANSWER_BYTES_MAX`` bytes of one answer, so neither its time nor its
memory depends on what the server says.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import requests
import urllib3

from strata_plugin.errors import StrataError
from strata_plugin.limits import (
    CHAT_ANSWER_BYTES_MAX,
    CHAT_FILLER_TOKENS,
    CHAT_SEARCH_COUNTS,
    CHAT_WORDS_PER_TOKEN,
    CHAT_WORDS_SLACK,
)

#: A conversation: (role, content) pairs, in order.
Messages = tuple[tuple[str, str], ...]

#: Words per token where no tokenizer can count: OpenAI's rule of thumb for English text,
#: "1 token ~= 3/4 words" (OpenAI Help Center, "What are tokens and how to count them?").
WORDS_PER_TOKEN = 0.75

#: Common English words: most are one token, or a few, in any BPE vocabulary trained on
#: English, so a prompt's length moves in small steps as words are added.
WORDS = tuple("""
the of and to in is was he for it with as his on be at by had are but from or have an
they which one you were her all she there would their we him been has when who will more
no if out so said what up its about into than them can only other new some could time
these two may then do first any my now such like our over man me even most made after
also did many before must through back years where much your way well down should
because each just those people how too little state good very make world still own see
men work long get here between both life being under never day same another know while
last might us great old year off come since against go came right used take three
""".split())
#: Appended one at a time to close the last gap: each is one token in most vocabularies.
FILLERS = (" a", " I", ".", ",", " o", " x", "!", "?", ";", " e", " s", " t", "a", "e")


class ChatTokenizerError(StrataError, RuntimeError):
    """The server's tokenizer endpoint answered, but not as expected."""


class ChatTooShort(StrataError, ValueError):
    """The ISL asked for is shorter than the chat template's own tokens."""


@dataclass(frozen=True)
class ChatPrompt:
    messages: Messages
    n_tokens: int | None  # the server's templated count; None where it cannot count


def _without_userinfo(url: str) -> str:
    """``url`` without ``user:password@``: what an error message may name."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def as_json_messages(messages: Messages) -> list[dict[str, str]]:
    return [{"role": r, "content": c} for r, c in messages]


class ServerCounter:
    """Counts a conversation's templated tokens with the server's own endpoint."""

    def __init__(self, base_url: str, kind: str, *, model: str | None = None,
                 headers: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> None:
        if kind not in ("vllm", "llamacpp"):
            raise ValueError(f"unknown tokenizer endpoint kind {kind!r}")
        self.base_url = base_url.rstrip("/")
        self.kind = kind
        self.model = model
        self.timeout_s = timeout_s
        self._session = requests.Session()
        self._session.headers.update({"Content-Type": "application/json", **(headers or {})})
        self.calls = 0
        self.last_answer = "no answer yet"  # the last call and its answer, for errors
        self.where = _without_userinfo(self.base_url)  # for messages: no credentials

    @property
    def name(self) -> str:
        return ("POST /tokenize with messages" if self.kind == "vllm"
                else "POST /apply-template + POST /tokenize")

    def _post(self, path: str, body: dict) -> dict:
        """One call; its answer read up to CHAT_ANSWER_BYTES_MAX bytes, as a JSON object."""
        self.calls += 1
        url = self.base_url + path
        try:
            with self._session.post(url, data=json.dumps(body), timeout=self.timeout_s,
                                    stream=True) as r:
                raw = r.raw.read(CHAT_ANSWER_BYTES_MAX + 1, decode_content=True)
                status = r.status_code
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise ChatTokenizerError(f"POST {path} at {self.where}: "
                                     f"{type(exc).__name__}") from None
        if len(raw) > CHAT_ANSWER_BYTES_MAX:
            raise ChatTokenizerError(f"POST {path} at {self.where}: the answer is longer "
                                     f"than {CHAT_ANSWER_BYTES_MAX} bytes "
                                     "(limits.CHAT_ANSWER_BYTES_MAX)")
        text = raw.decode("utf-8", "replace")
        self.last_answer = f"POST {path} -> {' '.join(text.split())[:160]}"
        if status != 200:
            raise ChatTokenizerError(f"POST {path}: HTTP {status}: {text[:200]}")
        try:
            out = json.loads(text)
        except ValueError:
            raise ChatTokenizerError(f"POST {path}: not JSON: {text[:200]!r}") from None
        if not isinstance(out, dict):
            raise ChatTokenizerError(f"POST {path}: not a JSON object: {text[:200]}")
        return out

    def count(self, messages: Messages) -> int:
        """The server's templated count of ``messages``: a whole number >= 0, else a
        ChatTokenizerError naming what it answered (a boolean is not a count, though
        Python's ``True`` is an ``int``)."""
        msgs = as_json_messages(messages)
        if self.kind == "vllm":
            body: dict = {"messages": msgs, "add_generation_prompt": True}
            if self.model:
                body["model"] = self.model
            out = self._post("/tokenize", body)
            if "count" in out:
                n = out["count"]
            else:
                tokens = out.get("tokens")
                n = len(tokens) if isinstance(tokens, list) else None
        else:
            text = self._post("/apply-template", {"messages": msgs}).get("prompt")
            if not isinstance(text, str):
                raise ChatTokenizerError("POST /apply-template: no 'prompt' in the answer")
            tokens = self._post("/tokenize", {"content": text, "add_special": True,
                                              "parse_special": True}).get("tokens")
            n = len(tokens) if isinstance(tokens, list) else None
        if n is None:
            raise ChatTokenizerError(f"{self.name}: no token count in the answer "
                                     f"({self.last_answer})")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ChatTokenizerError(f"{self.name}: the token count is {json.dumps(n)[:40]}, "
                                     f"not a whole number >= 0 ({self.last_answer})")
        return n


#: Which endpoint to try first for each engine (``server.engine``).
_BY_ENGINE = {"vllm": ("vllm",), "sglang": ("vllm",), "llamacpp": ("llamacpp",)}


def find_counter(base_url: str, engine: str, *, model: str | None = None,
                 headers: Mapping[str, str] | None = None
                 ) -> tuple[ServerCounter | None, str]:
    """The server's tokenizer endpoint that counts a conversation, and how it was found;
    (None, why) where it has none. A probe conversation must count, and a longer one
    must count more."""
    tried = []
    for kind in _BY_ENGINE.get(engine, ("vllm", "llamacpp")):
        c = ServerCounter(base_url, kind, model=model, headers=headers, timeout_s=10.0)
        try:
            short = c.count((("user", "hello"),))
            longer = c.count((("user", "hello hello hello hello"),))
        except (requests.RequestException, ValueError, ChatTokenizerError) as exc:
            tried.append(f"{c.name}: {' '.join(str(exc).split())[:160]}")
            continue
        if longer > short > 0:
            c.timeout_s = 30.0
            return c, f"{c.name} ({engine or 'engine not named'})"
        tried.append(f"{c.name}: counts {short} and {longer} do not grow with the text")
    return None, "; ".join(tried) or "no tokenizer endpoint known for this engine"


def _words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(n)]


def words_max(target: int) -> int:
    """The most words a prompt of ``target`` tokens may hold (limits.CHAT_WORDS_PER_TOKEN)."""
    return CHAT_WORDS_PER_TOKEN * max(0, target) + CHAT_WORDS_SLACK


def most_words(count: Callable[[int], int], base: int, target: int,
               max_words: int | None = None) -> tuple[int, int]:
    """The most words ``k`` whose count ``count(k)`` is at most ``target``, and that count.

    ``count(0) == base <= target``. The count grows with the words, not always by one
    (a word may be several tokens), so ``k`` is found by interpolation, every other step
    a bisection (about five counts for a few thousand tokens).

    Bounded whatever ``count`` says: ``k`` never passes ``max_words`` (default
    :func:`words_max`), at most ``CHAT_SEARCH_COUNTS`` counts are asked, and a count
    that falls as words are added, or that has not reached ``target`` at ``max_words``,
    is a ChatTokenizerError saying so (the extrapolation from a count that stopped
    growing asked for ever more words: billions, on 449ac52).
    """
    if max_words is None:
        max_words = words_max(target)
    lo, f_lo = 0, base
    hi = f_hi = None
    k = min(max_words, max(1, target - base))  # one word per token: most vocabularies
    for step in range(CHAT_SEARCH_COUNTS):
        fk = count(k)
        if fk < f_lo or (f_hi is not None and fk > f_hi):
            a, b = ((lo, f_lo), (k, fk)) if fk < f_lo else ((k, fk), (hi, f_hi))
            raise ChatTokenizerError(
                f"the count falls as words are added: {a[0]} words count {a[1]} tokens, "
                f"{b[0]} words count {b[1]}")
        if fk == target:
            return k, fk
        if fk < target:
            lo, f_lo = k, fk
        else:
            hi, f_hi = k, fk
        if hi is not None and hi - lo <= 1:
            return lo, f_lo
        if hi is None or f_hi is None:  # still short: extrapolate the tokens per word
            if lo >= max_words:
                raise ChatTokenizerError(
                    f"the count does not reach the ISL: {lo} words count {f_lo} tokens "
                    f"(none, {base}), and a prompt of {target} tokens may hold at most "
                    f"{max_words} words (limits.CHAT_WORDS_PER_TOKEN: "
                    f"{CHAT_WORDS_PER_TOKEN} a token, plus {CHAT_WORDS_SLACK})")
            per = (f_lo - base) / lo
            k = max_words if per <= 0 else min(
                max_words, lo + max(1, math.ceil((target - f_lo) / per)))
        elif step % 2:
            k = (lo + hi) // 2
        else:
            k = lo + round((target - f_lo) * (hi - lo) / (f_hi - f_lo))
            k = min(hi - 1, max(lo + 1, k))
    raise ChatTokenizerError(f"no word count found for {target} tokens in "
                             f"{CHAT_SEARCH_COUNTS} counts (limits.CHAT_SEARCH_COUNTS; last "
                             f"{lo} words: {f_lo} tokens, {hi} words: {f_hi})")


def exact_content(count: Callable[[str], int], target: int, rng: random.Random,
                  head: str = "") -> tuple[str, int]:
    """Content (``head`` then seeded words, then fillers) whose templated count is
    ``target``; ``count(content)`` is the server's count of the whole conversation.

    The most words that fit (:func:`most_words`), then fillers that each add one token
    until the count is ``target``. ChatTooShort when the template alone is longer than
    ``target``; ChatTokenizerError when no filler closes the gap.
    """
    pool: list[str] = []

    def text(k: int) -> str:
        if k > len(pool):
            pool.extend(_words(rng, k - len(pool)))
        return " ".join(([head] if head else []) + pool[:k])

    base = count(text(0))
    if base > target:
        raise ChatTooShort(f"the chat template and prompt head alone are {base} tokens, "
                           f"more than the ISL {target}")
    k, cur = most_words(lambda k: count(text(k)), base, target)
    content = text(k)
    if target - cur > CHAT_FILLER_TOKENS:
        raise ChatTokenizerError(
            f"{k} words count {cur} tokens and one more word passes the ISL {target}: a "
            f"gap of {target - cur} is more than fillers may close (limits."
            f"CHAT_FILLER_TOKENS = {CHAT_FILLER_TOKENS})")
    while cur < target:
        for f in FILLERS:
            n = count(content + f)
            if n == cur + 1:
                content, cur = content + f, n
                break
        else:
            raise ChatTokenizerError(f"no prompt of exactly {target} tokens found (closest "
                                     f"{cur}: no filler adds exactly one token)")
    return content, cur


def estimated_content(target: int, rng: random.Random, head: str = "") -> str:
    """Content of about ``target`` tokens where nothing can count them."""
    n = max(1, round(target * WORDS_PER_TOKEN))
    return " ".join(([head] if head else []) + _words(rng, n))


class ChatPrompter:
    """One case runner's chat prompts: exact where the server counts, else estimated."""

    def __init__(self, counter: ServerCounter | None, how: str) -> None:
        self.counter = counter
        self.how = how
        self._heads: dict[tuple[str, int], str] = {}

    @property
    def exact(self) -> bool:
        return self.counter is not None

    def note(self) -> str:
        """The line a case records about its input lengths."""
        if self.counter is not None:
            return f"exact: counted by the server's tokenizer ({self.how})"
        return ("ISL not exact: the server has no tokenizer endpoint that counts a "
                f"conversation ({self.how}); the prompts are about {WORDS_PER_TOKEN:g} "
                "words per token, and the input lengths are the server's counts from "
                "usage.prompt_tokens")

    def prompt(self, isl: int, seed_key: str, *, shared_tokens: int = 0,
               shared_key: str = "") -> ChatPrompt:
        """One user message of ``isl`` templated tokens; with ``shared_tokens``, its first
        words are the same for every request of ``shared_key`` (a shared prefix)."""
        head = self._head(shared_key, shared_tokens) if shared_tokens else ""
        rng = random.Random(seed_key)
        if self.counter is None:
            body = estimated_content(isl - shared_tokens if head else isl, rng, head)
            return ChatPrompt((("user", body),), None)
        c = self.counter
        try:
            body, n = exact_content(lambda t: c.count((("user", t),)), isl, rng, head)
        except ChatTokenizerError as exc:
            raise self._failed(f"a chat prompt of ISL {isl}", exc) from None
        return ChatPrompt((("user", body),), n)

    def _failed(self, what: str, exc: ChatTokenizerError) -> ChatTokenizerError:
        """The error in the user's words: which prompt, whose count, its last answer."""
        c = self.counter
        assert c is not None
        answer = "" if c.last_answer in str(exc) else f" last answered {c.last_answer};"
        return ChatTokenizerError(
            f"{what} cannot be built to the server's count: {exc}. The server's tokenizer "
            f"({c.name} at {c.where}){answer} check that endpoint, or run this case with "
            "your own texts (texts=FILE) or on the completions API (token-ID prompts)")

    def _head(self, key: str, tokens: int) -> str:
        """The shared words: the most that fit in ``tokens`` templated tokens."""
        got = self._heads.get((key, tokens))
        if got is not None:
            return got
        rng = random.Random(f"{key}:shared")
        if self.counter is None:
            head = estimated_content(tokens, rng)
        else:
            c = self.counter
            pool = _words(rng, words_max(tokens))  # the most words the search may ask

            def count(k: int) -> int:
                return c.count((("user", " ".join(pool[:k])),))

            try:
                base = count(0)
                k, _ = most_words(count, base, tokens) if base < tokens else (0, base)
            except ChatTokenizerError as exc:
                raise self._failed(f"a shared chat prefix of {tokens} tokens", exc) from None
            head = " ".join(pool[:k])
        self._heads[(key, tokens)] = head
        return head


def user_texts(path: str) -> list[Messages]:
    """Prompts from a JSONL file of the user's own texts, one request per line:
    ``{"prompt": "text"}`` (one user message) or ``{"messages": [{"role": ..., "content":
    ...}, ...]}`` (a conversation sent as it is). ValueError names the line and the key."""
    out: list[Messages] = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}, line {n}"
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{where}: not JSON ({exc})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{where}: expected an object with 'prompt' or 'messages'")
            if isinstance(obj.get("prompt"), str) and obj["prompt"]:
                out.append((("user", obj["prompt"]),))
                continue
            msgs = obj.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise ValueError(f"{where}: expected 'prompt' (a non-empty string) or "
                                 "'messages' (a non-empty list)")
            conv = []
            for i, m in enumerate(msgs):
                if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                        and isinstance(m.get("content"), str)):
                    raise ValueError(f"{where}: messages[{i}] needs string 'role' and "
                                     "'content'")
                conv.append((m["role"], m["content"]))
            out.append(tuple(conv))
    if not out:
        raise ValueError(f"{path}: no prompts (one JSON object a line)")
    return out


def conversation_text(messages: Sequence[tuple[str, str]]) -> str:
    """A conversation as one text prompt, for an API that takes text (completions)."""
    return "\n".join(c for _, c in messages)

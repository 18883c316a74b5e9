"""Trace replay: requests at a recorded trace's times, with its lengths and shared prefixes.

Readers for the public formats (each file's own columns, nothing renamed by hand):

* ``mooncake``: JSONL, one request a line: ``timestamp`` (ms since the first request),
  ``input_length``, ``output_length``, ``hash_ids`` (one id per 512-token block of the
  prompt; requests that share leading ids share that prefix). Mooncake's FAST'25
  trace release (kvcache-ai/Mooncake, "Open Source Trace").
* ``burstgpt``: CSV with ``Timestamp`` (s), ``Model``, ``Request tokens``,
  ``Response tokens``, ``Total tokens``, ``Log Type`` (BurstGPT's release). Rows with 0
  response tokens are failures in the trace and are left out.
* ``azure``: CSV with ``TIMESTAMP`` (a date-time), ``ContextTokens``,
  ``GeneratedTokens`` (Azure LLM inference trace 2023/2024, AzurePublicDataset).
* ``strata``: JSONL or CSV with ``timestamp_s``, ``input_length``, ``output_length`` and
  optionally ``prefix_group`` and ``prefix_tokens`` (requests of one group share their
  first ``prefix_tokens`` tokens exactly), ``conversation_id``, ``turn`` and ``think_s``
  (multi-turn: turn k is sent ``think_s`` after turn k-1's answer ended, its prompt the
  previous turns' inputs and answers followed by its own ``input_length`` new tokens;
  ``timestamp_s`` counts only for a conversation's first turn).

Prompts are exact token-ID lists: a shared block's tokens depend only on the block's
id (and the run's salt), so two requests with the same leading blocks send the same
leading tokens, and the rest of each prompt is the request's own.

Every row is checked, whatever the format: a trace is one format (a row whose columns
are another format's is an error naming its line), each number is finite, whole where it
counts tokens, and within the limits below; an error is a ``TraceError`` naming the file,
the line and the field. The limits (docs/formats.md, Trace files) bound what one file can
cost before a request is sent: reading is linear in the file, and building one prompt is
linear in its length.
"""

from __future__ import annotations

import csv
import json
import math
import random
import re
from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from strata_plugin import limits
from strata_plugin.errors import StrataError
from strata_plugin.load.workload import TokenSpace

FORMATS = ("mooncake", "burstgpt", "azure", "strata")
MOONCAKE_BLOCK_TOKENS = 512

#: The columns each format must have on every row, in the order detection tries them.
REQUIRED: dict[str, tuple[str, ...]] = {
    "mooncake": ("timestamp", "input_length", "output_length"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "strata": ("timestamp_s", "input_length", "output_length"),
}

# The limits (strata_plugin/limits.py, where each is stated once with its reason): requests
# (data rows) in one file, bytes in one line, tokens in one prompt (a conversation turn's
# history included) and in one answer, and times (offsets from the first request, and
# think times) in seconds: finite, >= 0 and at most MAX_SPAN_S; a case replays in real
# time. Read as this module's globals, so a test may set them lower.
MAX_ROWS = limits.MAX_ROWS
MAX_LINE_BYTES = limits.MAX_LINE_BYTES
MAX_ISL = limits.MAX_ISL
MAX_OSL = limits.MAX_OSL
MAX_SPAN_S = limits.MAX_SPAN_S

_NUMBER = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*", re.ASCII)


class TraceError(StrataError, ValueError):
    """A trace file that cannot be read: the message names the file, line and field.

    ``file`` is the file's name, ``line`` its 1-based line (None for the whole file),
    ``field`` the column (None when the line as a whole is wrong)."""

    def __init__(self, message: str, *, file: str = "", line: int | None = None,
                 field: str | None = None) -> None:
        super().__init__(message)
        self.file, self.line, self.field = file, line, field


@dataclass(frozen=True)
class TraceRequest:
    t_s: float  # arrival, seconds after the trace's first request
    isl: int
    osl: int
    blocks: tuple[str, ...] = ()  # shared prefix blocks, in order
    block_tokens: int = 0  # tokens per shared block (the last may be cut by isl)
    conversation: str = ""  # multi-turn: the conversation this turn belongs to
    turn: int = 0
    think_s: float = 0.0  # pause after the previous turn's answer


@dataclass(frozen=True)
class Trace:
    name: str
    fmt: str
    requests: tuple[TraceRequest, ...]

    @property
    def duration_s(self) -> float:
        return self.requests[-1].t_s if self.requests else 0.0


def _show(v: object, limit: int = 40) -> str:
    """A value for an error message, cut short (a line may be 64 KiB)."""
    text = repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class _Row:
    """One data row: where it is and its values (JSON values, or CSV strings)."""

    file: str
    line: int
    values: Mapping[str, object]

    def fail(self, message: str, name: str | None = None) -> TraceError:
        return TraceError(f"{self.file}:{self.line}: {message}", file=self.file,
                          line=self.line, field=name)

    def get(self, name: str) -> object:
        """The value, None when absent or blank (an empty CSV cell)."""
        v = self.values.get(name)
        return None if isinstance(v, str) and not v.strip() else v

    def need(self, name: str, fmt: str) -> object:
        v = self.get(name)
        if v is None:
            raise self.fail(f"{name} is missing (the {fmt} format needs "
                            f"{', '.join(REQUIRED[fmt])} on every row)", name)
        return v

    def number(self, name: str, v: object, lo: float, hi: float) -> float:
        """A finite number in [lo, hi]: a JSON number, or a plain ASCII decimal string."""
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise self.fail(f"{name}={_show(v)} is not a number", name)
        if isinstance(v, str):
            if not _NUMBER.fullmatch(v):
                raise self.fail(f"{name}={_show(v)} is not a number", name)
        try:
            x = float(v)
        except OverflowError:  # an integer past the float range
            x = math.inf
        if not math.isfinite(x):
            raise self.fail(f"{name}={_show(v)} is not a finite number", name)
        if not lo <= x <= hi:
            raise self.fail(f"{name}={_show(v)} is outside {lo:g}..{hi:g}", name)
        return x

    def count(self, name: str, v: object, lo: int, hi: int) -> int:
        """A whole number of tokens (or a turn) in [lo, hi]."""
        x = self.number(name, v, -math.inf, math.inf)
        if x != math.floor(x):
            raise self.fail(f"{name}={_show(v)} is not a whole number", name)
        if not lo <= x <= hi:
            raise self.fail(f"{name}={_show(v)} is outside {lo}..{hi}", name)
        return int(x)

    def name(self, name: str) -> str:
        """An optional id (a prefix group, a conversation): a string or a whole number."""
        v = self.get(name)
        if v is None:
            return ""
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise self.fail(f"{name}={_show(v)} is not a name (a string or an integer)", name)
        return str(v)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) for every line, each at most MAX_LINE_BYTES and UTF-8."""
    limit = MAX_LINE_BYTES + 2  # the line, then \r\n
    with path.open("rb") as fh:
        n = 0
        while True:
            raw = fh.readline(limit + 1)
            if not raw:
                return
            n += 1
            body = raw.rstrip(b"\r\n")
            if len(body) > MAX_LINE_BYTES:
                raise TraceError(f"{path.name}:{n}: the line is longer than {MAX_LINE_BYTES} "
                                 "bytes (MAX_LINE_BYTES)", file=path.name, line=n)
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError(f"{path.name}:{n}: not UTF-8 text (byte {exc.start + 1} of "
                                 "the line)", file=path.name, line=n) from None
            if n == 1:
                text = text.removeprefix("\ufeff")  # a byte-order mark
            yield n, text


def _counted(path: Path, rows: Iterator[_Row]) -> Iterator[_Row]:
    for i, row in enumerate(rows, 1):
        if i > MAX_ROWS:
            raise row.fail(f"more than {MAX_ROWS} rows (MAX_ROWS); cut the trace "
                           "(e.g. head -n) or sample it")
        yield row


def _jsonl_rows(path: Path, lines: Iterator[tuple[int, str]]) -> Iterator[_Row]:
    for n, text in lines:
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, an int of 4300+ digits
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
            raise TraceError(f"{path.name}:{n}: not JSON ({msg})", file=path.name,
                             line=n) from None
        if not isinstance(value, dict):
            raise TraceError(f"{path.name}:{n}: not a JSON object ({type(value).__name__})",
                             file=path.name, line=n)
        yield _Row(path.name, n, value)


def _csv_rows(path: Path, lines: Iterator[tuple[int, str]]) -> Iterator[_Row]:
    at = [0]  # the physical line the csv reader has read up to

    def feed() -> Iterator[str]:
        for n, text in lines:
            at[0] = n
            yield text + "\n"

    reader = csv.reader(feed())
    header: list[str] | None = None
    try:
        for rec in reader:
            n = at[0]
            if not rec or (len(rec) == 1 and not rec[0].strip()):
                continue
            if header is None:
                header = rec
                dup = sorted({h for h in rec if rec.count(h) > 1})
                if dup:
                    raise TraceError(f"{path.name}:{n}: column {_show(dup[0])} appears twice",
                                     file=path.name, line=n, field=dup[0])
                continue
            if len(rec) != len(header):
                raise TraceError(f"{path.name}:{n}: {len(rec)} fields, the header has "
                                 f"{len(header)}", file=path.name, line=n)
            yield _Row(path.name, n, dict(zip(header, rec)))
    except csv.Error as exc:
        raise TraceError(f"{path.name}:{at[0]}: not CSV ({exc})", file=path.name,
                         line=at[0]) from None


def _rows(path: Path) -> Iterator[_Row]:
    """Every data row of a JSONL or CSV file, checked as text (line length, UTF-8, syntax)."""
    lines = _lines(path)
    first = next(((n, t) for n, t in lines if t.strip()), None)
    if first is None:
        return iter(())

    def again() -> Iterator[tuple[int, str]]:
        yield first
        yield from lines

    jsonl = path.suffix == ".jsonl" or first[1].lstrip().startswith("{")
    return _counted(path, (_jsonl_rows if jsonl else _csv_rows)(path, again()))


def _formats_of(keys: Container[str]) -> list[str]:
    return [f for f, cols in REQUIRED.items() if all(c in keys for c in cols)]


def detect_format(rows: Sequence[tuple[str, Mapping[str, object]]]) -> str:
    """The format of the first row's columns (read_trace then checks every row)."""
    keys = set(rows[0][1]) if rows else set()
    found = _formats_of(keys)
    if not found:
        raise TraceError(f"unknown trace columns {sorted(keys)}; the formats are {FORMATS}")
    return found[0]


def _azure_time(row: _Row, v: object) -> float:
    name = "TIMESTAMP"
    if not isinstance(v, str):
        raise row.fail(f"{name}={_show(v)} is not a date-time", name)
    text = v.strip()
    if "." in text:  # the trace has 7 fractional digits; Python parses up to 6
        head, frac = text.split(".", 1)
        digits = len(frac) - len(frac.lstrip("0123456789"))
        text = f"{head}.{frac[:min(digits, 6)]}{frac[digits:]}"
    try:
        t = datetime.fromisoformat(text)
        if t.tzinfo is None:  # the trace's times are UTC; never the local zone (DST)
            t = t.replace(tzinfo=UTC)
        return t.timestamp()
    except (ValueError, OverflowError, OSError):
        raise row.fail(f"{name}={_show(v)} is not a date-time", name) from None


def _request(row: _Row, fmt: str) -> TraceRequest | None:
    """One row as a request (None: a failure the trace logged, left out)."""
    need = row.need
    if fmt == "mooncake":
        ids = row.get("hash_ids")
        if ids is None:
            ids = []
        if not isinstance(ids, list):
            raise row.fail(f"hash_ids={_show(ids)} is not a list of block ids", "hash_ids")
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, (int, str)):
                raise row.fail(f"hash_ids has {_show(i)}, not a block id", "hash_ids")
        return TraceRequest(
            row.number("timestamp", need("timestamp", fmt), 0, MAX_SPAN_S * 1000) / 1000.0,
            row.count("input_length", need("input_length", fmt), 1, MAX_ISL),
            row.count("output_length", need("output_length", fmt), 1, MAX_OSL),
            tuple(str(i) for i in ids), MOONCAKE_BLOCK_TOKENS)
    if fmt == "burstgpt":
        t = row.number("Timestamp", need("Timestamp", fmt), 0, MAX_SPAN_S)
        osl = row.count("Response tokens", need("Response tokens", fmt), 0, MAX_OSL)
        isl = row.count("Request tokens", need("Request tokens", fmt), 1 if osl else 0, MAX_ISL)
        return TraceRequest(t, isl, osl) if osl else None  # 0 response tokens: a failure
    if fmt == "azure":
        return TraceRequest(_azure_time(row, need("TIMESTAMP", fmt)),
                            row.count("ContextTokens", need("ContextTokens", fmt), 1, MAX_ISL),
                            row.count("GeneratedTokens", need("GeneratedTokens", fmt), 1,
                                      MAX_OSL))
    def opt(name: str) -> object:
        v = row.get(name)
        return 0 if v is None else v

    group = row.name("prefix_group")
    k = row.count("prefix_tokens", opt("prefix_tokens"), 0, MAX_ISL) if group else 0
    conv = row.name("conversation_id")
    turn = row.count("turn", opt("turn"), 0, MAX_ROWS) if conv else 0
    think = row.number("think_s", opt("think_s"), 0, MAX_SPAN_S)
    return TraceRequest(row.number("timestamp_s", need("timestamp_s", fmt), 0, MAX_SPAN_S),
                        row.count("input_length", need("input_length", fmt), 1, MAX_ISL),
                        row.count("output_length", need("output_length", fmt), 1, MAX_OSL),
                        (f"group:{group}",) if group and k else (), k, conv, turn, think)


def _check_span(path: Path, reqs: list[tuple[int, TraceRequest]]) -> None:
    """Absolute times (Azure's date-times): every request within MAX_SPAN_S of the first."""
    t0 = min(q.t_s for _, q in reqs)
    for n, q in reqs:
        if q.t_s - t0 > MAX_SPAN_S:
            raise TraceError(f"{path.name}:{n}: TIMESTAMP is {q.t_s - t0:.0f} s after the "
                             f"trace's first request, over MAX_SPAN_S ({MAX_SPAN_S:g} s)",
                             file=path.name, line=n, field="TIMESTAMP")


def _check_conversations(path: Path, reqs: list[tuple[int, TraceRequest]]) -> None:
    """Each conversation's turns are distinct, and every turn's whole prompt (the
    history and its own input) fits MAX_ISL."""
    convs: dict[str, list[tuple[int, TraceRequest]]] = {}
    for n, q in reqs:
        if q.conversation:
            convs.setdefault(q.conversation, []).append((n, q))
    for turns in convs.values():
        turns.sort(key=lambda nq: nq[1].turn)
        history = 0
        for k, (n, q) in enumerate(turns):
            if k and turns[k - 1][1].turn == q.turn:
                raise TraceError(f"{path.name}:{n}: turn {q.turn} of conversation "
                                 f"{_show(q.conversation)} is also on line {turns[k - 1][0]}",
                                 file=path.name, line=n, field="turn")
            if history + q.isl > MAX_ISL:
                raise TraceError(f"{path.name}:{n}: this turn's prompt (the conversation's "
                                 f"history and input_length) is {history + q.isl} tokens, "
                                 f"over MAX_ISL ({MAX_ISL})", file=path.name, line=n,
                                 field="input_length")
            history += q.isl + q.osl


def read_trace(path: Path | str, fmt: str = "auto") -> Trace:
    """Read a trace file; times become seconds after its first request, in time order.

    Every row is checked (module docstring); a ``TraceError`` names the file, the line and
    the field of the first problem."""
    path = Path(path)
    if fmt != "auto" and fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; expected one of {FORMATS}",
                         file=path.name)
    chosen, first_line = (None if fmt == "auto" else fmt), 0
    reqs: list[tuple[int, TraceRequest]] = []
    left_out = 0
    known: dict[tuple[str, ...], list[str]] = {}  # the formats of each set of columns seen
    try:
        rows = _rows(path)
        for row in rows:
            keys = tuple(row.values)
            found = known.get(keys)
            if found is None:
                found = _formats_of(row.values)
                if len(known) < 64:
                    known[keys] = found
            if chosen is None:
                if not found:
                    raise row.fail(f"unknown trace columns {_show(sorted(row.values), 200)}; the "
                                   f"formats are {FORMATS} (docs/formats.md)")
                chosen, first_line = found[0], row.line
            if chosen not in found:
                if found:
                    was = (f"line {first_line}'s are the {chosen} format's" if first_line
                           else f"the {chosen} format was asked for")
                    raise row.fail(f"the columns are the {found[0]} format's, {was}: a trace "
                                   "is one format")
                missing = next(c for c in REQUIRED[chosen] if c not in row.values)
                row.need(missing, chosen)
            q = _request(row, chosen)
            if q is None:
                left_out += 1
            else:
                reqs.append((row.line, q))
    except OSError as exc:
        raise TraceError(f"{path.name}: cannot read ({exc.strerror or exc})",
                         file=path.name) from None
    if not reqs:
        why = (f" (all {left_out} rows have 0 Response tokens: failures in the trace, left out)"
               if left_out else "")
        raise TraceError(f"{path.name}: no requests{why}", file=path.name)
    assert chosen is not None
    if chosen == "azure":
        _check_span(path, reqs)
    _check_conversations(path, reqs)
    ordered = sorted((q for _, q in reqs), key=lambda q: q.t_s)  # stable: ties keep file order
    t0 = ordered[0].t_s
    return Trace(path.stem, chosen, tuple(replace(q, t_s=q.t_s - t0) for q in ordered))


@dataclass(frozen=True)
class TraceWorkload:
    """A trace as one case: ``strata.replay(TraceWorkload(read_trace(p), ...))``.

    ``time_scale`` stretches (>1) or compresses (<1) the trace's own timing;
    ``length_scale`` shrinks every length (and the block size) so a production trace
    fits a small target; ``block_tokens`` overrides the format's block size before
    scaling; ``max_requests`` keeps the first N; ``max_in_flight`` caps the requests open
    at once (a safety bound, reported when it was reached).
    """

    trace: Trace
    name: str = ""
    time_scale: float = 1.0
    length_scale: float = 1.0
    block_tokens: int | None = None
    max_requests: int | None = None
    max_in_flight: int = 256
    seed: int = 0
    expect_stop: bool = False
    requests_: tuple[TraceRequest, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("time_scale", "length_scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                    math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, not {_show(v)}")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        object.__setattr__(self, "name", self.name or f"trace-{self.trace.name}")
        object.__setattr__(self, "requests_", tuple(self._scaled()))
        if not self.requests_:
            raise ValueError(f"{self.name}: the trace has no requests")
        for i, q in enumerate(self.requests_):
            if q.isl > MAX_ISL or q.osl > MAX_OSL or q.t_s > MAX_SPAN_S \
                    or q.think_s > MAX_SPAN_S:
                raise ValueError(
                    f"{self.name}: request {i} scaled to isl={q.isl}, osl={q.osl}, "
                    f"t_s={q.t_s:g}, think_s={q.think_s:g}: over the trace limits (MAX_ISL "
                    f"{MAX_ISL}, MAX_OSL {MAX_OSL}, MAX_SPAN_S {MAX_SPAN_S:g})")

    def _scaled(self) -> list[TraceRequest]:
        reqs = self.trace.requests[: self.max_requests]
        out = []
        for q in reqs:
            bt = self.block_tokens if self.block_tokens is not None else q.block_tokens
            out.append(replace(
                q, t_s=q.t_s * self.time_scale, isl=max(1, round(q.isl * self.length_scale)),
                osl=max(1, round(q.osl * self.length_scale)),
                block_tokens=max(0, round(bt * self.length_scale)) if q.blocks else 0,
                think_s=q.think_s * self.time_scale))
        return out

    @property
    def requests(self) -> tuple[TraceRequest, ...]:
        return self.requests_

    @property
    def concurrency(self) -> int:
        return self.max_in_flight

    def params(self) -> dict:
        reqs = self.requests_
        span = reqs[-1].t_s if len(reqs) > 1 else 0.0
        return {"arrival": "trace", "trace": self.trace.name, "trace_format": self.trace.fmt,
                "requests": len(reqs), "time_scale": self.time_scale,
                "length_scale": self.length_scale, "block_tokens": self.block_tokens,
                "max_in_flight": self.max_in_flight, "seed": self.seed,
                "isl_mean": sum(q.isl for q in reqs) / len(reqs),
                "osl_mean": sum(q.osl for q in reqs) / len(reqs),
                "offered_rate": (len(reqs) - 1) / span if span > 0 else None,
                "shared_block_requests": sum(1 for q in reqs if q.blocks),
                "conversations": len({q.conversation for q in reqs if q.conversation})}

    def conversations(self) -> dict[str, list[int]]:
        """Request indices of each conversation, in turn order."""
        out: dict[str, list[int]] = {}
        for i, q in enumerate(self.requests_):
            if q.conversation:
                out.setdefault(q.conversation, []).append(i)
        for ids in out.values():
            ids.sort(key=lambda i: self.requests_[i].turn)
        return out


def answer_tokens(q: TraceRequest, index: int, space: TokenSpace, *, seed: int = 0,
                  salt: str = "") -> tuple[int, ...]:
    """The tokens that stand for request ``index``'s answer in the next turn's prompt.

    The server's own answer is not known as token ids on every API, so a turn's history
    carries a fixed answer of the right length; the prefix cache can then reuse the
    previous turns' prompts, not their answers."""
    rng = random.Random(f"{seed}:answer:{index}:{salt}")
    return tuple(rng.randrange(space.low, space.high) for _ in range(q.osl))


def conversation_prompts(tw: TraceWorkload, space: TokenSpace, *, salt: str = ""
                         ) -> dict[int, tuple[int, ...]]:
    """Every multi-turn request's full prompt: previous inputs and answers, then its own."""
    out: dict[int, tuple[int, ...]] = {}
    for ids in tw.conversations().values():
        history: tuple[int, ...] = ()
        for i in ids:
            q = tw.requests[i]
            out[i] = history + trace_prompt(q, i, space, seed=tw.seed, salt=salt)
            history = out[i] + answer_tokens(q, i, space, seed=tw.seed, salt=salt)
    return out


def trace_prompt(q: TraceRequest, index: int, space: TokenSpace, *, seed: int = 0,
                 salt: str = "") -> tuple[int, ...]:
    """Request ``index``'s exact prompt: its shared blocks' tokens, then its own."""
    head: list[int] = []
    for b in q.blocks:
        if len(head) >= q.isl or q.block_tokens <= 0:
            break
        rng = random.Random(f"{seed}:block:{b}:{salt}")
        head.extend(rng.randrange(space.low, space.high) for _ in range(q.block_tokens))
    head = head[: q.isl]
    rng = random.Random(f"{seed}:trace:{index}:{salt}")
    tail = [rng.randrange(space.low, space.high) for _ in range(q.isl - len(head))]
    return tuple(head + tail)

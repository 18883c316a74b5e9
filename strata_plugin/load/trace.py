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
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from strata_plugin.errors import StrataError
from strata_plugin.load.workload import TokenSpace

FORMATS = ("mooncake", "burstgpt", "azure", "strata")
MOONCAKE_BLOCK_TOKENS = 512


class TraceError(StrataError, ValueError):
    """A trace file that cannot be read: the message names the file, line and field."""


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


def _int(v: object, where: str, name: str) -> int:
    try:
        out = int(float(str(v)))
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {name}={v!r} is not a number") from None
    if out < 0:
        raise TraceError(f"{where}: {name}={v!r} is negative")
    return out


def _float(v: object, where: str, name: str) -> float:
    try:
        return float(str(v))
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {name}={v!r} is not a number") from None


def _rows(path: Path) -> list[tuple[str, dict]]:
    """(where, row) for each JSONL line or CSV row."""
    text = path.read_text()
    if path.suffix == ".jsonl" or text.lstrip().startswith("{"):
        out = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    out.append((f"{path.name}:{i}", json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise TraceError(f"{path.name}:{i}: not JSON ({exc.msg})") from None
        return out
    reader = csv.DictReader(text.splitlines())
    return [(f"{path.name}:{i}", row) for i, row in enumerate(reader, 2)]


def detect_format(rows: Sequence[tuple[str, dict]]) -> str:
    keys = set(rows[0][1]) if rows else set()
    if {"timestamp", "input_length", "output_length"} <= keys:
        return "mooncake"
    if {"Timestamp", "Request tokens", "Response tokens"} <= keys:
        return "burstgpt"
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= keys:
        return "azure"
    if {"timestamp_s", "input_length", "output_length"} <= keys:
        return "strata"
    raise TraceError(f"unknown trace columns {sorted(keys)}; the formats are {FORMATS}")


def _azure_time(v: str, where: str) -> float:
    text = v.strip()
    if "." in text:  # the trace has 7 fractional digits; Python parses up to 6
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise TraceError(f"{where}: TIMESTAMP={v!r} is not a date-time") from None


def read_trace(path: Path | str, fmt: str = "auto") -> Trace:
    """Read a trace file; times become seconds after its first request, in time order."""
    path = Path(path)
    rows = _rows(path)
    if not rows:
        raise TraceError(f"{path.name}: no requests")
    fmt = detect_format(rows) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; expected one of {FORMATS}")
    reqs: list[TraceRequest] = []
    for where, r in rows:
        if fmt == "mooncake":
            ids = r.get("hash_ids") or []
            reqs.append(TraceRequest(
                _float(r["timestamp"], where, "timestamp") / 1000.0,
                _int(r["input_length"], where, "input_length"),
                _int(r["output_length"], where, "output_length"),
                tuple(str(i) for i in ids), MOONCAKE_BLOCK_TOKENS))
        elif fmt == "burstgpt":
            osl = _int(r["Response tokens"], where, "Response tokens")
            if osl == 0:
                continue
            reqs.append(TraceRequest(_float(r["Timestamp"], where, "Timestamp"),
                                     _int(r["Request tokens"], where, "Request tokens"), osl))
        elif fmt == "azure":
            reqs.append(TraceRequest(_azure_time(r["TIMESTAMP"], where),
                                     _int(r["ContextTokens"], where, "ContextTokens"),
                                     _int(r["GeneratedTokens"], where, "GeneratedTokens")))
        else:
            group = str(r.get("prefix_group") or "")
            k = _int(r.get("prefix_tokens") or 0, where, "prefix_tokens") if group else 0
            conv = str(r.get("conversation_id") or "")
            reqs.append(TraceRequest(_float(r["timestamp_s"], where, "timestamp_s"),
                                     _int(r["input_length"], where, "input_length"),
                                     _int(r["output_length"], where, "output_length"),
                                     (f"group:{group}",) if group and k else (), k, conv,
                                     _int(r.get("turn") or 0, where, "turn") if conv else 0,
                                     _float(r.get("think_s") or 0, where, "think_s")))
    bad = [i for i, q in enumerate(reqs) if q.isl < 1 or q.osl < 1]
    if bad:
        raise TraceError(f"{path.name}: {len(bad)} request(s) with no input or output tokens")
    reqs.sort(key=lambda q: q.t_s)
    t0 = reqs[0].t_s
    reqs = [replace(q, t_s=q.t_s - t0) for q in reqs]
    return Trace(path.stem, fmt, tuple(reqs))


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
        if self.time_scale <= 0 or self.length_scale <= 0:
            raise ValueError("time_scale and length_scale must be > 0")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        object.__setattr__(self, "name", self.name or f"trace-{self.trace.name}")
        object.__setattr__(self, "requests_", tuple(self._scaled()))
        if not self.requests_:
            raise ValueError(f"{self.name}: the trace has no requests")

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

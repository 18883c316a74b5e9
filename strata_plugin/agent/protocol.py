"""The agent's line protocol, shared by the agent (writer) and the handle (reader).

stdout, one line each:

* a line that begins with a digit is one telemetry sample, already a CSV row of
  ``wall_ns,node,source,device,metric,value,kind`` (docs/formats.md), so the
  harness can append it to ``samples/<source>.csv`` without re-encoding it;
* any other line is ``<keyword> <payload>``: ``hello {json}``, ``pong <id> <wall_ns>``,
  ``unavailable {json}``, ``command {json}``, ``info {json}``, ``event {json}``,
  ``snapshot <label> {json}``, ``error {json}``, ``bye {json}``.

stdin: ``ping <id>``, ``stop``, ``pids <pid>...``, ``snapshot <label>``; EOF means stop.
See docs/agent.md for the full description.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

#: The agent's version, sent in its ``hello`` line and recorded in snapshots.
AGENT_VERSION = "0.1.0"

PROTOCOL_VERSION = 1

CSV_HEADER = "wall_ns,node,source,device,metric,value,kind"
SAMPLE_COLUMNS = tuple(CSV_HEADER.split(","))
KINDS = ("gauge", "counter")
GAUGE = "gauge"
COUNTER = "counter"

#: Keywords of the non-sample lines the agent writes.
AGENT_KEYWORDS = (
    "hello",
    "pong",
    "unavailable",
    "command",
    "info",
    "event",
    "snapshot",
    "error",
    "bye",
)

_QUOTE_CHARS = (",", '"', "\n", "\r")
_csv_cache: dict[str, str] = {}


def csv_field(text: str) -> str:
    """Quote a CSV field only when it needs it (RFC 4180); cached, as names repeat."""
    cached = _csv_cache.get(text)
    if cached is not None:
        return cached
    out = text
    if any(c in text for c in _QUOTE_CHARS):
        out = '"' + text.replace("\r", " ").replace("\n", " ").replace('"', '""') + '"'
    if len(_csv_cache) < 100_000:
        _csv_cache[text] = out
    return out


def format_value(value: float | int) -> str | None:
    """Shortest exact text of a value; None for NaN/inf, which are never emitted."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value) or math.isinf(value):
        return None
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def sample_line(
    wall_ns: int, node: str, source: str, device: str, metric: str, value: float | int, kind: str
) -> str | None:
    """One sample as its CSV row with a trailing newline (None when the value is not finite)."""
    text = format_value(value)
    if text is None:
        return None
    return f"{wall_ns},{node},{source},{csv_field(device)},{csv_field(metric)},{text},{kind}\n"


def control_line(keyword: str, *parts: Any) -> str:
    """``keyword part...``; dicts and lists are written as compact JSON."""
    words = [keyword]
    for p in parts:
        if isinstance(p, (dict, list)):
            words.append(json.dumps(p, separators=(",", ":"), sort_keys=True))
        else:
            words.append(str(p))
    return " ".join(words) + "\n"


def is_sample_line(line: str | bytes) -> bool:
    if not line:
        return False
    first = line[0]
    if isinstance(first, int):
        return 48 <= first <= 57
    return first.isdigit()


def valid_label(text: str) -> bool:
    """Node names and sources travel unquoted: no comma, quote, space or newline."""
    return bool(text) and not any(c in text for c in ',"\n\r \t')


@dataclass(frozen=True)
class Sample:
    """One parsed sample row (the handle writes rows verbatim; tests and tools parse them)."""

    wall_ns: int
    node: str
    source: str
    device: str
    metric: str
    value: float
    kind: str


def parse_sample_line(line: str) -> Sample:
    import csv

    row = next(csv.reader([line.rstrip("\n")]))
    if len(row) != 7:
        raise ValueError(f"sample row has {len(row)} fields, expected 7: {line!r}")
    wall, node, source, device, metric, value, kind = row
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} in {line!r}")
    return Sample(int(wall), node, source, device, metric, float(value), kind)


def split_control(line: str) -> tuple[str, str]:
    """``(keyword, rest)`` of a non-sample line."""
    keyword, _, rest = line.rstrip("\n").partition(" ")
    return keyword, rest

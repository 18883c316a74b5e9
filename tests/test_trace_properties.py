"""Property tests over the trace reader (Hypothesis, fixed seeds): whatever a file holds
(bytes, JSON values of every type, numbers such as nan, inf, 1e400 and negatives, CSV
cells of any text), ``read_trace`` gives a trace a ``TraceWorkload`` takes, or a
``TraceError`` naming the file, the line and the field; never another exception, and
never more than ``BUDGET_S`` for one of these small files."""

from __future__ import annotations

import json
import math
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata_plugin.load import trace as tr
from strata_plugin.load.trace import TraceError, TraceWorkload, read_trace
from tests.own_cpu import own_cpu

#: The reader's own CPU time for one file of at most a dozen short lines; it takes about
#: a millisecond. CPU time, not wall time: CI's loaded host once stalled a 1 ms read for
#: 1.7 s of wall time, and a scheduler's pause is not the reader's cost; nor is the garbage
#: collector's pass over the whole session's heap (tests/own_cpu.py).
BUDGET_S = 1.0
SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=100,
                    suppress_health_check=[HealthCheck.too_slow])

#: Each format's columns, as docs/formats.md lists them.
FORMAT_COLUMNS = {
    "mooncake": ("timestamp", "input_length", "output_length"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "strata": ("timestamp_s", "input_length", "output_length"),
}
COLUMNS = sorted({c for cols in FORMAT_COLUMNS.values() for c in cols}
                 | {"hash_ids", "prefix_group", "prefix_tokens", "conversation_id", "turn",
                    "think_s", "Model", "Log Type"})
RAW_NUMBERS = ["1e400", "-1e400", "NaN", "Infinity", "-Infinity", "1e-400", "-0", "0",
               "1", "3.5", "-3", "1e12", "1048576", "1048577", "31622400", "1" * 400]
CELLS = ["", " ", "1e400", "nan", "inf", "-1", "0", "1", "2.5", "7", "1e12", "0x10",
         "\uff11", "1_000", "2023-11-16 18:15:46.6805900", "2023-02-30 00:00:00",
         "9999-12-31 23:59:59", "0001-01-01 00:00:00", "2023-11-16T18:15:46+05:00", "a,b",
         '"', "\x00", "\u00e9t\u00e9"]

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                         st.sampled_from(CELLS))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)


@st.composite
def json_token(draw: st.DrawFn) -> str:
    """A JSON value as text, including the literals Python's json reads as inf or nan."""
    if draw(st.booleans()):
        return draw(st.sampled_from(RAW_NUMBERS))
    return json.dumps(draw(json_values))


GOOD = {"timestamp": "5", "timestamp_s": "0.5", "Timestamp": "2.0",
        "TIMESTAMP": '"2023-11-16 18:15:46.6805900"', "hash_ids": "[1, 2]",
        "conversation_id": '"c"', "prefix_group": '"g"'}


@st.composite
def jsonl_file(draw: st.DrawFn) -> bytes:
    """Rows mostly of one format with good values, each value or line now and then
    replaced by anything: another type, a raw literal, junk text or bytes."""
    fmt = draw(st.sampled_from(sorted(FORMAT_COLUMNS)))
    lines = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["row"] * 12 + ["other", "text", "bytes", "blank"]))
        if kind == "text":
            lines.append(draw(st.text(max_size=20)).encode("utf-8", "surrogatepass"))
            continue
        if kind == "bytes":
            lines.append(draw(st.binary(max_size=20)))
            continue
        if kind == "blank":
            lines.append(b"  ")
            continue
        keys = list(FORMAT_COLUMNS[draw(st.sampled_from(sorted(FORMAT_COLUMNS)))
                                if kind == "other" else fmt])
        if draw(st.integers(0, 15)) == 0:
            keys.pop(draw(st.integers(0, len(keys) - 1)))  # a column goes missing
        keys += draw(st.lists(st.sampled_from(COLUMNS), max_size=2))
        fields = []
        for k in keys:
            v = json_token() if draw(st.integers(0, 9)) == 0 else st.just(GOOD.get(k, "3"))
            fields.append(f"{json.dumps(k)}: {draw(v)}")
        lines.append(("{" + ", ".join(fields) + "}").encode())
    return b"\n".join(lines) + b"\n"


@st.composite
def csv_file(draw: st.DrawFn) -> bytes:
    fmt = draw(st.sampled_from(sorted(FORMAT_COLUMNS)))
    header = list(FORMAT_COLUMNS[fmt]) + draw(st.lists(st.sampled_from(COLUMNS), max_size=2,
                                                    unique=True))
    if draw(st.booleans()):
        header = draw(st.permutations(header))
    good = {"TIMESTAMP": "2023-11-16 18:15:46.6805900", "Timestamp": "2.5"}
    anything = st.one_of(st.sampled_from(CELLS), st.text(max_size=8))
    lines = [",".join(header)]
    for _ in range(draw(st.integers(0, 8))):
        n = len(header) + (draw(st.sampled_from([-1, 1])) if draw(st.integers(0, 15)) == 0
                           else 0)
        cells = [draw(anything) if draw(st.integers(0, 9)) == 0 else good.get(h, "7")
                 for h in [*header, "x"][:max(n, 0)]]
        lines.append(",".join(cells))
    return "\n".join(lines).encode("utf-8", "surrogatepass")


def check(path: Path, data: bytes) -> str:
    """The property: a valid trace, or a TraceError naming the file and the line."""
    path.write_bytes(data)
    lines = data.count(b"\n") + 1
    with own_cpu() as spent:
        outcome = _read_and_check(path, lines)
    assert spent() < BUDGET_S
    return outcome


def _read_and_check(path: Path, lines: int) -> str:
    try:
        trace = read_trace(path)
    except TraceError as err:
        assert err.file == path.name
        if err.line is None:
            assert str(err).startswith(f"{path.name}: ")
        else:
            assert 1 <= err.line <= lines
            assert str(err).startswith(f"{path.name}:{err.line}: ")
        if err.field is not None:
            assert err.field in str(err)
        outcome = "refused"
    else:
        reqs = trace.requests
        assert reqs and reqs[0].t_s == 0.0
        assert all(a.t_s <= b.t_s for a, b in pairwise(reqs))
        for q in reqs:
            assert math.isfinite(q.t_s) and 0 <= q.t_s <= tr.MAX_SPAN_S
            assert 1 <= q.isl <= tr.MAX_ISL and 1 <= q.osl <= tr.MAX_OSL
            assert math.isfinite(q.think_s) and 0 <= q.think_s <= tr.MAX_SPAN_S
        tw = TraceWorkload(trace)
        assert tw.params()["requests"] == len(reqs)
        outcome = "read"
    return outcome


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces")


def run_property(strategy: st.SearchStrategy[bytes], path: Path) -> Counter[str]:
    """Run ``check`` over the strategy's files; the outcomes, counted (both must occur,
    or the property would hold vacuously)."""
    seen: Counter[str] = Counter()

    @SETTINGS
    @given(data=strategy)
    def prop(data: bytes) -> None:
        seen[check(path, data)] += 1

    prop()
    return seen


def test_any_jsonl_rows_read_or_are_named(folder):
    seen = run_property(jsonl_file(), folder / "p.jsonl")
    assert seen["read"] >= 10 and seen["refused"] >= 10, seen


def test_any_csv_rows_read_or_are_named(folder):
    seen = run_property(csv_file(), folder / "p.csv")
    assert seen["read"] >= 10 and seen["refused"] >= 10, seen


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".txt"])
def test_any_bytes_read_or_are_named(folder, suffix):
    seen = run_property(st.binary(max_size=200), folder / f"p{suffix}")
    assert seen["refused"] >= 20, seen


def test_the_columns_here_are_the_readers():
    assert FORMAT_COLUMNS == tr.REQUIRED

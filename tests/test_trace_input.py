"""The trace reader on hostile and broken files: every row is checked, every error is a
``TraceError`` naming the file, the line and the field, and the stated limits
(load/trace.py, docs/formats.md) hold just below and just above each one."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from strata_plugin.load import trace as tr
from strata_plugin.load.trace import TraceError, TraceWorkload, read_trace, trace_prompt
from strata_plugin.load.workload import TokenSpace
from tests.own_cpu import own_cpu

SPACE = TokenSpace(300, 1000)


def _jsonl(tmp_path: Path, rows: list, name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def _moon(t: object = 0, isl: object = 10, osl: object = 5, **kw: object) -> dict:
    return {"timestamp": t, "input_length": isl, "output_length": osl, **kw}


def _strata(t: object = 0.0, isl: object = 10, osl: object = 5, **kw: object) -> dict:
    return {"timestamp_s": t, "input_length": isl, "output_length": osl, **kw}


def _raises(path: Path, line: int | None, field: str | None, match: str) -> TraceError:
    with pytest.raises(TraceError, match=match) as info:
        read_trace(path)
    err = info.value
    assert (err.file, err.line, err.field) == (path.name, line, field), str(err)
    assert str(err).startswith(f"{path.name}:{line}: " if line else f"{path.name}: ")
    return err


# --- each bare traceback of the old reader, now a named error ---------------------------------


def test_a_later_row_missing_a_column_names_its_line_and_the_column(tmp_path):
    # was a KeyError: the format came from row 0 and row 2 was never checked
    p = _jsonl(tmp_path, [_moon(), {"timestamp": 5, "input_length": 10}])
    _raises(p, 2, "output_length", r"t.jsonl:2: output_length is missing")


def test_a_row_that_is_not_an_object_names_its_line(tmp_path):
    # was an AttributeError ('list' object has no attribute 'get')
    p = _jsonl(tmp_path, [_strata(), "[1, 2]"])
    _raises(p, 2, None, r"t.jsonl:2: not a JSON object \(list\)")


@pytest.mark.parametrize("text", ["1e400", "-1e400", "NaN", "Infinity"])
def test_a_number_past_the_float_range_or_nan_is_named(tmp_path, text):
    # 1e400 was an OverflowError out of int(float(...)); NaN became a length
    p = tmp_path / "t.jsonl"
    p.write_text(f'{{"timestamp": 0, "input_length": {text}, "output_length": 3}}\n')
    _raises(p, 1, "input_length", r"input_length=.* is not a finite number")


def test_a_trace_whose_every_row_is_a_logged_failure_says_so(tmp_path):
    # was an IndexError: every BurstGPT row had 0 response tokens, reqs[0] on an empty list
    p = tmp_path / "b.csv"
    p.write_text("Timestamp,Model,Request tokens,Response tokens\n1.0,m,10,0\n2.0,m,12,0\n")
    _raises(p, None, None, r"b.csv: no requests \(all 2 rows have 0 Response tokens")


def test_bytes_that_are_not_utf8_name_the_line(tmp_path):
    # was a UnicodeDecodeError out of read_text()
    p = tmp_path / "t.jsonl"
    p.write_bytes(json.dumps(_moon()).encode() + b"\n" + b'{"timestamp": "\xff\xfe"}\n')
    _raises(p, 2, None, r"t.jsonl:2: not UTF-8 text")


@pytest.mark.parametrize("t", ["NaN", "-Infinity"])
def test_a_timestamp_that_is_not_finite_is_refused(tmp_path, t):
    # NaN timestamps were accepted: the sort was broken and offsets came out negative
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(_strata(1.0)) + "\n" + f'{{"timestamp_s": {t}, "input_length": 4, '
                 '"output_length": 2}\n' + json.dumps(_strata(0.5)) + "\n")
    _raises(p, 2, "timestamp_s", r"timestamp_s=.* is not a finite number")


def test_a_negative_think_time_or_timestamp_is_refused(tmp_path):
    p = _jsonl(tmp_path, [_strata(conversation_id="c", turn=0),
                          _strata(conversation_id="c", turn=1, think_s=-0.5)])
    _raises(p, 2, "think_s", r"think_s=-0.5 is outside 0\.\.")
    q = _jsonl(tmp_path, [_moon(0), _moon(-3)], "m.jsonl")
    _raises(q, 2, "timestamp", r"timestamp=-3 is outside 0\.\.")


def test_a_huge_input_length_is_refused_before_any_prompt_is_built(tmp_path):
    # isl=1e12 was read as 10**12 tokens; building its prompt ran for as long as one let it
    p = _jsonl(tmp_path, [_moon(isl=1e12)])
    # the reader's CPU time: a loaded host's pause is not its cost (tests/own_cpu.py)
    with own_cpu() as spent:
        _raises(p, 1, "input_length", r"input_length=1000000000000.0 is outside 1\.\.1048576")
    assert spent() < 1.0


@pytest.mark.parametrize("v, what", [(3.5, "not a whole number"), ("12abc", "not a number"),
                                     (True, "not a number"), ([3], "not a number"),
                                     ("\uff11\uff12", "not a number"),  # full-width digits
                                     (0, r"outside 1\.\.")])
def test_token_counts_are_whole_ascii_numbers_of_at_least_one(tmp_path, v, what):
    p = _jsonl(tmp_path, [_strata(osl=v)])
    _raises(p, 1, "output_length", f"output_length=.* {what}")


# --- one format per file, every row ----------------------------------------------------------


def test_mixed_formats_across_rows_name_the_line(tmp_path):
    p = _jsonl(tmp_path, [_moon(), _moon(100), _strata(0.2)])
    _raises(p, 3, None, r"t.jsonl:3: the columns are the strata format's, line 1's are the "
            r"mooncake format's: a trace is one format")


def test_an_asked_format_is_checked_on_every_row_too(tmp_path):
    p = _jsonl(tmp_path, [_strata(), _moon()])
    with pytest.raises(TraceError, match=r"t.jsonl:2: the columns are the mooncake format's, "
                       r"the strata format was asked for") as info:
        read_trace(p, fmt="strata")
    assert info.value.line == 2


def test_csv_rows_are_checked_one_by_one(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,190,7\n2023-11-16 18:15:47,,7\n")
    _raises(p, 3, "ContextTokens", r"a.csv:3: ContextTokens is missing")
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:47,190,7,9\n")
    _raises(p, 2, None, r"a.csv:2: 4 fields, the header has 3")
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,190,7\n")
    _raises(p, 2, "TIMESTAMP", r"a.csv:2: TIMESTAMP='yesterday' is not a date-time")


def test_azure_date_times_are_utc_whatever_the_local_zone(tmp_path, monkeypatch):
    """Naive date-times are the trace's UTC: a local zone's DST change must not move one."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        p = tmp_path / "a.csv"  # New York's clocks went back at 02:00 on 2023-11-05
        p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-05 01:30:00.0000000,10,2\n2023-11-05 02:30:00.5000000,10,2\n")
        assert read_trace(p).requests[1].t_s == pytest.approx(3600.5)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_blank_lines_and_a_byte_order_mark_are_not_rows(tmp_path):
    p = tmp_path / "b.csv"
    p.write_bytes(b"\xef\xbb\xbfTimestamp,Model,Request tokens,Response tokens\n\n"
                  b"1.0,m,10,3\n\n2.5,m,12,4\n")
    t = read_trace(p)
    assert t.fmt == "burstgpt" and [q.t_s for q in t.requests] == [0.0, 1.5]


# --- the limits, just below and just above -----------------------------------------------------


def test_input_and_output_lengths_at_their_limits(tmp_path):
    ok = _jsonl(tmp_path, [_moon(isl=tr.MAX_ISL, osl=tr.MAX_OSL)])
    q = read_trace(ok).requests[0]
    assert (q.isl, q.osl) == (tr.MAX_ISL, tr.MAX_OSL)
    _raises(_jsonl(tmp_path, [_moon(isl=tr.MAX_ISL + 1)]), 1, "input_length",
            r"outside 1\.\.1048576")
    _raises(_jsonl(tmp_path, [_moon(osl=tr.MAX_OSL + 1)]), 1, "output_length",
            r"outside 1\.\.1048576")


def test_a_prompt_at_the_limit_builds_in_the_stated_time():
    """MAX_ISL's comment: 1.8 s measured on the shared 2-core VM; the bound is 5 s."""
    q = tr.TraceRequest(0.0, tr.MAX_ISL, 1)
    t0 = time.monotonic()
    assert len(trace_prompt(q, 0, SPACE)) == tr.MAX_ISL
    assert time.monotonic() - t0 < 5.0


def test_timestamps_at_the_span_limit(tmp_path):
    top = tr.MAX_SPAN_S
    assert read_trace(_jsonl(tmp_path, [_strata(0), _strata(top)])).duration_s == top
    _raises(_jsonl(tmp_path, [_strata(0), _strata(math.nextafter(top, math.inf))]), 2,
            "timestamp_s", r"timestamp_s=.* is outside 0\.\.3.16224e\+07")
    _raises(_jsonl(tmp_path, [_moon(top * 1000 * 1.0001)]), 1, "timestamp", "outside")
    a = tmp_path / "a.csv"  # Azure's absolute date-times: the span from the first one
    a.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 00:00:00,1,1\n"
                 "2024-01-02 00:00:00,1,1\n")
    assert read_trace(a).duration_s == top  # 2023-01-01 + 366 days = 2024-01-02
    a.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 00:00:00,1,1\n"
                 "2024-01-02 00:00:01,1,1\n")
    _raises(a, 3, "TIMESTAMP", r"a.csv:3: TIMESTAMP is 31622401 s after the trace's first")


def test_line_length_at_its_limit(tmp_path):
    def line(n: int) -> str:
        base = json.dumps(_moon(pad=""))
        return json.dumps(_moon(pad="x" * (n - len(base))))

    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(_moon()) + "\r\n" + line(tr.MAX_LINE_BYTES) + "\r\n")
    assert len(read_trace(p).requests) == 2
    p.write_text(json.dumps(_moon()) + "\n" + line(tr.MAX_LINE_BYTES + 1) + "\n")
    _raises(p, 2, None, r"t.jsonl:2: the line is longer than 65536 bytes")
    p.write_text(json.dumps(_moon()) + "\n" + "9" * (10 * tr.MAX_LINE_BYTES))  # no newline
    _raises(p, 2, None, r"longer than 65536")


def test_row_count_at_its_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(tr, "MAX_ROWS", 5)
    assert len(read_trace(_jsonl(tmp_path, [_moon(i) for i in range(5)])).requests) == 5
    _raises(_jsonl(tmp_path, [_moon(i) for i in range(6)]), 6, None, r"more than 5 rows")


def test_a_conversation_turns_whole_prompt_at_the_limit(tmp_path):
    """Turn k's prompt is the previous inputs and answers plus its own: that must fit."""
    first = _strata(isl=1000, osl=24, conversation_id="c", turn=0)
    fits = tr.MAX_ISL - 1024
    ok = _jsonl(tmp_path, [first, _strata(isl=fits, osl=1, conversation_id="c", turn=1)])
    tw = TraceWorkload(read_trace(ok))
    assert len(tr.conversation_prompts(tw, SPACE)[1]) == tr.MAX_ISL
    bad = _jsonl(tmp_path, [first, _strata(isl=fits + 1, osl=1, conversation_id="c", turn=1)])
    _raises(bad, 2, "input_length", r"this turn's prompt .* is 1048577 tokens")


def test_a_conversation_turn_appears_once(tmp_path):
    p = _jsonl(tmp_path, [_strata(conversation_id="c", turn=0),
                          _strata(1.0, conversation_id="c", turn=1),
                          _strata(2.0, conversation_id="c", turn=1)])
    err = _raises(p, 3, "turn", r"turn 1 of conversation 'c' is also on line 2")
    assert "line 2" in str(err)


def test_a_scale_past_the_limits_or_not_finite_is_refused(tmp_path):
    t = read_trace(_jsonl(tmp_path, [_moon(isl=tr.MAX_ISL // 2 + 1)]))
    TraceWorkload(t, length_scale=1.0)
    with pytest.raises(ValueError, match="over the trace limits"):
        TraceWorkload(t, length_scale=2.0)
    for bad in (math.nan, math.inf, 0, -1):
        with pytest.raises(ValueError, match="time_scale must be a finite number > 0"):
            TraceWorkload(t, time_scale=bad)

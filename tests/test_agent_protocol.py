"""The line protocol: sample rows are valid CSV rows of docs/formats.md."""

from __future__ import annotations

import csv
import io
import math

import pytest

from strata_plugin.agent import protocol
from strata_plugin.agent.collectors.base import Collector


def test_sample_line_is_a_csv_row_and_round_trips() -> None:
    line = protocol.sample_line(
        123, "n1", "prom", 'engine=0;le="0.1",x', "ttft_seconds_bucket", 40.0, "counter"
    )
    row = next(csv.reader(io.StringIO(line)))
    assert row == [
        "123",
        "n1",
        "prom",
        'engine=0;le="0.1",x',
        "ttft_seconds_bucket",
        "40",
        "counter",
    ]
    s = protocol.parse_sample_line(line)
    assert (s.wall_ns, s.device, s.value, s.kind) == (123, 'engine=0;le="0.1",x', 40.0, "counter")
    assert protocol.is_sample_line(line) and protocol.is_sample_line(line.encode())
    assert not protocol.is_sample_line("hello {}")


def test_values_are_exact_and_non_finite_values_are_dropped() -> None:
    assert protocol.format_value(3) == "3"
    assert protocol.format_value(True) == "1"
    assert protocol.format_value(0.1) == "0.1"
    assert protocol.format_value(2.0) == "2"
    assert float(protocol.format_value(1 / 3)) == 1 / 3
    assert protocol.format_value(math.nan) is None
    assert protocol.sample_line(1, "n", "s", "", "m", math.inf, "gauge") is None


def test_newlines_never_break_a_row() -> None:
    line = protocol.sample_line(1, "n", "log", "a\nb", "m", 1, "gauge")
    assert line.count("\n") == 1


def test_control_lines() -> None:
    line = protocol.control_line("unavailable", {"collector": "nvml", "reason": "x"})
    assert line == 'unavailable {"collector":"nvml","reason":"x"}\n'
    assert protocol.split_control(line) == ("unavailable", '{"collector":"nvml","reason":"x"}')
    assert protocol.control_line("pong", "p1", 42) == "pong p1 42\n"


def test_parse_rejects_bad_rows() -> None:
    with pytest.raises(ValueError):
        protocol.parse_sample_line("1,n,s,d,m,1,sometimes\n")
    with pytest.raises(ValueError):
        protocol.parse_sample_line("1,n,s\n")


def test_labels() -> None:
    assert protocol.valid_label("gpu-node-1")
    for bad in ("", "a b", "a,b", 'a"b'):
        assert not protocol.valid_label(bad)


def test_collector_reports_each_unavailable_key_once() -> None:
    c = Collector()
    c.mark_unavailable("gpu0/x", "first")
    c.mark_unavailable("gpu0/x", "second")
    assert c.drain()[0] == {"gpu0/x": "second"}
    c.mark_unavailable("gpu0/x", "third")
    assert c.drain()[0] == {}

"""Following a server log with named regexes: growth, partial lines, truncation, rotation."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from strata_plugin.agent.collectors.base import Unavailable
from strata_plugin.agent.collectors.log import LogCollector, LogFollower, parse_pattern

FIXTURE = Path(__file__).parent / "data" / "logs" / "llamacpp_server.log"


def values(emits):
    out: dict[str, list[float]] = {}
    for _, _, metric, value, _ in emits:
        out.setdefault(metric, []).append(value)
    return out


def append(path: Path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


def test_llamacpp_timing_lines_with_default_patterns(tmp_path) -> None:
    log = tmp_path / "server.log"
    log.write_text("old line before the agent started\nprompt eval time = 1.0 ms / 1 tokens\n")
    c = LogCollector(str(log))
    c.probe()
    assert c.sample(time.time_ns()) == []  # starts at the end: old timings are not replayed
    append(log, FIXTURE.read_text())
    emits = c.sample(time.time_ns())
    v = values(emits)
    assert v["llama_prompt.ms"] == [37.5, 412.03]
    assert v["llama_prompt.tokens"] == [12, 512]
    assert v["llama_eval.ms"] == [190.19, 1501.77]  # "prompt eval" lines are not eval lines
    assert v["llama_eval.tokens"] == [16, 128]
    assert v["llama_eval.count"] == [1, 2]
    assert v["llama_eval.tokens_total"] == [16, 144]
    assert v["llama_total.tokens"] == [28, 640]
    assert v["llama_draft.accepted"] == [12] and v["llama_draft.generated"] == [21]
    kinds = {m: k for _, _, m, _, k in emits}
    assert kinds["llama_eval.ms"] == "gauge" and kinds["llama_eval.ms_total"] == "counter"
    walls = [w for w, *_ in emits]
    assert walls == sorted(walls)


def test_user_patterns_text_groups_become_events(tmp_path) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    name, rx = parse_pattern(r"req=POST (?P<path>/\S+) \S+ (?P<status>\d+)")
    c = LogCollector(str(log), {name: rx.pattern, "idle": r"all slots are idle"}, defaults=False)
    c.probe()
    append(log, FIXTURE.read_text())
    v = values(c.sample(time.time_ns()))
    assert v["req.status"] == [200]
    assert v["idle.count"] == [1, 2, 3]
    _, _, _, events = c.drain()
    req = [e for e in events if e["name"] == "req"]
    assert len(req) == 1 and req[0]["groups"] == {"path": "/v1/chat/completions"}
    assert "POST /v1/chat/completions" in req[0]["line"]
    assert sum(1 for e in events if e["name"] == "idle") == 3  # marker-only pattern


def test_follower_partial_lines_truncation_rotation_and_late_file(tmp_path) -> None:
    path = tmp_path / "late.log"
    f = LogFollower(str(path))
    assert f.lines() == []  # does not exist yet
    path.write_text("first\nsec")
    assert f.lines() == ["first"]  # appeared after start: read from its start
    append(path, "ond\n")
    assert f.lines() == ["second"]
    path.write_text("")  # truncated in place
    append(path, "after truncate\n")
    assert f.lines() == ["after truncate"]
    os.rename(path, tmp_path / "late.log.1")  # rotated
    append(tmp_path / "late.log.1", "tail of old\n")
    path.write_text("new file\n")
    assert f.lines() == ["tail of old", "new file"]
    f.close()


def test_bad_patterns_and_missing_directory() -> None:
    with pytest.raises(ValueError, match="NAME=REGEX"):
        parse_pattern("no equals sign")
    with pytest.raises(ValueError, match="bad regex"):
        parse_pattern("x=(unclosed")
    with pytest.raises(Unavailable, match="does not exist"):
        LogCollector("/no/such/dir/server.log").probe()

"""Hardware counters through `perf stat -I`: parser, a fake perf, and the real perf here."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata_plugin.agent.collectors.base import Unavailable
from strata_plugin.agent.collectors.perf import PerfCollector, parse_perf_line
from strata_plugin.agent.targets import ProcessTargets

FIXTURE = Path(__file__).parent / "data" / "perf_stat_interval.txt"


@pytest.fixture
def sleeper():
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


def test_parse_interval_rows() -> None:
    rows = [parse_perf_line(line) for line in FIXTURE.read_text().splitlines()]
    assert rows[0] is None and rows[1] is None
    assert rows[2] == ("cycles", 1234567890.0, "")
    assert rows[3] == ("instructions", 2345678901.0, "")
    assert rows[7] == ("cache-misses", None, "<not supported>")


def test_fake_perf_sums_intervals_into_counters(tmp_path, sleeper) -> None:
    perf = tmp_path / "perf"
    perf.write_text(
        f"#!{sys.executable}\nimport sys, time\n"
        f"for line in open({str(FIXTURE)!r}):\n"
        "    sys.stderr.write(line); sys.stderr.flush()\n"
        "time.sleep(30)\n"
    )
    perf.chmod(0o755)
    c = PerfCollector(ProcessTargets(pids=[sleeper.pid]), interval_s=0.5, perf=str(perf))
    c.probe()
    c.targets.probe()
    c.sample(time.time_ns())  # starts perf for the known PIDs
    deadline = time.monotonic() + 5
    emits: list = []
    while time.monotonic() < deadline:
        emits += c.sample(time.time_ns())
        if sum(1 for e in emits if e[2] == "instructions") >= 2:
            break
        time.sleep(0.05)
    last = {m: v for _, _, m, v, _ in emits}
    assert last["cycles"] == 2234567890.0  # cumulative over both intervals
    assert last["instructions"] == 4345678901.0
    assert all(k == "counter" for *_, k in emits)
    unavailable, _, commands, _ = c.drain()
    assert unavailable["cache-misses"] == "perf stat: cache-misses <not supported>"
    assert c.failed is None  # two of three events work
    assert commands[0][1][-6:] == ["-p", str(sleeper.pid), "-I", "500", "-x", ","]
    c.close()


def test_real_perf_counts_or_says_why(sleeper) -> None:
    if shutil.which("perf") is None:
        with pytest.raises(Unavailable, match="perf not found"):
            PerfCollector(ProcessTargets(pids=[sleeper.pid])).probe()
        return
    t = ProcessTargets(pids=[sleeper.pid])
    t.probe()
    c = PerfCollector(t, interval_s=0.1)
    c.probe()
    emits: list = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and c.failed is None:
        emits += c.sample(time.time_ns())
        if emits:
            break
        time.sleep(0.1)
    c.close()
    if emits:
        assert {m for _, _, m, _, _ in emits} <= {"cycles", "instructions", "cache-misses"}
    else:  # a VM or container without PMU access: UNAVAILABLE with perf's own words
        assert c.failed and (
            "not supported" in c.failed or "not counted" in c.failed or "exited" in c.failed
        )


def test_unavailable_without_perf_or_target() -> None:
    with pytest.raises(Unavailable, match="not found"):
        PerfCollector(ProcessTargets(pids=[1]), which=lambda n: None).probe()
    with pytest.raises(Unavailable, match="no server process"):
        PerfCollector(ProcessTargets(), which=lambda n: "/usr/bin/perf").probe()

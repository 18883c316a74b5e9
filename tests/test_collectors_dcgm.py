"""DCGM through `dcgmi dmon`: the parser on saved output, and fake dcgmi tools on PATH."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest

from strata_plugin.agent.collectors.base import Unavailable
from strata_plugin.agent.collectors.dcgm import DEFAULT_FIELDS, DcgmCollector, DmonParser

FIXTURE = Path(__file__).parent / "data" / "dcgmi_dmon.txt"


def test_parser_on_saved_output() -> None:
    p = DmonParser(DEFAULT_FIELDS)
    rows = [p.parse(line) for line in FIXTURE.read_text().splitlines()]
    assert rows[0] is None and rows[1] is None  # header and units
    gpu0 = {m: v for _, m, v, _ in rows[2]}
    assert gpu0["sm_active"] == 0.776 and gpu0["dram_active"] == 0.231
    assert gpu0["pcie_rx_bytes_per_s"] == 7654321
    assert rows[2][0][0] == "gpu0"
    assert rows[3] == []  # all N/A
    assert {d for d, *_ in rows[5]} == {"gpu1"}
    assert p.parse("GPU-I 3   0.5   N/A") == [("gpu-i3", "gr_engine_active", 0.5, "gauge")]
    assert p.parse("Error: Unable to connect to host engine.") is None


def test_violation_times_are_microseconds_turned_into_ns() -> None:
    # DCGM_FI_DEV_POWER_VIOLATION / THERMAL_VIOLATION (240/241) count microseconds; the
    # agent's names end in _ns and match NVML's, so the throttle signal reads either.
    p = DmonParser((240, 241))
    assert p.parse("GPU 0   1500   2") == [
        ("gpu0", "violation_power_ns", 1_500_000.0, "counter"),
        ("gpu0", "violation_thermal_ns", 2_000.0, "counter"),
    ]


def fake_tool(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return str(path)


def test_live_dmon_process_is_parsed_and_stopped(tmp_path) -> None:
    tool = fake_tool(
        tmp_path,
        "dcgmi",
        (
            "import sys, time\n"
            f"lines = open({str(FIXTURE)!r}).read().splitlines()\n"
            "print(' '.join(sys.argv[1:]), file=sys.stderr)\n"
            "for i in range(200):\n"
            "    print(lines[2 + i % 4], flush=True)\n"
            "    time.sleep(0.05)\n"
        ),
    )
    c = DcgmCollector(interval_s=0.1, dcgmi=tool)
    c.probe()
    time.sleep(0.3)
    emits = c.sample(time.time_ns())
    c.close()
    assert any(dev == "gpu0" and m == "sm_active" and v == 0.776 for _, dev, m, v, _ in emits)
    assert all(k == "gauge" for *_, k in emits)
    _, _, commands, _ = c.drain()
    assert commands == [
        ("dcgmi_dmon", [tool, "dmon", "-e", ",".join(map(str, DEFAULT_FIELDS)), "-d", "100"])
    ]
    assert c._proc is not None and c._proc.poll() is not None  # stopped on close


def sh_tool(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_host_engine_down_is_unavailable_with_dmons_message(tmp_path) -> None:
    tool = sh_tool(
        tmp_path,
        "dcgmi",
        (
            "echo 'Error: unable to establish a connection to the specified host: localhost'\n"
            "echo 'Error: Unable to connect to host engine. Host engine connection invalid.'\n"
            "exit 255\n"
        ),
    )
    with pytest.raises(Unavailable, match=r"exited 255: .*Unable to connect to host engine"):
        DcgmCollector(dcgmi=tool).probe()


def test_dmon_dying_mid_run_is_reported(tmp_path) -> None:
    row = FIXTURE.read_text().splitlines()[2]
    tool = sh_tool(
        tmp_path,
        "dcgmi",
        (
            f"echo '{row}'\n"
            "sleep 0.3\n"
            "echo 'The third-party Profiling module returned an unrecoverable error'\n"
            "exit 1\n"
        ),
    )
    c = DcgmCollector(interval_s=0.1, dcgmi=tool)
    c.probe()
    parse = c.parser.parse

    def slow_on_words(line: str):  # the reader lags behind the exit, as on a busy host
        if "unrecoverable" in line:
            time.sleep(0.4)
        return parse(line)

    c.parser.parse = slow_on_words  # type: ignore[method-assign]
    deadline = time.monotonic() + 20
    emits = []
    while c.failed is None and time.monotonic() < deadline:
        emits += c.sample(time.time_ns())
        time.sleep(0.05)
    assert c.failed and "exited 1 mid-run" in c.failed and "unrecoverable error" in c.failed
    assert any(m == "sm_active" for _, _, m, _, _ in emits)  # what came before is kept
    unavailable, _, _, _ = c.drain()
    assert "unrecoverable" in unavailable[""]


def test_missing_dcgmi() -> None:
    if shutil.which("dcgmi"):
        pytest.skip("dcgmi is installed here")
    with pytest.raises(Unavailable, match="dcgmi not found"):
        DcgmCollector().probe()
    with pytest.raises(Unavailable, match="not found"):
        DcgmCollector(which=lambda name: None).probe()

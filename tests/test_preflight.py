"""Preflight checks: ports, tools, nodes, idle GPUs."""

from __future__ import annotations

import os
import socket
import sys

import pytest
from fake_nvml import FakeGpu, FakeNvml, FakeProcess

from strata_plugin.run.preflight import (
    PreflightError,
    check_gpus_idle,
    check_nodes,
    check_port_free,
    check_tools,
    preflight,
    require_preflight,
)


@pytest.fixture
def listener():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_busy_port_fails_and_names_the_holder(listener) -> None:
    c = check_port_free(listener)
    assert not c.ok
    assert "in use" in c.detail and f"pid {os.getpid()}" in c.detail


def test_free_port_passes() -> None:
    assert check_port_free(free_port()).ok


def test_tools_and_nodes() -> None:
    tools = check_tools([os.path.basename(sys.executable), "no-such-tool-x9"])
    assert tools[0].ok and not tools[1].ok and "not found" in tools[1].detail

    def boom():
        raise TimeoutError("ssh timed out")

    nodes = check_nodes(
        {
            "a": lambda: True,
            "b": lambda: "Permission denied (publickey)",
            "c": lambda: False,
            "d": boom,
            "e": lambda: None,
        }
    )
    assert [n.ok for n in nodes] == [True, False, False, False, True]
    assert nodes[1].detail == "Permission denied (publickey)"
    assert "ssh timed out" in nodes[3].detail


def test_gpus_skipped_with_reason_without_nvml() -> None:
    (c,) = check_gpus_idle(nvml=FakeNvml(init_error=12))
    assert c.ok and c.skipped and "nvmlInit failed" in c.detail


def test_busy_gpu_fails_idle_gpu_passes() -> None:
    nv = FakeNvml(gpus=[FakeGpu(processes=[FakeProcess(os.getpid(), 3 << 30)]), FakeGpu()])
    busy, idle = check_gpus_idle(nvml=nv)
    assert not busy.ok and f"pid {os.getpid()}" in busy.detail and "3072 MiB" in busy.detail
    assert idle.ok
    assert nv.inits == 0
    hidden = FakeNvml(gpus=[FakeGpu(mem_used=20 << 30)])
    (c,) = check_gpus_idle(nvml=hidden)
    assert not c.ok and "no visible process" in c.detail


def test_preflight_stops_the_run_with_every_reason(listener) -> None:
    checks = preflight(
        ports=[listener, free_port()],
        tools=["no-such-tool-x9"],
        nodes={"head": lambda: True},
        nvml=FakeNvml(),
    )
    assert [c.name for c in checks][:3] == [
        f"port {listener} free",
        checks[1].name,
        "tool no-such-tool-x9",
    ]
    with pytest.raises(PreflightError) as exc:
        require_preflight(checks)
    assert len(exc.value.failed) == 2
    assert "no-such-tool-x9 not found" in str(exc.value)
    ok = preflight(ports=[free_port()], gpus=True, nvml=FakeNvml(gpus=[FakeGpu()]))
    assert require_preflight(ok) == ok

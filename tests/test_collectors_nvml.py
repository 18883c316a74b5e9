"""The NVML collector against a fake at the pynvml call boundary (no GPU here)."""

from __future__ import annotations

import sys
import time

import pytest
from fake_nvml import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NOT_SUPPORTED,
    FakeGpu,
    FakeNvml,
    FakeProcess,
    NVMLError,
)

from strata_plugin.agent import nvml_lib
from strata_plugin.agent.collectors.base import Unavailable
from strata_plugin.agent.collectors.nvml import NvmlCollector


def values(emits):
    return {(dev, metric): value for _, dev, metric, value, _ in emits}


def probed(nv) -> NvmlCollector:
    c = NvmlCollector(nvml=nv)
    c.probe()
    return c


def test_success_reads_every_metric_family() -> None:
    nv = FakeNvml(gpus=[FakeGpu(processes=[FakeProcess(4242, 1 << 30)]), FakeGpu(gpm=False)])
    c = probed(nv)
    time.sleep(0.1)  # GPM needs two samples >= ~0.1 s apart
    emits = c.sample(time.time_ns())
    v = values(emits)
    kinds = {m: k for _, _, m, _, k in emits}
    assert v[("gpu0", "power_mw")] == 350_000
    assert v[("gpu0", "util_gpu_pct")] == 97 and v[("gpu0", "mem_used_bytes")] == 512 << 20
    assert v[("gpu0", "sm_clock_mhz")] == 1755 and v[("gpu0", "sm_clock_max_mhz")] == 1980
    assert v[("gpu0", "temp_c")] == 64 and v[("gpu0", "pstate")] == 0
    assert v[("gpu0", "clock_event_reasons")] == 0x4
    assert v[("gpu0", "clock_event_sw_power_cap")] == 1
    assert v[("gpu0", "clock_event_hw_slowdown")] == 0
    assert v[("gpu0", "violation_power_ns")] == 123_000
    assert v[("gpu0", "pcie_link_gen")] == 5 and v[("gpu0", "pcie_link_width_max")] == 16
    assert v[("gpu0", "pcie_tx_bytes")] == 197_000  # field value, cumulative
    assert v[("gpu0/pid4242", "proc_mem_used_bytes")] == 1 << 30
    assert v[("gpu0", "compute_procs")] == 1
    assert v[("gpu0", "gpm_sm_util_pct")] == 2.5  # the fake answers metric id + 0.5
    assert v[("gpu0", "gpm_dram_bw_util_pct")] == 10.5
    assert ("gpu1", "gpm_sm_util_pct") not in v
    assert kinds["energy_mj"] == "counter" and kinds["violation_power_ns"] == "counter"
    assert kinds["power_mw"] == "gauge"
    e1 = v[("gpu0", "energy_mj")]
    e2 = values(c.sample(time.time_ns()))[("gpu0", "energy_mj")]
    assert e2 > e1
    _, info, _, _ = c.drain()
    assert info[0]["driver_version"] == "550.54.15"
    assert info[0]["gpus"][0]["name"].startswith("FAKE NVIDIA H100")
    c.close()
    assert nv.inits == 0  # every nvmlInit was paired with nvmlShutdown


def test_not_supported_fields_are_unavailable_per_metric_with_nvml_text() -> None:
    nv = FakeNvml(
        not_supported={"nvmlDeviceGetViolationStatus(1)", "nvmlDeviceGetPcieThroughput"},
        unsupported_fields={138, 139},
        unsupported_gpm={60, 61},
    )
    c = probed(nv)
    time.sleep(0.1)
    v = values(c.sample(time.time_ns()))
    unavailable, _, _, _ = c.drain()
    assert unavailable["gpu0/violation_thermal_ns"].endswith(
        "NVML_ERROR_NOT_SUPPORTED (Not Supported)"
    )
    assert "NVML_ERROR_NOT_SUPPORTED" in unavailable["gpu0/pcie_tx_kbps"]
    assert unavailable["gpu0/nvlink_data_tx_kib"] == "field 138: NVML_ERROR_NOT_SUPPORTED"
    assert "NVML_ERROR_NOT_SUPPORTED" in unavailable["gpu0/gpm_nvlink_tx_mibps"]
    assert "GPM not supported" in unavailable["gpu1/gpm_sm_util_pct"]
    # the rest still flows, and unsupported calls are not retried every tick
    assert ("gpu0", "violation_power_ns") in v and ("gpu0", "pcie_tx_bytes") in v
    assert ("gpu0", "gpm_sm_util_pct") in v
    n_calls = nv.calls.count("nvmlDeviceGetPcieThroughput")
    c.sample(time.time_ns())
    assert nv.calls.count("nvmlDeviceGetPcieThroughput") == n_calls


def test_no_permission_is_named() -> None:
    nv = FakeNvml(no_permission={"nvmlDeviceGetTotalEnergyConsumption"})
    c = probed(nv)
    c.sample(time.time_ns())
    unavailable, _, _, _ = c.drain()
    assert "NVML_ERROR_NO_PERMISSION (Insufficient Permissions)" in unavailable["gpu0/energy_mj"]


def test_a_call_that_starts_raising_mid_run_is_reported_then_dropped() -> None:
    nv = FakeNvml()
    c = probed(nv)
    c.sample(time.time_ns())
    nv.raise_on["nvmlDeviceGetPowerUsage"] = NVMLError(NVML_ERROR_GPU_IS_LOST)
    v = values(c.sample(time.time_ns()))
    assert ("gpu0", "power_mw") not in v and ("gpu0", "temp_c") in v
    unavailable, _, _, _ = c.drain()
    assert "failed mid-run: NVML_ERROR_GPU_IS_LOST" in unavailable["gpu0/power_mw"]
    for _ in range(3):
        c.sample(time.time_ns())
    n = nv.calls.count("nvmlDeviceGetPowerUsage")
    c.sample(time.time_ns())
    assert nv.calls.count("nvmlDeviceGetPowerUsage") == n  # dropped after 3 failures
    # a non-NVML exception is reported with its type
    nv.raise_on["nvmlDeviceGetTemperature"] = RuntimeError("driver hiccup")
    c.sample(time.time_ns())
    unavailable, _, _, _ = c.drain()
    assert "RuntimeError: driver hiccup" in unavailable["gpu0/temp_c"]


def test_library_absent(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with pytest.raises(Unavailable, match="pynvml not installed"):
        NvmlCollector().probe()


def test_init_failure_is_unavailable_with_the_error_name() -> None:
    with pytest.raises(Unavailable, match="nvmlInit failed: NVML_ERROR_NOT_SUPPORTED"):
        NvmlCollector(nvml=FakeNvml(init_error=NVML_ERROR_NOT_SUPPORTED)).probe()


def test_no_gpus_is_unavailable() -> None:
    nv = FakeNvml(gpus=[])
    with pytest.raises(Unavailable, match="no GPUs"):
        NvmlCollector(nvml=nv).probe()
    assert nv.inits == 0


def test_real_pynvml_on_this_machine() -> None:
    """The installed pynvml: without a driver it must say so, not crash."""
    nv, _reason = nvml_lib.load_nvml()
    if nv is not None:
        nvml_lib.shutdown(nv)
        pytest.skip("a real NVML is present here")
    with pytest.raises(Unavailable) as exc:
        NvmlCollector().probe()
    assert "NVML_ERROR_" in str(exc.value) or "pynvml not installed" in str(exc.value)

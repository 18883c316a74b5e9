"""GPU release after a server stops, against the fake NVML and a fake clock."""

from __future__ import annotations

import pytest
from fake_nvml import FakeGpu, FakeNvml, FakeProcess, NVMLError

from strata_plugin.run.gpu_release import GpuNotReleased, require_gpu_release, wait_gpu_release


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += dt


def test_released_after_a_few_polls() -> None:
    gpu = FakeGpu(processes=[FakeProcess(4242, 30 << 30), FakeProcess(777, 1 << 30)])
    nv = FakeNvml(gpus=[gpu])
    clock = Clock()
    polls = 0

    def sleep(dt: float) -> None:
        nonlocal polls
        polls += 1
        clock.sleep(dt)
        if polls == 3:  # the server's worker finally exits
            gpu.processes = [p for p in gpu.processes if p.pid != 4242]

    r = wait_gpu_release([4242], timeout_s=10, poll_s=0.5, nvml=nv, sleep=sleep, clock=clock)
    assert r.ok and not r.skipped and r.waited_s == pytest.approx(1.5)
    assert "none of pids [4242]" in r.detail
    assert nv.inits == 0


def test_still_held_after_the_timeout_fails_loudly() -> None:
    nv = FakeNvml(gpus=[FakeGpu(), FakeGpu(processes=[FakeProcess(4242, 30 << 30)])])
    clock = Clock()
    r = wait_gpu_release(
        [4242, 4243], timeout_s=2, poll_s=0.5, nvml=nv, sleep=clock.sleep, clock=clock
    )
    assert not r.ok and r.waited_s >= 2
    assert r.holders[0].pid == 4242 and r.holders[0].gpu == 1
    assert "pid 4242 on gpu1 (30720 MiB)" in r.detail
    with pytest.raises(GpuNotReleased, match="still held"):
        require_gpu_release(r)


def test_require_idle_counts_any_process() -> None:
    nv = FakeNvml(gpus=[FakeGpu(processes=[FakeProcess(99, 1 << 20)])])
    clock = Clock()
    assert wait_gpu_release([4242], timeout_s=1, nvml=nv, sleep=clock.sleep, clock=clock).ok
    r = wait_gpu_release(
        [4242], timeout_s=1, require_idle=True, nvml=nv, sleep=clock.sleep, clock=clock
    )
    assert not r.ok and r.holders[0].pid == 99


def test_no_nvml_is_skipped_with_reason_and_query_errors_fail() -> None:
    r = wait_gpu_release([1], nvml=FakeNvml(init_error=12))
    assert r.ok and r.skipped and "nvmlInit failed" in r.detail
    nv = FakeNvml()
    nv.raise_on["nvmlDeviceGetComputeRunningProcesses"] = NVMLError(15)
    r = wait_gpu_release([1], nvml=nv)
    assert not r.ok and "NVML_ERROR_GPU_IS_LOST" in r.detail

"""A scripted stand-in for the ``pynvml`` module, for tests and dry runs on machines without GPUs.

It answers the calls Strata makes with plausible H100-like numbers, and can be
told which calls fail and how (``not_supported``, ``no_permission``, ``raise_on``),
which GPUs support GPM, and which processes hold memory. Pass an instance
wherever an ``nvml=`` argument is accepted; nothing here touches a real GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
_MESSAGES = {
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """Like pynvml.NVMLError: carries the numeric ``value``; ``str()`` is NVML's message."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeProcess:
    pid: int
    usedGpuMemory: int


@dataclass
class FakeGpu:
    name: str = "FAKE NVIDIA H100 80GB HBM3 (scripted stub, no GPU)"
    power_mw: int = 350_000
    energy_mj: int = 1_000_000
    mem_used: int = 512 << 20  # what an idle H100 shows; a loaded one holds far more
    mem_total: int = 80 << 30
    clock_reasons: int = 0x4  # SwPowerCap
    gpm: bool = True
    processes: list[FakeProcess] = field(default_factory=list)
    # the memory system and links (an H100 SXM's as its datasheet and NVML give them)
    mem_clock_max_mhz: int = 2619
    bus_width_bits: int = 5120
    nvlink_links: int = 18  # active links; 0: a PCIe card without NVLink
    nvlink_mbps: int = 25_000  # NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON (field 90)


class _Metric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = NVML_SUCCESS
        self.value = 0.0


class c_nvmlGpmMetricsGet_t:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [_Metric() for _ in range(128)]


class FakeNvml:
    """Module-like object; attribute names follow pynvml."""

    NVMLError = NVMLError
    NVML_SUCCESS = NVML_SUCCESS
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_UNKNOWN = NVML_ERROR_UNKNOWN
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_GPM_METRICS_GET_VERSION = 1
    c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        not_supported: set[str] | None = None,
        no_permission: set[str] | None = None,
        unsupported_fields: set[int] | None = None,
        unsupported_gpm: set[int] | None = None,
        init_error: int | None = None,
    ) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu(), FakeGpu(gpm=False)]
        self.not_supported = set(not_supported or ())
        self.no_permission = set(no_permission or ())
        self.unsupported_fields = set(unsupported_fields or ())
        self.unsupported_gpm = set(unsupported_gpm or ())
        self.raise_on: dict[str, Exception] = {}  # call name -> exception, set mid-run
        self.init_error = init_error
        self.inits = 0
        self.calls: list[str] = []
        self._gpm_counter = 0

    # -- plumbing -------------------------------------------------------------
    def _check(self, name: str) -> None:
        self.calls.append(name)
        if name in self.raise_on:
            raise self.raise_on[name]
        if name in self.not_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if name in self.no_permission:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)

    def _gpu(self, h: int) -> FakeGpu:
        return self.gpus[h]

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        return self._gpu(h).name

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-fake-{h:04d}"

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode())

    # -- device values --------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        self._check("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=97, memory=41)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        self._check("nvmlDeviceGetMemoryInfo")
        g = self._gpu(h)
        return SimpleNamespace(used=g.mem_used, total=g.mem_total, free=g.mem_total - g.mem_used)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        self._check("nvmlDeviceGetPowerUsage")
        return self._gpu(h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        self._check("nvmlDeviceGetEnforcedPowerLimit")
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        self._check("nvmlDeviceGetTotalEnergyConsumption")
        g = self._gpu(h)
        g.energy_mj += 175  # 350 W for 0.5 s
        return g.energy_mj

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        self._check("nvmlDeviceGetClockInfo")
        return 1755 if clock == 1 else 2619

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        self._check("nvmlDeviceGetMaxClockInfo")
        return 1980 if clock == 1 else self._gpu(h).mem_clock_max_mhz

    def nvmlDeviceGetMemoryBusWidth(self, h: int) -> int:
        self._check("nvmlDeviceGetMemoryBusWidth")
        return self._gpu(h).bus_width_bits

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkState")
        if link >= max(1, self._gpu(h).nvlink_links):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return 1 if self._gpu(h).nvlink_links else 0

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature")
        return 64

    def nvmlDeviceGetPerformanceState(self, h: int) -> int:
        self._check("nvmlDeviceGetPerformanceState")
        return 0

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        self._check("nvmlDeviceGetCurrentClocksEventReasons")
        return self._gpu(h).clock_reasons

    def nvmlDeviceGetViolationStatus(self, h: int, policy: int) -> Any:
        self._check(f"nvmlDeviceGetViolationStatus({policy})")
        return SimpleNamespace(referenceTime=1_700_000_000_000_000, violationTime=123_000 * (h + 1))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        self._check("nvmlDeviceGetCurrPcieLinkGeneration")
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        self._check("nvmlDeviceGetCurrPcieLinkWidth")
        return 16

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        self._check("nvmlDeviceGetMaxPcieLinkGeneration")
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        self._check("nvmlDeviceGetMaxPcieLinkWidth")
        return 16

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        self._check("nvmlDeviceGetPcieThroughput")
        return 1200 if counter == 0 else 5400

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[Any]) -> list[Any]:
        self._check("nvmlDeviceGetFieldValues")
        out = []
        for fid in ids:
            fid = fid[0] if isinstance(fid, tuple) else fid
            ret = NVML_ERROR_NOT_SUPPORTED if fid in self.unsupported_fields else NVML_SUCCESS
            out.append(
                SimpleNamespace(
                    fieldId=fid,
                    nvmlReturn=ret,
                    valueType=3,
                    value=SimpleNamespace(
                        ullVal=self._gpu(h).nvlink_mbps if fid == 90 else fid * 1000, dVal=0.0),
                )
            )
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[FakeProcess]:
        self._check("nvmlDeviceGetComputeRunningProcesses")
        return list(self._gpu(h).processes)

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[FakeProcess]:
        self._check("nvmlDeviceGetGraphicsRunningProcesses")
        return []

    # -- GPM -------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, h: int) -> Any:
        self._check("nvmlGpmQueryDeviceSupport")
        return SimpleNamespace(isSupportedDevice=1 if self._gpu(h).gpm else 0)

    def nvmlGpmSampleAlloc(self) -> Any:
        return SimpleNamespace(n=0)

    def nvmlGpmSampleFree(self, s: Any) -> None:
        pass

    def nvmlGpmSampleGet(self, h: int, s: Any) -> Any:
        self._check("nvmlGpmSampleGet")
        self._gpm_counter += 1
        s.n = self._gpm_counter
        return s

    def nvmlGpmMetricsGet(self, mg: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
        self._check("nvmlGpmMetricsGet")
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            if m.metricId in self.unsupported_gpm:
                m.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
                continue
            m.nvmlReturn = NVML_SUCCESS
            m.value = float(m.metricId) + 0.5  # recognisable per metric
        return mg


def stub() -> FakeNvml:
    """The agent's ``--nvml-stub tests/fake_nvml.py`` entry: two scripted GPUs."""
    return FakeNvml()

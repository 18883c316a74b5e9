"""GPUs through NVML (pynvml, imported lazily): device counters, clocks, throttling, GPM.

Per GPU (device ``gpu<N>``). Cumulative counters are preferred where NVML has
them, because a window's delta of a counter is exact while a polled snapshot
aliases:

* counters: ``energy_mj``; ``violation_<policy>_ns`` (time clocks were held
  back by power, thermal, sync_boost, board_limit, low_util, reliability, from
  nvmlDeviceGetViolationStatus); field values ``pcie_tx_bytes``,
  ``pcie_rx_bytes``, ``pcie_replays``, ``nvlink_data_tx_kib``, ``nvlink_data_rx_kib``;
* gauges: ``util_gpu_pct``, ``util_mem_pct`` (coarse: "a kernel was running"),
  ``mem_used_bytes``, ``mem_total_bytes``, ``power_mw``, ``sm_clock_mhz``,
  ``mem_clock_mhz``, ``sm_clock_max_mhz``, ``mem_clock_max_mhz``, ``temp_c``,
  ``pstate``, ``clock_event_reasons`` (bitmask) and one 0/1 gauge per reason
  (``clock_event_sw_power_cap``...), ``pcie_link_gen``, ``pcie_link_width``,
  ``pcie_link_gen_max``, ``pcie_link_width_max``, ``pcie_tx_kbps``,
  ``pcie_rx_kbps`` (a 20 ms snapshot), ``compute_procs``;
* GPM (Hopper+; one nvmlGpmSampleGet per tick, metrics over the pair of the
  previous and this tick's sample): ``gpm_sm_util_pct``,
  ``gpm_sm_occupancy_pct``, ``gpm_tensor_util_pct``, ``gpm_dram_bw_util_pct``,
  ``gpm_graphics_util_pct``, ``gpm_fp16/32/64_util_pct``, ``gpm_pcie_tx_mibps``,
  ``gpm_pcie_rx_mibps``, ``gpm_nvlink_tx_mibps``, ``gpm_nvlink_rx_mibps``;
* per process (device ``gpu<N>/pid<P>``): ``proc_mem_used_bytes``.

Each call is probed once: a call that fails (NOT_SUPPORTED, NO_PERMISSION...)
is reported UNAVAILABLE per metric with the NVML error text and not retried.
A call that starts failing mid-run is reported, and dropped after 3 failures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, List, Tuple, Union

from .. import nvml_lib
from .base import Collector, Emit, Unavailable

if TYPE_CHECKING:
    import argparse

    from ..targets import ProcessTargets

Values = List[Tuple[str, Union[float, int], str]]

#: bit -> name, as nvmlClocksEventReason* in nvml.h
CLOCK_EVENT_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
#: (constant, documented value, metric suffix) for nvmlDeviceGetViolationStatus
VIOLATION_POLICIES = (
    ("NVML_PERF_POLICY_POWER", 0, "power"),
    ("NVML_PERF_POLICY_THERMAL", 1, "thermal"),
    ("NVML_PERF_POLICY_SYNC_BOOST", 2, "sync_boost"),
    ("NVML_PERF_POLICY_BOARD_LIMIT", 3, "board_limit"),
    ("NVML_PERF_POLICY_LOW_UTILIZATION", 4, "low_util"),
    ("NVML_PERF_POLICY_RELIABILITY", 5, "reliability"),
)
#: (field id, metric, kind) read with one nvmlDeviceGetFieldValues call
FIELDS = (
    (197, "pcie_tx_bytes", "counter"),  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    (198, "pcie_rx_bytes", "counter"),  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
    (94, "pcie_replays", "counter"),  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
    (138, "nvlink_data_tx_kib", "counter"),  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    (139, "nvlink_data_rx_kib", "counter"),  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
)
#: (GPM metric id, metric name)
GPM_METRICS = (
    (1, "gpm_graphics_util_pct"),
    (2, "gpm_sm_util_pct"),
    (3, "gpm_sm_occupancy_pct"),
    (5, "gpm_tensor_util_pct"),
    (10, "gpm_dram_bw_util_pct"),
    (11, "gpm_fp64_util_pct"),
    (12, "gpm_fp32_util_pct"),
    (13, "gpm_fp16_util_pct"),
    (20, "gpm_pcie_tx_mibps"),
    (21, "gpm_pcie_rx_mibps"),
    (60, "gpm_nvlink_rx_mibps"),
    (61, "gpm_nvlink_tx_mibps"),
)
#: NVML asks for GPM sample pairs at least ~100 ms apart (DCGM's own tests use 100 ms).
GPM_MIN_INTERVAL_S = 0.09
_VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


def field_value(fv: Any) -> float | int:
    """The number in a c_nvmlFieldValue_t, by its valueType."""
    return getattr(fv.value, _VALUE_MEMBERS.get(int(fv.valueType), "ullVal"))


def error_code_name(nv: Any, code: int) -> str:
    for attr in dir(nv):
        if attr.startswith("NVML_ERROR_") and getattr(nv, attr, None) == code:
            return attr
    return f"NVML error {code}"


class _Reader:
    """One NVML call producing one or more metrics of one GPU."""

    __slots__ = ("failures", "fn", "metrics", "name")

    def __init__(self, name: str, metrics: tuple[str, ...], fn: Callable[[], Values]) -> None:
        self.name = name
        self.metrics = metrics
        self.fn = fn
        self.failures = 0


class _Gpu:
    __slots__ = ("gpm", "gpm_ids", "gpm_t", "handle", "index", "readers", "static")

    def __init__(self, index: int, handle: Any) -> None:
        self.index = index
        self.handle = handle
        self.readers: list[_Reader] = []
        self.static: Values = []
        self.gpm: list[Any] | None = None  # [metrics_get struct, prev sample, cur sample]
        self.gpm_ids: list[tuple[int, str]] = []
        self.gpm_t = 0.0  # monotonic time of the previous GPM sample


class NvmlCollector(Collector):
    source = "nvml"

    def __init__(self, nvml: Any | None = None, gpm: bool = True, per_process: bool = True,
                 source: str = "nvml") -> None:
        super().__init__()
        self.source = source  # "nvml-stub" when a test's stand-in answers instead of a GPU
        self._module = nvml
        self.gpm = gpm
        self.per_process = per_process
        self.nv: Any = None
        self.gpus: list[_Gpu] = []

    # -- probing -------------------------------------------------------------
    def probe(self) -> None:
        nv, reason = nvml_lib.load_nvml(self._module)
        if nv is None:
            raise Unavailable(reason or "NVML unavailable")
        self.nv = nv
        try:
            count = nv.nvmlDeviceGetCount()
        except Exception as e:
            self._shutdown()
            raise Unavailable(f"nvmlDeviceGetCount: {nvml_lib.error_text(nv, e)}") from None
        if count == 0:
            self._shutdown()
            raise Unavailable("NVML found no GPUs")
        info: dict[str, Any] = {"kind": "nvml", "source": self.source, "gpus": []}
        for label, fn in (
            ("driver_version", "nvmlSystemGetDriverVersion"),
            ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion"),
            ("nvml_version", "nvmlSystemGetNVMLVersion"),
        ):
            try:
                info[label] = nvml_lib.decode(getattr(nv, fn)())
            except Exception as e:
                info[label] = f"UNAVAILABLE: {nvml_lib.error_text(nv, e)}"
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except Exception as e:
                self.mark_unavailable(
                    f"gpu{i}", f"nvmlDeviceGetHandleByIndex: {nvml_lib.error_text(nv, e)}"
                )
                continue
            gpu = _Gpu(i, h)
            info["gpus"].append(self._describe(gpu))
            self._build_readers(gpu)
            self.gpus.append(gpu)
        self.info(**info)
        if not self.gpus:
            self._shutdown()
            raise Unavailable("no GPU handle could be opened")

    def _describe(self, gpu: _Gpu) -> dict[str, Any]:
        nv, h = self.nv, gpu.handle
        out: dict[str, Any] = {"device": f"gpu{gpu.index}"}
        for key, fn in (("name", "nvmlDeviceGetName"), ("uuid", "nvmlDeviceGetUUID")):
            try:
                out[key] = nvml_lib.decode(getattr(nv, fn)(h))
            except Exception as e:
                out[key] = f"UNAVAILABLE: {nvml_lib.error_text(nv, e)}"
        try:
            out["pci_bus_id"] = nvml_lib.decode(nv.nvmlDeviceGetPciInfo(h).busId)
        except Exception as e:
            out["pci_bus_id"] = f"UNAVAILABLE: {nvml_lib.error_text(nv, e)}"
        return out

    def _try(
        self, gpu: _Gpu, name: str, metrics: tuple[str, ...], fn: Callable[[], Values]
    ) -> None:
        """Probe one call; keep it as a reader when it works, else report each metric."""
        try:
            fn()
        except Exception as e:
            reason = f"{name}: {nvml_lib.error_text(self.nv, e)}"
            for m in metrics:
                self.mark_unavailable(f"gpu{gpu.index}/{m}", reason)
            return
        gpu.readers.append(_Reader(name, metrics, fn))

    def _build_readers(self, gpu: _Gpu) -> None:
        nv, h = self.nv, gpu.handle
        c = nvml_lib.const
        clock_sm = c(nv, "NVML_CLOCK_SM", 1)
        clock_mem = c(nv, "NVML_CLOCK_MEM", 2)

        def util() -> Values:
            u = nv.nvmlDeviceGetUtilizationRates(h)
            return [("util_gpu_pct", u.gpu, "gauge"), ("util_mem_pct", u.memory, "gauge")]

        def memory() -> Values:
            m = nv.nvmlDeviceGetMemoryInfo(h)
            return [("mem_used_bytes", m.used, "gauge"), ("mem_total_bytes", m.total, "gauge")]

        self._try(gpu, "nvmlDeviceGetUtilizationRates", ("util_gpu_pct", "util_mem_pct"), util)
        self._try(gpu, "nvmlDeviceGetMemoryInfo", ("mem_used_bytes", "mem_total_bytes"), memory)
        self._try(
            gpu,
            "nvmlDeviceGetPowerUsage",
            ("power_mw",),
            lambda: [("power_mw", nv.nvmlDeviceGetPowerUsage(h), "gauge")],
        )
        self._try(
            gpu,
            "nvmlDeviceGetTotalEnergyConsumption",
            ("energy_mj",),
            lambda: [("energy_mj", nv.nvmlDeviceGetTotalEnergyConsumption(h), "counter")],
        )
        self._try(
            gpu,
            "nvmlDeviceGetClockInfo(SM)",
            ("sm_clock_mhz",),
            lambda: [("sm_clock_mhz", nv.nvmlDeviceGetClockInfo(h, clock_sm), "gauge")],
        )
        self._try(
            gpu,
            "nvmlDeviceGetClockInfo(MEM)",
            ("mem_clock_mhz",),
            lambda: [("mem_clock_mhz", nv.nvmlDeviceGetClockInfo(h, clock_mem), "gauge")],
        )
        temp_gpu = c(nv, "NVML_TEMPERATURE_GPU", 0)
        self._try(
            gpu,
            "nvmlDeviceGetTemperature",
            ("temp_c",),
            lambda: [("temp_c", nv.nvmlDeviceGetTemperature(h, temp_gpu), "gauge")],
        )
        self._try(
            gpu,
            "nvmlDeviceGetPerformanceState",
            ("pstate",),
            lambda: [("pstate", nv.nvmlDeviceGetPerformanceState(h), "gauge")],
        )

        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )

        def clock_events() -> Values:
            mask = int(reasons_fn(h))  # type: ignore[misc]  # tried below only where it is set
            out: Values = [("clock_event_reasons", mask, "gauge")]
            out.extend(
                (f"clock_event_{n}", 1 if mask & bit else 0, "gauge")
                for bit, n in CLOCK_EVENT_REASONS
            )
            return out

        ce_metrics = (
            "clock_event_reasons",
            *tuple(f"clock_event_{n}" for _, n in CLOCK_EVENT_REASONS),
        )
        if reasons_fn is None:
            for m in ce_metrics:
                self.mark_unavailable(f"gpu{gpu.index}/{m}", "pynvml lacks clock event reasons")
        else:
            self._try(gpu, "nvmlDeviceGetCurrentClocksEventReasons", ce_metrics, clock_events)

        for const_name, default, suffix in VIOLATION_POLICIES:
            policy = c(nv, const_name, default)
            metric = f"violation_{suffix}_ns"

            def viol(policy: int = policy, metric: str = metric) -> Values:
                v = nv.nvmlDeviceGetViolationStatus(h, policy)
                return [(metric, v.violationTime, "counter")]

            self._try(gpu, f"nvmlDeviceGetViolationStatus({suffix})", (metric,), viol)

        self._try(
            gpu,
            "nvmlDeviceGetCurrPcieLinkGeneration",
            ("pcie_link_gen",),
            lambda: [("pcie_link_gen", nv.nvmlDeviceGetCurrPcieLinkGeneration(h), "gauge")],
        )
        self._try(
            gpu,
            "nvmlDeviceGetCurrPcieLinkWidth",
            ("pcie_link_width",),
            lambda: [("pcie_link_width", nv.nvmlDeviceGetCurrPcieLinkWidth(h), "gauge")],
        )
        tx = c(nv, "NVML_PCIE_UTIL_TX_BYTES", 0)
        rx = c(nv, "NVML_PCIE_UTIL_RX_BYTES", 1)
        self._try(
            gpu,
            "nvmlDeviceGetPcieThroughput",
            ("pcie_tx_kbps", "pcie_rx_kbps"),
            lambda: [
                ("pcie_tx_kbps", nv.nvmlDeviceGetPcieThroughput(h, tx), "gauge"),
                ("pcie_rx_kbps", nv.nvmlDeviceGetPcieThroughput(h, rx), "gauge"),
            ],
        )
        self._probe_fields(gpu)
        if self.per_process:
            self._try(
                gpu,
                "nvmlDeviceGetComputeRunningProcesses",
                ("proc_mem_used_bytes",),
                lambda: self._processes(gpu),
            )
        self._probe_static(gpu)
        if self.gpm:
            self._probe_gpm(gpu)

    def _probe_static(self, gpu: _Gpu) -> None:
        """Values that do not change during a run: read once, repeated every tick for slicing."""
        nv, h = self.nv, gpu.handle
        c = nvml_lib.const
        for metric, fn, args in (
            ("sm_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", (c(nv, "NVML_CLOCK_SM", 1),)),
            ("mem_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", (c(nv, "NVML_CLOCK_MEM", 2),)),
            ("pcie_link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", ()),
            ("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth", ()),
            ("power_limit_mw", "nvmlDeviceGetEnforcedPowerLimit", ()),
        ):
            try:
                gpu.static.append((metric, getattr(nv, fn)(h, *args), "gauge"))
            except Exception as e:
                self.mark_unavailable(
                    f"gpu{gpu.index}/{metric}", f"{fn}: {nvml_lib.error_text(nv, e)}"
                )

    def _probe_fields(self, gpu: _Gpu) -> None:
        nv, h = self.nv, gpu.handle
        try:
            values = nv.nvmlDeviceGetFieldValues(h, [f for f, _, _ in FIELDS])
        except Exception as e:
            reason = f"nvmlDeviceGetFieldValues: {nvml_lib.error_text(nv, e)}"
            for _, m, _ in FIELDS:
                self.mark_unavailable(f"gpu{gpu.index}/{m}", reason)
            return
        ok = []
        for (fid, metric, kind), fv in zip(FIELDS, values):
            ret = int(fv.nvmlReturn)
            if ret == 0:
                ok.append((fid, metric, kind))
            else:
                self.mark_unavailable(
                    f"gpu{gpu.index}/{metric}", f"field {fid}: {error_code_name(nv, ret)}"
                )
        if not ok:
            return
        ids = [f for f, _, _ in ok]

        def fields() -> Values:
            vals = nv.nvmlDeviceGetFieldValues(h, ids)
            return [
                (m, field_value(fv), k)
                for (_, m, k), fv in zip(ok, vals)
                if int(fv.nvmlReturn) == 0
            ]

        gpu.readers.append(_Reader("nvmlDeviceGetFieldValues", tuple(m for _, m, _ in ok), fields))

    def _processes(self, gpu: _Gpu) -> Values:
        procs = self.nv.nvmlDeviceGetComputeRunningProcesses(gpu.handle)
        out: Values = [("compute_procs", len(procs), "gauge")]
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            if used is not None:
                out.append((f"pid{p.pid}/proc_mem_used_bytes", used, "gauge"))
        return out

    def _probe_gpm(self, gpu: _Gpu) -> None:
        nv, h = self.nv, gpu.handle
        metrics = tuple(m for _, m in GPM_METRICS)

        def unavailable(reason: str) -> None:
            for m in metrics:
                self.mark_unavailable(f"gpu{gpu.index}/{m}", reason)

        if not hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            unavailable("pynvml has no GPM API (needs nvidia-ml-py >= 11.525)")
            return
        try:
            support = nv.nvmlGpmQueryDeviceSupport(h)
            if not support.isSupportedDevice:
                unavailable("GPM not supported on this GPU (Hopper or newer needed)")
                return
            prev = nv.nvmlGpmSampleAlloc()
            cur = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(h, prev)
        except Exception as e:
            unavailable(f"GPM: {nvml_lib.error_text(nv, e)}")
            return
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nvml_lib.const(nv, "NVML_GPM_METRICS_GET_VERSION", 1)
        mg.numMetrics = len(GPM_METRICS)
        for i, (mid, _) in enumerate(GPM_METRICS):
            mg.metrics[i].metricId = mid
        gpu.gpm = [mg, prev, cur]
        gpu.gpm_ids = list(GPM_METRICS)
        gpu.gpm_t = time.monotonic()

    # -- sampling ------------------------------------------------------------
    def _gpm_values(self, gpu: _Gpu) -> Values:
        nv = self.nv
        now = time.monotonic()
        if now - gpu.gpm_t < GPM_MIN_INTERVAL_S:
            return []  # too short a pair gives noise; the next tick covers this time
        gpm = gpu.gpm
        assert gpm is not None  # sampled only while set (sample() checks)
        mg, prev, cur = gpm
        nv.nvmlGpmSampleGet(gpu.handle, cur)
        gpu.gpm_t = now
        mg.sample1, mg.sample2 = prev, cur
        nv.nvmlGpmMetricsGet(mg)
        gpm[1], gpm[2] = cur, prev
        out: Values = []
        for i, (_, metric) in enumerate(gpu.gpm_ids):
            m = mg.metrics[i]
            ret = int(m.nvmlReturn)
            if ret == 0:
                out.append((metric, m.value, "gauge"))
            else:
                self.mark_unavailable(
                    f"gpu{gpu.index}/{metric}", f"GPM metric: {error_code_name(nv, ret)}"
                )
        return out

    def sample(self, wall_ns: int) -> list[Emit]:
        out: list[Emit] = []
        for gpu in self.gpus:
            dev = f"gpu{gpu.index}"
            for metric, value, kind in gpu.static:
                out.append((wall_ns, dev, metric, value, kind))
            for r in list(gpu.readers):
                try:
                    values = r.fn()
                except Exception as e:
                    r.failures += 1
                    reason = f"{r.name} failed mid-run: {nvml_lib.error_text(self.nv, e)}"
                    for m in r.metrics:
                        self.mark_unavailable(f"{dev}/{m}", reason)
                    if r.failures >= 3:
                        gpu.readers.remove(r)
                    continue
                r.failures = 0
                for metric, value, kind in values:
                    if "/" in metric:  # per-process: "pid<P>/metric"
                        sub, _, metric = metric.partition("/")
                        out.append((wall_ns, f"{dev}/{sub}", metric, value, kind))
                    else:
                        out.append((wall_ns, dev, metric, value, kind))
            if gpu.gpm is not None:
                try:
                    for metric, value, kind in self._gpm_values(gpu):
                        out.append((wall_ns, dev, metric, value, kind))
                except Exception as e:
                    reason = f"GPM failed mid-run: {nvml_lib.error_text(self.nv, e)}"
                    for _, m in gpu.gpm_ids:
                        self.mark_unavailable(f"{dev}/{m}", reason)
                    gpu.gpm = None
        return out

    def _shutdown(self) -> None:
        if self.nv is not None:
            nvml_lib.shutdown(self.nv)
            self.nv = None

    def close(self) -> None:
        if self.nv is not None:
            for gpu in self.gpus:
                if gpu.gpm is not None:
                    for s in gpu.gpm[1:]:
                        try:
                            self.nv.nvmlGpmSampleFree(s)
                        except Exception:
                            pass
                    gpu.gpm = None
        self._shutdown()


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory (``registry.py``): the agent's options -> this collector."""
    if args.nvml_stub:
        return NvmlCollector(nvml=nvml_lib.load_stub(args.nvml_stub), gpm=not args.no_gpm,
                             source="nvml-stub")
    return NvmlCollector(gpm=not args.no_gpm)

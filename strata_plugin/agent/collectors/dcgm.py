"""DCGM profiling fields through ``dcgmi dmon -e <ids> -d <ms>`` (when dcgmi exists).

dmon prints a header (``#Entity  GRACT  SMACT ...``) repeated every few rows, a
units row (``ID``), then one row per entity per tick (``GPU 0  0.571 ...``);
``N/A`` marks a value not yet available. A reader thread parses rows as they
come and stamps them with the wall clock at arrival; ``sample()`` drains them.
Metric names come from :data:`FIELD_NAMES` (else ``f<id>``); device ``gpu<N>``
(or ``<group><N>`` for MIG instances). When dmon cannot connect to the host
engine or the profiling module refuses (perfmon held by another profiler), the
collector is UNAVAILABLE with dmon's own message.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from .base import Collector, Emit, Unavailable, spawn_line_tool, stop_line_tool

if TYPE_CHECKING:
    import argparse

    from ..targets import ProcessTargets

DEFAULT_FIELDS = (1001, 1002, 1003, 1004, 1005, 1009, 1010, 1011, 1012)
#: field id -> (metric, kind); ratios are 0..1, PCIe/NVLink in bytes/s
FIELD_NAMES = {
    100: ("sm_clock_mhz", "gauge"),
    101: ("mem_clock_mhz", "gauge"),
    140: ("memory_temp_c", "gauge"),
    150: ("gpu_temp_c", "gauge"),
    155: ("power_w", "gauge"),
    156: ("energy_mj", "counter"),
    203: ("gpu_util_pct", "gauge"),
    204: ("mem_copy_util_pct", "gauge"),
    240: ("violation_power_ns", "counter"),
    241: ("violation_thermal_ns", "counter"),
    252: ("fb_used_mib", "gauge"),
    1001: ("gr_engine_active", "gauge"),
    1002: ("sm_active", "gauge"),
    1003: ("sm_occupancy", "gauge"),
    1004: ("tensor_active", "gauge"),
    1005: ("dram_active", "gauge"),
    1006: ("fp64_active", "gauge"),
    1007: ("fp32_active", "gauge"),
    1008: ("fp16_active", "gauge"),
    1009: ("pcie_tx_bytes_per_s", "gauge"),
    1010: ("pcie_rx_bytes_per_s", "gauge"),
    1011: ("nvlink_tx_bytes_per_s", "gauge"),
    1012: ("nvlink_rx_bytes_per_s", "gauge"),
}
#: field id -> factor to the metric's unit. DCGM reports the violation times 240/241 in
#: microseconds (DCGM API reference, Field Identifiers: DCGM_FI_DEV_POWER_VIOLATION,
#: "Throttling duration due to power constraints in us"); the agent's names, shared with
#: nvml, are in ns, so the throttle signal reads either source the same way.
FIELD_SCALE = {240: 1e3, 241: 1e3}


def dmon_argv(dcgmi: str, fields: tuple[int, ...], interval_ms: int) -> list[str]:
    return [dcgmi, "dmon", "-e", ",".join(map(str, fields)), "-d", str(interval_ms)]


class DmonParser:
    """Turns dmon's text rows into (device, metric, value, kind) tuples."""

    def __init__(self, fields: tuple[int, ...]) -> None:
        self.fields = fields
        self.metrics = [FIELD_NAMES.get(f, (f"f{f}", "gauge")) for f in fields]
        self.scales = [FIELD_SCALE.get(f, 1.0) for f in fields]

    def parse(self, line: str) -> list[tuple[str, str, float, str]] | None:
        """Values of a data row; None for headers, units and unrecognised lines."""
        words = line.split()
        if len(words) < 3 or line.lstrip().startswith("#") or words[0] == "ID":
            return None
        group, ident, values = words[0], words[1], words[2:]
        if not (ident.isdigit() or "/" in ident):
            return None
        device = f"gpu{ident}" if group == "GPU" else f"{group.lower()}{ident}"
        out = []
        for (metric, kind), scale, text in zip(self.metrics, self.scales, values):
            if text == "N/A":
                continue
            try:
                out.append((device, metric, float(text) * scale, kind))
            except ValueError:
                continue
        return out


class DcgmCollector(Collector):
    source = "dcgm"

    def __init__(
        self,
        fields: tuple[int, ...] = DEFAULT_FIELDS,
        interval_s: float = 0.5,
        dcgmi: str = "dcgmi",
        which: Callable[[str], str | None] = shutil.which,
        probe_timeout_s: float = 8.0,
    ) -> None:
        super().__init__()
        self.fields = tuple(fields)
        self.interval_ms = max(100, round(interval_s * 1000))
        self.dcgmi = dcgmi
        self.which = which
        self.probe_timeout_s = probe_timeout_s
        self.parser = DmonParser(self.fields)
        self._proc: subprocess.Popen[str] | None = None
        self._queue: deque[Emit] = deque()
        self._lines: deque[str] = deque(maxlen=20)  # dmon's last words, for reasons
        self._got_data = threading.Event()
        self._thread: threading.Thread | None = None

    def probe(self) -> None:
        path = self.which(self.dcgmi)
        if path is None:
            raise Unavailable(f"{self.dcgmi} not found on PATH (DCGM not installed)")
        argv = dmon_argv(path, self.fields, self.interval_ms)
        self.record_command("dcgmi_dmon", argv)
        try:
            self._proc = spawn_line_tool(argv, lines_on="stdout")
        except OSError as e:
            raise Unavailable(f"cannot start {argv[0]}: {e}") from None
        self._thread = threading.Thread(target=self._read, name="dcgm-dmon", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.probe_timeout_s
        while time.monotonic() < deadline:
            if self._got_data.wait(0.05):
                return
            if self._proc.poll() is not None:
                break
        reason = " | ".join(line.strip() for line in self._lines if line.strip())[-500:]
        self.close()
        if self._proc is not None and self._proc.returncode not in (None, 0):
            raise Unavailable(f"dcgmi dmon exited {self._proc.returncode}: {reason or 'no output'}")
        raise Unavailable(
            f"dcgmi dmon gave no data in {self.probe_timeout_s}s: {reason or 'no output'}"
        )

    def _read(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        for line in proc.stdout:
            wall = time.time_ns()
            rows = self.parser.parse(line)
            if rows is None:
                self._lines.append(line)
                continue
            self._got_data.set()
            for device, metric, value, kind in rows:
                self._queue.append((wall, device, metric, value, kind))

    def sample(self, wall_ns: int) -> list[Emit]:
        proc = self._proc
        exited = proc is not None and proc.poll() is not None and self.failed is None
        if exited and self._thread is not None:
            self._thread.join(1.0)  # its last rows and words may still be in the pipe
        out = []
        q = self._queue
        while q:
            out.append(q.popleft())
        if exited:
            assert proc is not None
            tail = " | ".join(line.strip() for line in self._lines if line.strip())[-300:]
            self.failed = f"dcgmi dmon exited {proc.returncode} mid-run: {tail}"
            self.mark_unavailable("", self.failed)
        return out

    def close(self) -> None:
        stop_line_tool(self._proc)
        if self._thread is not None:
            self._thread.join(1)


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory (``registry.py``): the agent's options -> this collector."""
    fields = tuple(int(f) for f in args.dcgm_fields.split(",") if f.strip())
    return DcgmCollector(fields=fields, interval_s=args.interval)

"""The run's resolved telemetry facts, as ``manifest.json`` records them at run start.

The profile is read once (``configure/profile.py``); what analysis and the report need
from it (the sampling interval, link capacities, whether GPUs and RDMA rails are
expected) is written here into the manifest under ``telemetry``, so a run folder is
analysed from its own record, never by re-reading the profile TOML with other defaults.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The key of these facts in manifest.json.
MANIFEST_KEY = "telemetry"
#: The sampling interval a run folder without these facts is read with (the profile default).
DEFAULT_INTERVAL_S = 0.5


@dataclass(frozen=True)
class TelemetryFacts:
    interval_s: float = DEFAULT_INTERVAL_S
    collectors: tuple[str, ...] = ()
    #: "node/iface" -> bits/s where the real limit is not the NIC's rate (shaping, a
    #: shared uplink): the network rules measure against it.
    link_caps_bits_s: dict[str, float] = field(default_factory=dict)
    #: the profile says the server runs on GPUs (telemetry.gpu_expected, or a container
    #: given GPUs); the run can still show one (NVML samples, :func:`engine_gpu_line`)
    gpu_expected: bool = False
    #: RDMA devices the collectives should use (NCCL_IB_HCA), in the profile's order.
    expected_rails: tuple[str, ...] = ()
    expects_rdma: bool = False  # rdma is sampled, or NCCL_IB_HCA is set

    def to_json(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "collectors": list(self.collectors),
                "link_caps_bits_s": dict(sorted(self.link_caps_bits_s.items())),
                "gpu_expected": self.gpu_expected, "expected_rails": list(self.expected_rails),
                "expects_rdma": self.expects_rdma}

    def link_caps(self) -> dict[tuple[str, str], float]:
        """(node, iface) -> bytes/s per direction, as the rails analysis wants them."""
        out = {}
        for key, bits in self.link_caps_bits_s.items():
            node, sep, iface = key.rpartition("/")
            if sep and node and iface:
                out[(node, iface)] = bits / 8.0
        return out

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> TelemetryFacts:
        """The facts a run recorded; a folder from before they were recorded reads as the
        defaults (its top-level ``gpu_expected`` still honoured). Values that do not
        parse are dropped, never guessed."""
        t = manifest.get(MANIFEST_KEY)
        t = t if isinstance(t, Mapping) else {}
        interval = _positive(t.get("interval_s")) or DEFAULT_INTERVAL_S
        caps = {}
        raw_caps = t.get("link_caps_bits_s")
        for key, bits in (raw_caps.items() if isinstance(raw_caps, Mapping) else ()):
            v = _positive(bits)
            if v is not None and "/" in str(key):
                caps[str(key)] = v
        collectors = t.get("collectors")
        rails = t.get("expected_rails")
        return cls(
            interval_s=interval,
            collectors=tuple(str(c) for c in collectors) if isinstance(collectors, list) else (),
            link_caps_bits_s=caps,
            gpu_expected=bool(t.get("gpu_expected", manifest.get("gpu_expected", False))),
            expected_rails=tuple(str(r) for r in rails) if isinstance(rails, list) else (),
            expects_rdma=bool(t.get("expects_rdma", False)))


@dataclass(frozen=True)
class SampleMetric:
    """One series of the telemetry samples (``samples/<source>.csv``): who writes it, its
    kind and unit, and what it means. The agent cannot import this (it is
    self-contained, docs/agent.md); its tests hold what it emits to these rows."""

    source: str
    metric: str
    device: str  # "" host-wide or the server's tree; else the device's pattern
    kind: str  # "counter" (cumulative) or "gauge" (a level)
    unit: str
    meaning: str


#: Sample series declared here as they are added (docs/formats.md lists the older ones).
SAMPLE_METRICS = (
    SampleMetric(
        "runstate", "queued_s", "", "counter", "s",
        "thread-seconds the server's threads were runnable without a CPU, counted while "
        "the wait lasts: the kernel's run_delay (``wait_s``, booked only when a wait ends) "
        "plus the span a thread in R has not run since the last sample, once longer than "
        "the scheduler tick; at most about one interval late, never above what the kernel "
        "books. Its growth over an interval against ``run_s``'s is the interval's split "
        "between waiting for a CPU and running, however the CPU was lost"),
    SampleMetric(
        "runstate", "state_R_run", "", "gauge", "threads",
        "threads in R at the sample whose run time over the interval just ended was at "
        "least their queued time (on a CPU, mostly)"),
    SampleMetric(
        "runstate", "state_R_wait", "", "gauge", "threads",
        "threads in R at the sample whose queued time over the interval just ended "
        "exceeded their run time (kept from a CPU); state_R_run + state_R_wait = state_R"),
    SampleMetric(
        "allowance", "children_cpu_s", "pid<N> <command>", "counter", "s",
        "CPU of the named process's children that ended and were reaped (cutime + "
        "cstime), less what was counted under another name (a child's own series while "
        "it was named, the server's tree, the path's proxies): the work of its short-"
        "lived children. Its growth plus cpu_s's is the process's CPU as an actor; the "
        "list is ranked by both"),
    SampleMetric(
        "cpu", "forks", "", "counter", "count",
        "processes and threads started on the host (/proc/stat ``processes``); its rate "
        "is the host's rate of process starts"),
)


def _positive(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


#: Lines an engine prints at start-up when it runs on a GPU, as the engine words them:
#: llama.cpp names each GPU device a model is loaded on (``llama_model_load_from_file_impl:
#: using device CUDA0 (...) - N MiB free``, src/llama.cpp), vLLM the platform it detected
#: (``Automatically detected platform cuda.``, vllm/platforms/__init__.py). A CPU build
#: prints neither (llama.cpp lists no CPU device; vLLM says ``platform cpu``).
ENGINE_GPU_LINES = (
    ("llama.cpp", re.compile(r"using device (?:CUDA|ROCm|HIP|Vulkan|SYCL|Metal|MUSA|CANN)\d*\b")),
    ("vLLM", re.compile(r"Automatically detected platform (?:cuda|rocm|tpu|xpu|hpu)\b")),
)
#: How much of each server log is read for them (they come in the first lines).
ENGINE_LOG_HEAD_BYTES = 4 << 20


def engine_gpu_line(text: str) -> str | None:
    """The first line of an engine's log saying it runs on a GPU, or None."""
    for line in text.splitlines():
        if any(rx.search(line) for _, rx in ENGINE_GPU_LINES):
            return line.strip()
    return None


def engine_reports_gpu(run_dir: Path) -> str | None:
    """``service/<block>/*.log`` of a run: the first line where the engine reports a GPU."""
    for log in sorted(Path(run_dir).glob("service/*/*.log")):
        try:
            with log.open("rb") as fh:
                text = fh.read(ENGINE_LOG_HEAD_BYTES).decode("utf-8", "replace")
        except OSError:
            continue
        line = engine_gpu_line(text)
        if line is not None:
            return line
    return None

"""The device's limits a case is held against: peak memory bandwidth and peak FLOPs,
each saying whether it was measured, reported by the device (NVML) or taken from a
datasheet, and from what.

* A CPU (the embedded target): the probe's measurements (run/cpu_probe.py), recorded in
  the manifest (``roofline.<config>.cpu``): memory bandwidth over arrays beyond the
  last-level cache, the same within it, and float32 matrix-multiply FLOPs.
* GPUs: bandwidth from NVML's maximum memory clock and bus width (the agent's static
  snapshot, ``gpus.json``): clock x bus width / 8 x 2, the memory transferring on both
  clock edges (double data rate; the clock NVML reports for HBM and GDDR alike). Where
  NVML does not give both, the datasheet's bandwidth (analysis/gpu_datasheets.py). FLOPs
  from the datasheet row for the data type the model computes in. PCIe from the link's
  generation and width (per direction, after line encoding: PCI Express Base
  Specification, each generation's transfer rate and encoding), NVLink from the active
  links and NVML's common link speed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata_plugin.analysis.gpu_datasheets import datasheet_for

#: NVML's bandwidth may differ from the datasheet's by the rounding of the stated figure
#: and the memory clock's reporting: H200, 3201 MHz x 6144 bits x 2 = 4.92 TB/s against
#: 4.8 TB/s stated (+2.4%); H100 SXM 2619 MHz x 5120 bits = 3.35 TB/s (0.1%). More than
#: this is worth a note (a clock capped, a wrong row).
NVML_DATASHEET_TOLERANCE = 0.05

#: PCIe generation -> (GT/s per lane, encoding efficiency): 8b/10b for 1-2, 128b/130b for
#: 3-5, and 6.0's FLIT mode at 242/256 (PCI Express Base Specification 1.0-6.0)
PCIE_GEN = {1: (2.5, 0.8), 2: (5.0, 0.8), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130),
            5: (32.0, 128 / 130), 6: (64.0, 242 / 256)}


@dataclass(frozen=True)
class Peak:
    what: str  # "memory bandwidth", "FLOPs (bf16)"
    value: float | None  # bytes/s or FLOP/s; None: unavailable
    unit: str  # "B/s" | "FLOP/s"
    basis: str = ""  # "measured" | "nvml" | "datasheet"
    source: str = ""  # how it was obtained
    unavailable: str = ""

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"what": self.what, "value": self.value, "unit": self.unit}
        if self.value is None:
            d["unavailable"] = self.unavailable
        else:
            d.update(basis=self.basis, source=self.source)
        return d


@dataclass(frozen=True)
class DeviceLimits:
    kind: str  # "cpu" | "gpu"
    device: str  # what it is, in words
    bandwidth: Peak  # memory (DRAM/HBM)
    flops: Peak
    #: a CPU's last-level cache: its size and the bandwidth within it (None on a GPU)
    cache_bytes: int | None = None
    cache_bandwidth: Peak | None = None
    links: tuple[Peak, ...] = ()  # PCIe, NVLink
    #: the CPUs the server may run on (the probe's), for "the device was busy"
    n_cpus: int | None = None
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "device": self.device,
                "bandwidth": self.bandwidth.to_json(), "flops": self.flops.to_json(),
                "cache_bytes": self.cache_bytes,
                "cache_bandwidth": None if self.cache_bandwidth is None
                else self.cache_bandwidth.to_json(),
                "links": [p.to_json() for p in self.links], "n_cpus": self.n_cpus,
                "notes": list(self.notes)}


def _gb(x: float) -> str:
    return f"{x / 1e12:.3g} TB/s" if x >= 1e12 else f"{x / 1e9:.3g} GB/s"


# --- the CPU ------------------------------------------------------------------------------


def cpu_limits(probe: Mapping[str, Any], dtype: str = "fp32") -> DeviceLimits:
    """The CPU's limits from the probe recorded in the manifest; the compute roof for the
    type the model computes in: bf16 where the probe measured it (the engine's own torch),
    else float32 GEMM."""
    cpus = list(probe.get("cpus") or ())
    where = f"{len(cpus)} CPU{'s' if len(cpus) != 1 else ''} ({_cpulist(cpus)})"
    model = (probe.get("fingerprint") or {}).get("cpu_model") or "CPU"
    when = probe.get("measured_utc", "")
    cached = " (cached for this machine)" if probe.get("cached_from") else ""
    load = probe.get("other_busy_cores")
    notes = []
    if probe.get("contended"):
        notes.append(f"measured while other processes held {load} of the {len(cpus)} probed "
                     "CPUs: the peaks may read low")

    def bw(level: str) -> Peak:
        runs = [r for r in probe.get(level) or () if isinstance(r, dict) and r.get("bytes_s")]
        if not runs:
            return Peak(f"memory bandwidth ({level})", None, "B/s",
                        unavailable=f"no {level} bandwidth in the probe")
        best = max(runs, key=lambda r: r["bytes_s"])
        others = ", ".join(f"{r['kernel']} {_gb(r['bytes_s'])}" for r in runs)
        return Peak(f"memory bandwidth ({'DRAM' if level == 'dram' else 'last-level cache'})",
                    float(best["bytes_s"]), "B/s", "measured",
                    f"the best of STREAM triad and a read pass ({others}) over "
                    f"{best['array_bytes'] / 2**20:.4g} MiB arrays per CPU on {where}, best of "
                    f"{best['reps']}; {when}{cached}")

    mm = probe.get("matmul") or {}
    flops = (Peak("FLOPs (float32 GEMM)", float(mm["flops_s"]), "FLOP/s", "measured",
                  f"numpy float32 matmul {mm['n']}x{mm['n']} on {where}, best of "
                  f"{mm['reps']}; {when}{cached}")
             if mm.get("flops_s") else
             Peak("FLOPs (float32 GEMM)", None, "FLOP/s", unavailable="no matmul probe"))
    bf = probe.get("matmul_bf16") or {}
    if (dtype == "bf16" and bf.get("flops_s") and flops.value is not None
            and float(bf["flops_s"]) < flops.value):
        # A roof must bound what the engine can do: a CPU without bf16 instructions (AVX2
        # only) runs torch's bf16 multiply emulated, slower than float32, and an engine
        # may compute in float32 there; the higher roof holds either way.
        notes.append(f"the bf16 matmul measured {float(bf['flops_s']) / 1e9:.3g} GFLOP/s, "
                     "below float32's (no bf16 in this CPU's instructions: emulated): the "
                     "float32 roof")
    elif dtype == "bf16" and bf.get("flops_s"):
        engine = (probe.get("fingerprint") or {}).get("engine_python") or "the engine's python"
        flops = Peak("FLOPs (bf16 GEMM)", float(bf["flops_s"]), "FLOP/s", "measured",
                     f"torch {bf.get('torch', '')} bf16 matmul {bf['n']}x{bf['n']} through "
                     f"the server's interpreter ({engine}) on {where}, best of {bf['reps']}; "
                     f"{when}{cached}")
    elif dtype == "bf16" and bf.get("unavailable"):
        notes.append(f"no bf16 matmul measured ({bf['unavailable']}): the float32 roof")
    return DeviceLimits("cpu", f"{model}, {where}", bw("dram"), flops,
                        cache_bytes=probe.get("llc_bytes"), cache_bandwidth=bw("llc"),
                        n_cpus=len(cpus) or None, notes=tuple(notes))


def _cpulist(cpus: Sequence[int]) -> str:
    if not cpus:
        return "-"
    out, start, prev = [], cpus[0], cpus[0]
    for c in [*cpus[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(out)


# --- GPUs ---------------------------------------------------------------------------------


def gpu_bandwidth(g: Mapping[str, Any]) -> Peak:
    """One GPU's memory bandwidth: NVML's max memory clock x bus width x 2, else its
    datasheet row's."""
    clock, bus = g.get("mem_clock_max_mhz"), g.get("memory_bus_width_bits")
    sheet = datasheet_for(str(g.get("name", "")))
    if isinstance(clock, (int, float)) and isinstance(bus, (int, float)) and clock and bus:
        v = clock * 1e6 * bus / 8 * 2
        src = (f"NVML: max memory clock {clock:g} MHz x {bus:g}-bit bus / 8 x 2 (double "
               "data rate)")
        if sheet is not None:
            dev = v / sheet.bandwidth_bytes_s - 1
            src += f"; datasheet {sheet.row} {_gb(sheet.bandwidth_bytes_s)} ({dev:+.1%})"
        return Peak("memory bandwidth (HBM/GDDR)", v, "B/s", "nvml", src)
    if sheet is not None:
        why = "NVML gives no memory clock or bus width"
        return Peak("memory bandwidth (HBM/GDDR)", sheet.bandwidth_bytes_s, "B/s",
                    "datasheet", f"{why}: {sheet.source}")
    return Peak("memory bandwidth (HBM/GDDR)", None, "B/s",
                unavailable=f"NVML gives no memory clock or bus width and no datasheet row "
                f"matches {g.get('name')!r} (analysis/gpu_datasheets.py)")


def gpu_flops(g: Mapping[str, Any], dtype: str) -> Peak:
    sheet = datasheet_for(str(g.get("name", "")))
    if sheet is None:
        return Peak(f"FLOPs ({dtype})", None, "FLOP/s",
                    unavailable=f"no datasheet row matches {g.get('name')!r} "
                    "(analysis/gpu_datasheets.py)")
    v = sheet.peak_flops(dtype)
    if v is None:
        return Peak(f"FLOPs ({dtype})", None, "FLOP/s",
                    unavailable=f"{sheet.row}: the datasheet states no {dtype} rate")
    return Peak(f"FLOPs ({dtype}, dense)", v, "FLOP/s", "datasheet",
                f"{sheet.row}: {sheet.source}")


def pcie_link(g: Mapping[str, Any]) -> Peak:
    gen, width = g.get("pcie_link_gen_max"), g.get("pcie_link_width_max")
    if not isinstance(gen, int) or not isinstance(width, int) or gen not in PCIE_GEN:
        return Peak("PCIe (per direction)", None, "B/s",
                    unavailable="NVML gives no PCIe generation or width")
    gts, enc = PCIE_GEN[gen]
    return Peak("PCIe (per direction)", gts * 1e9 * enc / 8 * width, "B/s", "nvml",
                f"NVML: PCIe Gen{gen} x{width}, {gts:g} GT/s per lane, encoding {enc:.4g}")


def nvlink(g: Mapping[str, Any]) -> Peak | None:
    nv = g.get("nvlink")
    if not isinstance(nv, dict) or not nv.get("links_active"):
        return None
    speed = nv.get("speed_mbps_per_link")
    if not isinstance(speed, (int, float)):
        return Peak("NVLink", None, "B/s", unavailable=f"link speed: {speed}")
    n = int(nv["links_active"])
    return Peak("NVLink", n * speed * 1e6, "B/s", "nvml",
                f"NVML: {n} active links x {speed:g} MB/s (NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON)")


def gpu_limits(gpus: Sequence[Mapping[str, Any]], dtype: str) -> DeviceLimits:
    """The GPUs a case ran on, summed (a model split across them reads its parts in
    parallel)."""
    if not gpus:
        missing = Peak("", None, "", unavailable="no GPU in the static snapshots")
        return DeviceLimits("gpu", "no GPU", missing, missing)
    bws = [gpu_bandwidth(g) for g in gpus]
    fls = [gpu_flops(g, dtype) for g in gpus]
    names = sorted({str(g.get("name", "?")) for g in gpus})
    device = f"{len(gpus)} x {', '.join(names)}"

    def total(ps: list[Peak]) -> Peak:
        if any(p.value is None for p in ps):
            return next(p for p in ps if p.value is None)
        src = ps[0].source if len(ps) == 1 else f"{len(ps)} GPUs summed; each: {ps[0].source}"
        return Peak(ps[0].what, sum(p.value or 0.0 for p in ps), ps[0].unit, ps[0].basis, src)

    notes = []
    for g, p in zip(gpus, bws):
        sheet = datasheet_for(str(g.get("name", "")))
        if p.basis == "nvml" and sheet is not None and p.value:
            off = p.value / sheet.bandwidth_bytes_s - 1
            if abs(off) > NVML_DATASHEET_TOLERANCE:
                notes.append(f"gpu{g.get('index')}: NVML's bandwidth {_gb(p.value)} is "
                             f"{off:+.1%} off its datasheet's {_gb(sheet.bandwidth_bytes_s)}")
    links = [pcie_link(gpus[0])]
    nvl = nvlink(gpus[0])
    if nvl is not None:
        links.append(nvl)
    return DeviceLimits("gpu", device, total(bws), total(fls), links=tuple(links),
                        notes=tuple(notes))


def snapshot_gpus(run_dir: Path, nodes: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The GPUs of the nodes' "before" static snapshots (``gpus.json``), node by node;
    each with ``node`` added."""
    out: list[dict[str, Any]] = []
    root = Path(run_dir) / "nodes"
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        if nodes is not None and d.name not in nodes:
            continue
        p = d / "static" / "before" / "gpus.json"
        try:
            facts = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        for g in facts.get("gpus") or ():
            if isinstance(g, dict):
                out.append({**g, "node": d.name})
    return out


def compute_dtype(weight_dtype: str | None, engine_dtype: str | None = None) -> str:
    """The data type a GPU's matrix multiplies run in, from the stored weights: 16-bit
    floats as themselves; FP8 as fp8; GGUF's quantized blocks as int8 (llama.cpp's CUDA
    kernels multiply them as int8 dot products with the activations quantized to 8 bits);
    packed integer Hugging Face weights (GPTQ/AWQ, dequantized to 16-bit) as fp16;
    float32 as fp32."""
    w = (engine_dtype or weight_dtype or "").upper()
    if w in ("BF16", "BFLOAT16"):
        return "bf16"
    if w in ("F16", "FP16", "FLOAT16", "HALF"):
        return "fp16"
    if w.startswith(("F8", "FP8")):
        return "fp8"
    if w in ("F32", "FP32", "FLOAT32"):
        return "fp32"
    if w.startswith(("Q", "IQ", "TQ", "I8", "INT8", "MXFP4")):
        return "int8"  # GGUF blocks (llama.cpp's MMQ kernels: int8 dot products)
    return "fp16"  # packed 4-bit HF weights (GPTQ/AWQ): dequantized to 16-bit

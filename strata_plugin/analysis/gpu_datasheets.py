"""Data-center GPUs' peaks from their vendor's public datasheets: dense FLOPs per data
type, and the memory bandwidth the datasheet states.

Why a table: NVML gives a GPU's memory clock and bus width (so its bandwidth, computed in
analysis/device_limits.py), never its FLOPs. Each row cites the document and the table it
was copied from. NVIDIA's Hopper and Blackwell datasheets give Tensor Core rates *with
sparsity* (2:4 structured, footnoted "*"); a dense matrix multiply does half of that, and
the rows below hold the dense figure (the datasheet's number / 2, said in the row). The
A100 and L40S datasheets state dense and sparse side by side; their dense figures are
taken as they are.

Matching: NVML's device name (``nvmlDeviceGetName``, e.g. ``NVIDIA H100 80GB HBM3``),
upper-cased, against each row's patterns, first match wins; the form factors that share a
chip (SXM, PCIe, NVL) are told apart by their names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TFLOP = 1e12


@dataclass(frozen=True)
class Datasheet:
    row: str  # the product as the datasheet names it
    patterns: tuple[str, ...]  # regexes on the upper-cased NVML name
    bandwidth_bytes_s: float
    #: dense peak, FLOP/s (ops/s for int8), by data type
    flops: tuple[tuple[str, float], ...]
    source: str  # the document and its table

    def peak_flops(self, dtype: str) -> float | None:
        return dict(self.flops).get(dtype)


def _dense(**tflops: float) -> tuple[tuple[str, float], ...]:
    return tuple((k, v * TFLOP) for k, v in tflops.items())


H100_DS = ("NVIDIA H100 Tensor Core GPU Datasheet (nvidia.com/en-us/data-center/h100), "
           "table 'Technical Specifications'")
H100_PCIE_DS = ("NVIDIA H100 PCIe GPU Product Brief PB-11133-001, Table 1 'Product "
                "Specifications'")
H200_DS = ("NVIDIA H200 Tensor Core GPU Datasheet (nvidia.com/en-us/data-center/h200), "
           "table 'Technical Specifications'")
A100_DS = ("NVIDIA A100 Tensor Core GPU Datasheet (nvidia.com/en-us/data-center/a100), "
           "table 'NVIDIA A100 Tensor Core GPU Specifications'")
L40S_DS = ("NVIDIA L40S GPU Datasheet (nvidia.com/en-us/data-center/l40s), table "
           "'L40S Specifications'")
HGX_DS = ("NVIDIA HGX platform specifications (nvidia.com/en-us/data-center/hgx), table "
          "'Specifications', HGX B200 column (8 GPUs, Tensor Core rates with sparsity)")
SPARSE = "Tensor Core rates: the datasheet's with-sparsity figure / 2"

DATASHEETS: tuple[Datasheet, ...] = (
    Datasheet("H200 NVL", (r"\bH200 NVL",), 4.8e12,
              _dense(fp64=30, fp32=60, tf32=835 / 2, bf16=1671 / 2, fp16=1671 / 2,
                     fp8=3341 / 2, int8=3341 / 2),
              f"{H200_DS}, H200 NVL column: 4.8 TB/s; {SPARSE}"),
    Datasheet("H200 SXM", (r"\bH200\b",), 4.8e12,
              _dense(fp64=34, fp32=67, tf32=989 / 2, bf16=1979 / 2, fp16=1979 / 2,
                     fp8=3958 / 2, int8=3958 / 2),
              f"{H200_DS}, H200 SXM column: 4.8 TB/s; {SPARSE}"),
    Datasheet("H100 NVL", (r"\bH100 NVL",), 3.9e12,
              _dense(fp64=30, fp32=60, tf32=835 / 2, bf16=1671 / 2, fp16=1671 / 2,
                     fp8=3341 / 2, int8=3341 / 2),
              f"{H100_DS}, H100 NVL column: 3.9 TB/s; {SPARSE}"),
    Datasheet("H100 PCIe", (r"H100 PCIE", r"H100.*PCIE"), 2.0e12,
              _dense(fp64=26, fp32=51, tf32=756 / 2, bf16=1513 / 2, fp16=1513 / 2,
                     fp8=3026 / 2, int8=3026 / 2),
              f"{H100_PCIE_DS}: 2,000 GB/s; {SPARSE}"),
    Datasheet("H100 SXM", (r"H100 80GB HBM3", r"H100 SXM", r"H100$"), 3.35e12,
              _dense(fp64=34, fp32=67, tf32=989 / 2, bf16=1979 / 2, fp16=1979 / 2,
                     fp8=3958 / 2, int8=3958 / 2),
              f"{H100_DS}, H100 SXM column: 3.35 TB/s; {SPARSE}"),
    Datasheet("A100 80GB SXM", (r"A100-SXM4-80GB", r"A100.*SXM.*80GB"), 2.039e12,
              _dense(fp64=9.7, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
              f"{A100_DS}, A100 80GB SXM column: 2,039 GB/s; dense figures as stated"),
    Datasheet("A100 80GB PCIe", (r"A100 80GB PCIE", r"A100.*PCIE.*80GB"), 1.935e12,
              _dense(fp64=9.7, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
              f"{A100_DS}, A100 80GB PCIe column: 1,935 GB/s; dense figures as stated"),
    Datasheet("A100 40GB", (r"A100-SXM4-40GB", r"A100-PCIE-40GB", r"A100.*40GB"), 1.555e12,
              _dense(fp64=9.7, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
              f"{A100_DS}, A100 40GB PCIe and SXM columns: 1,555 GB/s; dense figures "
              "as stated"),
    Datasheet("L40S", (r"L40S",), 864e9,
              _dense(fp32=91.6, tf32=183, bf16=362.05, fp16=362.05, fp8=733, int8=733),
              f"{L40S_DS}: 864 GB/s; dense figures as stated (beside the with-sparsity "
              "ones)"),
    Datasheet("B200", (r"B200",), 8.0e12,
              _dense(fp64=296 / 8, fp32=600 / 8, tf32=18000 / 16, bf16=36000 / 16,
                     fp16=36000 / 16, fp8=72000 / 16, int8=72000 / 16),
              f"{HGX_DS}: 64 TB/s aggregate / 8 GPUs; per GPU = the column / 8, Tensor "
              "Core rates / 2 again for dense"),
)


def datasheet_for(name: str) -> Datasheet | None:
    """The row whose pattern matches NVML's device name, or None."""
    up = name.upper().strip()
    for d in DATASHEETS:
        if any(re.search(p, up) for p in d.patterns):
            return d
    return None

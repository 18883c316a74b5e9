"""The device's limits (analysis/device_limits.py, analysis/gpu_datasheets.py): GPUs from
recorded NVML values (tests/fake_nvml.py, which says it is fake) and their datasheets;
the CPU from the probe's record."""

from __future__ import annotations

import json

import pytest

from strata_plugin.agent.snapshot import collect_snapshot
from strata_plugin.analysis.device_limits import (
    NVML_DATASHEET_TOLERANCE,
    compute_dtype,
    cpu_limits,
    gpu_bandwidth,
    gpu_limits,
    pcie_link,
    snapshot_gpus,
)
from strata_plugin.analysis.gpu_datasheets import DATASHEETS, datasheet_for
from tests.fake_nvml import FakeGpu, FakeNvml

#: NVML readings of real GPUs: (nvmlDeviceGetName, max memory clock MHz, bus width bits),
#: the clocks as nvidia-smi -q reports them ("Max Clocks: Memory") and the bus widths of
#: their memory (HBM: 1024 bits a stack, 5 stacks on H100/A100, 6 on H200; L40S: GDDR6,
#: 384 bits).
RECORDED = {
    "H100 SXM": ("NVIDIA H100 80GB HBM3", 2619, 5120),
    "H200 SXM": ("NVIDIA H200", 3201, 6144),
    "A100 80GB SXM": ("NVIDIA A100-SXM4-80GB", 1593, 5120),
    "L40S": ("NVIDIA L40S", 9001, 384),
}


def _gpus(*gpus: FakeGpu) -> list[dict]:
    files = collect_snapshot(nvml=FakeNvml(list(gpus)), which=lambda name: None,
                             python_packages=False)
    return json.loads(files["gpus.json"])["gpus"]


@pytest.mark.parametrize("row", sorted(RECORDED))
def test_nvml_bandwidth_agrees_with_the_datasheet_within_the_tolerance(row):
    name, clock, bus = RECORDED[row]
    (g,) = _gpus(FakeGpu(name=name, mem_clock_max_mhz=clock, bus_width_bits=bus))
    assert g["memory_bus_width_bits"] == bus and g["mem_clock_max_mhz"] == clock
    p = gpu_bandwidth(g)
    assert p.basis == "nvml" and p.value == clock * 1e6 * bus / 8 * 2
    sheet = datasheet_for(name)
    assert sheet is not None and sheet.row == row
    assert abs(p.value / sheet.bandwidth_bytes_s - 1) <= NVML_DATASHEET_TOLERANCE
    assert f"datasheet {row}" in p.source


def test_a_capped_memory_clock_is_a_note_and_not_silently_the_datasheet():
    g = _gpus(FakeGpu(name="NVIDIA H100 80GB HBM3", mem_clock_max_mhz=1593))
    lim = gpu_limits(g, "bf16")
    assert lim.bandwidth.value == pytest.approx(1593e6 * 5120 / 8 * 2)
    assert lim.notes and lim.notes[0] == ("gpu0: NVML's bandwidth 2.04 TB/s is -39.1% off its "
                                      "datasheet's 3.35 TB/s")
    # just inside the tolerance: no note (3.35 TB/s x 1.05 = 2748 MHz on a 5120-bit bus)
    ok = _gpus(FakeGpu(name="NVIDIA H100 80GB HBM3", mem_clock_max_mhz=2748))
    assert gpu_limits(ok, "bf16").notes == ()
    over = _gpus(FakeGpu(name="NVIDIA H100 80GB HBM3", mem_clock_max_mhz=2752))
    assert gpu_limits(over, "bf16").notes


def test_without_a_bus_width_the_datasheet_gives_the_bandwidth():
    nv = FakeNvml([FakeGpu(name="NVIDIA H200")], not_supported={"nvmlDeviceGetMemoryBusWidth"})
    g = json.loads(collect_snapshot(nvml=nv, which=lambda n: None,
                                    python_packages=False)["gpus.json"])["gpus"]
    assert "UNAVAILABLE" in str(g[0]["memory_bus_width_bits"])
    p = gpu_bandwidth(g[0])
    assert (p.basis, p.value) == ("datasheet", 4.8e12)
    unknown = gpu_bandwidth({"name": "Some Future GPU"})
    assert unknown.value is None and "no datasheet row matches" in unknown.unavailable


def test_dense_flops_are_half_the_sparse_datasheet_figures():
    assert datasheet_for("NVIDIA H100 80GB HBM3").peak_flops("bf16") == 1979e12 / 2
    assert datasheet_for("NVIDIA H200").peak_flops("fp8") == 3958e12 / 2
    assert datasheet_for("NVIDIA A100-SXM4-80GB").peak_flops("bf16") == 312e12  # stated dense
    assert datasheet_for("NVIDIA L40S").peak_flops("bf16") == 362.05e12  # stated dense
    assert datasheet_for("NVIDIA B200").peak_flops("bf16") == 36e15 / 16
    for d in DATASHEETS:  # every row cites a document and its table
        assert "table" in d.source.lower() or "Table" in d.source, d.row


def test_names_pick_the_form_factor_and_not_a_lookalike():
    assert datasheet_for("NVIDIA H100 PCIe").row == "H100 PCIe"
    assert datasheet_for("NVIDIA H100 NVL").row == "H100 NVL"
    assert datasheet_for("NVIDIA H200 NVL").row == "H200 NVL"
    assert datasheet_for("NVIDIA A100-PCIE-40GB").row == "A100 40GB"
    assert datasheet_for("NVIDIA A100 80GB PCIe").row == "A100 80GB PCIe"
    assert datasheet_for("NVIDIA GH200 480GB") is None  # Grace Hopper: not the H200 row
    assert datasheet_for("NVIDIA GeForce RTX 4090") is None


def test_two_gpus_sum_and_the_links_come_from_nvml():
    gpus = _gpus(FakeGpu(), FakeGpu())
    lim = gpu_limits(gpus, compute_dtype("BF16"))
    assert lim.bandwidth.value == pytest.approx(2 * 2619e6 * 5120 / 8 * 2)
    assert lim.flops.value == 2 * 1979e12 / 2 and lim.flops.basis == "datasheet"
    pcie, nvl = lim.links
    assert pcie.value == pytest.approx(32e9 * 128 / 130 / 8 * 16)  # Gen5 x16 per direction
    assert nvl.value == 18 * 25_000 * 1e6
    no_nvlink = _gpus(FakeGpu(nvlink_links=0))[0]
    assert no_nvlink["nvlink"]["links_active"] == 0
    assert len(gpu_limits([no_nvlink], "bf16").links) == 1
    assert pcie_link({"pcie_link_gen_max": "UNAVAILABLE: x"}).value is None


def test_the_compute_type_follows_the_stored_weights():
    assert [compute_dtype(w) for w in ("BF16", "F16", "F8_E4M3", "F32", "Q8_0", "Q4_K", "I32")] \
        == ["bf16", "fp16", "fp8", "fp32", "int8", "int8", "fp16"]


def test_gpus_are_read_from_each_nodes_before_snapshot(tmp_path):
    for node, n in (("a", 2), ("b", 1)):
        d = tmp_path / "nodes" / node / "static" / "before"
        d.mkdir(parents=True)
        files = collect_snapshot(nvml=FakeNvml([FakeGpu()] * n), which=lambda x: None,
                                 python_packages=False)
        (d / "gpus.json").write_text(files["gpus.json"])
    got = snapshot_gpus(tmp_path)
    assert [(g["node"], g["index"]) for g in got] == [("a", 0), ("a", 1), ("b", 0)]


def test_the_cpu_limits_are_the_probes_best_kernel_and_say_measured():
    probe = {"cpus": [0, 1], "llc_bytes": 32 << 20, "measured_utc": "T",
             "fingerprint": {"cpu_model": "AMD EPYC"},
             "dram": [{"kernel": "triad", "bytes_s": 20e9, "array_bytes": 64 << 20, "reps": 4},
                      {"kernel": "read", "bytes_s": 30e9, "array_bytes": 64 << 20, "reps": 4}],
             "llc": [{"kernel": "read", "bytes_s": 150e9, "array_bytes": 2 << 20, "reps": 20}],
             "matmul": {"flops_s": 200e9, "n": 2048, "reps": 4},
             "contended": True, "other_busy_cores": 0.7}
    lim = cpu_limits(probe)
    assert (lim.bandwidth.value, lim.bandwidth.basis) == (30e9, "measured")
    assert "triad 20 GB/s, read 30 GB/s" in lim.bandwidth.source
    assert lim.cache_bandwidth.value == 150e9 and lim.cache_bytes == 32 << 20
    assert lim.flops.value == 200e9 and lim.n_cpus == 2
    assert lim.device == "AMD EPYC, 2 CPUs (0-1)"
    assert "other processes held 0.7" in lim.notes[0]


def test_a_bf16_model_is_held_against_the_bf16_multiply_where_it_was_measured():
    probe = {"cpus": [0], "fingerprint": {"engine_python": "/venv/bin/python"},
             "dram": [{"kernel": "read", "bytes_s": 30e9, "array_bytes": 1, "reps": 4}],
             "matmul": {"flops_s": 100e9, "n": 2048, "reps": 4},
             "matmul_bf16": {"flops_s": 400e9, "n": 2048, "reps": 4, "torch": "2.13.0+cpu"}}
    bf = cpu_limits(probe, "bf16").flops
    assert (bf.what, bf.value) == ("FLOPs (bf16 GEMM)", 400e9)
    assert "torch 2.13.0+cpu bf16 matmul 2048x2048 through the server's interpreter" in bf.source
    assert cpu_limits(probe, "fp32").flops.value == 100e9
    assert cpu_limits(probe, "int8").flops.value == 100e9  # no int8 probe: float32's
    failed = {**probe, "matmul_bf16": {"unavailable": "no torch"}}
    lim = cpu_limits(failed, "bf16")
    assert lim.flops.value == 100e9 and "no bf16 matmul measured (no torch)" in lim.notes[0]


def test_an_emulated_bf16_multiply_below_float32_leaves_the_float32_roof():
    """A CPU without bf16 instructions (AVX2 only) emulates it: measured here at 1.35
    GFLOP/s against float32's ~100; a roof must bound the engine, so float32's holds.
    At float32's rate exactly the bf16 row is kept (the boundary)."""
    probe = {"cpus": [0], "fingerprint": {"engine_python": "/venv/bin/python"},
             "dram": [{"kernel": "read", "bytes_s": 30e9, "array_bytes": 1, "reps": 4}],
             "matmul": {"flops_s": 100e9, "n": 2048, "reps": 4},
             "matmul_bf16": {"flops_s": 1.35e9, "n": 512, "reps": 4, "torch": "2.13.0+cpu"}}
    lim = cpu_limits(probe, "bf16")
    assert (lim.flops.what, lim.flops.value) == ("FLOPs (float32 GEMM)", 100e9)
    assert "bf16 matmul measured 1.35 GFLOP/s, below float32's" in lim.notes[0]
    just_below = {**probe, "matmul_bf16": {**probe["matmul_bf16"], "flops_s": 99.9e9}}
    assert cpu_limits(just_below, "bf16").flops.value == 100e9
    equal = {**probe, "matmul_bf16": {**probe["matmul_bf16"], "flops_s": 100e9}}
    assert cpu_limits(equal, "bf16").flops.what == "FLOPs (bf16 GEMM)"

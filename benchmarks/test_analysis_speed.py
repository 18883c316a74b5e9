"""Analysis speed: a 30-minute, 16-GPU run with 50,000 requests, summarized per case.

Not a pass/fail test: it prints figures. The fabricated run has 2 nodes x 8 GPUs x 20
NVML metrics sampled at 10 Hz for 30 minutes (5.76 M samples, ~300 MB of CSV), small
host collectors at 1 Hz, and 50,000 measured requests (16 token events each) in 20
case windows. The analysis (``writer.analyze_run``: read every raw file, align clocks,
summarize every window, request metrics and a verdict per case) runs in a fresh
process so its peak RSS is its own. Run it with::

    pytest benchmarks/test_analysis_speed.py --benchmark-only -s

Target on the 2-core CI machine: under 5 s and under 2 GiB. The request side scales
with token events: set STRATA_BENCH_EVENTS to see it (default 16 per request).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

NODES, GPUS, METRICS = 2, 8, 20
DURATION_S, HZ = 30 * 60, 10
N_REQUESTS, N_CASES = 50_000, 20
EVENTS = int(os.environ.get("STRATA_BENCH_EVENTS", "16"))
T0 = 1_700_000_000_000_000_000
ANCHOR_MONO = 5_000_000_000_000
GPU_METRICS = (
    "gpu_util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "power_w",
    "energy_mj",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "mem_clock_mhz",
    "temp_c",
    "pstate",
    "throttle_reasons",
    "violation_power_ns",
    "violation_thermal_ns",
    "pcie_tx_bytes_s",
    "pcie_rx_bytes_s",
    "gpm_sm_activity_pct",
    "gpm_sm_occupancy_pct",
    "gpm_tensor_activity_pct",
    "gpm_dram_bw_util_pct",
    "gpm_nvlink_tx_bytes_s",
)
COUNTERS = {"energy_mj", "violation_power_ns", "violation_thermal_ns"}
assert len(GPU_METRICS) == METRICS


def _write_gpu_csv(path: Path, node: str, offset_ns: int, rng: np.random.Generator) -> int:
    """10 Hz x 8 GPUs x 20 metrics, rows in time order, built from pooled value strings."""
    pool = [f"{v:.4g}" for v in rng.random(4096) * 100]
    n_t = DURATION_S * HZ
    idx = rng.integers(0, len(pool), size=(n_t, GPUS * METRICS))
    prefixes = [f",{node},nvml,gpu{g},{m}," for g in range(GPUS) for m in GPU_METRICS]
    kinds = [
        ",counter\n" if m in COUNTERS else ",gauge\n" for _ in range(GPUS) for m in GPU_METRICS
    ]
    counter_cols = [i for i, m in enumerate(GPU_METRICS * GPUS) if m in COUNTERS]
    acc = np.zeros(len(prefixes))
    rows = 0
    with path.open("w") as fh:
        fh.write("wall_ns,node,source,device,metric,value,kind\n")
        for i in range(n_t):
            ts = str(T0 + offset_ns + i * (1_000_000_000 // HZ))
            row_idx = idx[i]
            acc[counter_cols] += 1e5
            vals = [pool[j] for j in row_idx]
            for c in counter_cols:
                vals[c] = f"{acc[c]:.10g}"
            fh.write("".join(ts + p + v + k for p, v, k in zip(prefixes, vals, kinds, strict=True)))
            rows += len(prefixes)
    return rows


def _write_host_csvs(node_dir: Path, node: str, offset_ns: int) -> None:
    n = DURATION_S
    lines = {"proc": [], "cpu": [], "mem": []}
    for i in range(n):
        ts = T0 + offset_ns + i * 1_000_000_000
        lines["proc"] += [
            f"{ts},{node},proc,,cpu_user_s,{0.9 * i:.6g},counter",
            f"{ts},{node},proc,,cpu_system_s,{0.1 * i:.6g},counter",
            f"{ts},{node},proc,,major_faults,{i // 10},counter",
            f"{ts},{node},proc,,read_bytes,{i * 1000},counter",
            f"{ts},{node},proc,,num_threads,8,gauge",
        ]
        lines["cpu"] += [f"{ts},{node},cpu,cpu{c},busy_s,{0.3 * i:.6g},counter" for c in range(8)]
        lines["cpu"] += [
            f"{ts},{node},cpu,,busy_s,{2.4 * i:.6g},counter",
            f"{ts},{node},cpu,,psi_cpu_some_total_us,{i * 1000},counter",
        ]
        lines["mem"] += [
            f"{ts},{node},mem,,mem_available_bytes,{6e10:.6g},gauge",
            f"{ts},{node},mem,,mem_total_bytes,{1e11:.6g},gauge",
        ]
    for src, ls in lines.items():
        (node_dir / "samples" / f"{src}.csv").write_text(
            "wall_ns,node,source,device,metric,value,kind\n" + "\n".join(ls) + "\n"
        )


def _write_requests(run_dir: Path) -> list[tuple[int, int, str]]:
    """50,000 request lines (plain dicts: to_json via asdict would take minutes)."""
    rng = random.Random(7)
    case_s = DURATION_S / N_CASES
    per_case = N_REQUESTS // N_CASES
    windows = []
    with (run_dir / "requests.jsonl").open("w") as fh, (run_dir / "cases.jsonl").open("w") as cfh:
        for c in range(N_CASES):
            cid = f"case{c:02d}"
            start_s, end_s = c * case_s + 5, (c + 1) * case_s - 5
            span = end_s - start_s
            for k in range(per_case):
                disp = ANCHOR_MONO + int((start_s + span * k / per_case) * 1e9)
                ttft = int(rng.uniform(0.05, 0.3) * 1e9)
                step = int(rng.uniform(0.01, 0.03) * 1e9)
                events = [
                    {
                        "handled_ns": disp + ttft + j * step + 1000,
                        "kind": "content",
                        "n_tokens": 4,
                        "t_ns": disp + ttft + j * step,
                    }
                    for j in range(EVENTS)
                ]
                done = disp + ttft + EVENTS * step
                fh.write(
                    json.dumps(
                        {
                            "api": "openai",
                            "case_id": cid,
                            "dispatched_ns": disp,
                            "done_ns": done,
                            "error": None,
                            "events": events,
                            "extra": {},
                            "finish_reason": "length",
                            "first_byte_ns": disp + ttft // 2,
                            "isl": 512,
                            "osl": 4 * EVENTS,
                            "output_sha256": f"{k:064x}",
                            "output_text": "",
                            "phase": "measured",
                            "proc": {
                                "cpu_s": 0.5,
                                "major_faults": 0,
                                "read_bytes": 0,
                                "shared": True,
                            },
                            "request_id": f"{cid}/measured/{k}",
                            "scheduled_ns": disp - 10_000,
                            "timings": None,
                            "usage": {
                                "cached_tokens": 0,
                                "completion_tokens": 4 * EVENTS,
                                "prompt_tokens": 512,
                                "source": "usage",
                            },
                        },
                        separators=(",", ":"),
                    )
                    + "\n"
                )
            w0 = T0 + int(start_s * 1e9)
            w1 = T0 + int(end_s * 1e9) + int(0.5e9)
            windows.append((w0, w1, cid))
            cfh.write(
                json.dumps(
                    {
                        "case_id": cid,
                        "name": cid,
                        "config_id": "default",
                        "params": {"isl": 512, "osl": 4 * EVENTS, "concurrency": 32},
                        "client_bound": False,
                        "outcome": "passed",
                    }
                )
                + "\n"
            )
    return windows


def make_big_run(root: Path) -> tuple[Path, int]:
    run_dir = root / "bench-run"
    run_dir.mkdir()
    rng = np.random.default_rng(3)
    total = 0
    nodes = {}
    for n in range(NODES):
        node = f"node{n}"
        off = (n + 1) * 3_000_000
        node_dir = run_dir / "nodes" / node
        (node_dir / "samples").mkdir(parents=True)
        total += _write_gpu_csv(node_dir / "samples" / "nvml.csv", node, off, rng)
        _write_host_csvs(node_dir, node, off)
        (node_dir / "unavailable.json").write_text('{"dcgm": "not installed"}')
        nodes[node] = {
            "clock_offset_ns": off,
            "offset_start_ns": off,
            "offset_end_ns": off + 100_000,
            "clock_uncertainty_ns": 50_000,
        }
    windows = _write_requests(run_dir)
    marks = [
        "kind,name,case_id,start_wall_ns,end_wall_ns",
        f"run,run,,{T0},{T0 + DURATION_S * 1_000_000_000}",
    ]
    marks += [f"measured,{cid},{cid},{a},{b}" for a, b, cid in windows]
    (run_dir / "markers.csv").write_text("\n".join(marks) + "\n")
    manifest = {
        "run_id": "bench-run",
        "nodes": nodes,
        "clock_anchor": {"mono_ns": ANCHOR_MONO, "wall_ns": T0},
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir, total


CHILD = textwrap.dedent("""
    import json, resource, sys, time
    import numpy, pandas  # the first load imports them anyway; kept out of the figure
    from strata_plugin.analysis.case_summary import analyze_run
    w0, c0 = time.perf_counter(), time.process_time()
    ra = analyze_run(sys.argv[1], parallel=sys.argv[2] == "parallel")
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({
        "wall_s": wall, "cpu_main_s": cpu, "cpu_worker_s": kids.ru_utime + kids.ru_stime,
        "rss_main_mib": me.ru_maxrss / 1024, "rss_worker_mib": kids.ru_maxrss / 1024,
        "samples": len(ra.store), "series": len(ra.store.keys), "windows": len(ra.windows),
        "cases": len(ra.analyses), "requests": sum(len(v) for v in ra.bundle.records.values()),
        "hw_rows": sum(len(v) for v in ra.hw_by_window.values()),
        "verdicts": sorted({a.verdict.summary() for a in ra.analyses})}))
""")


@pytest.fixture(scope="module")
def big_run(tmp_path_factory) -> tuple[Path, int, float]:
    t = time.perf_counter()
    run_dir, n = make_big_run(tmp_path_factory.mktemp("analysis-speed"))
    return run_dir, n, time.perf_counter() - t


def _analyse(run_dir: Path, mode: str) -> dict:
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(run_dir), mode],
        capture_output=True,
        text=True,
        cwd=root,
        check=True,
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["parallel", "serial"])
def test_analysis_speed(benchmark, big_run, mode) -> None:
    """``parallel``: samples in a worker process beside the requests (the default for a
    run this size); ``serial``: everything in one process, for comparison."""
    run_dir, n_samples, gen_s = big_run
    results: list[dict] = []
    benchmark.pedantic(lambda: results.append(_analyse(run_dir, mode)), rounds=2, iterations=1)
    best = min(results, key=lambda r: r["wall_s"])
    size_mb = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file()) / 1e6
    print(
        f"\n[{mode}] {n_samples:,} GPU samples (+ host samples), {best['requests']:,} requests "
        f"x {EVENTS} events, {size_mb:.0f} MB raw (generated in {gen_s:.1f} s)\n"
        f"  analysis wall {best['wall_s']:.2f} s (best of {len(results)}), CPU main "
        f"{best['cpu_main_s']:.2f} s + worker {best['cpu_worker_s']:.2f} s\n"
        f"  peak RSS main {best['rss_main_mib']:.0f} MiB, worker {best['rss_worker_mib']:.0f} MiB"
        f"\n  {best['samples']:,} samples in {best['series']} series, {best['windows']} windows, "
        f"{best['hw_rows']:,} summary rows, {best['cases']} verdicts"
    )
    benchmark.extra_info.update({k: v for k, v in best.items() if k != "verdicts"})
    assert best["samples"] >= n_samples
    assert best["cases"] == N_CASES

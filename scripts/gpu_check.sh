#!/usr/bin/env bash
# Device check of the GPU collectors (NVML incl. GPM, DCGM when present).
#
# Runs the sampling agent for about 20 s while torch drives each GPU through
# phases — idle, bf16 matmul (tensor-bound), device-to-device copies
# (DRAM-bound), host-to-device copies (PCIe-bound) — then prints, per phase,
# what every GPU metric showed (min / mean / max; counters as a rate) and which
# metrics were UNAVAILABLE and why. On a machine without a GPU, NVML or torch it
# says so and exits 0 after a short idle run. STRATA_GPU_CHECK_FAKE=1 runs it
# against the scripted NVML instead (to try the script itself without a GPU).
#
# Then the roofline's checks (docs/roofline.md), which fail the script (exit 1):
#  * each GPU's memory bandwidth from NVML (max memory clock x bus width x 2) agrees
#    with its datasheet row within analysis/device_limits.NVML_DATASHEET_TOLERANCE (5%);
#  * a decode-like pass (a bf16 weight matrix of 4 GiB read once a step by a
#    matrix-vector product, 200 steps) held against that bandwidth by the analysis's
#    own code (analysis/roofline.case_roofline) reports a share in (0, 1]: above 1,
#    the peak or the bytes counted are wrong. Needs torch with CUDA; said so without.
#
# Usage: scripts/gpu_check.sh [SECONDS]      (default 20)
# Files: the agent's output folder is kept under $OUT/gpu_check when $OUT is
# set (the device runner's folder), else under a temporary folder it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TOTAL="${1:-20}"
BASE="${OUT:-$(mktemp -d)}"
OUTDIR="$BASE/gpu_check"
mkdir -p "$OUTDIR"
exec python3 - "$SECONDS_TOTAL" "$OUTDIR" <<'PY'
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, ".")
from strata_plugin.agent.handle import AgentHandle, agent_argv  # noqa: E402

total_s = float(sys.argv[1])
out = Path(sys.argv[2])

LOAD = r'''
import sys, time, torch
phase_s = float(sys.argv[1])
n = torch.cuda.device_count()
devs = [torch.device(f"cuda:{i}") for i in range(n)]
a = [torch.randn(8192, 8192, device=d, dtype=torch.bfloat16) for d in devs]
big = [torch.empty(1 << 30, dtype=torch.uint8, device=d) for d in devs]  # 1 GiB
dst = [torch.empty_like(x) for x in big]
host = torch.empty(1 << 28, dtype=torch.uint8).pin_memory()  # 256 MiB pinned
torch.cuda.synchronize()
def mark(name):
    print(f"{name} {time.time_ns()}", flush=True)
def run(name, step, seconds):
    mark(name)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for i in range(n):
            with torch.cuda.device(devs[i]):
                step(i)
        torch.cuda.synchronize()
mark("idle"); time.sleep(phase_s)
run("matmul", lambda i: [a[i] @ a[i] for _ in range(8)], phase_s)
run("d2d_copy", lambda i: [dst[i].copy_(big[i]) for _ in range(4)], phase_s)
run("h2d_copy", lambda i: [big[i][: host.numel()].copy_(host, non_blocking=True) for _ in range(8)],
    phase_s)
mark("end")
'''


def have_torch_cuda() -> tuple[bool, str]:
    probe = "import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.device_count())"
    try:
        p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False, "torch import timed out"
    if p.returncode != 0:
        return False, "torch not importable: " + (p.stderr.strip().splitlines() or ["?"])[-1]
    version, avail, count = p.stdout.split()
    if avail != "True" or count == "0":
        return False, f"torch {version} sees no CUDA device"
    return True, f"torch {version}, {count} CUDA device(s)"


ok_torch, torch_note = have_torch_cuda()
collectors = ["nvml", "dcgm", "cpu", "proc"]
# STRATA_GPU_CHECK_FAKE=1 swaps in the scripted NVML, to try this script without a GPU.
fake = ["--nvml-stub", "tests/fake_nvml.py"] if os.environ.get("STRATA_GPU_CHECK_FAKE") == "1" else []
argv = agent_argv("gpu-check", 0.2, collectors=collectors, extra=fake)
agent = AgentHandle.start("gpu-check", out / "node", argv)
# the scripted NVML reports itself as "nvml-stub": the same collector, said to be fake
statuses = {k.removesuffix("-stub"): v for k, v in agent.hello["collectors"].items()}
print(f"agent pid {agent.hello['pid']}, interval 0.2 s, output {out / 'node'}")
for name in ("nvml", "dcgm"):
    st = statuses[name]
    print(f"  {name}: {st['status']}" + (f" — {st['reason']}" if st.get("reason") else ""))
print(f"  load: {torch_note}")

phases: list[tuple[str, int]] = []
if statuses["nvml"]["status"] != "ok" and statuses["dcgm"]["status"] != "ok":
    print("no GPU telemetry source on this machine: nothing to check (this is fine off-GPU)")
    time.sleep(1.0)
    agent.stop()
    sys.exit(0)
if ok_torch:
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(total_s / 4)], stdout=subprocess.PIPE,
                            text=True)
    agent.track_pids([load.pid])
    for line in load.stdout:
        name, wall = line.split()
        phases.append((name, int(wall)))
    load.wait()
    if load.returncode != 0:
        print(f"load exited {load.returncode}; readings below are partial")
else:
    t0 = time.time_ns()
    phases.append(("idle", t0))
    time.sleep(total_s)
    phases.append(("end", time.time_ns()))
agent.measure_clock_offset()
info = agent.stop()
print(f"agent: {info.reason}, {info.samples} samples")

windows = [(name, start, phases[i + 1][1]) for i, (name, start) in enumerate(phases[:-1])]


def read(source: str) -> list[dict[str, str]]:
    path = out / "node" / "samples" / f"{source}.csv"
    return list(csv.DictReader(open(path))) if path.exists() else []


def summarize(rows: list[dict[str, str]], source: str) -> dict:
    series: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    for r in rows:
        series.setdefault((r["device"], r["metric"], r["kind"]), []).append(
            (int(r["wall_ns"]), float(r["value"])))
    result = {}
    for phase, start, end in windows:
        print(f"\n[{source}] phase {phase} ({(end - start) / 1e9:.1f} s)")
        print(f"  {'device':<14} {'metric':<34} {'min':>14} {'mean':>14} {'max':>14}")
        for (dev, metric, kind), pts in sorted(series.items()):
            inside = [(t, v) for t, v in pts if start <= t <= end]
            if len(inside) < 2:
                continue
            if kind == "counter":
                (t0, v0), (t1, v1) = inside[0], inside[-1]
                rate = (v1 - v0) / ((t1 - t0) / 1e9) if t1 > t0 else 0.0
                print(f"  {dev:<14} {metric + ' /s':<34} {'':>14} {rate:14.4g} {'':>14}")
                result[f"{phase}/{dev}/{metric}/rate"] = rate
            else:
                vals = [v for _, v in inside]
                lo, mean, hi = min(vals), statistics.fmean(vals), max(vals)
                if metric.startswith("clock_event_") and metric != "clock_event_reasons" and hi == 0:
                    continue  # a reason flag never raised: the mask row already says so
                print(f"  {dev:<14} {metric:<34} {lo:14.4g} {mean:14.4g} {hi:14.4g}")
                result[f"{phase}/{dev}/{metric}"] = {"min": lo, "mean": mean, "max": hi}
    return result


summary = {"phases": windows, "torch": torch_note, "collectors": statuses}
for source in ("nvml", "dcgm"):
    rows = read(source)
    if rows:
        summary[source] = summarize(rows, source)
unavailable = json.loads((out / "node" / "unavailable.json").read_text())
print("\nUNAVAILABLE:")
for key, reason in sorted(unavailable.items()):
    if key.split("/")[0] in ("nvml", "dcgm"):
        print(f"  {key}: {reason}")
summary["unavailable"] = unavailable
(out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
print(f"\nsummary written to {out / 'summary.json'}")

# --- the roofline's checks -----------------------------------------------------------
from strata_plugin.agent import nvml_lib  # noqa: E402
from strata_plugin.agent.snapshot import _nvml_facts  # noqa: E402
from strata_plugin.analysis.device_limits import (  # noqa: E402
    NVML_DATASHEET_TOLERANCE, gpu_bandwidth, gpu_limits)
from strata_plugin.analysis.gpu_datasheets import datasheet_for  # noqa: E402

DECODE = r'''
import json, sys, time, torch
rows, cols, steps = 32768, 65536, 200  # 4 GiB of bf16 weights: far beyond the L2
w = torch.randn(rows, cols, device="cuda:0", dtype=torch.bfloat16)
x = torch.randn(cols, 1, device="cuda:0", dtype=torch.bfloat16)
for _ in range(5):
    w @ x
torch.cuda.synchronize()
t0 = time.monotonic_ns()
for _ in range(steps):
    w @ x
torch.cuda.synchronize()
print(json.dumps({"rows": rows, "cols": cols, "steps": steps, "t0": t0,
                  "t1": time.monotonic_ns(), "bytes": w.numel() * w.element_size()}))
'''
failures = []
nv = nvml_lib.load_stub("tests/fake_nvml.py") if fake else None
facts, why = _nvml_facts(nv)
gpus = (facts or {}).get("gpus") or []
print("\nROOFLINE: memory bandwidth from NVML against the datasheet "
      f"(tolerance {NVML_DATASHEET_TOLERANCE:.0%})")
if not gpus:
    print(f"  no GPU through NVML ({why}): nothing to check")
for g in gpus:
    p = gpu_bandwidth(g)
    sheet = datasheet_for(str(g.get("name", "")))
    if p.basis != "nvml" or sheet is None:
        failures.append(f"gpu{g.get('index')} {g.get('name')}: bandwidth basis {p.basis or '-'}, "
                        f"datasheet row {sheet.row if sheet else 'none'} ({p.source or p.unavailable})")
        print("  FAIL " + failures[-1])
        continue
    off = p.value / sheet.bandwidth_bytes_s - 1
    line = (f"gpu{g.get('index')} {g.get('name')}: NVML {p.value / 1e12:.3f} TB/s, "
            f"datasheet {sheet.row} {sheet.bandwidth_bytes_s / 1e12:.3f} TB/s ({off:+.1%})")
    ok = abs(off) <= NVML_DATASHEET_TOLERANCE
    print(("  ok   " if ok else "  FAIL ") + line)
    if not ok:
        failures.append(line)
summary["roofline"] = {"bandwidth": [gpu_bandwidth(g).to_json() for g in gpus]}
if gpus and ok_torch and not fake:
    from strata_plugin.analysis.roofline import weight_pass  # noqa: E402

    p = subprocess.run([sys.executable, "-c", DECODE], capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        failures.append(f"decode-like pass exited {p.returncode}: {p.stderr.strip()[-300:]}")
        print("  FAIL " + failures[-1])
    else:
        d = json.loads(p.stdout.strip().splitlines()[-1])
        seconds = (d["t1"] - d["t0"]) / 1e9
        # held against gpu0 as a decode case is: one weight matrix read once a step
        roof = weight_pass(d["bytes"], d["rows"] * d["cols"], d["steps"], seconds,
                           gpu_limits(gpus[:1], "bf16"))
        dec = roof.decode
        share = None if dec is None else dec.share
        line = (f"decode-like pass on gpu0: {d['bytes'] / 2**30:.3g} GiB a step, "
                f"{d['steps']} steps in {seconds * 1e3:.4g} ms: "
                f"{(dec.bytes_s if dec else 0) / 1e12:.3f} TB/s, share "
                f"{'-' if share is None else f'{share:.4f}'} of the "
                f"{dec.roof if dec else '-'} roof")
        ok = share is not None and 0 < share <= 1 and dec.roof == "memory"
        print(("  ok   " if ok else "  FAIL ") + line)
        if not ok:
            failures.append(line)
        summary["roofline"]["decode"] = roof.to_json()
elif gpus:
    print("  decode-like pass: skipped (" + ("the scripted NVML" if fake else torch_note) + ")")
(out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
if failures:
    print(f"\nROOFLINE: {len(failures)} check(s) failed")
    sys.exit(1)
print("\nROOFLINE: checks passed")
PY

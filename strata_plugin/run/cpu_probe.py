"""The CPU's limits, measured: memory bandwidth and float32 matrix-multiply rate, on the
CPUs the server runs on.

Why measured: a CPU's peak bandwidth and FLOPs depend on its memory channels, its
vector units and how many cores the server may use, and no table knows a VM's share of a
host. So a short probe measures them, pinned to the server's own CPUs (its affinity), in
a child process whose BLAS is single-threaded before numpy loads:

* **Bandwidth**: one pinned process per CPU, all started together, each running two
  kernels over its own float64 arrays: STREAM's triad ``a = b + q*c`` (John McCalpin,
  STREAM benchmark, cs.virginia.edu/stream/ref.html: 24 bytes per element counted,
  written in cache-sized chunks so that ``q*c`` never goes to memory) and a read pass
  (``dot(b, c)``: 16 bytes per element, all reads, which is what a decode step does with
  its weights). Twice: arrays of at least 4x the last-level cache per array (STREAM's
  rule: memory, not cache) and arrays that fit in half the last-level cache (a working
  set that stays in cache; the cache-aware roofline of Ilic, Pratas and Sousa, IEEE
  Computer Architecture Letters 13(1), 2014). Best repetition (STREAM reports the best).
* **FLOPs**: numpy's float32 matrix multiply (its BLAS), one single-threaded pinned
  process per CPU on its own 2048 x 2048 matrices, all started together: 2n^3 FLOPs a
  product and CPU, over the slowest CPU's time, best pass. (Independent products rather
  than one multi-threaded one: a BLAS's threads synchronize inside a product, and on a
  shared host one descheduled thread stalls them all.) float32 is the type llama.cpp
  computes its CPU matrix products in for float weights; quantized weights multiply as
  int8 dot products, whose hardware peak is higher: docs/roofline.md says what that
  means for the share. Where the server is a Python process with torch (vLLM, SGLang),
  also its bf16 matrix multiply, through its own interpreter: the type those engines'
  CPU kernels multiply bf16 models in.

The probe takes a few seconds. Its result is cached per machine (``<strata cache>/
device-limits/``) under a fingerprint: the CPU model, the CPUs, the last-level cache,
the memory size, numpy's version and the boot. A measurement taken while other processes
held a quarter of the probed CPUs (``other_cpu_frac``, analysis/thresholds.py) says so
(``contended``, with their load), and the next run measures again and keeps the faster
figure of each while every measurement is contended: contention only lowers a measured
rate. A quiet measurement is the machine's own, so it replaces what was cached.

The cache is a file anyone on the machine could have written: it is read only when it is
a regular file within CPU_CACHE_BYTES_MAX, and every figure is checked (a finite number
above zero, at most CPU_FLOPS_PER_CPU_MAX / CPU_BYTES_S_PER_CPU_MAX a CPU: no machine
measures more); an entry that fails a check is discarded, the CPUs measured again and
the file rewritten.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PROBE_VERSION = 1
#: elements per triad chunk: 64K float64 = 512 KiB, so q*c stays in a core's L2
TRIAD_CHUNK = 64 * 1024
#: the matrix multiply's size: 17 GFLOP a product, ~0.1-0.2 s on one core
MATMUL_N = 2048
#: the probe's processes run at this niceness where allowed (root): ahead of other
#: processes for its few seconds, so that it measures the hardware rather than what a
#: busy host leaves (the result records the niceness it got)
PROBE_NICE = -10
MIB = 1 << 20


# --- the machine ------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _size(text: str) -> int | None:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text.rstrip("KMG")
    return int(digits) * mult if digits.isdigit() else None


def llc_bytes(cpus: Sequence[int]) -> tuple[int | None, str]:
    """The last-level cache the probed CPUs share (summed over distinct caches) and where
    that came from (sysfs cpu*/cache/index*)."""
    seen: dict[str, int] = {}
    level = 0
    for c in cpus:
        base = f"/sys/devices/system/cpu/cpu{c}/cache"
        for idx in sorted(Path(base).glob("index*")) if Path(base).is_dir() else ():
            lvl = _read(f"{idx}/level").strip()
            typ = _read(f"{idx}/type").strip()
            size = _size(_read(f"{idx}/size"))
            if not lvl.isdigit() or typ == "Instruction" or size is None:
                continue
            if int(lvl) > level:
                level, seen = int(lvl), {}
            if int(lvl) == level:
                seen[_read(f"{idx}/shared_cpu_list").strip() or f"{c}"] = size
    if not seen:
        return None, "no cache sizes in sysfs (/sys/devices/system/cpu/cpu*/cache)"
    return sum(seen.values()), f"sysfs: L{level}, {len(seen)} cache(s)"


def fingerprint(cpus: Sequence[int], engine_python: str | None = None) -> dict[str, Any]:
    import numpy

    model = ""
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = next((line.split()[1] for line in _read("/proc/meminfo").splitlines()
                if line.startswith("MemTotal:")), "")
    return {"probe_version": PROBE_VERSION, "cpu_model": model or os.uname().machine,
            "cpus": list(cpus), "llc_bytes": llc_bytes(cpus)[0], "mem_total_kb": mem,
            "numpy": numpy.__version__, "engine_python": engine_python,
            "boot_id": _read("/proc/sys/kernel/random/boot_id").strip()}


# --- the child: the kernels -------------------------------------------------------------


#: (level, kernel, timed passes): what each CPU's process runs, in this order
PLAN = (("dram", "triad", 4), ("dram", "read", 4), ("llc", "triad", 20), ("llc", "read", 20),
        ("matmul", "matmul", 4))


def _worker(cpu: int, sizes: dict[str, int], barrier, out) -> None:
    """One pinned process running the plan: each kernel's passes (after a warm-up) each
    started with every other CPU's at a barrier."""
    import numpy as np

    os.sched_setaffinity(0, {cpu})
    try:  # the hardware's peak, not the share other processes leave: ahead of them if allowed
        os.nice(PROBE_NICE)
    except OSError:
        pass
    times: dict[str, list[float]] = {}
    data: dict[str, tuple] = {}
    for level, kernel, reps in PLAN:
        n = sizes[level]
        if level not in data:
            data.clear()  # free the DRAM arrays before the next level's
            if level == "matmul":
                rng = np.random.default_rng(cpu)
                data[level] = (rng.standard_normal((n, n), dtype=np.float32),
                               rng.standard_normal((n, n), dtype=np.float32))
            else:
                a, b, c = np.zeros(n), np.full(n, 1.0), np.full(n, 2.0)
                a += 0.0  # every page touched before timing
                data[level] = (a, b, c, np.empty(min(TRIAD_CHUNK, n)))
        d = data[level]
        got = []
        for _ in range(reps + 1):  # the first pass warms up (BLAS, caches, pages)
            barrier.wait()
            t0 = time.perf_counter()
            if kernel == "matmul":
                d[0] @ d[1]
            elif kernel == "triad":
                a, b, c, tmp = d
                for i in range(0, n, TRIAD_CHUNK):
                    j = min(n, i + TRIAD_CHUNK)
                    np.multiply(c[i:j], 3.0, out=tmp[: j - i])
                    np.add(tmp[: j - i], b[i:j], out=a[i:j])
            else:
                d[1].dot(d[2])
            got.append(time.perf_counter() - t0)
        times[f"{level}/{kernel}"] = got[1:]
    out.put((cpu, times, os.nice(0)))


def child(cpus: Sequence[int]) -> dict[str, Any]:
    """The probe itself (in a process whose BLAS is single-threaded): every CPU runs the
    plan on its own data at the same time, one single-threaded process each (nothing
    synchronizes inside a pass, so one descheduled thread does not stall the others); a
    pass's time is the slowest CPU's, its rate all CPUs' work over that time; the best
    pass is reported."""
    import multiprocessing as mp

    llc, _ = llc_bytes(cpus)
    llc = llc or 32 * MIB  # no sysfs: 32 MiB, as large as most servers' L3 per socket
    # STREAM's rule, each array at least 4x the cache, within 1.5 GiB in all
    dram = max(16 * MIB, min(512 * MIB, 4 * llc // len(cpus), 1536 * MIB // (3 * len(cpus))))
    cache = max(64 << 10, llc // 2 // (3 * len(cpus)))
    sizes = {"dram": dram // 8, "llc": cache // 8, "matmul": MATMUL_N}
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(len(cpus)), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(c, sizes, barrier, out)) for c in cpus]
    for p in procs:
        p.start()
    try:
        answers = [out.get(timeout=240) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    results = {cpu: t for cpu, t, _ in answers}
    got: dict[str, Any] = {"dram": [], "llc": [], "nice": max(n for _, _, n in answers)}
    for level, kernel, reps in PLAN:
        per_pass = [max(results[c][f"{level}/{kernel}"][r] for c in cpus) for r in range(reps)]
        best, median = min(per_pass), sorted(per_pass)[len(per_pass) // 2]
        n = sizes[level]
        if kernel == "matmul":
            got["matmul"] = {"kernel": "matmul", "dtype": "float32", "n": n,
                             "flops_per_product": 2 * n**3, "reps": reps, "best_s": best,
                             "median_s": median, "flops_s": 2 * n**3 * len(cpus) / best}
            continue
        per_elem = 24 if kernel == "triad" else 16
        got[level].append({"kernel": kernel, "bytes_per_element": per_elem,
                           "array_bytes": n * 8, "arrays_per_cpu": 3, "reps": reps,
                           "best_s": best, "median_s": median,
                           "bytes_s": per_elem * n * len(cpus) / best})
    return got


#: The bf16 matrix multiply, in the engine's own interpreter (its torch: vLLM's and
#: SGLang's CPU kernels multiply bf16 weights in bf16, at up to twice float32's rate with
#: AVX512-BF16 or AMX, which numpy has no kernel for). Self-contained: Strata is not
#: installed there. One pinned single-threaded process per CPU, started together. The
#: size is the largest of n, n/2, ... (at least 256) whose product a 256 x 256 product's
#: time says takes at most BF16_PRODUCT_S on every CPU: without bf16 in the hardware
#: (AVX2 only) torch emulates it, and one 2048 product took 64 s on such a vCPU, where
#: AVX512-BF16 takes well under a second.
BF16_PRODUCT_S = 1.0
BF16_SCRIPT = r'''
import json, multiprocessing as mp, os, sys, time
cpus, n, reps, nice = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
budget = float(sys.argv[5])

def work(i, cpu, barrier, out, sizes):
    os.sched_setaffinity(0, {cpu})
    try:
        os.nice(nice)
    except OSError:
        pass
    import torch
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(cpu)
    a = torch.randn(256, 256, generator=g).to(torch.bfloat16)
    a @ a
    t0 = time.perf_counter()
    a @ a
    t = time.perf_counter() - t0
    m = n
    while m > 256 and t * (m / 256) ** 3 > budget:
        m //= 2
    sizes[i] = m
    barrier.wait()
    size = min(sizes[:])
    x = torch.randn(size, size, generator=g).to(torch.bfloat16)
    y = torch.randn(size, size, generator=g).to(torch.bfloat16)
    times = []
    for _ in range(reps + 1):
        barrier.wait()
        t0 = time.perf_counter()
        x @ y
        times.append(time.perf_counter() - t0)
    out.put((cpu, times[1:], torch.__version__, size))

ctx = mp.get_context("fork")
barrier, out, sizes = ctx.Barrier(len(cpus)), ctx.Queue(), ctx.Array("i", len(cpus))
procs = [ctx.Process(target=work, args=(i, c, barrier, out, sizes)) for i, c in enumerate(cpus)]
for p in procs:
    p.start()
got = [out.get(timeout=240) for _ in procs]
for p in procs:
    p.join()
res = {c: t for c, t, _, _ in got}
n = got[0][3]
per_pass = [max(res[c][r] for c in cpus) for r in range(reps)]
best = min(per_pass)
print(json.dumps({"kernel": "matmul", "dtype": "bfloat16", "n": n, "reps": reps,
                  "flops_per_product": 2 * n ** 3, "best_s": best,
                  "median_s": sorted(per_pass)[len(per_pass) // 2],
                  "flops_s": 2 * n ** 3 * len(cpus) / best, "torch": got[0][2]}))
'''


#: The bf16 probe's bound: importing torch (a few seconds) and 6 products of at most
#: BF16_PRODUCT_S each, with room for a busy host.
BF16_TIMEOUT_S = 120.0


def _bf16(cpus: Sequence[int], engine_python: str) -> tuple[dict[str, Any], float]:
    """The bf16 matrix multiply through the engine's interpreter; its CPU seconds."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        p = subprocess.run([engine_python, "-c", BF16_SCRIPT, json.dumps(list(cpus)),
                            str(MATMUL_N), "4", str(PROBE_NICE), str(BF16_PRODUCT_S)],
                           capture_output=True, text=True, timeout=BF16_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        own = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return {"unavailable": f"{engine_python}: the bf16 multiply took over "
                f"{BF16_TIMEOUT_S:.0f} s"}, own
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode != 0:
        why = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["?"]
        return {"unavailable": f"{engine_python}: exit {p.returncode}: {why[0][:300]}"}, own
    return json.loads(p.stdout.strip().splitlines()[-1]), own


def engine_python(pid: int | None) -> str | None:
    """The server's own interpreter when it is a Python process with torch (vLLM,
    SGLang): its bf16 kernels are the engine's, so the probe measures with them."""
    if pid is None:
        return None
    # argv[0] first: a virtualenv's python is a link to the base interpreter, and only
    # the path it was started by finds the virtualenv's packages (its pyvenv.cfg)
    found = []
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        if "/" in argv0:
            found.append(str(Path(os.readlink(f"/proc/{pid}/cwd")) / argv0))
        found.append(os.readlink(f"/proc/{pid}/exe"))
    except (OSError, UnicodeDecodeError):
        pass
    for exe in found:
        if os.path.basename(exe).startswith("python"):
            p = subprocess.run([exe, "-c", "import torch"], capture_output=True, timeout=120)
            if p.returncode == 0:
                return exe
    return None


# --- the parent: run, check the load, cache ----------------------------------------------


def _cpu_jiffies(cpus: Sequence[int]) -> tuple[int, int]:
    """(busy, total) jiffies of these CPUs from /proc/stat."""
    busy = total = 0
    want = {f"cpu{c}" for c in cpus}
    for line in _read("/proc/stat").splitlines():
        f = line.split()
        if f and f[0] in want:
            v = [int(x) for x in f[1:9]]
            total += sum(v)
            busy += sum(v) - v[3] - v[4]  # idle, iowait
    return busy, total


def _run_child(cpus: Sequence[int], python: str) -> tuple[dict[str, Any], float]:
    """The probe in a child process (BLAS single-threaded before numpy loads); its result
    and the CPU seconds it used."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([python, "-m", "strata_plugin.run.cpu_probe",
                        "--cpus", ",".join(map(str, cpus))],
                       capture_output=True, text=True, timeout=300, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"the CPU probe exited {p.returncode}: "
                           f"{(p.stderr or p.stdout).strip()[-300:]}")
    own = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(p.stdout.strip().splitlines()[-1]), own


def measure(cpus: Sequence[int], python: str = sys.executable,
            engine_python: str | None = None) -> dict[str, Any]:
    """Run the probe on ``cpus`` (and the bf16 multiply with ``engine_python``'s torch);
    the result as the manifest records it."""
    from strata_plugin.analysis.thresholds import value as threshold_value

    cpus = sorted(cpus)
    hz = os.sysconf("SC_CLK_TCK")
    b0 = _cpu_jiffies(cpus)
    t0 = time.monotonic()
    got, own = _run_child(cpus, python)
    if engine_python:
        got["matmul_bf16"], own_bf16 = _bf16(cpus, engine_python)
        own += own_bf16
    wall = time.monotonic() - t0
    b1 = _cpu_jiffies(cpus)
    others = max(0.0, ((b1[0] - b0[0]) / hz - own) / wall) if wall > 0 else 0.0
    limit = threshold_value("other_cpu_frac") * len(cpus)
    llc, llc_src = llc_bytes(cpus)
    return {
        "cpus": cpus,
        "llc_bytes": llc, "llc_source": llc_src,
        "dram": got["dram"], "llc": got["llc"], "matmul": got["matmul"], "nice": got["nice"],
        **({"matmul_bf16": got["matmul_bf16"]} if "matmul_bf16" in got else {}),
        "wall_s": round(wall, 3),
        "other_busy_cores": round(others, 3),
        "contended": others >= limit,
        "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": fingerprint(cpus, engine_python),
    }


def _cache_path(fp: dict[str, Any]) -> Path:
    from strata_plugin.embedded.llama_setup import cache_root

    key = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_root()) / "device-limits" / f"cpu-{key}.json"


def _rate(v: Any, most: float) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and 0 < v <= most)


def _whole(v: Any, least: int = 1) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def cache_problem(entry: Any, fp: dict[str, Any], cpus: Sequence[int]) -> str:
    """Why a cached measurement of ``cpus`` cannot be used ("" when it can): every key
    the roofline reads, of its type, each rate finite, above zero and within the
    plausible ceiling per CPU (CPU_FLOPS_PER_CPU_MAX, CPU_BYTES_S_PER_CPU_MAX)."""
    from strata_plugin.limits import CPU_BYTES_S_PER_CPU_MAX, CPU_FLOPS_PER_CPU_MAX

    if not isinstance(entry, dict):
        return "not a JSON object"
    if entry.get("fingerprint") != fp:
        return "another machine's fingerprint"
    if entry.get("cpus") != list(cpus):
        return "cpus is not the probed CPUs"
    n = len(cpus)
    for level in ("dram", "llc"):
        runs = entry.get(level)
        if not isinstance(runs, list) or not runs:
            return f"{level} is not a list of measurements"
        for r in runs:
            if not isinstance(r, dict) or r.get("kernel") not in ("triad", "read"):
                return f"{level}: a measurement without its kernel (triad or read)"
            if not _rate(r.get("bytes_s"), CPU_BYTES_S_PER_CPU_MAX * n):
                return (f"{level} {r['kernel']}: bytes_s {str(r.get('bytes_s'))[:40]} is not "
                        "a finite number above zero within CPU_BYTES_S_PER_CPU_MAX a CPU")
            if not (_whole(r.get("array_bytes")) and _whole(r.get("reps"))):
                return f"{level} {r['kernel']}: array_bytes or reps is not a whole number"
    for key in ("matmul", "matmul_bf16"):
        mm = entry.get(key)
        if key == "matmul_bf16" and (mm is None or (isinstance(mm, dict)
                                                    and isinstance(mm.get("unavailable"), str))):
            continue
        if not isinstance(mm, dict):
            return f"{key} is not an object"
        if not _rate(mm.get("flops_s"), CPU_FLOPS_PER_CPU_MAX * n):
            return (f"{key}: flops_s {str(mm.get('flops_s'))[:40]} is not a finite number "
                    "above zero within CPU_FLOPS_PER_CPU_MAX a CPU")
        if not (_whole(mm.get("n")) and _whole(mm.get("reps"))):
            return f"{key}: n or reps is not a whole number"
    if not isinstance(entry.get("contended"), bool):
        return "contended is not true or false"
    busy = entry.get("other_busy_cores")
    if not (busy == 0 or _rate(busy, n)):
        return "other_busy_cores is not a number from 0 to the CPUs probed"
    llc = entry.get("llc_bytes")
    if llc is not None and not _whole(llc):
        return "llc_bytes is not a whole number"
    if not _whole(entry.get("measurements", 1)):
        return "measurements is not a whole number"
    if not isinstance(entry.get("measured_utc", ""), str):
        return "measured_utc is not a string"
    return ""


def _read_cache(path: Path, fp: dict[str, Any], cpus: Sequence[int]
                ) -> tuple[dict[str, Any] | None, str]:
    """The cached entry when it can be used, else (None, why not)."""
    from strata_plugin.formats.bounded import read_json
    from strata_plugin.limits import CPU_CACHE_BYTES_MAX

    try:
        entry = read_json(path, CPU_CACHE_BYTES_MAX, "CPU_CACHE_BYTES_MAX")
    except (OSError, ValueError) as e:  # BoundedReadError: too large, a FIFO, not JSON
        return None, str(e)
    why = cache_problem(entry, fp, cpus)
    return (None, why) if why else (entry, "")


def _best(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """A cached measurement ``a`` and a fresh one ``b`` of the same CPUs. Fresh and quiet,
    ``b`` is the machine's and wins whole; both contended, the faster of each figure is
    kept (contention only ever lowers a rate, so the best seen is the nearer the
    machine's), and the entry stays contended: measured again next time."""
    if not b.get("contended"):
        return {**b, "measurements": int(a.get("measurements", 1)) + 1}
    out = dict(b)
    for level in ("dram", "llc"):
        runs = {r["kernel"]: r for r in a.get(level) or ()}
        out[level] = [max((r, runs.get(r["kernel"], r)), key=lambda x: x["bytes_s"])
                      for r in b.get(level) or ()]
    for key in ("matmul", "matmul_bf16"):
        if (a.get(key) or {}).get("flops_s", 0) > (b.get(key) or {}).get("flops_s", 0):
            out[key] = a[key]
    out["contended"] = bool(a.get("contended")) and bool(b.get("contended"))
    out["measurements"] = int(a.get("measurements", 1)) + 1
    return out


def cpu_limits(cpus: Sequence[int], *, use_cache: bool = True,
               python: str = sys.executable, engine_python: str | None = None
               ) -> dict[str, Any]:
    """The measured limits of these CPUs. This machine's cache is used when its
    fingerprint matches and it was measured on a quiet host; else the CPUs are measured
    now (a few seconds), merged with a contended cached measurement while this one is
    contended too (the faster figure of each), and the result cached. A cache entry that
    fails its checks (cache_problem) is discarded, said as ``cache_discarded``, and the
    file rewritten."""
    cpus = sorted(cpus)
    fp = fingerprint(cpus, engine_python)
    path = _cache_path(fp)
    cached, why = None, ""
    if use_cache and os.path.lexists(path):
        cached, why = _read_cache(path, fp, cpus)  # a wrong entry: measured, rewritten
        if cached is not None and not cached.get("contended"):
            return {**cached, "cached_from": str(path)}
    result = measure(cpus, python, engine_python)
    if use_cache and cached is None and os.path.lexists(path):
        result["cache_discarded"] = why[:500]
    if cached is not None:
        result = _best(cached, result)
    if use_cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            kept = {k: v for k, v in result.items() if k != "cache_discarded"}  # this run's
            tmp.write_text(json.dumps(kept, indent=2, sort_keys=True, allow_nan=False) + "\n")
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache: measured again next time
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Strata's CPU probe (JSON out)")
    ap.add_argument("--cpus", required=True, help="comma-separated CPU ids")
    args = ap.parse_args(argv)
    print(json.dumps(child([int(c) for c in args.cpus.split(",")])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

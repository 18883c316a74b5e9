"""Fabricate a realistic run folder: manifest, markers, cases, requests, samples.

The report is tested on these folders because no server or GPU is needed to make
them, and because each case can be given a known behaviour (CPU-bound, faulting,
idle, GPU memory-bound...) that the verdict must then find. Node clocks are skewed
on purpose: samples are written in each node's own clock, and the report must undo
the offset recorded in the manifest.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata_plugin.formats.records import ProcDelta, RequestRecord, Timings, TokenEvent, Usage
from strata_plugin.formats.windows import Marker, write_markers

ANCHOR_MONO = 1_000_000_000_000
ANCHOR_WALL = 1_700_000_000_000_000_000
S = 1_000_000_000

#: Idle levels; a case's ``behaviour`` overrides any of them inside its window.
IDLE: dict[str, float] = dict(
    server_cores=0.05,
    other_cores=0.1,
    major_faults_s=0.0,
    read_bytes_s=0.0,
    runq_per_cpu_s=0.01,
    invol_per_cpu_s=2.0,
    iowait_frac=0.0,
    steal_frac=0.0,
    psi_cpu=0.0,
    psi_io=0.0,
    psi_mem=0.0,
    mem_available_frac=0.6,
    disk_busy=0.0,
    net_bytes_s=1e4,
    waiting=0.0,
    running=0.0,
    kv=0.05,
    gpu_util=0.0,
    sm=0.0,
    tensor=0.0,
    dram=0.0,
    occ=0.0,
    power_w=80.0,
    clock_ratio=1.0,
    throttle=0.0,
    pcie_bytes_s=1e6,
    rdma_bytes_s=0.0,
    gpu_skew=0.0,
)


@dataclass
class CaseSpec:
    case_id: str
    name: str = ""
    isl: int = 128
    osl: int = 32
    concurrency: int = 1
    n_requests: int = 8
    duration_s: float = 8.0
    behaviour: dict[str, float] = field(default_factory=dict)
    ab_group: str = ""
    ab_arm: str = ""
    proc: tuple[float, int, int] | None = (0.5, 0, 0)  # cpu_s, major faults, read bytes
    output_text: str = ""  # same text in two arms => same output SHA
    client_bound: bool = False
    chunk_jitter: float = 0.0  # occasional long gaps: prefill interference
    gap_s: float = 0.0  # idle time between requests (input-starved)


@dataclass
class RunSpec:
    cases: list[CaseSpec]
    gpus: int = 0  # per node
    nodes: int = 1
    cores: int = 4
    server_threads: int = 4
    interval_s: float = 0.25
    baseline_s: float = 3.0
    cooldown_s: float = 2.0
    gap_between_cases_s: float = 1.0
    offsets_ns: tuple[int, ...] = (7_000_000, -3_000_000)  # node clock - harness clock
    drift_ns: int = 200_000  # offset change between start and end
    unavailable: dict[str, str] = field(default_factory=dict)  # collector -> reason, node 0
    skip_sources: tuple[str, ...] = ()  # write no samples for these
    skip_metrics: tuple[str, ...] = ()  # drop these metric names
    prom: bool = True
    gpu_expected: bool | None = None
    seed: int = 1
    run_id: str = "20250101T000000Z-test00"
    # what the host does during the idle baseline too (other users' load: background)
    baseline_behaviour: dict[str, float] = field(default_factory=dict)
    # the agent's runstate collector on the head node at this interval (0: none); a case
    # whose behaviour sets ``frozen_frac`` has its server frozen that share of every
    # ``frozen_period_s`` (default 0.6 s): its tokens wait, its run time stands still
    runstate_s: float = 0.0


def frozen_until(t_ns: int, beh: dict[str, float]) -> int | None:
    """When a freeze that ``t_ns`` (monotonic, or harness wall: same phase) falls in ends;
    None outside one. Phases count from the anchor."""
    frac = beh.get("frozen_frac", 0.0)
    if not frac:
        return None
    period = int(beh.get("frozen_period_s", 0.6) * S)
    phase = (t_ns - ANCHOR_MONO) % period
    return t_ns - phase + int(frac * period) if phase < frac * period else None


def _proc_record(spec: CaseSpec, rng: random.Random) -> ProcDelta | None:
    if spec.proc is None:
        return None
    cpu, faults, read = spec.proc
    # The odd request differs a little (real counters do); the median stays exact.
    j = 1.0 + (0.01 if rng.random() < 0.3 else 0.0)
    return ProcDelta(
        cpu_s=round(cpu * j, 4),
        major_faults=int(faults * j),
        read_bytes=int(read * j),
        shared=spec.concurrency > 1,
    )


def _records(spec: CaseSpec, start_mono: int, rng: random.Random) -> list[RequestRecord]:
    out = []
    slots = max(1, spec.concurrency)
    per_slot = max(1, -(-spec.n_requests // slots))
    slot_s = spec.duration_s / per_slot
    busy_s = max(0.05, slot_s - spec.gap_s)
    for i in range(spec.n_requests):
        slot, k = i % slots, i // slots
        t0 = start_mono + int((k * slot_s + 0.001 * slot) * S)
        ttft = 0.25 * busy_s if spec.osl > 1 else 0.98 * busy_s  # prefill-only: all TTFT
        step = (busy_s - ttft) / max(spec.osl - 1, 1)
        events, t = [], t0 + int(ttft * S)
        for j in range(spec.osl):
            jitter = 1.0 + rng.uniform(-0.05, 0.05)
            if spec.chunk_jitter and j and j % 10 == 0:
                jitter += spec.chunk_jitter
            if j:
                t += int(step * jitter * S)
            thaw = frozen_until(t, spec.behaviour)
            if thaw is not None:  # a frozen server sends nothing until it thaws
                t = thaw + int(step * S)
            events.append(TokenEvent(t_ns=t, n_tokens=1, handled_ns=t + 20_000))
        done = t + 1_000_000
        text = spec.output_text or f"{spec.case_id}-{i}"
        out.append(
            RequestRecord(
                request_id=f"{spec.case_id}/measured/{i}",
                case_id=spec.case_id,
                phase="measured",
                api="openai",
                scheduled_ns=t0 - 50_000,
                dispatched_ns=t0,
                first_byte_ns=t0 + 1_000_000,
                events=tuple(events),
                done_ns=done,
                usage=Usage(
                    prompt_tokens=spec.isl,
                    completion_tokens=spec.osl,
                    cached_tokens=0,
                    source="usage",
                ),
                timings=Timings(
                    prompt_n=spec.isl,
                    prompt_ms=ttft * 1000 * 0.97,  # 3% of TTFT before the server
                    predicted_n=spec.osl,
                    predicted_ms=(busy_s - ttft) * 1000,
                ),
                finish_reason="length",
                output_text=text,
                output_sha256=hashlib.sha256(text.encode()).hexdigest(),
                isl=spec.isl,
                osl=spec.osl,
                proc=_proc_record(spec, rng),
            )
        )
    return out


def _window_of(t_wall: int, windows: list[tuple[int, int, dict]]) -> dict[str, float]:
    lv = dict(IDLE)
    for a, b, beh in windows:
        if a <= t_wall <= b:
            lv.update(beh)
    return lv


class _Writer:
    """One node's samples, written in that node's clock."""

    def __init__(self, node_dir: Path, node: str) -> None:
        self.dir = node_dir / "samples"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.node = node
        self.rows: dict[str, list[tuple]] = {}

    def add(
        self, t_node: int, source: str, device: str, metric: str, value: float, kind: str
    ) -> None:
        self.rows.setdefault(source, []).append(
            (t_node, self.node, source, device, metric, f"{value:.6g}", kind)
        )

    def flush(self, skip_sources: tuple[str, ...], skip_metrics: tuple[str, ...]) -> None:
        for source, rows in sorted(self.rows.items()):
            if source in skip_sources:
                continue
            with (self.dir / f"{source}.csv").open("w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(("wall_ns", "node", "source", "device", "metric", "value", "kind"))
                w.writerows(r for r in rows if r[4] not in skip_metrics)


def _samples(
    run: RunSpec, root: Path, t_start: int, t_end: int, windows: list[tuple[int, int, dict]]
) -> dict[str, dict[str, Any]]:
    rng = random.Random(run.seed)
    nodes = {}
    step = int(run.interval_s * S)
    for n in range(run.nodes):
        node = f"node{n}"
        off0 = run.offsets_ns[n % len(run.offsets_ns)]
        off1 = off0 + run.drift_ns
        nodes[node] = {
            "clock_offset_ns": off0,
            "offset_start_ns": off0,
            "offset_end_ns": off1,
            "clock_uncertainty_ns": 150_000,
            "start_wall_ns": t_start,
            "end_wall_ns": t_end,
        }
        node_dir = root / "nodes" / node
        w = _Writer(node_dir, node)
        acc: dict[tuple[str, str, str], float] = {}
        gpu_acc: dict[str, float] = {}

        def counter(t_node, source, device, metric, rate, dt, *, _acc=acc, _w=w):
            key = (source, device, metric)
            _acc[key] = _acc.get(key, 1000.0) + rate * dt
            _w.add(t_node, source, device, metric, _acc[key], "counter")

        t = t_start
        while t <= t_end:
            lv = _window_of(t, windows)
            frac = (t - t_start) / max(t_end - t_start, 1)
            t_node = t + off0 + int(frac * (off1 - off0))
            dt = run.interval_s
            noise = 1.0 + rng.uniform(-0.01, 0.01)
            server = lv["server_cores"] * noise if n == 0 else 0.05
            other = lv["other_cores"]
            busy = min(run.cores, server + other)
            # proc (the server process, head node only)
            if n == 0:
                counter(t_node, "proc", "", "cpu_user_s", 0.9 * server, dt)
                counter(t_node, "proc", "", "cpu_system_s", 0.1 * server, dt)
                counter(t_node, "proc", "", "major_faults", lv["major_faults_s"], dt)
                counter(t_node, "proc", "", "minor_faults", 100.0, dt)
                counter(t_node, "proc", "", "read_bytes", lv["read_bytes_s"], dt)
                counter(t_node, "proc", "", "write_bytes", 1e3, dt)
                counter(
                    t_node, "proc", "", "runqueue_delay_ns", lv["runq_per_cpu_s"] * server * 1e9, dt
                )
                counter(t_node, "proc", "", "ctx_involuntary", lv["invol_per_cpu_s"] * server, dt)
                counter(t_node, "proc", "", "ctx_voluntary", 50.0, dt)
                w.add(t_node, "proc", "", "rss_bytes", 2.5e9, "gauge")
                w.add(t_node, "proc", "", "num_threads", run.server_threads, "gauge")
                for k in range(run.server_threads):
                    counter(
                        t_node,
                        "proc",
                        f"tid{100 + k}",
                        "thread_cpu_s",
                        server / run.server_threads,
                        dt,
                    )
            # cpu
            for c in range(run.cores):
                counter(t_node, "cpu", f"cpu{c}", "busy_s", busy / run.cores, dt)
            counter(t_node, "cpu", "", "busy_s", busy, dt)
            counter(t_node, "cpu", "", "idle_s", run.cores - busy, dt)
            counter(t_node, "cpu", "", "iowait_s", lv["iowait_frac"] * run.cores, dt)
            counter(t_node, "cpu", "", "steal_s", lv["steal_frac"] * run.cores, dt)
            for kind, key in (("cpu", "psi_cpu"), ("io", "psi_io"), ("memory", "psi_mem")):
                counter(t_node, "cpu", "", f"psi_{kind}_some_total_us", lv[key] * 1e6, dt)
                w.add(t_node, "cpu", "", f"psi_{kind}_some_avg10", 100 * lv[key], "gauge")
            w.add(t_node, "cpu", "", "load1", busy, "gauge")
            # mem
            total = 32 * 2**30
            w.add(t_node, "mem", "", "mem_total_bytes", total, "gauge")
            w.add(
                t_node, "mem", "", "mem_available_bytes", lv["mem_available_frac"] * total, "gauge"
            )
            w.add(t_node, "mem", "", "cached_bytes", 8 * 2**30, "gauge")
            w.add(t_node, "mem", "", "swap_used_bytes", 0, "gauge")
            # disk
            counter(t_node, "disk", "nvme0n1", "read_bytes", lv["read_bytes_s"], dt)
            counter(t_node, "disk", "nvme0n1", "write_bytes", 1e4, dt)
            counter(t_node, "disk", "nvme0n1", "reads", lv["read_bytes_s"] / 4096, dt)
            counter(t_node, "disk", "nvme0n1", "busy_ms", lv["disk_busy"] * 1000, dt)
            # net
            for iface, speed in (("eth0", 10_000), ("lo", 0)):
                counter(t_node, "net", iface, "rx_bytes", lv["net_bytes_s"], dt)
                counter(t_node, "net", iface, "tx_bytes", lv["net_bytes_s"], dt)
                if speed:
                    w.add(t_node, "net", iface, "link_speed_mbps", speed, "gauge")
            # prom
            if run.prom and n == 0:
                w.add(t_node, "prom", "", "waiting_requests", lv["waiting"], "gauge")
                w.add(t_node, "prom", "", "running_requests", lv["running"], "gauge")
                w.add(t_node, "prom", "", "kv_cache_usage", lv["kv"], "gauge")
            # GPUs
            for g in range(run.gpus):
                dev = f"gpu{g}"
                skew = 1.0 - lv["gpu_skew"] * (g % 2)
                util = min(1.0, lv["gpu_util"] * skew)
                w.add(t_node, "nvml", dev, "gpu_util_pct", 100 * util, "gauge")
                w.add(t_node, "nvml", dev, "gpm_sm_activity_pct", 100 * lv["sm"] * skew, "gauge")
                w.add(t_node, "nvml", dev, "gpm_tensor_activity_pct", 100 * lv["tensor"], "gauge")
                w.add(t_node, "nvml", dev, "gpm_dram_bw_util_pct", 100 * lv["dram"], "gauge")
                w.add(t_node, "nvml", dev, "gpm_sm_occupancy_pct", 100 * lv["occ"], "gauge")
                power = lv["power_w"] if util > 0 else 80.0
                w.add(t_node, "nvml", dev, "power_w", power, "gauge")
                gpu_acc[dev] = gpu_acc.get(dev, 5e6) + power * dt * 1000
                w.add(t_node, "nvml", dev, "energy_mj", gpu_acc[dev], "counter")
                w.add(t_node, "nvml", dev, "sm_clock_max_mhz", 1980, "gauge")
                w.add(t_node, "nvml", dev, "sm_clock_mhz", 1980 * lv["clock_ratio"], "gauge")
                w.add(
                    t_node,
                    "nvml",
                    dev,
                    "throttle_reasons",
                    0x4 if lv["throttle"] > 0 else 0x0,
                    "gauge",
                )
                counter(t_node, "nvml", dev, "violation_power_ns", lv["throttle"] * 1e9, dt)
                w.add(t_node, "nvml", dev, "temp_c", 40 + 30 * util, "gauge")
                w.add(t_node, "nvml", dev, "mem_used_bytes", 60 * 2**30, "gauge")
                w.add(t_node, "nvml", dev, "pcie_rx_bytes_s", lv["pcie_bytes_s"], "gauge")
                w.add(t_node, "nvml", dev, "pcie_tx_bytes_s", lv["pcie_bytes_s"] / 2, "gauge")
            if run.nodes > 1:
                for rail in ("mlx5_0/1", "mlx5_3/1"):
                    counter(t_node, "rdma", rail, "xmit_bytes", lv["rdma_bytes_s"], dt)
                    counter(t_node, "rdma", rail, "rcv_bytes", lv["rdma_bytes_s"], dt)
                    w.add(t_node, "rdma", rail, "link_rate_gbps", 400, "gauge")
                    counter(t_node, "rdma", rail, "port_xmit_wait", 0.0, dt)
            t += step
        if n == 0 and run.runstate_s:
            _runstate(run, w, t_start, t_end, off0, off1, windows)
        skip = tuple(run.skip_sources)
        if n == 0:
            skip += tuple(run.unavailable)
        w.flush(skip, run.skip_metrics)
        unavailable = dict(run.unavailable) if n == 0 else {}
        if not run.gpus:
            unavailable.setdefault("nvml", "NVML library not found (no NVIDIA driver)")
            unavailable.setdefault("dcgm", "dcgmi not on PATH")
        if run.nodes == 1:
            unavailable.setdefault("rdma", "no /sys/class/infiniband devices")
        (node_dir / "unavailable.json").write_text(json.dumps(unavailable, sort_keys=True))
    return nodes


def _runstate(run: RunSpec, w: _Writer, t_start: int, t_end: int, off0: int, off1: int,
              windows: list[tuple[int, int, dict]]) -> None:
    """The runstate collector's samples: the server's threads run in a case window (the
    case's ``server_cores``), sleep outside it, and stand still while frozen."""
    step = int(run.runstate_s * S)
    run_s = wait_s = 1000.0
    t = t_start
    threads = float(run.server_threads)
    while t <= t_end:
        lv = _window_of(t, windows)
        # the phase counts on the monotonic clock: wall - (ANCHOR_WALL - ANCHOR_MONO)
        frozen = frozen_until(t - ANCHOR_WALL + ANCHOR_MONO, lv) is not None
        t_node = t + off0 + int((t - t_start) / max(t_end - t_start, 1) * (off1 - off0))
        if not frozen:
            run_s += lv["server_cores"] * run.runstate_s
        running = 0.0 if frozen else min(threads, round(lv["server_cores"]))
        for metric, v in (("run_s", run_s), ("wait_s", wait_s)):
            w.add(t_node, "runstate", "", metric, v, "counter")
        for metric, v in (("threads", threads), ("state_R", running),
                          ("state_S", threads - running), ("state_D", 0.0), ("state_T", 0.0),
                          ("state_other", 0.0), ("frozen", 1.0 if frozen else 0.0)):
            w.add(t_node, "runstate", "", metric, v, "gauge")
        t += step


def make_run(root: Path, run: RunSpec) -> Path:
    """Write a complete run folder under ``root/<run_id>`` and return its path."""
    run_dir = root / run.run_id
    run_dir.mkdir(parents=True)
    rng = random.Random(run.seed)
    mono = ANCHOR_MONO + S  # one second after the anchor

    def wall(m: int) -> int:
        return ANCHOR_WALL + (m - ANCHOR_MONO)

    markers = []
    run_start = mono
    markers.append(
        Marker("baseline", "baseline:default", "", wall(mono), wall(mono + int(run.baseline_s * S)))
    )
    windows = [(wall(mono), wall(mono + int(run.baseline_s * S)), run.baseline_behaviour)]
    mono += int(run.baseline_s * S)
    cases_lines, records = [], []
    for spec in run.cases:
        mono += int(run.gap_between_cases_s * S)
        case_start = mono
        warm_end = case_start + S // 2
        start = warm_end
        recs = _records(spec, start, rng)
        end = max(r.done_ns for r in recs)
        for r in recs:
            markers.append(
                Marker(
                    "request", r.request_id, spec.case_id, wall(r.dispatched_ns), wall(r.done_ns)
                )
            )
        markers.append(
            Marker("warmup", spec.case_id, spec.case_id, wall(case_start), wall(warm_end))
        )
        markers.append(Marker("measured", spec.case_id, spec.case_id, wall(start), wall(end)))
        markers.append(Marker("case", spec.case_id, spec.case_id, wall(case_start), wall(end)))
        windows.append((wall(start), wall(end), spec.behaviour))
        records.extend(recs)
        line: dict[str, Any] = {
            "case_id": spec.case_id,
            "name": spec.name or spec.case_id,
            "params": {
                "isl": spec.isl,
                "osl": spec.osl,
                "concurrency": spec.concurrency,
                "requests": spec.n_requests,
                "arrival": "closed",
            },
            "scaled_from": None,
            "config_id": "default",
            "api": "openai",
            "window_mono_ns": [start, end],
            "warmup_s": 0.5,
            "outcome": "passed",
            "self_check": {
                "client_cpu_cores": 0.9 if spec.client_bound else 0.05,
                "dispatch_lateness_p99_ms": 250.0 if spec.client_bound else 0.4,
                "handling_lag_p99_ms": 0.1,
                "dispatch_delay_share": 0.18 if spec.client_bound else 0.004,
                "client_bound": spec.client_bound,
                "reasons": ["dispatch lateness p99 250.00 ms > 5.0 ms, 18.0% of the "
                            "requests' time (9 of 24 requests late)"] if spec.client_bound else [],
            },
            "client_bound": spec.client_bound,
            "problems": [],
        }
        if spec.ab_group:
            line.update(ab_group=spec.ab_group, ab_arm=spec.ab_arm)
        cases_lines.append(line)
        mono = end
    mono += int(run.gap_between_cases_s * S)
    markers.append(
        Marker("cooldown", "cooldown:default", "", wall(mono), wall(mono + int(run.cooldown_s * S)))
    )
    mono += int(run.cooldown_s * S)
    markers.append(Marker("run", "run", "", wall(run_start), wall(mono)))
    write_markers(run_dir / "markers.csv", markers)
    with (run_dir / "requests.jsonl").open("w") as fh:
        for r in records:
            fh.write(r.to_json() + "\n")
    with (run_dir / "cases.jsonl").open("w") as fh:
        for line in cases_lines:
            fh.write(json.dumps(line, sort_keys=True) + "\n")
    nodes = _samples(run, run_dir, wall(run_start), wall(mono), windows)
    manifest = {
        "run_id": run.run_id,
        "strata_version": "0.1.0",
        "argv": ["pytest", "cases/"],
        "git_sha": "0123456789abcdef0123456789abcdef01234567",
        "host": {
            "hostname": "testhost",
            "kernel": "6.1.0",
            "machine": "x86_64",
            "cpu_model": "Test CPU",
            "cpus": run.cores,
            "python": "3.11.7",
        },
        "versions": {"pytest": "9.0.3", "pandas": "3.1.1", "llama.cpp": "b4000"},
        "profile": {"name": "test-profile", "_path": "fixtures/profiles/test.toml"},
        "servers": {
            "default": {
                "argv": ["llama-server", "-m", "model.gguf", "--port", "8080"],
                "base_url": "http://127.0.0.1:8080",
                "startup_s": 1.5,
            }
        },
        "started_utc": "2025-01-01T00:00:00+00:00",
        "clock_anchor": {"mono_ns": ANCHOR_MONO, "wall_ns": ANCHOR_WALL},
        "nodes": nodes,
        "complete": True,
    }
    if run.gpu_expected is not None:
        manifest["telemetry"] = {"gpu_expected": run.gpu_expected}
    (run_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return run_dir


def cpu_run(root: Path, **kw: Any) -> Path:
    """A CPU-only run (llama.cpp default) with an idle, a CPU-bound and an A/B pair."""
    cases = [
        CaseSpec("light", behaviour=dict(server_cores=0.6), proc=(0.3, 0, 0)),
        CaseSpec(
            "cpu_bound",
            concurrency=4,
            n_requests=8,
            behaviour=dict(server_cores=3.9, other_cores=0.05, running=4, waiting=2),
            proc=(3.0, 0, 0),
        ),
        CaseSpec(
            "ab_control",
            ab_group="mmap",
            ab_arm="control",
            n_requests=6,
            behaviour=dict(server_cores=1.2, major_faults_s=42.0, read_bytes_s=5.2e6, psi_io=0.2),
            proc=(66.29, 2800, 344_780_000),
            output_text="same answer",
        ),
        CaseSpec(
            "ab_treatment",
            ab_group="mmap",
            ab_arm="treatment",
            n_requests=6,
            behaviour=dict(server_cores=0.8),
            proc=(2.75, 16, 1_960_000),
            output_text="same answer",
        ),
    ]
    return make_run(root, RunSpec(cases=cases, **kw))


def gpu_run(root: Path, **kw: Any) -> Path:
    """A two-node GPU run: a memory-bound decode case and a compute-bound prefill case."""
    cases = [
        CaseSpec(
            "decode",
            concurrency=8,
            n_requests=16,
            osl=64,
            behaviour=dict(
                gpu_util=0.97,
                sm=0.7,
                tensor=0.2,
                dram=0.72,
                occ=0.4,
                power_w=450,
                server_cores=1.0,
                running=8,
            ),
        ),
        CaseSpec(
            "prefill",
            isl=4096,
            osl=1,
            n_requests=4,
            behaviour=dict(
                gpu_util=0.99,
                sm=0.9,
                tensor=0.75,
                dram=0.3,
                occ=0.5,
                power_w=690,
                server_cores=1.0,
                running=1,
            ),
        ),
    ]
    kw.setdefault("gpus", 2)
    kw.setdefault("nodes", 2)
    kw.setdefault("run_id", "20250101T000000Z-gpu000")
    return make_run(root, RunSpec(cases=cases, **kw))

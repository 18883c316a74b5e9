"""From a window's telemetry summary and its requests to the classifier's inputs.

The rules in ``strata_plugin.analysis.rules`` read plain numbers; this module is the one
place that knows which metric of which collector each number comes from (the names
are listed in docs/formats.md, "Metric names"). A signal whose metric has no sample in
the window stays None, so the classifier treats it as unmeasured.

Rail, link and GPU-peer facts come from ``strata_plugin.analysis.rails`` (``rails.analyze``,
merged with ``rails.merge_signals``): link utilization against the profile's
``telemetry.link_caps``, RDMA errors / congestion / socket fallback, rail imbalance
and stragglers.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from strata_plugin.agent.cgroups import parse_cpulist
from strata_plugin.analysis import rails
from strata_plugin.analysis.rules import WindowSignals
from strata_plugin.analysis.rules.registry import active, plugin_signals
from strata_plugin.analysis.thresholds import value as threshold_value
from strata_plugin.analysis.timeline import HwStat, inflight_fraction

GPU_SOURCES = ("nvml", "dcgm")


class HwView:
    """Lookup over one window's ``HwStat`` rows by (node, source, device, metric)."""

    def __init__(self, rows: Iterable[HwStat]) -> None:
        self.rows = list(rows)
        self.by_key = {(r.node, r.source, r.device, r.metric): r for r in self.rows}

    def select(
        self,
        source: str | Sequence[str],
        metric: str,
        node: str | None = None,
        device_prefix: str | None = None,
    ) -> list[HwStat]:
        sources = (source,) if isinstance(source, str) else tuple(source)
        out = [
            r
            for r in self.rows
            if r.source in sources
            and r.metric == metric
            and (node is None or r.node == node)
            and (device_prefix is None or r.device.startswith(device_prefix))
        ]
        if len(sources) > 1 and out:
            # One source per device: the first listed source wins (nvml before dcgm).
            seen: dict[tuple[str, str], HwStat] = {}
            for r in sorted(out, key=lambda r: sources.index(r.source)):
                seen.setdefault((r.node, r.device), r)
            out = list(seen.values())
        return sorted(out, key=lambda r: (r.node, r.device))

    def nodes(self) -> list[str]:
        return sorted({r.node for r in self.rows})

    def has_source(self, source: str) -> bool:
        return any(r.source == source for r in self.rows)


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _val(r: HwStat) -> float | None:
    """A row's level: the rate of a counter, the mean of a gauge or fraction."""
    return r.rate if r.kind == "counter" else r.mean


def _per_device(
    view: HwView, metric: str, scale: float = 1.0, sources: Sequence[str] = GPU_SOURCES
) -> dict[tuple[str, str], float]:
    out = {}
    for r in view.select(tuple(sources), metric):
        v = _val(r)
        if v is not None:
            out[(r.node, r.device)] = v * scale
    return out


def _cv(xs: Sequence[float]) -> float | None:
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    if m <= 0:
        return None
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) / m


def _max_min(xs: Sequence[float], floor: float) -> float | None:
    if len(xs) < 2 or max(xs) <= floor:
        return None
    return max(xs) / max(min(xs), floor)


def server_node(view: HwView) -> str | None:
    """The node that runs the server: the one whose proc collector saw the most CPU."""
    cpu: dict[str, float] = defaultdict(float)
    for m in ("cpu_user_s", "cpu_system_s"):
        for r in view.select("proc", m):
            if not r.device.startswith("tid"):
                cpu[r.node] += r.rate or 0.0
    if cpu:
        return max(sorted(cpu), key=lambda n: cpu[n])
    nodes = [n for n in view.nodes() if any(r.node == n and r.source == "cpu" for r in view.rows)]
    return nodes[0] if nodes else (view.nodes()[0] if view.nodes() else None)


@dataclass(frozen=True)
class RequestFacts:
    """What the requests of the window say, for the serving rules."""

    intervals_wall: tuple[tuple[int, int], ...]  # (dispatched, end) per measured request
    chunk_gap_p50: float | None
    chunk_gap_p99: float | None
    n_chunk_gaps: int
    tpot_p50: float | None  # the decode pace the gaps are compared with
    server_queue_frac: float | None  # median of (ttft - server prompt ms) / ttft
    concurrency: int | None
    client_bound: bool | None
    client_lateness_p99_ms: float | None
    client_cpu_fraction: float | None
    outside_server_frac: float | None = None  # median of outside_server_ms / e2e


def _gpu_signals(view: HwView) -> dict:
    util = _per_device(view, "gpu_util_pct", 0.01)
    sm = _per_device(view, "gpm_sm_activity_pct", 0.01)
    tensor = _per_device(view, "gpm_tensor_activity_pct", 0.01)
    dram = _per_device(view, "gpm_dram_bw_util_pct", 0.01)
    occ = _per_device(view, "gpm_sm_occupancy_pct", 0.01)
    pcie: dict[tuple[str, str], float] = defaultdict(float)
    for m in (
        "gpm_pcie_rx_bytes_s",
        "gpm_pcie_tx_bytes_s",
        "pcie_rx_bytes_s",
        "pcie_tx_bytes_s",
        "pcie_rx_bytes_total",  # counters: their window rate is bytes/s
        "pcie_tx_bytes_total",
    ):
        for k, v in _per_device(view, m).items():
            pcie[k] = max(pcie[k], v)
    nvl: dict[tuple[str, str], float] = defaultdict(float)
    for m in (
        "gpm_nvlink_tx_bytes_s",
        "gpm_nvlink_rx_bytes_s",
        "nvlink_tx_bytes_total",
        "nvlink_rx_bytes_total",
    ):
        for k, v in _per_device(view, m).items():
            nvl[k] = max(nvl[k], v)
    viol: dict[tuple[str, str], float] = defaultdict(float)
    for m in ("violation_power_ns", "violation_thermal_ns"):
        for k, v in _per_device(view, m, 1e-9).items():
            viol[k] += v
    for k, v in _per_device(view, "frac_throttled").items():
        viol[k] = max(viol[k], v)
    clock_low = _per_device(view, "frac_sm_clock_below_90pct_max")
    devices = set(util) | set(sm)
    return dict(
        n_gpus=len(devices),
        gpu_util=_mean(list(util.values())),
        sm_active=_mean(list(sm.values())),
        tensor_active=_mean(list(tensor.values())),
        dram_active=_mean(list(dram.values())),
        sm_occupancy=_mean(list(occ.values())),
        sm_active_cv=_cv([sm[k] for k in sorted(sm)]),
        gpu_util_max_min=_max_min([util[k] for k in sorted(util)], 0.01),
        pcie_bytes_s=max(pcie.values()) if pcie else None,
        nvlink_bytes_s=max(nvl.values()) if nvl else None,
        throttle_frac=max(viol.values()) if viol else None,
        sm_clock_low_frac=max(clock_low.values()) if clock_low else None,
    )


def _rdma_signals(view: HwView) -> dict:
    per_rail: dict[tuple[str, str], float] = defaultdict(float)
    for m in ("xmit_bytes", "rcv_bytes"):
        for r in view.select("rdma", m):
            if r.rate is not None:
                per_rail[(r.node, r.device)] = max(per_rail[(r.node, r.device)], r.rate)
    caps = {
        (r.node, r.device): r.mean * 1e9 / 8
        for r in view.select("rdma", "link_rate_gbps")
        if r.mean
    }
    utils = [per_rail[k] / caps[k] for k in sorted(per_rail) if k in caps]
    busy = [per_rail[k] for k in sorted(per_rail)]
    # error and congestion counters: rails.RailsReport.signals (errors apart from congestion)
    return dict(
        rdma_util=max(utils) if utils else None,
        rdma_rail_max_min=_max_min(busy, 1e6) if len(busy) >= 2 else None,
    )


def _rate(
    view: HwView,
    source: str,
    metric: str,
    node: str | None,
    device: str | None = None,
    exclude_tid: bool = True,
) -> float | None:
    rows = [
        r
        for r in view.select(source, metric, node)
        if (device is None or r.device == device)
        and not (exclude_tid and r.device.startswith("tid"))
    ]
    if source in ("proc", "path") and any(r.device == "" for r in rows):
        # The process tree ("") already sums its processes (pid<N>): count it once.
        rows = [r for r in rows if r.device == ""]
    vals = [r.rate for r in rows if r.rate is not None]
    return sum(vals) if vals else None


def _psi(view: HwView, kind: str, node: str | None) -> float | None:
    total = _rate(view, "cpu", f"psi_{kind}_some_total_us", node)
    if total is not None:
        return total / 1e6
    avg = [r.mean for r in view.select("cpu", f"psi_{kind}_some_avg10", node) if r.mean is not None]
    return max(avg) / 100.0 if avg else None


def cgroup_throttled_frac(view: HwView, node: str | None) -> float | None:
    """Share of the server cgroup's CFS periods in which it was throttled (0..1).

    Linux kernel docs, scheduler/sched-bwc.rst, Statistics: ``nr_periods`` enforcement
    intervals elapsed, ``nr_throttled`` of them throttled. Throttled *time* is summed
    over the CPUs the group ran on, so over a window it can exceed the window; the
    period count cannot. Without period counts: throttled time per core, capped at 1.
    """
    periods = _rate(view, "cpu", "cgroup_nr_periods", node)
    n_throttled = _rate(view, "cpu", "cgroup_nr_throttled", node)
    if periods and n_throttled is not None:
        return min(1.0, max(0.0, n_throttled / periods))
    if periods == 0.0 and n_throttled is not None:
        return 0.0  # no period elapsed: the group did not run into its quota
    throttled_us = _rate(view, "cpu", "cgroup_throttled_us", node)
    if throttled_us is None:
        return None
    cores = [r for r in view.select("cpu", "busy_s", node) if r.device.startswith("cpu")]
    return min(1.0, throttled_us / 1e6 / max(1, len(cores)))


def cgroup_quota_used(view: HwView, node: str | None, server_cpu: float | None) -> float | None:
    """The server's CPU over its cgroup's CFS quota (cores over cores); None without a
    quota. The cgroup's own usage counter where the kernel reports it (v2 cpu.stat
    ``usage_usec``), else the server's process tree (v1 cpu.stat has no usage)."""
    quota = [r.mean for r in view.select("cpu", "cgroup_quota_cores", node) if r.mean]
    if not quota:
        return None
    used = _rate(view, "cpu", "cgroup_usage_s", node)
    if used is None:
        used = server_cpu
    return None if used is None else used / quota[0]


def cgroup_mem_events(view: HwView, node: str | None) -> float | None:
    """Memory-limit events of the server's cgroup in the window: allocations that hit
    the limit (v2 memory.events ``max``, v1 ``memory.failcnt``) plus OOM kills."""
    deltas = [r.delta for m in ("cgroup_mem_max_events", "cgroup_mem_oom_kills")
              for r in view.select("mem", m, node) if r.delta is not None]
    return sum(deltas) if deltas else None


def cgroup_mem_free_frac(view: HwView, node: str | None) -> float | None:
    """What the server's cgroup may still allocate, as a share of its limit (the lowest
    in the window); None without a limit."""
    limit = [r.mean for r in view.select("mem", "cgroup_mem_limit_bytes", node) if r.mean]
    usage = [r.max for r in view.select("mem", "cgroup_mem_usage_bytes", node)
             if r.max is not None]
    if not limit or not usage:
        return None
    return max(0.0, (limit[0] - usage[0]) / limit[0])


def _host_signals(view: HwView, node: str | None) -> dict:
    cores = [r for r in view.select("cpu", "busy_s", node) if r.device.startswith("cpu")]
    n_cores = len(cores) or None
    total = _rate(view, "cpu", "busy_s", node, device="")
    if total is None and cores:
        total = sum(r.rate or 0.0 for r in cores)
    iowait = _rate(view, "cpu", "iowait_s", node, device="")
    steal = _rate(view, "cpu", "steal_s", node, device="")
    throttled = cgroup_throttled_frac(view, node)
    user = _rate(view, "proc", "cpu_user_s", node)
    system = _rate(view, "proc", "cpu_system_s", node)
    server_cpu = None if user is None and system is None else (user or 0.0) + (system or 0.0)
    threads_rows = [
        r for r in view.select("proc", "thread_cpu_s", node) if r.device.startswith("tid")
    ]
    n_threads = [r.max for r in view.select("proc", "num_threads", node) if r.max is not None]
    server_threads = int(max(n_threads)) if n_threads else (len(threads_rows) or None)
    max_thread = max((r.rate for r in threads_rows if r.rate is not None), default=None)
    if max_thread is None:  # the agent's own gauge: the busiest thread's share of a core
        top = [
            r.mean for r in view.select("proc", "top_thread_cpu_frac", node) if r.mean is not None
        ]
        max_thread = max(top) if top else None
    runq = _rate(view, "proc", "runqueue_delay_ns", node)
    invol = _rate(view, "proc", "ctx_involuntary", node)
    busy_cpu = server_cpu if server_cpu and server_cpu > 0.01 else None
    # The proxies on the request's way (an attached server behind one): neither the
    # server's CPU nor other processes'; their run-queue wait per CPU-second like the
    # server's (a proxy starved of CPU delays every byte it relays).
    p_user = _rate(view, "path", "cpu_user_s", node)
    p_sys = _rate(view, "path", "cpu_system_s", node)
    path_cpu = None if p_user is None and p_sys is None else (p_user or 0.0) + (p_sys or 0.0)
    path_runq = _rate(view, "path", "runqueue_delay_ns", node)
    disk = [r.rate / 1000.0 for r in view.select("disk", "busy_ms", node) if r.rate is not None]
    avail = [r.min for r in view.select("mem", "mem_available_bytes", node) if r.min is not None]
    total_mem = [r.mean for r in view.select("mem", "mem_total_bytes", node) if r.mean]
    mem_frac = avail[0] / total_mem[0] if avail and total_mem else None
    cg_frac = cgroup_mem_free_frac(view, node)
    if cg_frac is not None:  # the server's own limit binds first when it is tighter
        mem_frac = cg_frac if mem_frac is None else min(mem_frac, cg_frac)
    return dict(
        n_cores=n_cores,
        host_busy_cores=total,
        iowait_frac=iowait / n_cores if iowait is not None and n_cores else None,
        steal_frac=steal / n_cores if steal is not None and n_cores else None,
        psi_cpu_some=_psi(view, "cpu", node),
        psi_io_some=_psi(view, "io", node),
        psi_mem_some=_psi(view, "memory", node),
        cgroup_throttled_frac=throttled,
        cgroup_quota_used=cgroup_quota_used(view, node, server_cpu),
        server_cpu_cores=server_cpu,
        path_cpu_cores=path_cpu,
        path_runq_delay_per_cpu_s=(path_runq / 1e9 / path_cpu)
        if path_runq is not None and path_cpu and path_cpu > 0.01
        else (0.0 if path_runq is not None else None),
        server_threads=server_threads,
        server_max_thread_cores=max_thread,
        runq_delay_per_cpu_s=(runq / 1e9 / busy_cpu)
        if runq is not None and busy_cpu
        else (0.0 if runq is not None else None),
        ctx_involuntary_per_cpu_s=(invol / busy_cpu)
        if invol is not None and busy_cpu
        else (0.0 if invol is not None else None),
        major_faults_per_s=_rate(view, "proc", "major_faults", node),
        read_bytes_s=_rate(view, "proc", "read_bytes", node),
        disk_busy_frac=max(disk) if disk else None,
        mem_available_frac=mem_frac,
        cgroup_mem_events=cgroup_mem_events(view, node),
    )


# --- the server's CPU allowance and the other processes (agent source ``allowance``) -------

#: The allowance collector's series (agent/collectors/allowance.py): the one place the
#: analysis names them.
ALLOWANCE = "allowance"
_OTHER_DEVICE = re.compile(r"^pid(\d+) (.*)$", re.S)
#: How many other processes a window names (cpu_contention's evidence).
OTHER_PROCESSES_NAMED = 5


def _cpu_word(n: float) -> str:
    return f"{n:g} CPU" + ("" if n == 1 else "s")


def allowance(view: HwView, node: str | None) -> tuple[float | None, str, frozenset[int] | None]:
    """The fewest CPUs the server could use in the window, what set it, and which CPUs
    (None for a quota, which limits time, not CPUs).

    ``allowed_cpus`` is sampled every tick; its least value is the window's allowance.
    The series of the affinity masks and of the cpusets carry their CPU lists in their
    device names ("affinity 0-1", "cpuset 1"); the one with the fewest CPUs names the
    limit (a cpuset before the affinity it also sets, Linux docs admin-guide/
    cgroup-v1/cpusets.rst 1.4; the quota where it is tighter than both)."""
    counts = [r.min for r in view.select(ALLOWANCE, "allowed_cpus", node) if r.min is not None]
    if not counts:
        return None, "", None
    allowed = min(counts)
    sets: list[tuple[float, int, str, frozenset[int] | None]] = []
    for rank, metric, word in ((0, "cpuset_cpus", "cpuset "), (1, "affinity_cpus", "affinity ")):
        for r in view.select(ALLOWANCE, metric, node, device_prefix=word):
            cpus = parse_cpulist(r.device[len(word):])
            if r.min is not None and cpus:
                sets.append((float(len(cpus)), rank, r.device, cpus))
    quota = [r.min for r in view.select(ALLOWANCE, "quota_cores", node) if r.min is not None]
    if quota:
        sets.append((min(quota), 2, f"CFS quota {min(quota):g}", None))
    if not sets:
        return allowed, "", None
    n, _, what, cpus = min(sets, key=lambda x: (x[0], x[1]))
    if what.startswith("CFS quota"):
        return allowed, f"{what} CPU", None
    if n > allowed + 1e-9:  # the masks and the cpuset overlap on fewer CPUs than either
        mask = min((x for x in sets if x[1] == 1), key=lambda x: x[0], default=None)
        both = (cpus or frozenset()) & (mask[3] if mask and mask[3] else frozenset())
        return allowed, (f"{what} and {mask[2] if mask else ''} ({_cpu_word(allowed)} "
                         "in both)"), both or None
    return allowed, f"{what} ({_cpu_word(n)})", cpus


def other_processes(view: HwView, node: str | None, duration_s: float
                    ) -> tuple[tuple[int, str, float, bool], ...]:
    """The busiest other processes in the window: (PID, command, cores over the window,
    Strata's own), busiest on the server's CPUs first (cores times ``allowed_share``),
    at most ``OTHER_PROCESSES_NAMED``. A process's cores are its own CPU (``cpu_s``) plus
    its reaped children's (``children_cpu_s``, where sampled): a parent that runs short-
    lived children does their work. The path's proxies
    (source ``path``) are left out: they are the request's way, not other work."""
    if duration_s <= 0:
        return ()
    path = {int(r.device[3:]) for r in view.rows
            if r.source == "path" and r.device[3:].isdigit() and r.device.startswith("pid")}
    own = {r.device: (r.max or 0.0) >= 0.5
           for r in view.select(ALLOWANCE, "strata_own", node)}
    share = {r.device: r.mean for r in view.select(ALLOWANCE, "allowed_share", node)
             if r.mean is not None}
    # runs recorded before children_cpu_s have none: the process's own CPU alone
    children = {r.device: r.delta for r in view.select(ALLOWANCE, "children_cpu_s", node)
                if r.delta is not None}
    ranked = []
    for r in view.select(ALLOWANCE, "cpu_s", node):
        m = _OTHER_DEVICE.match(r.device)
        if m is None or r.delta is None or int(m.group(1)) in path:
            continue
        cores = (max(0.0, r.delta) + max(0.0, children.get(r.device, 0.0))) / duration_s
        if cores > 0:
            # busiest on the server's CPUs first: its cores times the share of its CPUs
            # the server may use too
            ranked.append((-cores * share.get(r.device, 1.0), int(m.group(1)),
                           (int(m.group(1)), m.group(2), round(cores, 3),
                            own.get(r.device, False))))
    ranked.sort(key=lambda x: (x[0], x[1]))
    return tuple(x[2] for x in ranked[:OTHER_PROCESSES_NAMED])


#: A CPU weight's device: ``<file> <group>`` for the server's cgroup, ``pid<N> <file>
#: <group>`` for a named other process's (agent/collectors/allowance.py).
_WEIGHT_DEVICE = re.compile(r"^(?:pid(\d+) )?(cpu\.shares|cpu\.weight) (.*)$", re.S)


def cpu_weights(view: HwView, node: str | None) -> dict:
    """The server's CPU weight and its threads' nice values, and the named other
    processes' (what decides each one's share of contended CPUs): ``server_cpu_weight``
    (file, value, group; the least in the window where it changed), ``server_nice``
    (least, greatest over its threads), ``other_weights`` ((PID, nice, weight or None),
    each PID the allowance collector named)."""
    server: list[tuple[float, str, str]] = []
    others: dict[int, tuple[str, float, str]] = {}
    for r in view.select(ALLOWANCE, "cpu_weight", node):
        m = _WEIGHT_DEVICE.match(r.device)
        if m is None or r.min is None:
            continue
        if m.group(1) is None:
            server.append((r.min, m.group(2), m.group(3)))
        else:
            others[int(m.group(1))] = (m.group(2), r.min, m.group(3))
    lo = [r.min for r in view.select(ALLOWANCE, "nice_min", node) if r.min is not None]
    hi = [r.max for r in view.select(ALLOWANCE, "nice_max", node) if r.max is not None]
    nice: dict[int, float] = {}
    for r in view.select(ALLOWANCE, "nice", node):
        m = _OTHER_DEVICE.match(r.device)
        if m is not None and r.mean is not None:
            nice[int(m.group(1))] = round(r.mean)
    weight = min(server) if server else None
    return dict(
        server_cpu_weight=None if weight is None else (weight[1], weight[0], weight[2]),
        server_nice=(min(lo), max(hi)) if lo and hi else None,
        other_weights=tuple((pid, nice.get(pid), others.get(pid))
                            for pid in sorted(set(nice) | set(others))),
    )


def _allowance_signals(view: HwView, node: str | None, duration_s: float,
                       server_cpu: float | None, path_cpu: float | None) -> dict:
    allowed, by, cpus = allowance(view, node)
    others_on_allowed = None
    if cpus and server_cpu is not None:
        busy = {r.device: r.rate for r in view.select("cpu", "busy_s", node, device_prefix="cpu")
                if r.rate is not None}
        names = [f"cpu{c}" for c in sorted(cpus)]
        if names and all(n in busy for n in names):
            # the server (and its path, on these CPUs or not: counted against them, a
            # lower bound of the others') ran only on its allowed CPUs
            others_on_allowed = max(0.0, sum(busy[n] for n in names) - server_cpu
                                    - (path_cpu or 0.0))
    frozen = [r.mean for r in view.select("runstate", "frozen", node) if r.mean is not None]
    stopped = [r.mean for r in view.select("runstate", "state_T", node) if r.mean is not None]
    threads = [r.mean for r in view.select("runstate", "threads", node) if r.mean]
    run = _rate(view, "runstate", "run_s", node)
    wait = _rate(view, "runstate", "wait_s", node)
    throttled = _rate(view, "runstate", "throttled_s", node)
    return dict(
        server_allowed_cpus=allowed,
        server_allowance_by=by,
        allowed_cpus_other_cores=others_on_allowed,
        server_run_cores=run,
        server_runnable_cores=None if run is None or wait is None
        else run + wait + (throttled or 0.0),
        other_processes=other_processes(view, node, duration_s),
        host_process_starts_per_s=_rate(view, "cpu", "forks", node, device=""),
        **cpu_weights(view, node),
        server_frozen_frac=max(frozen) if frozen else None,
        server_stopped_frac=min(1.0, max(stopped) / max(threads))
        if stopped and threads else None,
    )


# Ethernet links (net_util, net_wire_busy): rails.RailsReport.signals, which honours the
# run's recorded link caps (formats/telemetry.TelemetryFacts).


#: The prom collector's common names (agent/collectors/prom.ALIASES) of the engines'
#: preemption counters. Only these: vLLM also exports a per-request histogram
#: ``vllm:request_num_preemptions`` whose ``_count`` and buckets grow by one per finished
#: request, preempted or not, and a name match on "preempt" read those as preemptions.
PREEMPTION_COUNTERS = ("preemptions_total", "retracted_requests_total")


def _prom_signals(view: HwView) -> dict:
    waiting = [r.mean for r in view.select("prom", "waiting_requests") if r.mean is not None]
    kv = [r.max for r in view.select("prom", "kv_cache_usage") if r.max is not None]
    pre = [
        r.delta
        for r in view.rows
        if r.source == "prom" and r.delta is not None and r.metric in PREEMPTION_COUNTERS
    ]
    return dict(
        waiting_mean=sum(waiting) if waiting else None,
        kv_usage_max=max(kv) if kv else None,
        preemptions=sum(pre) if pre else None,
        engine_queue_frac=_ratio(view, "queue_time_seconds_sum", "ttft_seconds_sum"),
        prefix_cache_hit_frac=_ratio(view, "prefix_cache_hits_total",
                                     "prefix_cache_queries_total"),
    )


def _ratio(view: HwView, num: str, den: str) -> float | None:
    """Growth of one engine counter over another's in the window (None without both, or
    when the second did not grow): e.g. the engine's own queue time over its TTFT, both
    summed over the requests its histograms recorded in the window."""
    def grew(metric: str) -> float | None:
        deltas = [r.delta for r in view.select("prom", metric) if r.delta is not None]
        return sum(deltas) if deltas else None

    n, d = grew(num), grew(den)
    return n / d if n is not None and d else None


def build_signals(
    *,
    window: str,
    duration_s: float,
    start_ns: int,
    end_ns: int,
    hw: Iterable[HwStat],
    requests: RequestFacts | None,
    gpu_present: bool,
    gpu_expected: bool,
    multi_node: bool,
    unavailable: Sequence[tuple[str, str]],
    link_caps: Mapping[tuple[str, str], float] | None = None,
    expect_rdma: bool = False,
    rails_report: rails.RailsReport | None = None,
) -> WindowSignals:
    """``link_caps`` ((node, iface) -> bytes/s) and ``expect_rdma`` go to ``rails.analyze``;
    pass ``rails_report`` instead when it is already computed for these rows."""
    view = HwView(hw)
    node = server_node(view)
    fields: dict = {}
    fields.update(_gpu_signals(view))
    fields.update(_rdma_signals(view))
    fields.update(_host_signals(view, node))
    fields.update(_allowance_signals(view, node, duration_s, fields.get("server_cpu_cores"),
                                     fields.get("path_cpu_cores")))
    fields.update(_prom_signals(view))
    if rails_report is None:
        rails_report = rails.analyze(
            view.rows, window=window, link_caps=link_caps, expect_rdma=expect_rdma
        )
    fields = rails.merge_signals(fields, rails_report)
    # the rule plugins' own signals (rules/registry.py), and why where theirs failed
    extra, failed = plugin_signals(view, node)
    fields.update(extra)
    if requests is not None:
        gap = None
        # p99 gap over the typical decode pace. TPOT, not only the median gap: tokens that
        # arrive several to a read (speculative decoding, batched SSE) make the median gap
        # near zero and the ratio meaningless.
        pace = max(requests.tpot_p50 or 0.0, requests.chunk_gap_p50 or 0.0)
        enough = requests.n_chunk_gaps >= threshold_value("chunk_gaps_min")
        if enough and pace > 0 and requests.chunk_gap_p99:
            gap = requests.chunk_gap_p99 / pace
        fields.update(
            inflight_frac=inflight_fraction(requests.intervals_wall, start_ns, end_ns)
            if requests.intervals_wall
            else None,
            chunk_gap_p99_p50=gap,
            server_queue_frac=requests.server_queue_frac,
            outside_server_frac=requests.outside_server_frac,
            concurrency=requests.concurrency,
            client_bound=requests.client_bound,
            client_lateness_p99_ms=requests.client_lateness_p99_ms,
            client_cpu_fraction=requests.client_cpu_fraction,
        )
    return active().signals_class(
        window=window,
        duration_s=duration_s,
        gpu_present=gpu_present,
        gpu_expected=gpu_expected,
        multi_node=multi_node,
        unavailable=(*unavailable, *failed),
        **fields,
    )

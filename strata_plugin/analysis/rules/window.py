"""The classifier's input (one window's signals) and output (evidence, verdict)."""

from __future__ import annotations

from dataclasses import dataclass

#: A named other process's weights (``WindowSignals.other_weights``): its PID, its nice
#: value and its cpu cgroup's (file, weight, group), each None where not read.
OtherWeight = tuple[int, float | None, tuple[str, float, str] | None]


@dataclass(frozen=True)
class EngineFacts:
    """One engine of several the request's path ends at (replicas behind a router; the
    head and workers of one deployment), as the rules read it: keyed by its identity,
    node and root PID, never by its place in a list. Built by
    ``analysis/engine_case.py`` from the engine's own samples and the requests it served;
    None = not measured."""

    node: str
    pid: int
    #: its own evidence in words (``analysis/engine_lines.EngineLine.evidence``), then its
    #: share of the case's requests and their pace where known
    words: str
    quota_cores: float | None = None  # its own cgroup's CFS quota, in cores
    throttled_frac: float | None = None  # its cgroup's throttled periods over its periods
    #: its median TPOT over the fastest engine's, set only where it is the engine
    #: ``analysis/engine_requests.imbalance`` names slow (beyond ``engine_pace_ratio``)
    slower: float | None = None

    @property
    def key(self) -> str:
        return f"{self.node}/pid{self.pid}"


@dataclass(frozen=True)
class WindowSignals:
    """One window, reduced to the numbers the rules read. None = not measured.

    Built by ``strata_plugin.analysis.signals`` from the timeline summary and the case
    metrics. GPU values are means over the GPUs of the window (ratios 0-1); byte
    rates are the busiest device's; CPU values are for the node that runs the server.
    """

    window: str
    duration_s: float
    gpu_present: bool = False  # some GPU telemetry was measured
    gpu_expected: bool = False  # the run says the server uses GPUs
    multi_node: bool = False
    unavailable: tuple[tuple[str, str], ...] = ()  # ("node/collector", reason)
    # GPU
    n_gpus: int = 0
    gpu_util: float | None = None
    sm_active: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    sm_occupancy: float | None = None
    sm_active_cv: float | None = None
    gpu_util_max_min: float | None = None
    pcie_bytes_s: float | None = None
    nvlink_bytes_s: float | None = None
    throttle_frac: float | None = None
    sm_clock_low_frac: float | None = None
    rdma_util: float | None = None
    rdma_rail_max_min: float | None = None
    rdma_rail_cv: float | None = None  # CV of the active rails' throughput
    rdma_error_events: float | None = None  # error counter increases, all rails
    rdma_congestion_per_s: float | None = None  # CNP/ECN/xmit-wait, busiest counter's rate
    # the largest deviation from the peers' median of a GPU or node rails.py flagged as a
    # straggler (0 when peers were compared and none was)
    straggler_rel_dev: float | None = None
    # host
    n_cores: int | None = None
    host_busy_cores: float | None = None
    iowait_frac: float | None = None
    steal_frac: float | None = None
    psi_cpu_some: float | None = None
    psi_io_some: float | None = None
    psi_mem_some: float | None = None
    cgroup_throttled_frac: float | None = None
    # the server's CPU (its cgroup's usage where the kernel reports it) over the cgroup's
    # CFS quota in cores; None without a quota
    cgroup_quota_used: float | None = None
    server_cpu_cores: float | None = None
    # the proxies on the request's way to an attached server (agent source ``path``): their
    # CPU in cores, and their threads' run-queue wait per CPU-second (None: no proxy)
    path_cpu_cores: float | None = None
    path_runq_delay_per_cpu_s: float | None = None
    server_threads: int | None = None
    server_max_thread_cores: float | None = None
    # the server's CPU allowance (agent source ``allowance``, every tick): the fewest CPUs
    # its threads could use in the window (their affinity masks within their cpuset, no
    # more than the CFS quota in cores), and what set it: "cpuset 0 (1 CPU)", "affinity
    # 0-1 (2 CPUs)", "CFS quota 0.5 CPU"
    server_allowed_cpus: float | None = None
    server_allowance_by: str = ""
    # other processes' CPU on the CPUs the server may use, in cores (those CPUs' busy
    # time less the server's and its path's); None without per-core or allowance samples
    allowed_cpus_other_cores: float | None = None
    # the server's threads on the runstate grid: the mean number wanting a CPU (running,
    # runnable and waiting, throttled by the quota) and the mean number running
    server_runnable_cores: float | None = None
    server_run_cores: float | None = None
    # the busiest other processes in the window, busiest first: (PID, command, cores,
    # Strata's own: the harness, the agent, the load workers)
    other_processes: tuple[tuple[int, str, float, bool], ...] = ()
    # processes and threads started on the host per second (agent source ``cpu``,
    # ``forks``): work in children too short-lived to be named shows here
    host_process_starts_per_s: float | None = None
    # the weights that decide the server's share of contended CPUs (agent source
    # ``allowance``): its cpu cgroup's (file "cpu.shares" | "cpu.weight", value, group),
    # its threads' least and greatest nice value, and the named other processes' (PID,
    # nice, their group's weight as the server's), where observed
    server_cpu_weight: tuple[str, float, str] | None = None
    server_nice: tuple[float, float] | None = None
    other_weights: tuple[OtherWeight, ...] = ()
    # what a stall was, from the runstate grid's samples in the window: the share of them
    # with the server's cgroup frozen, and the share of its threads' samples stopped
    # (state T: SIGSTOP or a tracer); with the thread count, server_stalled's actors
    server_frozen_frac: float | None = None
    server_stopped_frac: float | None = None
    runq_delay_per_cpu_s: float | None = None
    ctx_involuntary_per_cpu_s: float | None = None
    major_faults_per_s: float | None = None
    read_bytes_s: float | None = None
    disk_busy_frac: float | None = None
    mem_available_frac: float | None = None
    # the server cgroup's memory-limit events in the window (v2 memory.events max +
    # oom_kill; v1 memory.failcnt + oom_kill); None when its cgroup has no memory files
    cgroup_mem_events: float | None = None
    net_util: float | None = None  # busier direction / capacity, busiest interface
    net_wire_busy: float | None = None  # (tx + rx) / capacity, busiest interface
    # Ethernet bytes/s on a node that should use RDMA, where it exceeds what RDMA carried
    # (0 when RDMA is expected and nothing fell back; None when RDMA is not expected)
    socket_fallback_bytes_s: float | None = None
    # serving
    waiting_mean: float | None = None
    kv_usage_max: float | None = None
    preemptions: float | None = None
    # the server's queue share of TTFT, from the time ledger (analysis/ledger.py): the
    # engine's own queue clock, or its waiting count by Little's law; where neither
    # exists, TTFT outside prefill (queue and the way there merged: queue_split False)
    server_queue_frac: float | None = None
    queue_split: bool | None = None  # the ledger told the server's queue from the way there
    # the engine's own queue time over its TTFT, from its histograms (vLLM
    # request_queue_time_seconds / time_to_first_token_seconds): server-measured
    engine_queue_frac: float | None = None
    # prefix-cache hits over lookups, in tokens (vLLM prefix_cache_hits/queries)
    prefix_cache_hit_frac: float | None = None
    # the ledger's time before the server (network, proxy, the HTTP front end) as a
    # share of TTFT: TTFT - the client's send - the server's queue - prefill
    outside_server_frac: float | None = None
    # the same time in ms, the median request's: under a floor it is the server's own
    # HTTP front end as much as a path, whatever its share of a short TTFT
    before_server_ms: float | None = None
    # delivery (analysis/delivery.py): the ledger's share of the case's metric in tokens
    # the server made and the path held (its first token's in TTFT, the decode gaps'
    # beyond production), by what it rests on: the server's own token clock, or clumping
    # alone (token events read together after gaps while the server ran: weaker)
    delivery_frac: float | None = None
    delivery_clumped_frac: float | None = None
    # the time ledger (analysis/ledger.py): which metric the case is about ("ttft",
    # "itl", "e2e"), each part's share of it, and what no clock explains
    ledger_metric: str | None = None
    ledger_shares: tuple[tuple[str, float], ...] = ()
    ledger_residual_frac: float | None = None  # |residual| / the metric
    ledger_residual_ms: float | None = None  # the same, ms per request (per token: itl)
    ledger_residual_part: str = ""  # where most of it is ("decode gaps, no run state")
    # the ledger by cause (issue 30): each ``group:state`` cause's share of the metric,
    # largest first, and the level-1 split (running, waiting, blocked, stopped, outside,
    # unexplained) that sums to 1; whether run-state samples split it (else the server's
    # clocks count as running)
    ledger_causes: tuple[tuple[str, float], ...] = ()
    ledger_level1: tuple[tuple[str, float], ...] = ()
    ledger_run_state: bool | None = None
    # the server's mean cores on a CPU, and wanting one (running, run queue, quota), over
    # the window from the run-state grid (~20 ms: a short window is measured), and how
    # many grid samples the window held
    ledger_run_cores: float | None = None
    ledger_runnable_cores: float | None = None
    ledger_runstate_samples: int | None = None
    # (collector, samples in the window) on the server's node: a rule resting on fewer
    # than ``rule_min_samples`` is said so in the verdict
    collector_samples: tuple[tuple[str, int], ...] = ()
    # the server neither running nor able to run (frozen, stopped, no progress) during
    # the metric's time (its share of the ledger) and during the window
    server_stalled_frac: float | None = None
    server_stalled_window_frac: float | None = None
    # the share of the window with the server stalled while any request was in flight
    # (dispatch to last byte): a stall the requests waited out, however little of the
    # metric's definition (a median, a per-request mean, TPOT without TTFT) shows it
    server_stalled_inflight_frac: float | None = None
    chunk_gap_p99_p50: float | None = None
    # prefill-decode interference (analysis/interference.py); ab_*: against the A/B
    # control, only for a treatment arm
    prefill_stall_frac: float | None = None
    prefill_stall_share: float | None = None
    ab_prefill_stall_ratio: float | None = None
    ab_tail_pace_rise: float | None = None
    # the same window: decode time per token while the injected prefill was in flight
    # over the time outside it, minus 1 (interference.Interference.interference_factor)
    injected_pace_factor: float | None = None
    concurrency: int | None = None
    inflight_frac: float | None = None
    client_bound: bool | None = None
    client_lateness_p99_ms: float | None = None
    client_cpu_fraction: float | None = None
    # where the request's path ends at several engines: each one's own facts. The server's
    # cgroup rows (cgroup_*, its quota in the allowance) are then the first engine's
    # alone, so they are left None and each engine's own are read here instead
    engines: tuple[EngineFacts, ...] = ()


# --- outputs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """One comparison a rule made: ``metric op threshold`` with the measured value."""

    cls: str
    metric: str
    value: float
    op: str  # ">=" | "<" | "==" ...
    threshold: str  # name in thresholds.THRESHOLDS
    threshold_value: float
    unit: str
    source: str  # where the threshold comes from
    met: bool
    #: the actors behind the number, in words, where a rule names them: the allowance
    #: ("2.0 runnable threads on 1 allowed CPU (cpuset 0)") and what to change, the other
    #: processes that held the CPUs (PID, command, cores, Strata's own or not)
    detail: str = ""


@dataclass(frozen=True)
class Verdict:
    classes: tuple[str, ...]  # one or two: the ledger's largest cause first, if any
    evidence: tuple[Evidence, ...]
    confidence: float  # 0..1
    inconclusive: bool
    finer_trace: tuple[str, ...]
    missing_signals: tuple[str, ...]
    modifiers: tuple[str, ...] = ()  # e.g. ("throttling",)
    also_flagged: tuple[str, ...] = ()  # classes past threshold beyond the top two
    notes: tuple[str, ...] = ()
    # of the classes past threshold, those past it in the idle baseline too and felt in
    # the case (there before the run: a fact beside the class, never a lower rank); set by
    # the case analysis, which has the baseline (rules/verdict.py, with_background)
    background: tuple[str, ...] = ()
    # the time ledger's parts as shares of the case's metric, named classes first
    # (class-like part name, share 0..1): each class's weight in the time the case is about
    weights: tuple[tuple[str, float], ...] = ()
    # where the case's metric went (issue 30): the first class as the ledger's largest
    # cause with its share ("prefill compute, 98% of TTFT"), and the spare capacity beside
    # it, a modifier ("on 1.35 of 2 allowed cores; spare 0.65 cores"); "" where unmeasured
    lead: str = ""
    spare: str = ""
    spare_cores: float | None = None  # idle allowed CPUs (cores); None: not measured
    # classes past threshold in the idle baseline that this case's ledger does not feel
    # (not past threshold in the case, or a share of its metric under
    # ledger_second_min_share where the run-state grid measures them): said instead
    baseline_unfelt: tuple[str, ...] = ()

    @property
    def past_threshold(self) -> tuple[str, ...]:
        """Every class past threshold, ranked: the named ones, then the rest."""
        return (*self.classes, *self.also_flagged)

    @property
    def appeared_with_load(self) -> tuple[str, ...]:
        return tuple(c for c in self.past_threshold if c not in self.background)

    @property
    def confidence_label(self) -> str:
        return "high" if self.confidence >= 0.75 else "medium" if self.confidence >= 0.5 else "low"

    def summary(self) -> str:
        if self.inconclusive and not self.classes:
            return "inconclusive"
        head = "inconclusive: " if self.inconclusive else ""
        mods = f" (+{', '.join(self.modifiers)})" if self.modifiers else ""
        return f"{head}{' + '.join(self.classes)}{mods}"


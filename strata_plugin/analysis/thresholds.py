"""The one threshold table: every number a verdict depends on, with where it comes from.

The rules (``analysis/rules/``), the rail and link findings (``analysis/rails.py``),
the window fractions (``analysis/timeline.py``), the classifier's inputs
(``analysis/signals.py``) and the load generator's self-check (``load/generator.py``)
read their numbers from here, by name, so a report can print the table it was judged
by and a test can generate its cases from it.

A source is something a user can open: a public document with its section, or
``[inferred]`` (a judgement) with the measurement in this repository that set or
checked it (``docs/validation.md``, with the section). ``[inferred]`` rows that no
measurement here has checked say so.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from strata_plugin import entry_points


@dataclass(frozen=True)
class Threshold:
    name: str
    value: float
    unit: str
    source: str  # where the number comes from; "[inferred]" when it is a judgement


# Public documents, named once (title, then the section each row cites).
DCGM = "NVIDIA DCGM User Guide, Feature Overview > Profiling Metrics"
KEMPNER = (
    "KempnerPulse classification rules "
    "(github.com/KempnerInstitute/kempnerpulse/blob/main/docs/classification.md)"
)
NCU = "Nsight Compute Profiling Guide, Speed Of Light section rules"
NVML_FIELDS = "NVML API Reference, Field Value Enums (NVML_FI_DEV_CLOCKS_EVENT_REASON_*)"
PSI = "Linux kernel docs, accounting/psi.rst"
SCHEDSTAT = "Linux kernel docs, scheduler/sched-stats.rst (/proc/<pid>/schedstat run_delay)"
CGROUP_V2 = "Linux kernel docs, admin-guide/cgroup-v2.rst, CPU Interface Files (cpu.stat)"
CGROUP_V1 = "Linux kernel docs, scheduler/sched-bwc.rst, Statistics (cpu.stat)"
IOSTATS = "Linux kernel docs, admin-guide/iostats.rst, field 10 (io_ticks)"
USE = "Brendan Gregg, The USE Method (brendangregg.com/usemethod.html)"
VAL = "docs/validation.md"

THRESHOLDS: tuple[Threshold, ...] = (
    # GPU level 1: busy or waiting
    Threshold(
        "sm_active_busy",
        0.5,
        "ratio",
        f"{DCGM}, SM Activity: 'a value less than 0.5 likely indicates ineffective GPU "
        "usage'",
    ),
    Threshold(
        "sm_active_high",
        0.8,
        "ratio",
        f"{DCGM}, SM Activity: '0.8 or greater is necessary, but not sufficient, for "
        "effective use of the GPU'",
    ),
    Threshold(
        "gpu_util_busy",
        0.8,
        "ratio",
        "[inferred] NVML API Reference, nvmlUtilization_t.gpu (share of time a kernel "
        "ran): >= 80% counts as busy, the same cut as SM Activity's 0.8; not yet checked "
        "on a GPU in this repository",
    ),
    Threshold(
        "gpu_idle_util_pct",
        10.0,
        "%",
        "[inferred] NVML utilization below 10% counts as a hole in the GPU timeline; "
        "not yet checked on a GPU in this repository",
    ),
    # GPU busy: which kind
    Threshold(
        "sm_active_compute",
        0.6,
        "ratio",
        f"{KEMPNER}, 'tensor-heavy': tensor active >= 0.5 with SM active >= 0.6",
    ),
    Threshold(
        "tensor_active_compute",
        0.5,
        "ratio",
        f"{KEMPNER}, 'tensor-heavy'; {DCGM}, Tensor Activity",
    ),
    Threshold(
        "dram_active_bound",
        0.5,
        "ratio",
        f"{KEMPNER}, memory-bound: DRAM active >= 50%; {DCGM}, Memory BW Utilization: "
        "'in practice a peak of ~0.8 (80%) is the maximum achievable'",
    ),
    Threshold(
        "dram_active_low",
        0.4,
        "ratio",
        f"{NCU}: 'compute throughput and/or memory bandwidth below 60.0% of peak "
        f"typically indicate latency issues'; 0.6 x DCGM's practical DRAM peak of 0.8 "
        "= 0.48, rounded down [inferred]",
    ),
    Threshold(
        "tensor_active_low",
        0.3,
        "ratio",
        f"[inferred] {NCU}, latency-bound ('both compute and memory low'); well under "
        "KempnerPulse's 0.5 tensor-heavy cut",
    ),
    Threshold(
        "occupancy_low",
        0.25,
        "ratio",
        f"[inferred] {DCGM}, SM Occupancy (no number given); not yet checked on a GPU "
        "in this repository",
    ),
    Threshold(
        "comm_sm_max",
        0.5,
        "ratio",
        "[inferred] NCCL kernels occupy few SMs: 'busy' by NVML but SM active under "
        f"{DCGM}'s 0.5; not yet checked on a GPU in this repository",
    ),
    Threshold(
        "comm_tensor_max",
        0.2,
        "ratio",
        "[inferred] collectives use no tensor pipes; not yet checked on a GPU in this "
        "repository",
    ),
    Threshold(
        "rdma_link_frac",
        0.5,
        "of link rate",
        "NVIDIA nccl-tests issue #290: NDR 400 Gb/s gives 46-48 GB/s per NIC; half of "
        "the line rate is sustained collective traffic [inferred]",
    ),
    Threshold(
        "nvlink_bytes_s",
        1e11,
        "B/s",
        "[inferred] 100 GB/s on NVLink 4 (NVIDIA nccl-tests issue #212: 450 GB/s line "
        "rate per direction, ~370 GB/s effective) = heavy intra-node collectives",
    ),
    Threshold(
        "pcie_bytes_s_cap",
        55e9,
        "B/s",
        "PCI Express Base Specification 5.0: 32 GT/s per lane, 128b/130b encoding = "
        "63 GB/s per direction on x16; ~55 GB/s achievable after TLP overhead [inferred]",
    ),
    Threshold(
        "pcie_link_frac",
        0.5,
        "of pcie_bytes_s_cap",
        f"[inferred] half the achievable PCIe rate sustained; {KEMPNER}, I/O rule",
    ),
    Threshold(
        "pcie_active_bytes_s",
        1e9,
        "B/s",
        f"{KEMPNER}, I/O rule: >= 1 GB/s PCIe while SM active < 0.3",
    ),
    Threshold("pcie_sm_max", 0.3, "ratio", f"{KEMPNER}, I/O rule"),
    # throttling (modifier)
    Threshold(
        "throttle_frac",
        0.05,
        "of window",
        f"{NVML_FIELDS}: cumulative ns the clocks were held down, over the window; "
        "> 5% of the window [inferred]",
    ),
    Threshold(
        "sm_clock_ratio_min",
        0.9,
        "of max SM clock",
        "[inferred] SM clock under 90% of its maximum while busy (NVML API Reference, "
        "nvmlDeviceGetClockInfo / nvmlDeviceGetMaxClockInfo)",
    ),
    Threshold(
        "sm_clock_low_frac",
        0.2,
        "of window",
        "[inferred] SM clock under 0.9 x max for over a fifth of a busy window",
    ),
    # imbalance across GPUs / rails
    Threshold(
        "imbalance_cv",
        0.15,
        "CV",
        "[inferred] ranks of one tensor-parallel group do the same work; a CV over "
        "0.15 is more than run-to-run noise. Not yet checked on GPUs in this repository",
    ),
    Threshold(
        "imbalance_max_min",
        1.2,
        "ratio",
        "[inferred] busiest over idlest rank or rail > 1.2; not yet checked on GPUs in "
        "this repository",
    ),
    Threshold(
        "straggler_rel_dev",
        0.15,
        "of the peers' median",
        "[inferred] same cut as imbalance_cv",
    ),
    Threshold(
        "rail_active_bytes_s",
        1e6,
        "B/s",
        "[inferred] a rail under 1 MB/s carries control traffic only; it is left out of "
        "the imbalance ratio",
    ),
    # RDMA rails: errors and congestion (network)
    Threshold(
        "rail_error_events",
        1.0,
        "count",
        "InfiniBand Architecture Specification Vol. 1, PortCounters attribute: symbol, "
        "link and receive errors, discards stay at 0 on a healthy link; any increase in "
        "a window is news (Linux kernel docs, ABI/stable/sysfs-class-infiniband)",
    ),
    Threshold(
        "rail_congestion_per_s",
        100.0,
        "events/s",
        "[inferred] CNPs / ECN marks / transmit-wait ticks above 100/s mean the fabric "
        "is pushing back (DCQCN, Zhu et al., SIGCOMM 2015: CNPs throttle the sender)",
    ),
    Threshold(
        "socket_fallback_bytes_s",
        10e6,
        "B/s",
        "[inferred] HTTP, ssh, Prometheus and NCCL bootstrap stay well under 10 MB/s; "
        "collective traffic over TCP is hundreds of MB/s",
    ),
    # host CPU
    Threshold(
        "thread_core_saturated",
        0.9,
        "cores",
        "[inferred] one engine thread >= 0.9 of a core is a serial bottleneck "
        f"(proc(5), /proc/<pid>/task/<tid>/stat utime+stime); {USE}, CPU utilization",
    ),
    Threshold(
        "runq_delay_per_cpu_s",
        0.1,
        "s waiting / s running",
        f"{SCHEDSTAT}: > 0.1 of run time spent runnable but not running [inferred 10%]; "
        "normalized by CPU time because the agent sums threads. "
        f"{VAL}, Fault injection: CPU-hog arms 1.29-1.68",
    ),
    Threshold(
        "psi_some_frac",
        0.10,
        "of window",
        f"{PSI}: 'some' share of the window > 10% [inferred 10%]",
    ),
    Threshold(
        "cores_busy_frac",
        0.9,
        "of cores",
        f"[inferred] {USE}: 90% of all cores busy = CPU saturated",
    ),
    Threshold(
        "server_cores_of_threads",
        0.85,
        "of min(threads, allowed CPUs)",
        "[inferred] the server uses what its threads can use: it is CPU-bound. "
        f"{VAL}, Confusion matrix: clean llama.cpp decode arms are cpu_compute",
    ),
    Threshold(
        "cpu_compute_server_share",
        0.5,
        "of the host's busy cores",
        "[inferred] a saturated host is the server's doing only when the server holds "
        "at least half of its busy cores; below that, other processes fill it "
        "(cpu_contention's domain)",
    ),
    Threshold(
        "other_cpu_frac",
        0.25,
        "of cores",
        "[inferred] other processes hold a quarter of the cores while the server runs (of "
        "the CPUs its allowance gives it, where observed: a busy process on its only CPU). "
        f"{VAL}, Fault injection: CPU-hog arms 0.56-0.60",
    ),
    Threshold(
        "involuntary_ctx_per_cpu_s",
        50.0,
        "1/cpu-s",
        "[inferred] a busy thread on a free core is rarely preempted; fully contended at "
        "4 ms CFS slices it is ~250/s. "
        f"{VAL}, Fault injection: CPU-hog arms 607-752",
    ),
    Threshold("steal_frac", 0.05, "of CPU time", "[inferred] hypervisor steal above 5%"),
    Threshold(
        "cgroup_throttled_frac",
        0.05,
        "of CFS periods",
        f"{CGROUP_V1} and {CGROUP_V2}: nr_throttled / nr_periods of the server's own "
        "cgroup; throttled in over 5% of its enforcement periods [inferred 5%] "
        "(cpu_limited). Set before any run here; checked on held-out runs "
        f"({VAL}, Fault injection > Scorecard): quota arms 0.50-0.99, clean arms 0 "
        "(no quota)",
    ),
    Threshold(
        "cgroup_quota_used",
        0.8,
        "of the CFS quota",
        f"{CGROUP_V1}, Statistics and 'Examples' (quota / period = the cores a group may "
        "use): the server's CPU over its cgroup's quota; a group throttled in most "
        "periods uses nearly all of it. Corroboration of cpu_limited (raises its score, "
        "never fires it alone: a bursty group is throttled at a low average use) "
        "[inferred 80%]",
    ),
    Threshold(
        "runnable_excess_threads",
        0.5,
        "threads",
        f"[inferred] {SCHEDSTAT}: the server's threads wanting a CPU (run time, run-queue "
        "wait and CFS throttled time per second, the runstate grid) past the CPUs its "
        "allowance gives it (affinity within the cpuset, at most the CFS quota) by half "
        "a thread: half a thread queued for its own CPUs all the time (cpu_limited). "
        "tests/test_allowance_faults.py: two and three spinning threads on one CPU read "
        "1.8-2.0 runnable (excess 0.8-1.0); a server whose threads fit its CPUs cannot "
        "exceed them by run-queue wait on other processes alone",
    ),
    Threshold(
        "cpu_samples_disagree_factor",
        1.1,
        "x host busy cores",
        "[inferred] the server's CPU (proc) may exceed the node's busy CPU (cpu) only "
        "by sampling skew: 10% plus cpu_samples_disagree_slack_cores; past that the "
        "two collectors contradict each other",
    ),
    Threshold(
        "cpu_samples_disagree_slack_cores",
        0.5,
        "cores",
        "[inferred] half a core of skew between proc and cpu samples read at different "
        "instants of the same tick",
    ),
    # I/O and page faults
    Threshold(
        "major_faults_per_s",
        20.0,
        "1/s",
        "[inferred] sustained major faults while serving mean weights read back from "
        f"storage (proc(5), majflt). {VAL}, Fault injection: 0 of 30 clean arms "
        "crossed it; page-out arms showed 3-5/s (readahead), so read_bytes_s fires there",
    ),
    Threshold(
        "read_bytes_s",
        4e6,
        "B/s",
        "[inferred] a warm server reads almost nothing from storage (proc(5), "
        f"/proc/<pid>/io read_bytes). {VAL}, Fault injection: page-out arms 92-103 "
        "MB/s; 0 of 30 clean arms crossed it",
    ),
    Threshold(
        "disk_busy_frac",
        0.5,
        "of window",
        f"{IOSTATS}: device busy > 50% of the window [inferred 50%]",
    ),
    Threshold("iowait_frac", 0.10, "of CPU time", "[inferred] CPU iowait above 10%"),
    # memory
    Threshold(
        "mem_available_frac_min",
        0.10,
        "of MemTotal (or of the server cgroup's limit)",
        "[inferred] Linux kernel docs, filesystems/proc.rst, meminfo MemAvailable (page "
        f"cache is not free memory). {VAL}, Fault injection: memory-hog arms 0.074",
    ),
    Threshold(
        "cgroup_mem_events",
        1.0,
        "count",
        "Linux kernel docs, admin-guide/cgroup-v2.rst, Memory Interface Files "
        "(memory.events 'max': usage was about to go over memory.max, so the group "
        "reclaimed; 'oom_kill': a process of the group was killed) and "
        "admin-guide/cgroup-v1/memory.rst (memory.failcnt: usage hit the limit; "
        "memory.oom_control oom_kill): any in a window means the server's own memory "
        "limit was reclaiming or killing, however much the host had free [inferred: "
        "one event]. A limit filled by clean page cache also counts (cheap reclaim); "
        "not yet checked against a measured slowdown in this repository",
    ),
    # network
    Threshold(
        "net_link_frac",
        0.7,
        "of link speed",
        f"[inferred] {USE}, network utilization; TCP goodput tops out near 90-95% of "
        f"line rate. {VAL}, Network, two-node lab: capped runs 0.71-0.72",
    ),
    Threshold(
        "net_wire_busy",
        1.0,
        "(tx + rx) / capacity",
        "[inferred] request/response traffic (llama.cpp RPC, pipeline hops) alternates "
        "directions, so neither fills its half of the link that limits it; both together "
        "carrying a full direction's capacity means the wire was busy whenever one side "
        f"waited. Set and checked on the same run ({VAL}, Network, two-node lab: 8 "
        "Mbit/s cap, both directions 1.15-1.37): no held-out data yet",
    ),
    Threshold(
        "net_drop_events",
        1.0,
        "count",
        "[inferred] drops or errors on the interface that carries the traffic (reported "
        "as a rails finding; not a classifier input)",
    ),
    # serving
    Threshold(
        "waiting_requests_mean",
        0.5,
        "requests",
        f"{USE}, saturation: the engine's waiting queue (vLLM docs, Metrics: "
        "vllm:num_requests_waiting) averages at least half a request [inferred 0.5]",
    ),
    Threshold(
        "server_queue_frac",
        0.5,
        "of TTFT",
        "[inferred] the server's queue held the median request over half its TTFT: the time "
        "ledger's queue part (the engine's queue clock, or its waiting count by Little's law; "
        "where neither exists, TTFT outside prefill). "
        f"{VAL}, Fault injection: queueing arms 0.85-0.89",
    ),
    Threshold(
        "outside_server_frac",
        0.1,
        "of TTFT",
        "[inferred] the median request spent a tenth of its TTFT on the way to the server "
        "(the time ledger's before_server: the case's least time before prefill, which a "
        "path or proxy adds to every request alike): network, a proxy, TLS. Set from the "
        "clean side: the embedded target's clean decode cases read 0.000-0.031 (12 cases, "
        "four runs on a loaded 2-core host); a tenth is three times the highest. "
        f"{VAL}, Time ledger",
    ),
    Threshold(
        "outside_server_min_ms",
        20.0,
        "ms",
        "[inferred] the median request spent at least 20 ms before the server: under it its "
        "own HTTP front end (parsing, tokenizing, taking a slot) reads as much as a path. Set "
        "from the clean side: llama-server on a direct loopback connection, in two full runs "
        "of the suite on the 2-core host, read at most 6.1 ms at load average 1-2 (5 cases at "
        "0.10-0.17 of a 16-35 ms TTFT) and 12.2 ms at load average 5-7 (31 cases); 20 ms is "
        "over both, three times the quiet one, and the least a relay of 10 ms each way adds. "
        f"{VAL}, Time ledger",
    ),
    Threshold(
        "server_stalled_frac",
        0.1,
        "of the case's metric",
        "[inferred] a tenth of the time the case is about (TTFT, TPOT/ITL or end-to-end) "
        "with the server neither running nor able to run (frozen, stopped, no progress): "
        "the same tenth as prefill_stall_frac. "
        f"{VAL}, Time ledger: 0 in 15 clean cases, 0.33-0.34 with the freezer at a third",
    ),
    Threshold(
        "server_stalled_window_lead",
        0.2,
        "of the case's window, requests in flight",
        "[inferred] the server stalled (frozen, stopped, no progress) for a fifth of the "
        "window while requests were in flight is the case's story, first, whatever share "
        "of the metric it shows in: a stall is time the server did nothing, so a "
        "headline that leaves it out (TPOT without TTFT, a median) hides it, and compute "
        "is the largest cause of any healthy case. Set on the project's fault arms: the "
        "freezer at 200 of every 600 ms read 0.255 of the window as stalled with 0.020 of "
        "TPOT/ITL (ledger/freezer_third, the freezes fell in TTFT), the freezer and "
        "SIGSTOP set-aside arms 0.26-0.34, clean arms 0 (15 cases); a fifth is four "
        "fifths of the lowest fault arm. "
        f"{VAL}, Time ledger; Fault injection",
    ),
    Threshold(
        "ledger_residual_max",
        0.1,
        "of the case's metric",
        "[inferred] the time ledger closes when what no clock or server state explains is "
        "under a tenth of the case's metric (issue 23's example bound). "
        f"{VAL}, Time ledger: 0.0% in 15 of 15 clean decode cases on the embedded target",
    ),
    Threshold(
        "ledger_stall_factor",
        3.0,
        "x the request's pace",
        "[inferred] a gap between token events is a decode stall past 3x the request's own "
        "median time per token: the yardstick analysis/interference.py uses for stalls",
    ),
    Threshold(
        "ledger_clock_error_ms",
        1.0,
        "ms",
        "[inferred] the least clock error the ledger states per request where the client's "
        "self-check gave no loop lag: llama.cpp reports its timings in ms with microsecond "
        "digits, and two monotonic stamps on one host agree to microseconds",
    ),
    Threshold(
        "delivery_gap_min_ms",
        5.0,
        "ms",
        "[inferred] a gap's excess over the server's own production of the same tokens is "
        "delivery only past 5 ms (or the client's loop-lag p99, if larger): under it, the "
        "client's and the server's send jitter. Set on the fault suite's tuning set "
        "(buffer_100ms, clean arm, llama-server on a host with 0.74 of its cores held by "
        "other processes): its 1,128 gaps' excess read p50 -0.07 ms, p99 22 ms; at this "
        "floor the clean arms read 0.9-1.7% of TPOT/ITL as delivery. "
        f"{VAL}, Delivery",
    ),
    Threshold(
        "delivery_frac",
        0.1,
        "of the case's metric",
        "[inferred] a tenth of the case's metric in tokens the server made and the path "
        "held (the same tenth as outside_server_frac and server_stalled_frac). Set on the "
        "fault suite's tuning set (a relay buffering the response, flushed every 100 ms): "
        "its clean arm read 0.017, the buffered arm 0.205 while the server itself stalled "
        "for two thirds of the decode on a crowded host; a tenth is six times the clean "
        "and half the buffered. Judged apart on a 40 ms flush with 20 ms each way and on "
        f"the live 60 ms flush (tests/test_delivery_live.py). {VAL}, Delivery",
    ),
    Threshold(
        "delivery_burst_events",
        3.0,
        "token events in one read",
        "[inferred] without the server's token clock, a read carrying 3 token events or "
        "more after a gap is a clump (two in one read happen whenever two events share a "
        "TCP segment). Not set on a fault: the recorded smoke run's direct-connection "
        "decode cases (tests/golden/report_smoke.md) read 0.5-3% of TPOT/ITL as delivery "
        "from clumping with it, none past delivery_frac",
    ),
    Threshold(
        "delivery_running_frac",
        0.5,
        "of the gap",
        "[inferred] a clump is the path's only where the server's run state shows it "
        "running over half of the gap the samples cover (making the tokens it held): a "
        "server frozen, waiting for a CPU or asleep made the gap itself. Not set on a "
        "fault: the same check as delivery_burst_events",
    ),
    Threshold(
        "delivery_server_held_frac",
        0.8,
        "of the gap",
        "[inferred] a token the server stamped (its token clock) and the client read late "
        "is the server's own, not the path's, where the server's threads were held from a "
        "CPU (run queue, CFS quota, frozen or stopped) for this share of the gap the "
        "run-state samples cover: its HTTP thread sends after the engine's loop stamps, "
        "and a held sender holds the token. Set on one whole fault-suite run (the CFS "
        "quota arm, 0.5 CPU for 3.7 runnable threads: its delivery gaps were held 0.85-1.0 "
        "and read 15% of TPOT/ITL as delivery; the buffering and relay arms' delivery "
        "gaps were held under 0.55, a few ms of one arm at 0.65-0.85). "
        f"{VAL}, Delivery",
    ),
    Threshold(
        "kv_usage_high",
        0.95,
        "ratio",
        "[inferred] vLLM docs, Metrics: vllm:kv_cache_usage_perc (1 = full); past 0.95 "
        "the next request can preempt",
    ),
    Threshold(
        "preemptions_max",
        0.0,
        "count",
        "vLLM docs, Optimization and Tuning > Preemption: a request is preempted when "
        "the KV cache has no room; any preemption in the window "
        "(vllm:num_preemptions_total, sglang:num_retracted_requests_total) is news",
    ),
    Threshold(
        "chunk_gap_p99_p50",
        3.0,
        "ratio",
        "[inferred] chunk gap p99 over the decode pace (TPOT p50) > 3 with prompts "
        "arriving mid-decode (Sarathi-Serve, Agrawal et al., OSDI 2024, Figure 1: "
        "generation stalls while a new prompt's prefill runs)",
    ),
    Threshold(
        "chunk_gaps_min",
        20.0,
        "gaps",
        "[inferred] with fewer gaps the p99 is the largest gap, so one scheduling "
        "hiccup would make the ratio",
    ),
    Threshold(
        "inflight_frac_min",
        0.8,
        "of window",
        "[inferred] the server had no request in flight for over a fifth of the window",
    ),
    Threshold(
        "client_bound",
        1.0,
        "bool",
        "the load generator's own self-check (client_* rows below)",
    ),
    # the load generator's self-check (load/generator.py)
    Threshold(
        "client_lateness_p99_ms",
        5.0,
        "ms",
        "[inferred] 5 ms of dispatch lateness is a fraction of any TTFT worth measuring "
        "on a GPU server",
    ),
    Threshold(
        "client_handling_lag_p99_ms",
        5.0,
        "ms",
        "[inferred] same cut as client_lateness_p99_ms, for reading each stream event",
    ),
    Threshold(
        "client_cpu_cores",
        0.85,
        "cores",
        "[inferred] a Python client at 0.85 of a core has no headroom left (one "
        "interpreter lock)",
    ),
    Threshold(
        "client_delay_share",
        0.05,
        "of the requests' time",
        "[inferred] the client's delays count only as a real part of the requests' "
        f"lives. {VAL}, What changed in the attribution, item 4: starved client "
        "0.085-0.23, every other arm 0.001-0.011",
    ),
    # how the verdict is put together
    Threshold(
        "full_margin",
        0.25,
        "relative",
        "[inferred] a value this far past its threshold (relative) scores 1; scores "
        "rank classes and set confidence",
    ),
    Threshold(
        "dominance_margin",
        0.5,
        "score",
        "[inferred] a class leads a conflicting one when it is well past its threshold "
        "and the other barely past (scores 0..1: 0 at the threshold, 1 at full_margin)",
    ),
    Threshold(
        "missing_penalty",
        0.85,
        "factor",
        "[inferred] confidence multiplier per unmeasured collector a rule needed",
    ),
    # --- the verdict's confidence, and its first class from the time ledger (issue 30:
    # verdict.py reads these; before, they were literals in its code)
    Threshold(
        "confidence_at_threshold",
        0.5,
        "confidence",
        "[inferred] a class just past its threshold (score 0), or a ledger cause that only "
        "just leads the next, is as likely named right as not",
    ),
    Threshold(
        "confidence_span",
        0.4,
        "confidence",
        "[inferred] what a full score (rules: full_margin past; the ledger: the first cause "
        "twice the next) adds to confidence_at_threshold; 0.9 at most before agreement",
    ),
    Threshold(
        "confidence_agreement",
        0.1,
        "confidence",
        "[inferred] added when two measurements agree (two met rows of a rule; the ledger's "
        "first cause and its resource rule past threshold)",
    ),
    Threshold(
        "confidence_conflict_max",
        0.4,
        "confidence",
        "[inferred] the most a verdict of two classes the counters cannot tell apart (or "
        "whose signals contradict each other, or that no clock explains) may claim: under "
        "'medium' (0.5), so it reads as low",
    ),
    Threshold(
        "confidence_disagreeing_samples",
        0.2,
        "confidence",
        "[inferred] proc and cpu samples that contradict each other (the server used more "
        "CPU than the node): the classes are named, and barely trusted",
    ),
    Threshold(
        "confidence_floor",
        0.1,
        "confidence",
        "[inferred] a verdict that names a class past threshold never reads 0, however "
        "many collectors were missing",
    ),
    Threshold(
        "ledger_cause_lead",
        1.0,
        "x the next cause's share",
        "[inferred] the first class is the largest cause of the case's metric in the time "
        "ledger (each millisecond to one cause, as top-down analysis gives each pipeline "
        "slot one: Ahmad Yasin, 'A Top-Down Method for Performance Analysis and Counters "
        "Architecture', ISPASS 2014): at least the next cause's share",
    ),
    Threshold(
        "ledger_second_min_share",
        0.1,
        "of the case's metric",
        "[inferred] a class the run-state grid measures in the ledger (compute, waiting, "
        "I/O, stopped) is named beside the first only where the ledger gives it this much "
        "of the metric, the bound under which its residual counts as closed "
        "(ledger_residual_max); past threshold with less, it is 'also past threshold'",
    ),
    Threshold(
        "rule_min_samples",
        3.0,
        "samples",
        "[inferred] a collector's mean over a window rests on at least three samples (two "
        "intervals of a counter); fewer, and the rule reading it is said to rest on too "
        "few (issue 30: a 0.43 s window held one sample of the 0.5 s collectors)",
    ),
    # --- prefill-decode interference from the token stream (analysis/interference.py) ---
    Threshold(
        "prefill_stall_frac",
        0.1,
        "of decode time",
        "[inferred] decode requests lost a tenth of their decode time to stalls (gaps past "
        "3x the median time per token) while a prefill was in flight",
    ),
    Threshold(
        "prefill_stall_share",
        0.5,
        "of stall time",
        "[inferred] most stall time coincided with a prefill in flight: a stall with no "
        "prefill in flight is not interference",
    ),
    Threshold(
        "ab_prefill_stall_ratio",
        2.0,
        "ratio",
        "[inferred] an A/B treatment's stall time with a prefill in flight, per decode "
        "request, at least twice its control's",
    ),
    Threshold(
        "ab_tail_pace_rise",
        0.2,
        "ratio",
        "[inferred] the treatment's TPOT p95 over its control's (geometric mean of the "
        "control's repetitions), minus 1: the stalls reach the tail pace",
    ),
    Threshold(
        "injected_pace_factor",
        1.0,
        "ratio",
        "[inferred] in the treatment's own window, decode's time per token while the "
        "injected prefill was in flight at least twice its time per token outside it "
        "(interference factor >= 1): the same window, so the host's load between "
        "repetitions does not enter",
    ),
    Threshold(
        "client_timing_error_ms",
        5.0,
        "ms",
        "[inferred] the client's promised stamping error: its own loop lag p99 above this "
        "flags the run client-bound (docs/client.md, the capacity benchmark's figures)",
    ),
    Threshold(
        "client_read_backlog_bytes",
        65536.0,
        "bytes",
        "[inferred] more than one read's worth (64 KiB) already waiting in the socket at "
        "p99 of reads: the loop is reading late (docs/client.md)",
    ),
    # --- failures first (analysis/failures.py) ---
    Threshold(
        "requests_failed_share",
        0.5,
        "of the case's requests",
        "[inferred] when half or more of a case's requests failed, the server never had "
        "the load the case asked for: its window shows the error replies, not a resource "
        "limit, so the verdict is requests_failed and no resource rule is consulted "
        "(tests/test_failures_first.py: 1 of 2 failed is requests_failed, 1 of 3 is not)",
    ),
    Threshold(
        "engine_outage_margin_s",
        0.5,
        "s",
        "[inferred] a failed request is tied to an engine's death when it ended between "
        "the death and the new engine's first answer, widened by this much on each side: "
        "the engine watch sees a death up to one poll (run/engine_lifetime.POLL_S, 0.2 s) "
        "after it, and a request cut by the death ends at it; 0.5 s is that poll with "
        "room for a loaded host's late timer (tests/test_engine_lifetime.py: a failure "
        "just inside the margin is tied, one just outside is not)",
    ),
    Threshold(
        "engine_conn_match_s",
        0.05,
        "s",
        "[inferred] a request was served by the engine whose connection (agent/collectors/"
        "conns.py) opened within this much of the request's dispatch and closed within "
        "this much of its end, and by no other engine's. The connections are read on a "
        "20 ms grid and the span each opened and closed in is measured (the steps before "
        "and after), so this is the rest: a loopback router relays in well under 1 ms, "
        "and a loaded host delays the client's own stamps; wider makes two engines' "
        "requests that start and end together ambiguous sooner "
        "(tests/test_router_replicas.py: a connection just "
        "inside the margin at either end is matched, one just outside is not)",
    ),
    Threshold(
        "engine_pace_ratio",
        2.0,
        "x",
        "[inferred] an engine behind a router is named slower than the others when the "
        "median TPOT of the requests it served is over this many times the fastest "
        "engine's (analysis/engine_requests.py). Tuned on this 2-core host (load average "
        "2-3) with two llama-server replicas (tiny model, -t 1) behind testing/router.py, "
        "8 requests at concurrency 2, one replica under a CFS quota of its own: 0.25 core "
        "3.26-4.61x in 5 of 5 runs (named), 0.5 core 1.77, 1.90 and 2.06x (at the "
        "boundary), no quota 1.03x (the one clean run of 9 with 3 requests on each "
        "engine: equal replicas at concurrency 2 start and end their requests together, "
        "which leaves most of them not attributed); 1.0 core gave no run with 3 on each",
    ),
    Threshold(
        "engine_pace_min_requests",
        3,
        "requests",
        "[inferred] the least number of requests with a TPOT an engine served for its "
        "median to be compared with the others' (engine_pace_ratio): in the clean runs "
        "of engine_pace_ratio's tuning set, engines with 1 or 2 requests differed by "
        "2.5-2.7x (and 8.3x once, with the sampler starved), the one with 3 or more on "
        "each by 1.03x",
    ),
    # --- the roofline (analysis/roofline.py): evidence and a note, never a class ---
    Threshold(
        "roof_near_frac",
        0.8,
        "of the roof",
        f"{NCU}, High Throughput: 'utilizing greater than 80.0% of the available compute or "
        "memory performance of the device': a phase at this share of its roof is bound by "
        "that roof whatever the utilization counters say",
    ),
    Threshold(
        "roof_far_frac",
        0.6,
        "of the roof",
        f"{NCU}: 'compute throughput and/or memory bandwidth below 60.0% of peak "
        "typically indicate latency issues': under both roofs with a busy device, the time "
        "goes to scheduling or launches, not to the hardware's limit",
    ),
    # --- finer traces (analysis/traces/settle.py) ---
    Threshold(
        "trace_other_share",
        0.5,
        "of the server's runnable wait",
        "[inferred] other processes held the server's CPUs for at least half of the time "
        "its threads were runnable but waiting: the wait is theirs, not the server's own",
    ),
    Threshold(
        "trace_rtt_p50_ms",
        5.0,
        "ms",
        "[inferred] a loopback or same-rack TCP path has a smoothed RTT well under 1 ms; "
        "a median of 5 ms on the benchmark's connections is queueing or a distant peer",
    ),
    # --- A/B expectations (analysis/expectations.py) ---
    Threshold(
        "ab_max_repetitions",
        6,
        "repetitions per arm",
        "[inferred] an expected A/B effect whose interval still holds zero at the case's own "
        "repetitions gets more, one per arm at a time, up to this many per arm, then is "
        "reported 'not established': the mixed case's TPOT p95 rise, +203% .. +358% at 3/3 "
        "on a quiet 2-core host, had an interval of -75% .. +19578% at 3/3 under other "
        "jobs' load (issue 32); 6 per arm doubles the case at most (the vLLM smoke's mixed "
        "case, 6 runs of a few seconds each)",
    ),
    Threshold(
        "trace_retrans_per_s",
        1.0,
        "segments/s",
        "[inferred] a healthy path retransmits rarely; a segment a second over a window "
        "is loss the client and server both wait out",
    ),
)
_BY_NAME = {t.name: t for t in THRESHOLDS}


def plugin_thresholds() -> dict[str, Threshold]:
    """The rows the rule plugins declare (``RulePlugin.thresholds``, the ``strata.rules``
    entry points), by name: each a Threshold with its source and a name of its own."""
    return _checked(entry_points.load(entry_points.RULES))


@functools.cache
def _checked(plugins: tuple[entry_points.Plugin, ...]) -> dict[str, Threshold]:
    out: dict[str, Threshold] = {}
    for p in plugins:
        for t in getattr(p.obj, "thresholds", ()):
            if not isinstance(t, Threshold):
                raise p.error(f"its thresholds are Threshold rows, not {type(t).__name__}")
            if not t.source.strip():
                raise p.error(f"threshold {t.name!r} has no source: say where the number "
                              "comes from (a public document and its section, or "
                              "[inferred] and the measurement that set it)")
            if t.name in _BY_NAME or t.name in out:
                raise p.error(f"threshold {t.name!r} is already "
                              f"{'Strata' if t.name in _BY_NAME else 'another plugin'}'s")
            out[t.name] = t
    return out


def all_thresholds() -> tuple[Threshold, ...]:
    """Every row a verdict may cite: the table's, then the rule plugins'."""
    return (*THRESHOLDS, *plugin_thresholds().values())


def threshold(name: str) -> Threshold:
    """The row called ``name``, the table's or a rule plugin's (KeyError names it when
    there is none)."""
    t = _BY_NAME.get(name)
    return t if t is not None else plugin_thresholds()[name]


def value(name: str) -> float:
    return threshold(name).value

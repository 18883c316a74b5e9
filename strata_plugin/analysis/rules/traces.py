"""The finer traces a verdict names: what settles what the counters cannot."""

from __future__ import annotations

TRACE_CUDA = (
    "CUDA timeline of copies and kernels: nsys profile --trace=cuda,nvtx,osrt "
    "(H2D/D2H memcpy, kernels, launch gaps, event waits)"
)
TRACE_GPM = "SM / DRAM / tensor activity: NVML GPM or dcgmi dmon -e 1002,1003,1004,1005 -d 100"
TRACE_NCCL = (
    "per-rank NCCL timeline: nsys --trace=cuda,nvtx (NCCL NVTX ranges) on every node, "
    "aligned by the measured clock offsets"
)
TRACE_SCHED = (
    "per-thread scheduling trace: perf sched record / bpftrace runqlat + offcputime "
    "(on-CPU vs runnable vs blocked, per thread)"
)
TRACE_BLOCK = (
    "per-file block I/O trace: biosnoop / blktrace with filetop, and fault addresses "
    "(perf trace -F maj)"
)
TRACE_MEM = "memory reclaim trace: perf trace -e 'vmscan:*' or bpftrace on direct reclaim"
TRACE_NET = (
    "per-connection network trace: ss -ti (RTT, retransmits) and ethtool -S during the window"
)
TRACE_SERVER = "server scheduler metrics: the engine's /metrics (waiting/running, KV usage)"
TRACE_CLOCK = (
    "clock alignment check: re-measure node offsets and compare request markers with "
    "the server log timestamps"
)
TRACE_LEDGER = (
    "per-request time ledger with the server's run state: the agent's runstate collector "
    "(schedstat run/wait, thread states, freezer) and a per-thread scheduling trace (perf "
    "sched record / bpftrace offcputime) over the gaps no clock explains"
)
TRACE_RUNSTATE = (
    "the server's run state: the agent's runstate collector (schedstat run/wait, thread "
    "states, cgroup freezer and throttling) over the case window"
)

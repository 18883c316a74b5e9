"""The host rules, with or without a GPU: CPU compute, contention and quota, I/O and
page faults, memory pressure, the network, and a server starved of requests."""

from __future__ import annotations

import re

from strata_plugin.analysis.rules.outcome import Outcome, RuleCheck, margin, signal_margin
from strata_plugin.analysis.rules.traces import (
    TRACE_BLOCK,
    TRACE_MEM,
    TRACE_NET,
    TRACE_RUNSTATE,
    TRACE_SCHED,
)
from strata_plugin.analysis.rules.window import WindowSignals
from strata_plugin.analysis.thresholds import value as _v


def rule_input_starved(s: WindowSignals) -> Outcome:
    """The server sat idle for lack of requests (GPU or CPU alike)."""
    r = RuleCheck("input_starved", s)
    if not r.need("inflight_frac"):
        return r.unassessable("request windows (requests.jsonl)")
    if r.cmp("inflight_frac", "<", "inflight_frac_min"):
        return r.fire(signal_margin(s, "inflight_frac", "inflight_frac_min", "<"))
    return r.o




def _cpu_word(n: float) -> str:
    return f"{n:g} CPU" + ("" if n == 1 else "s")


def _allowance_words(s: WindowSignals) -> str:
    """The CPUs the server may use, in words: "2 allowed CPUs (affinity 0-1)", or the
    host's cores where the allowance was not observed; then the weights that decide its
    share of them when contended, where observed: "; weight cpu.shares 256 (/batch),
    nice 0"."""
    weight = _weight_words(s.server_cpu_weight, s.server_nice)
    weight = f"; weight {weight}" if weight else ""
    if s.server_allowed_cpus is None:
        return (f"{_cpu_word(float(s.n_cores or 0))} of the host (allowance not observed)"
                f"{weight}")
    by = re.sub(r" \(\d[^()]*\)$", "", s.server_allowance_by)  # its count is said already
    n = s.server_allowed_cpus
    return f"{n:g} allowed CPU{'' if n == 1 else 's'}" + (f" ({by})" if by else "") + weight


def _nice_words(lo: float, hi: float) -> str:
    return f"nice {lo:g}" if lo == hi else f"nice {lo:g} to {hi:g}"


def _weight_words(weight: tuple[str, float, str] | None,
                  nice: tuple[float, float] | None) -> str:
    """A cgroup weight and nice values in words: "cpu.shares 256 (/batch), nice 0"."""
    out = []
    if weight is not None:
        out.append(f"{weight[0]} {weight[1]:g} ({weight[2]})")
    if nice is not None:
        out.append(_nice_words(*nice))
    return ", ".join(out)


def _competitor_weight(s: WindowSignals, pid: int) -> str:
    """A named other process's weights where they differ from the server's (its group's
    weight, its nice value): what gave it more or less of the contended CPUs."""
    row = next((w for w in s.other_weights if w[0] == pid), None)
    if row is None:
        return ""
    _pid, nice, weight = row
    out = []
    if weight is not None and s.server_cpu_weight is not None and (
            tuple(weight) != tuple(s.server_cpu_weight)):
        out.append(f"{weight[0]} {weight[1]:g} ({weight[2]}) against the server's "
                   f"{s.server_cpu_weight[1]:g} ({s.server_cpu_weight[2]})")
    if nice is not None and s.server_nice is not None and not (
            s.server_nice[0] == nice == s.server_nice[1]):
        out.append(f"nice {nice:g} against the server's "
                   f"{_nice_words(*s.server_nice)[len('nice '):]}")
    return "; ".join(out)


def rule_cpu_compute(s: WindowSignals) -> Outcome:
    """The server's own threads use the CPUs they may use (CPU-only servers): the fewer of
    their threads and their allowance (affinity, cpuset, CFS quota), where observed; the
    host's cores where not."""
    r = RuleCheck("cpu_compute", s)
    if not r.need("server_cpu_cores", "n_cores"):
        return r.unassessable(TRACE_SCHED)
    assert s.server_cpu_cores is not None and s.n_cores is not None  # need() checked them
    cpus = s.server_allowed_cpus if s.server_allowed_cpus else float(s.n_cores)
    usable = float(min(s.server_threads, cpus) if s.server_threads else cpus)
    # the allowance in words where it was observed (the host's cores go without saying)
    words = (f"{s.server_cpu_cores:.2f} cores on {_allowance_words(s)}"
             if s.server_allowed_cpus is not None else "")
    if r.cmp("server_cpu_cores", ">=", "server_cores_of_threads", scale=usable, detail=words):
        return r.fire(signal_margin(s, "server_cpu_cores", "server_cores_of_threads", scale=usable))
    if (
        s.host_busy_cores is not None
        and r.cmp("host_busy_cores", ">=", "cores_busy_frac", scale=float(s.n_cores))
        and r.cmp(
            "server_cpu_cores",
            ">=",
            "cpu_compute_server_share",
            value=s.server_cpu_cores / max(s.host_busy_cores, 1e-9),
            label="server_share_of_busy_cores",
        )
    ):
        return r.fire(signal_margin(s, "host_busy_cores", "cores_busy_frac",
                                    scale=float(s.n_cores)))
    return r.o


#: What to change for each kind of allowance (rule_cpu_limited's evidence).
_WIDEN = {
    "cpuset": "a wider cpuset (cpuset.cpus; a pod's CPU set)",
    "affinity": "a wider affinity mask (taskset -a -p)",
    "CFS quota": "a higher CFS quota (cpu.max or cpu.cfs_quota_us; a pod's CPU limit)",
}


def _limited_words(runnable: float, allowed: float, by: str, where: str) -> str:
    """The allowance the server's threads exceed, and what to change (threads, CPUs,
    quota)."""
    how = next((v for k, v in _WIDEN.items() if by.startswith(k)), "more CPUs")
    threads = max(1, int(allowed))
    return (f"{runnable:.1f} runnable threads on {where}: give the server {how}, or run "
            f"it with at most {threads} compute thread{'' if threads == 1 else 's'} "
            "(llama.cpp -t, OMP_NUM_THREADS)")


def rule_cpu_limited(s: WindowSignals) -> Outcome:
    """The server's own allowance keeps its threads from the CPU, however idle the host:
    more of its threads want a CPU (running, queued, throttled: the runstate grid) than
    its affinity, cpuset or CFS quota gives it (a pod whose CPU set is smaller than the
    engine's threads, a taskset pin), or its cgroup's quota throttled it in its
    enforcement periods (a container, a pod, a systemd slice). Where the server is
    several engines, each engine's own cgroup is compared, one row each. Other processes
    taking the cores are ``cpu_contention``'s, not this."""
    r = RuleCheck("cpu_limited", s)
    over = s.server_runnable_cores is not None and s.server_allowed_cpus is not None
    own = [e for e in s.engines if e.throttled_frac is not None]
    if s.cgroup_throttled_frac is None and not over and not own:
        # the quota's throttling, and the allowance where the threads' demand was measured
        # (a run without the runstate grid lacks both, and says the first)
        r.need("cgroup_throttled_frac")
        if s.server_runnable_cores is not None:
            r.need("server_allowed_cpus")
        return r.unassessable(TRACE_SCHED)
    scores = []
    if s.cgroup_throttled_frac is not None and r.cmp(
        "cgroup_throttled_frac", ">=", "cgroup_throttled_frac"
    ):
        score = signal_margin(s, "cgroup_throttled_frac", "cgroup_throttled_frac")
        # Corroboration: a group throttled in most periods uses nearly all of its quota.
        # It adds a second met row (confidence) and never lowers the score.
        if s.cgroup_quota_used is not None and r.cmp(
            "cgroup_quota_used", ">=", "cgroup_quota_used"
        ):
            score = max(score, signal_margin(s, "cgroup_quota_used", "cgroup_quota_used"))
        scores.append(score)
    # several engines: each one's own cgroup, one row each (the server's rows are the
    # first engine's alone, and a quota on one replica is not the whole server's)
    for e in own:
        assert e.throttled_frac is not None  # own: measured
        if r.cmp("engines", ">=", "cgroup_throttled_frac",
                 value=e.throttled_frac, label=f"engine_throttled_frac {e.key}",
                 detail=e.words):
            scores.append(margin(e.throttled_frac, _v("cgroup_throttled_frac"), ">="))
    if over:
        runnable, allowed = s.server_runnable_cores or 0.0, s.server_allowed_cpus or 0.0
        words = _limited_words(runnable, allowed, s.server_allowance_by, _allowance_words(s))
        if r.cmp("server_runnable_cores", ">=", "runnable_excess_threads",
                 value=runnable - allowed, label="runnable_threads_over_allowed_cpus",
                 detail=words):
            scores.append(margin(runnable - allowed, _v("runnable_excess_threads"), ">="))
    return r.fire(max(scores)) if scores else r.o


def _at_own_quota(s: WindowSignals) -> bool:
    """The server's cgroup throttled it and it used (nearly) all of its quota."""
    return (
        s.cgroup_throttled_frac is not None
        and s.cgroup_quota_used is not None
        and s.cgroup_throttled_frac >= _v("cgroup_throttled_frac")
        and s.cgroup_quota_used >= _v("cgroup_quota_used")
    )


def _others_words(s: WindowSignals, where: str) -> str:
    """The busiest other processes of the window, named: PID, command, cores, and
    whether each is Strata's own (the harness, the agent, the load workers)."""
    if not s.other_processes:
        return ""
    return "other processes: " + "; ".join(
        f"pid {pid} {cmd} {cores:.2f} cores ({_OWN[own]}"
        + (f"; {w}" if (w := _competitor_weight(s, pid)) else "") + ")"
        for pid, cmd, cores, own in s.other_processes) + "".join(
        f"; {w}" for w in (named_share_words(s), process_starts_words(s),
                           f"the server: {where}") if w)


def process_starts_words(s: WindowSignals) -> str:
    """The host's rate of process starts, where sampled: children that live shorter than
    the allowance collector's tick are never named themselves, and a high rate says the
    other work may be theirs (counted in their parent's cores once reaped)."""
    if s.host_process_starts_per_s is None:
        return ""
    n = round(s.host_process_starts_per_s, 1)
    return f"{n:.0f} process starts/s" if n >= 10 else f"{n:.1f} process starts/s"


def others_host_cores(s: WindowSignals) -> float | None:
    """The cores other work held host-wide: the host's busy cores less the server's and
    its path's (the proxies on the request's way are the path, not other processes,
    issue 31); None where unmeasured."""
    if s.host_busy_cores is None or s.server_cpu_cores is None:
        return None
    return max(0.0, s.host_busy_cores - s.server_cpu_cores - (s.path_cpu_cores or 0.0))


def named_share_words(s: WindowSignals) -> str:
    """How much of the other work's CPU the named processes account for, host-wide: the
    busy cores less the server's and its path's, against the named ones' sum. Why: the
    list is a few processes over a cut, so it can cover a small part of what crowded the
    server; the rest is smaller processes, kernel threads and interrupts, or processes that
    lived between two samples, and the reader should know how much is left unnamed."""
    others = others_host_cores(s)
    if not s.other_processes or others is None:
        return ""
    held = round(others, 2)
    named = round(sum(cores for _pid, _cmd, cores, _own in s.other_processes), 2)
    if held == 0:  # contention on steal alone: the host's counters left nothing beside it
        return "the host's CPU counters left no time beside the server's"
    if named > held:  # the processes' and the host's counters are read apart
        return f"named: {named:.2f} cores, all of the {held:.2f} other work held host-wide"
    if named == held:
        return f"named: all {held:.2f} cores other work held host-wide"
    return f"named: {named:.2f} of the {held:.2f} cores other work held host-wide"


_OWN = {True: "Strata's own", False: "not Strata's"}


def rule_cpu_contention(s: WindowSignals) -> Outcome:
    """Other work on the same cores, or the hypervisor (steal), keeps the server's threads
    from the CPU. (Its own cgroup's quota is ``cpu_limited``.)"""
    r = RuleCheck("cpu_contention", s)
    margins = []
    if s.steal_frac is not None and r.cmp("steal_frac", ">=", "steal_frac"):
        margins.append(signal_margin(s, "steal_frac", "steal_frac"))
    if not r.need("host_busy_cores", "server_cpu_cores", "n_cores"):
        return r.fire(*margins) if margins else r.unassessable(TRACE_SCHED)
    assert (s.host_busy_cores is not None and s.server_cpu_cores is not None
            and s.n_cores is not None)  # need() checked them
    if s.allowed_cpus_other_cores is not None and s.server_allowed_cpus:
        # other processes on the CPUs the server may use, as a share of them: a busy
        # process on its only allowed CPU crowds it however idle the rest of the host.
        # At most all of them (the two are read apart; and a vanishing allowance, which
        # no sampled cpuset gives, would make the share infinite)
        other = min(1.0, s.allowed_cpus_other_cores / s.server_allowed_cpus)
        label = "other_processes_allowed_cpus_frac"
    else:
        other = (others_host_cores(s) or 0.0) / max(s.n_cores, 1)  # measured: need()
        label = "other_processes_cores_frac"
    crowded = r.cmp("host_busy_cores", ">=", "other_cpu_frac", value=other, label=label,
                    detail=_others_words(s, _allowance_words(s)))
    delayed = []
    if s.runq_delay_per_cpu_s is not None and r.cmp(
        "runq_delay_per_cpu_s", ">=", "runq_delay_per_cpu_s"
    ):
        delayed.append(signal_margin(s, "runq_delay_per_cpu_s", "runq_delay_per_cpu_s"))
    if s.ctx_involuntary_per_cpu_s is not None and r.cmp(
        "ctx_involuntary_per_cpu_s", ">=", "involuntary_ctx_per_cpu_s"
    ):
        delayed.append(signal_margin(s, "ctx_involuntary_per_cpu_s", "involuntary_ctx_per_cpu_s"))
    if crowded and delayed and _at_own_quota(s):
        # CFS throttling is run-queue delay and preemption too: a server that used its
        # whole quota got all its cgroup allows, so its waits are the quota's
        # (cpu_limited), not the other processes'.
        r.cmp("cgroup_quota_used", "<", "cgroup_quota_used", label="quota_used_not_binding")
    elif crowded and delayed:
        margins.append(sum(delayed) / len(delayed))
        margins.append(margin(other, _v("other_cpu_frac"), ">="))
    if (
        crowded
        and s.runq_delay_per_cpu_s is None
        and s.ctx_involuntary_per_cpu_s is None
        and not margins
    ):
        # others hold the cores, but whether the server waited for them is unmeasured
        # (a host that is not crowded is cleared without them)
        r.need("runq_delay_per_cpu_s")
    return r.fire(*margins) if margins else r.o


def rule_io_page_faults(s: WindowSignals) -> Outcome:
    r = RuleCheck("io_page_faults", s)
    if s.major_faults_per_s is None and s.read_bytes_s is None and s.disk_busy_frac is None:
        r.need("major_faults_per_s", "read_bytes_s")
        return r.unassessable(TRACE_BLOCK)
    margins = []
    if s.major_faults_per_s is not None and r.cmp("major_faults_per_s", ">=", "major_faults_per_s"):
        margins.append(signal_margin(s, "major_faults_per_s", "major_faults_per_s"))
    if s.read_bytes_s is not None and r.cmp("read_bytes_s", ">=", "read_bytes_s"):
        margins.append(signal_margin(s, "read_bytes_s", "read_bytes_s"))
    # A busy device is the server's only when nothing says otherwise: with its own fault
    # and read counters measured and quiet, the reads are another process's.
    own_measured = s.major_faults_per_s is not None or s.read_bytes_s is not None
    if (
        s.disk_busy_frac is not None
        and r.cmp("disk_busy_frac", ">=", "disk_busy_frac")
        and (margins or not own_measured)
    ):
        margins.append(signal_margin(s, "disk_busy_frac", "disk_busy_frac"))
    # Corroboration raises the score but never fires the rule alone.
    extra = []
    if s.psi_io_some is not None and r.cmp("psi_io_some", ">=", "psi_some_frac"):
        extra.append(signal_margin(s, "psi_io_some", "psi_some_frac"))
    if s.iowait_frac is not None and r.cmp("iowait_frac", ">=", "iowait_frac"):
        extra.append(signal_margin(s, "iowait_frac", "iowait_frac"))
    if margins:
        return r.fire(*margins, *extra)
    if s.major_faults_per_s is None:
        r.need("major_faults_per_s")
    return r.o


def rule_memory_pressure(s: WindowSignals) -> Outcome:
    r = RuleCheck("memory_pressure", s)
    if s.psi_mem_some is None and s.mem_available_frac is None and s.cgroup_mem_events is None:
        r.need("psi_mem_some", "mem_available_frac")
        return r.unassessable(TRACE_MEM)
    margins = []
    # The server's own memory limit: reclaim or OOM kills at the limit, on a host with
    # plenty free (a container, a pod). Counts: one event is past, a tenth more scores.
    if s.cgroup_mem_events is not None and r.cmp("cgroup_mem_events", ">=", "cgroup_mem_events"):
        margins.append(signal_margin(s, "cgroup_mem_events", "cgroup_mem_events"))
    if s.psi_mem_some is not None and r.cmp("psi_mem_some", ">=", "psi_some_frac"):
        margins.append(signal_margin(s, "psi_mem_some", "psi_some_frac"))
    if s.mem_available_frac is not None and r.cmp(
        "mem_available_frac", "<", "mem_available_frac_min"
    ):
        margins.append(signal_margin(s, "mem_available_frac", "mem_available_frac_min", "<"))
    return r.fire(*margins) if margins else r.o


def rule_network(s: WindowSignals) -> Outcome:
    """An interface near its capacity (one direction, or both together for request/response
    traffic), or the RDMA fabric erroring, congested, or bypassed (NCCL over sockets)."""
    r = RuleCheck("network", s)
    checks = (
        ("net_util", "net_link_frac"),
        # request/response traffic (llama.cpp RPC) alternates directions: one direction
        # never fills the link that limits it, both together do
        ("net_wire_busy", "net_wire_busy"),
        ("rdma_error_events", "rail_error_events"),  # rails.py rail_errors
        ("rdma_congestion_per_s", "rail_congestion_per_s"),  # rails.py rail_congestion
        ("socket_fallback_bytes_s", "socket_fallback_bytes_s"),  # rails.py socket_fallback
    )
    if all(getattr(s, n) is None for n, _ in checks):
        r.need("net_util")
        return r.unassessable(TRACE_NET)
    margins = [
        signal_margin(s, signal, thr)
        for signal, thr in checks
        if getattr(s, signal) is not None and r.cmp(signal, ">=", thr)
    ]
    if margins:
        return r.fire(*margins)
    if not r.need("net_util"):  # a link nobody measured is not cleared by rail counters
        return r.unassessable(TRACE_NET)
    return r.o




def _stall_words(frozen: float | None, stopped: float | None, threads: int | None) -> str:
    """What the stall was, from the runstate samples: the cgroup freezer, stopped
    threads (T), or neither (no progress while not asleep: swapped in, a paused VM)."""
    n = f" ({threads} threads)" if threads else ""
    if frozen:
        return f"frozen by its cgroup freezer in {frozen:.0%} of the window's samples{n}"
    if stopped:
        return (f"stopped (state T: SIGSTOP or a tracer) in {stopped:.0%} of its threads' "
                f"samples{n}")
    if frozen is None and stopped is None:
        return ""
    return ("neither frozen nor stopped: its threads neither ran nor waited for a CPU "
            "while not asleep (swapped in, a paused VM)")


def stalled_lead(s: WindowSignals) -> bool:
    """The server was stalled for ``server_stalled_window_lead`` of the window while
    requests were in flight: the case's story, first (the verdict's ledger-led step)."""
    x = s.server_stalled_inflight_frac
    return x is not None and x >= _v("server_stalled_window_lead")


def rule_server_stalled(s: WindowSignals) -> Outcome:
    """The server neither ran nor could run for part of the time the case is about:
    its cgroup frozen, its threads stopped (T), or neither run time nor run-queue wait
    advancing while its threads were not asleep (swapped in, a hypervisor pause). The
    time ledger gives the share: the queue, prefill, decode and the tail in that state;
    or the window does: stalled for ``server_stalled_window_lead`` of it while requests
    were in flight, however little of the metric's definition shows it."""
    r = RuleCheck("server_stalled", s)
    if not r.need("server_stalled_frac"):
        return r.unassessable(TRACE_RUNSTATE)
    words = _stall_words(s.server_frozen_frac, s.server_stopped_frac, s.server_threads)
    margins = []
    if r.cmp("server_stalled_frac", ">=", "server_stalled_frac", detail=words):
        margins.append(signal_margin(s, "server_stalled_frac", "server_stalled_frac"))
    if s.server_stalled_inflight_frac is not None and r.cmp(
        "server_stalled_inflight_frac", ">=", "server_stalled_window_lead",
        detail="" if margins else words,  # the actors said once
    ):
        margins.append(signal_margin(s, "server_stalled_inflight_frac",
                                     "server_stalled_window_lead"))
    if not margins:
        return r.o
    # corroboration: the window itself, not only the requests' time (adds a met row)
    if s.server_stalled_window_frac is not None and r.cmp(
        "server_stalled_window_frac", ">=", "server_stalled_frac"
    ):
        margins.append(signal_margin(s, "server_stalled_window_frac", "server_stalled_frac"))
    return r.fire(max(margins))

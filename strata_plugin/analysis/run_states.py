"""What the server's process tree was doing, interval by interval: the time ledger's
reading of the agent's ``runstate`` samples.

The ``runstate`` collector (device ``""``: the server's whole process tree, every ~20 ms)
writes cumulative counters summed over threads (``run_s`` on a CPU, ``wait_s`` runnable
but waiting for one, ``throttled_s`` held by the cgroup's CPU quota) and gauges at each
instant (``threads``, ``state_R/S/D/T/other``, ``frozen``). Each sampling interval is
split into five states, shares summing to 1:

* ``stalled``: neither running nor able to run: the cgroup freezer FROZEN/FREEZING
  (``frozen``), every thread stopped (``state_T``), or neither run time nor run-queue
  wait advancing while the threads were not asleep;
* ``waiting``: runnable but not on a CPU, in the run queue (``wait_s``: other threads on
  the same CPUs, the server's own or other processes'), over the busy reference (the
  cores the server's threads use when it runs: the 90th percentile of its run rate over
  the case window: "wall x busy threads");
* ``throttled``: runnable but held by the cgroup's CPU quota (``throttled_s``), in the
  same unit;
* ``running``: run time, in the same unit;
* ``io``: threads in uninterruptible sleep (``state_D``), in the same unit;
* ``sleeping``: the rest (threads in S: waiting on the network, a peer, a lock).

A thread that waits for a CPU holds back the threads that wait for it (a forward pass
ends at a barrier all threads reach), so the wait is counted before the run time: two
compute threads sharing one CPU run 1.0 core and wait 1.0 core, and the whole interval
is ``waiting``, not compute (its busy reference is the 1.0 core it could run), as a
token that took 40x its clean time because its threads queued for the CPU is.

The kernel books a wait when it ends, not while it lasts: a thread's schedstat run_delay
grows when the thread reaches a CPU (by the whole time it queued), and a cgroup's
throttled time when the quota is refilled (by the whole period it was held). On a 20 ms
grid those counters stand still while the threads wait and then jump, so read interval
by interval a server held by a 0.1-core quota ran in its bursts and "slept" in between,
and the jumps, many times an interval's room, were cut to one interval's worth: the
quota's hold read as 20% of the case where it was 90%. So what an interval cannot hold
of either counter's increment is moved back to the intervals before it, at most
LAZY_SPAN_S back (:func:`spread_back`); a counter that advances steadily stays put.
Where the agent also sampled ``queued_s`` (the run-queue wait counted while it lasts:
``wait_s`` plus the waits still under way) it is read in place of ``wait_s``, so a wait
longer than LAZY_SPAN_S is seen where it was; runs recorded before it read ``wait_s``.

Shares are kept as running totals per state, so the seconds in each state over any span
(a decode gap, a TTFT) are two interpolations (uniform within a sampling interval).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata_plugin.analysis.timeline import SampleStore

SOURCE = "runstate"
STATES = ("stalled", "waiting", "throttled", "io", "sleeping", "running")
#: The states in which the server's threads were held back from a CPU they wanted.
WAITING_STATES = ("waiting", "throttled")
#: Below this share of the busy reference, run time and run-queue wait did not advance.
NO_PROGRESS = 0.02
#: A span whose samples cover less than this share of it is not classified.
MIN_COVERAGE = 0.5
#: How far back a booked wait or throttled time is spread (module docstring): the CFS
#: bandwidth period's default, the longest a quota holds a group at once unless the
#: period is raised (Linux kernel docs, scheduler/sched-bwc.rst, Management:
#: cpu.cfs_period_us "the length of a period", 100 ms by default).
LAZY_SPAN_S = 0.1


@dataclass(frozen=True)
class RunStates:
    """The server's run state on the harness wall clock (ns)."""

    t: np.ndarray  # sample times, sorted (n,)
    cum: np.ndarray  # (n, len(STATES)) seconds spent in each state up to t[i]
    busy_ref_cores: float
    #: what was seen in the window: share of the window each raw signal was set
    seen: tuple[tuple[str, float], ...] = ()
    #: over the window: mean cores on a CPU, runnable without one (run queue) and held by
    #: the quota, in cores (thread-seconds per second); None without samples in it
    run_cores: float | None = None
    wait_cores: float | None = None
    throttled_cores: float | None = None
    #: samples (grid points) inside the window
    n_window: int = 0
    #: the server's threads over the window's stalled intervals (most of the interval
    #: stalled): (what, mean count) for all of them, stopped (T), in D, frozen cgroup
    stall_threads: tuple[tuple[str, float], ...] = ()

    def over(self, a_ns: int, b_ns: int) -> tuple[dict[str, float], float]:
        """Seconds in each state over [a, b], and the seconds the samples cover."""
        if b_ns <= a_ns or len(self.t) < 2:
            return dict.fromkeys(STATES, 0.0), 0.0
        lo, hi = max(a_ns, int(self.t[0])), min(b_ns, int(self.t[-1]))
        if hi <= lo:
            return dict.fromkeys(STATES, 0.0), 0.0
        out = {}
        for k, name in enumerate(STATES):
            col = self.cum[:, k]
            out[name] = float(np.interp(hi, self.t, col) - np.interp(lo, self.t, col))
        return out, (hi - lo) / 1e9

    def seconds_between(self, a_ns: np.ndarray, b_ns: np.ndarray, state: str) -> np.ndarray:
        """Seconds in ``state`` over each [a, b] (vectorized; outside the samples, none)."""
        col = self.cum[:, STATES.index(state)]
        if len(self.t) < 2:
            return np.zeros(len(a_ns))
        return np.maximum(0.0, np.interp(b_ns, self.t, col) - np.interp(a_ns, self.t, col))

    def share(self, a_ns: int, b_ns: int, state: str) -> float | None:
        """The share of [a, b] in ``state``; None where the samples cover too little."""
        secs, covered = self.over(a_ns, b_ns)
        if covered <= 0 or covered < MIN_COVERAGE * (b_ns - a_ns) / 1e9:
            return None
        return secs[state] / covered


def _series(store: SampleStore, node: str | None, metric: str) -> tuple[np.ndarray, np.ndarray
                                                                          ] | None:
    idx = store.find(node=node, source=SOURCE, metric=metric, device="")
    if not idx:
        return None
    i = idx[0]
    a, b = int(store.bounds[i]), int(store.bounds[i + 1])
    kind = store.keys[i].kind
    values = store.acc[a:b] if kind == "counter" else store.v[a:b]
    return store.t[a:b], values


def nodes_with_run_state(store: SampleStore) -> list[str]:
    return sorted({k.node for k in store.keys if k.source == SOURCE and k.metric == "run_s"})


def from_store(store: SampleStore, start_ns: int, end_ns: int, node: str | None = None
               ) -> RunStates | None:
    """The run states around [start, end] (one interval beyond each edge), from the node
    that ran the server (``node``; else the first with runstate samples). None when there
    are no ``run_s`` samples there."""
    if node is None or node not in nodes_with_run_state(store):
        nodes = nodes_with_run_state(store)
        if not nodes:
            return None
        node = nodes[0]
    run = _series(store, node, "run_s")
    if run is None or len(run[0]) < 2:
        return None
    t_all = run[0]
    i0 = max(0, int(np.searchsorted(t_all, start_ns, "right")) - 2)
    # past the end by the spread: a wait booked just after the window happened in it
    i1 = min(len(t_all), int(np.searchsorted(t_all, end_ns + LAZY_SPAN_S * 1e9, "left")) + 2)
    t = t_all[i0:i1].astype(np.int64)
    if len(t) < 2:
        return None

    def at(metric: str, default: float | None = 0.0) -> np.ndarray | None:
        s = _series(store, node, metric)
        if s is None or len(s[0]) == 0:
            return None if default is None else np.full(len(t), default)
        return np.interp(t, s[0], s[1])

    run_s = at("run_s")
    # the run-queue wait while it lasts where the agent sampled it (``queued_s``); runs
    # recorded before it have only the kernel's, booked when each wait ends
    wait = at("queued_s", None)
    if wait is None:
        wait = at("wait_s")
    throttled = at("throttled_s")
    threads = at("threads", None)
    state_s = at("state_S", None)
    state_d = at("state_D")
    state_t = at("state_T")
    frozen = at("frozen")
    assert run_s is not None and wait is not None and throttled is not None
    assert state_d is not None and state_t is not None and frozen is not None
    return classify_intervals(t, run_s, wait, state_d, state_t, frozen,
                              threads, state_s, start_ns, end_ns, throttled_s=throttled)


def spread_back(t: np.ndarray, inc: np.ndarray, room: np.ndarray,
                span_s: float = LAZY_SPAN_S) -> np.ndarray:
    """A counter's increments per interval (``inc``), booked when their waits ended,
    moved back to where they can have happened: what exceeds an interval's ``room`` (its
    length times the cores the server runs) goes to the interval before, and so on, but
    never further than ``span_s`` before it was booked (beyond that it is dropped: more
    held-back time than wall time, which the shares clip anyway). A counter that advances
    with time, as a perfect one would, never exceeds its room and stays where it is."""
    out = np.zeros(len(inc))
    carry: list[tuple[int, float]] = []  # (booked at: interval end, seconds still to place)
    span = span_s * 1e9
    for i in range(len(inc) - 1, -1, -1):
        if inc[i] > 0:
            carry.append((int(t[i + 1]), float(inc[i])))
        carry = [(at, x) for at, x in carry if at - int(t[i]) <= span]
        free = float(room[i]) if np.isfinite(room[i]) else 0.0
        kept: list[tuple[int, float]] = []
        for at, x in reversed(carry):  # the earliest booked first: nearest to here
            take = min(x, free)
            free -= take
            out[i] += take
            if x - take > 0:
                kept.append((at, x - take))
        carry = kept[::-1]
    return out


def _ends_mean(x: np.ndarray) -> np.ndarray:
    return (x[1:] + x[:-1]) / 2.0


def classify_intervals(
    t: np.ndarray,
    run_s: np.ndarray,
    wait_s: np.ndarray,
    state_d: np.ndarray,
    state_t: np.ndarray,
    frozen: np.ndarray,
    threads: np.ndarray | None,
    state_s: np.ndarray | None,
    start_ns: int,
    end_ns: int,
    throttled_s: np.ndarray | None = None,
) -> RunStates:
    """Each interval split into STATES (see the module's docstring); cumulative seconds.
    ``throttled_s``: the quota's hold, apart from the run-queue wait (None: none)."""
    dt = np.diff(t) / 1e9
    dt = np.where(dt > 0, dt, np.nan)
    run_rate = np.clip(np.diff(run_s), 0.0, None) / dt
    inside = (t[1:] > start_ns) & (t[:-1] < end_ns)
    rates = run_rate[inside & np.isfinite(run_rate)]
    busy = float(np.percentile(rates, 90)) if len(rates) else 0.0
    busy = max(busy, 1e-3)
    wait_inc = np.clip(np.diff(wait_s), 0.0, None)
    thr_inc = (np.zeros(len(dt)) if throttled_s is None
               else np.clip(np.diff(throttled_s), 0.0, None))
    room = busy * np.nan_to_num(dt)  # the held-back seconds an interval can hold
    wait_rate = spread_back(t, wait_inc, room) / dt
    thr_rate = spread_back(t, thr_inc, room) / dt
    n_threads = _ends_mean(threads) if threads is not None else np.full(len(dt), np.nan)
    stopped = np.clip(_ends_mean(np.minimum(frozen, 1.0)), 0.0, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        all_t = np.where(n_threads > 0, _ends_mean(state_t) / n_threads, 0.0)
    stopped = np.maximum(stopped, np.where(np.nan_to_num(all_t) >= 1.0, 1.0, 0.0))
    rest = 1.0 - stopped
    # held back from a CPU first (module docstring): the quota's hold, the run queue
    throttled = np.minimum(rest, np.nan_to_num(thr_rate / busy))
    rest = rest - throttled
    waiting = np.minimum(rest, np.nan_to_num(wait_rate / busy))
    rest = rest - waiting
    running = np.minimum(rest, np.nan_to_num(run_rate / busy))
    rest = rest - running
    io = np.minimum(rest, _ends_mean(state_d) / busy)
    rest = rest - io
    if state_s is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            asleep = np.where(n_threads > 0, _ends_mean(state_s) / n_threads, 1.0) >= 0.5
    else:
        asleep = np.ones(len(dt), bool)
    no_progress = np.nan_to_num(run_rate + wait_rate + thr_rate) < NO_PROGRESS * busy
    stuck = no_progress & ~asleep
    stalled = stopped + np.where(stuck, rest, 0.0)
    sleeping = np.where(stuck, 0.0, rest)
    shares = np.stack([stalled, waiting, throttled, io, sleeping, running], axis=1)
    secs = shares * np.nan_to_num(dt)[:, None]
    cum = np.vstack([np.zeros((1, len(STATES))), np.cumsum(secs, axis=0)])
    w = np.where(inside, np.nan_to_num(dt), 0.0)
    total = float(w.sum())
    seen: list[tuple[str, float]] = []
    if total > 0:
        for name, flag in (("frozen", _ends_mean(frozen) >= 0.5),
                           ("all threads stopped (T)", np.nan_to_num(all_t) >= 1.0),
                           ("no run or wait progress, not asleep", stuck),
                           ("threads in D", _ends_mean(state_d) >= 1.0)):
            share = float((w * flag).sum() / total)
            if share > 0:
                seen.append((name, round(share, 4)))
    stall_threads: list[tuple[str, float]] = []
    stuck_w = w * (stalled >= 0.5)
    if float(stuck_w.sum()) > 0:
        for label, series in (("threads", threads), ("stopped (T)", state_t),
                              ("in D", state_d)):
            if series is not None:
                mean = float(np.nansum(stuck_w * _ends_mean(series)) / stuck_w.sum())
                stall_threads.append((label, round(mean, 2)))
        stall_threads.append(("frozen cgroup", round(float(
            np.nansum(stuck_w * (_ends_mean(frozen) >= 0.5)) / stuck_w.sum()), 2)))
    cores: list[float | None] = [None, None, None]
    if total > 0:
        # the counters as booked (their totals: nothing clipped or dropped by the spread)
        cores = [float(np.nansum(w * r) / total)
                 for r in (run_rate, wait_inc / dt, thr_inc / dt)]
    return RunStates(t=t, cum=cum, busy_ref_cores=busy, seen=tuple(seen),
                     run_cores=cores[0], wait_cores=cores[1], throttled_cores=cores[2],
                     n_window=int(((t >= start_ns) & (t <= end_ns)).sum()),
                     stall_threads=tuple(stall_threads))

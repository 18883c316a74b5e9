"""Client capacity: how late does the client stamp events, from 1 to 1024 streams?

Two shapes. ``test_client_capacity_closed_loop`` is the one that tells the
truth about a real run: a closed loop that opens streams all the time while
others stream, the emitter streaming on accept, at 64-1024 streams, with a
plain thread-per-stream client and a single asyncio loop (aiohttp) measured in
the same run as references (``benchmarks/closed_loop_clients.py``;
``STRATA_BENCH_CL_STREAMS``, ``STRATA_BENCH_CL_MODES`` choose a subset). The
older ``test_client_capacity`` below opens every stream before a common start:

Not a pass/fail test: it prints figures. A loopback emitter in its own process
(strata_plugin.testing.emitter) sends 50 events/s on every stream, each carrying
its send time; the client's ``handled_ns - sent`` is the client's own lateness
(``read`` = ``t_ns - sent``: when the bytes were read, before parsing). All
streams are opened first and start emitting together at one monotonic instant,
so every figure is for all N streams running at once; they also end together,
as fixed-length requests do, and ``steady_p99`` leaves out that last 100 ms. Run it with::

    pytest benchmarks/test_client_capacity.py --benchmark-only -s

Three designs are measured:

* ``threads``: one process, a thread per stream reading its own body with
  ``send_streaming`` (every event wakes a thread and moves the GIL);
* ``mux``: one process, ``StreamMux.send_streaming`` from a thread per stream
  (the thread only submits and waits; the loop sends and reads every stream);
* ``pool``: a ``ShardedStreamRunner`` (what ``pool.run_streams`` uses): the
  streams spread over ``default_processes(N)`` worker processes, each running
  one loop; the workers are started once per N, as a run would.

Each round runs the three modes back to back (rotating the order) so they share
the background load: this host is shared, and ``others`` is the CPU that other
tenants of the host used during the run (host busy time less the client's and
the emitter's), in cores. Figures are medians
over REPEATS rounds.
"""

from __future__ import annotations

import os
import resource
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import closed_loop_clients as cl
import pytest
import requests

from strata_plugin.analysis.stats import percentile
from strata_plugin.formats.records import RequestRecord
from strata_plugin.load.client import RequestSpec, Timeouts, send_streaming
from strata_plugin.load.client.mux import StreamMux
from strata_plugin.testing.emitter import EmitterProcess, emitter_process, sent_stamps
from strata_plugin.testing.stream_pool import ShardedStreamRunner, default_processes

CONCURRENCY = tuple(
    int(x) for x in os.environ.get("STRATA_BENCH_STREAMS", "1,16,64,256,512").split(",") if x
)
MODES = ("threads", "mux", "pool")
RATE_HZ = 50
DURATION_S = float(os.environ.get("STRATA_BENCH_DURATION_S", "2"))
REPEATS = int(os.environ.get("STRATA_BENCH_REPEATS", "3"))
TIMEOUTS = Timeouts(connect_s=10, read_s=20)

Runner = Callable[[list[RequestSpec]], list[RequestRecord]]


@dataclass(frozen=True)
class Figures:
    events_per_s: float  # content events handled per second while all streams ran
    p50_ms: float
    p99_ms: float
    max_ms: float
    read_p99_ms: float
    steady_p99_ms: float  # without the last 100 ms, when every stream ends at once
    lost: int  # events sent by the emitter that never reached a record
    late_streams: int  # streams whose headers came after the common start
    cpu_cores: float  # this client (and its pool workers)
    other_cores: float  # other tenants of the host: host busy - client - emitter


_RESULTS: dict[tuple[str, int], list[Figures]] = {}


@pytest.fixture(scope="module")
def emitter() -> Iterator[EmitterProcess]:
    with emitter_process() as em:
        yield em
    _print_table()
    _print_closed_table()


def _specs(n: int, start_ns: int) -> list[RequestSpec]:
    extra = (("emit_interval_s", 1.0 / RATE_HZ), ("emit_start_ns", start_ns))
    events = int(DURATION_S * RATE_HZ)
    return [
        RequestSpec(f"s{i}", "capacity", "measured", events, prompt="x", extra_body=extra)
        for i in range(n)
    ]


def _in_threads(url: str, mux: StreamMux | None) -> Runner:
    send = send_streaming if mux is None else mux.send_streaming

    def run(specs: list[RequestSpec]) -> list[RequestRecord]:
        out: list[RequestRecord | None] = [None] * len(specs)

        def one(i: int) -> None:
            with requests.Session() as s:
                out[i] = send(
                    s, url, "chat", specs[i], scheduled_ns=time.monotonic_ns(), timeouts=TIMEOUTS
                )

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(specs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [r for r in out if r is not None]

    return run


def _in_pool(url: str, runner: ShardedStreamRunner) -> Runner:
    def run(specs: list[RequestSpec]) -> list[RequestRecord]:
        jobs = [(s, 0) for s in specs]
        return runner.run(jobs, url, "chat", concurrency=len(specs), timeouts=TIMEOUTS)

    return run


def _measure(
    run: Runner, n: int, em: EmitterProcess, pool: ShardedStreamRunner | None = None
) -> Figures:
    # Time to open every stream before the common start (threads and sessions).
    start_ns = time.monotonic_ns() + int((0.2 + 0.003 * n) * 1e9)
    specs = _specs(n, start_ns)
    cpu0, host0, em0 = _cpu_s(pool), _host_busy_s(), em.cpu_s()
    recs = run(specs)
    cpu, host, em_cpu = _cpu_s(pool) - cpu0, _host_busy_s() - host0, em.cpu_s() - em0
    wall = (time.monotonic_ns() - start_ns) / 1e9 + 0.2 + 0.003 * n
    pairs = []  # (sent_ns, handled_ns, read_ns)
    for r in recs:
        sent = sent_stamps(r.output_text)
        pairs.extend((s, e.handled_ns, e.t_ns) for s, e in zip(sent, r.events, strict=False))
    handled = [(h - s) / 1e6 for s, h, _ in pairs] or [0.0]
    end_ns = start_ns + int((DURATION_S - 0.1) * 1e9)
    steady = [(h - s) / 1e6 for s, h, _ in pairs if s < end_ns] or [0.0]
    read = [(t - s) / 1e6 for s, _, t in pairs] or [0.0]
    last = max((h for _, h, _ in pairs), default=start_ns)
    return Figures(
        events_per_s=len(pairs) / max(1e-9, (last - start_ns) / 1e9),
        p50_ms=percentile(handled, 50),
        p99_ms=percentile(handled, 99),
        max_ms=max(handled),
        read_p99_ms=percentile(read, 99),
        steady_p99_ms=percentile(steady, 99),
        lost=n * int(DURATION_S * RATE_HZ) - len(pairs),
        late_streams=sum(1 for r in recs if (r.first_byte_ns or start_ns + 1) > start_ns),
        cpu_cores=cpu / wall,
        other_cores=max(0.0, host - cpu - em_cpu) / wall,
    )


@pytest.mark.parametrize("n", CONCURRENCY)
def test_client_capacity(benchmark, emitter: EmitterProcess, n: int) -> None:
    """One round runs every mode once, back to back, in a rotating order."""
    runs: dict[str, list[Figures]] = {m: [] for m in MODES}
    rounds = iter(range(REPEATS))
    url = emitter.url
    with ShardedStreamRunner(default_processes(n)) as pool:
        _in_pool(url, pool)(_specs(default_processes(n), 0))  # workers up and warm

        def one_round() -> None:
            k = next(rounds) % len(MODES)
            for mode in MODES[k:] + MODES[:k]:
                if mode == "threads":
                    runs[mode].append(_measure(_in_threads(url, None), n, emitter))
                elif mode == "mux":
                    with StreamMux() as mux:
                        runs[mode].append(_measure(_in_threads(url, mux), n, emitter))
                else:
                    runs[mode].append(_measure(_in_pool(url, pool), n, emitter, pool))

        benchmark.pedantic(one_round, rounds=REPEATS, iterations=1)
    for mode in MODES:
        _RESULTS[(mode, n)] = runs[mode]
        med = _median(runs[mode])
        benchmark.extra_info[mode] = med.__dict__
        print(f"\n{mode:>7} n={n:<4} {_row(med)}")
    benchmark.extra_info["pool_processes"] = default_processes(n)


def _cpu_s(pool: ShardedStreamRunner | None) -> float:
    """CPU seconds of this process and of the pool's workers."""
    total = pool.cpu_s() if pool is not None else 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        total += ru.ru_utime + ru.ru_stime
    return total


def _host_busy_s() -> float:
    """Busy CPU seconds of the whole host (/proc/stat): is anything else competing?"""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    busy = sum(fields[:8]) - fields[3] - fields[4]  # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def _median(runs: list[Figures]) -> Figures:
    return Figures(
        **{k: statistics.median(getattr(r, k) for r in runs) for k in Figures.__dataclass_fields__}
    )


def _row(f: Figures) -> str:
    return (
        f"{f.events_per_s:7.0f} ev/s  p50 {f.p50_ms:6.3f}  p99 {f.p99_ms:7.3f}  "
        f"max {f.max_ms:8.3f}  read_p99 {f.read_p99_ms:7.3f}  "
        f"steady_p99 {f.steady_p99_ms:7.3f} ms  lost {f.lost:3.0f}  "
        f"late {f.late_streams:3.0f}  cpu {f.cpu_cores:4.2f}  "
        f"others {f.other_cores:4.2f}/{os.cpu_count()}"
    )


def _print_table() -> None:
    if not _RESULTS:
        return
    print(f"\nclient lateness (handled - sent), medians of {REPEATS} rounds of {DURATION_S:g} s")
    for (mode, n), runs in sorted(_RESULTS.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        print(f"{mode:>7} {n:>4} | {_row(_median(runs))}")


# --- The closed-loop shape (benchmarks/closed_loop_clients.py) -----------------------

CL_CONCURRENCY = tuple(
    int(x) for x in os.environ.get("STRATA_BENCH_CL_STREAMS", "64,256,512,1024").split(",")
)
CL_MODES = tuple(os.environ.get("STRATA_BENCH_CL_MODES", "loop,pool,threads,aiohttp").split(","))
CL_GENERATIONS = float(os.environ.get("STRATA_BENCH_CL_GENERATIONS", "2"))
_CL: dict[tuple[str, int], list[ClosedFigures]] = {}


@dataclass(frozen=True)
class ClosedFigures:
    p50_ms: float
    p99_ms: float
    max_ms: float
    lost: int  # events asked for that never reached the client
    errors: int
    cpu_cores: float
    cpu_us_per_event: float
    events_per_s: float
    bound_ms: float  # ours: the self-check's stated timing error bound (loop lag p99)
    own_ms: float  # ours: the loop's own part of it
    flagged: float  # ours: 1 if the self-check flagged the run client-bound


def _closed_figures(run: cl.Run) -> ClosedFigures:
    delays = [(h - s) / 1e6 for s, h in run.pairs] or [0.0]
    sc = run.self_check
    bound = own = flagged = float("nan")
    if sc is not None and hasattr(sc, "lag_p99_ms"):  # the pool's merged LoopStats
        bound, own = sc.lag_p99_ms(), sc.own_p99_ms()
    elif sc is not None:
        bound = getattr(sc, "timing_error_bound_ms", None) or float("nan")
        own = getattr(sc, "loop_own_lag_p99_ms", None) or float("nan")
        flagged = float(sc.client_bound)
    return ClosedFigures(
        p50_ms=percentile(delays, 50),
        p99_ms=percentile(delays, 99),
        max_ms=max(delays),
        lost=run.expected - len(run.pairs),
        errors=run.errors,
        cpu_cores=run.cpu_s / max(1e-9, run.wall_s),
        cpu_us_per_event=run.cpu_s / max(1, len(run.pairs)) * 1e6,
        events_per_s=len(run.pairs) / max(1e-9, run.wall_s),
        bound_ms=bound,
        own_ms=own,
        flagged=flagged,
    )


@pytest.mark.parametrize("n", CL_CONCURRENCY)
def test_client_capacity_closed_loop(benchmark, emitter: EmitterProcess, n: int) -> None:
    """2 x N requests, N in flight, every client on the same jobs; rounds rotate the order."""
    runs: dict[str, list[ClosedFigures]] = {m: [] for m in CL_MODES}
    rounds = iter(range(REPEATS))
    url = emitter.url
    jobs = cl.specs(int(CL_GENERATIONS * n), seed=n)
    with ShardedStreamRunner(default_processes(n)) as pool:
        _in_pool(url, pool)(_specs(default_processes(n), 0))  # workers up before the run

        def one_round() -> None:
            k = next(rounds) % len(CL_MODES)
            for mode in CL_MODES[k:] + CL_MODES[:k]:
                if mode == "loop":
                    run = cl.run_loop(url, jobs, n)
                elif mode == "pool":
                    run = cl.run_pool(pool, url, jobs, n)
                elif mode == "threads":
                    run = cl.run_threads(url, jobs, n)
                else:
                    run = cl.run_aiohttp(url, jobs, n)
                runs[mode].append(_closed_figures(run))

        benchmark.pedantic(one_round, rounds=REPEATS, iterations=1)
    for mode in CL_MODES:
        _CL[(mode, n)] = runs[mode]
        med = _closed_median(runs[mode])
        benchmark.extra_info[mode] = med.__dict__
        print(f"\nclosed {mode:>7} n={n:<4} {_closed_row(med)}")
    benchmark.extra_info["pool_processes"] = default_processes(n)


def _closed_median(runs: list[ClosedFigures]) -> ClosedFigures:
    fields = ClosedFigures.__dataclass_fields__
    return ClosedFigures(**{k: statistics.median(getattr(r, k) for r in runs) for k in fields})


def _closed_row(f: ClosedFigures) -> str:
    return (
        f"p50 {f.p50_ms:7.3f}  p99 {f.p99_ms:8.3f}  max {f.max_ms:8.1f} ms  lost {f.lost:5.0f}  "
        f"err {f.errors:3.0f}  cpu {f.cpu_cores:4.2f} cores {f.cpu_us_per_event:5.1f} us/ev  "
        f"{f.events_per_s:6.0f} ev/s  bound {f.bound_ms:7.2f} own {f.own_ms:7.2f} "
        f"flagged {f.flagged:.0f}"
    )


def _print_closed_table() -> None:
    if not _CL:
        return
    print(f"\nclosed loop, handling delay (handled - sent), medians of {REPEATS} rounds; "
          "ratio = reference p99 / this p99 (> 1: this client is better)")
    ns = sorted({n for _, n in _CL})
    for n in ns:
        ref = {m: _closed_median(_CL[(m, n)]) for m in CL_MODES if (m, n) in _CL}
        for mode, f in ref.items():
            ratios = "  ".join(
                f"{other}/{mode} {ref[other].p99_ms / max(1e-9, f.p99_ms):6.2f}"
                for other in ("threads", "aiohttp") if other in ref and other != mode
            )
            print(f"{mode:>7} {n:>4} | {_closed_row(f)} | {ratios}")

"""Client capacity: how late does the client stamp events, from 1 to 512 streams?

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
* ``mux``: one process, ``StreamMux``: a thread per stream sends the request
  and waits for headers, one selector loop thread reads every body;
* ``pool``: a ``ShardedStreamRunner`` (what ``pool.run_streams`` uses): the
  streams spread over ``default_processes(N)`` worker processes, each running
  a ``StreamMux``; the workers are started once per N, as a run would.

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

import pytest
import requests

from strata_plugin.analysis.stats import percentile
from strata_plugin.formats.records import RequestRecord
from strata_plugin.load.client import RequestSpec, Timeouts, send_streaming
from strata_plugin.load.client.mux import StreamMux
from strata_plugin.testing.emitter import EmitterProcess, emitter_process, sent_stamps
from strata_plugin.testing.stream_pool import ShardedStreamRunner, default_processes

CONCURRENCY = (1, 16, 64, 256, 512)
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

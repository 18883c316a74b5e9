"""The load beyond one loop, side by side: one loop, the pool, Ray on 1, 2 and 3 nodes.

Not a pass/fail test: it prints figures (and asserts only that no event was lost).
Against the test emitter (strata_plugin/testing/emitter.py, its own process, each event
carrying its send time on this host's CLOCK_MONOTONIC), at N = 256, 1024 and 2048
streams (``STRATA_BENCH_SCALE_STREAMS``): an open loop of 2 x N requests at a fixed
rate of N / D per second (D = EVENTS x INTERVAL_S, each stream's length), so about N
streams are open at once once it has ramped, connections opening all the time. Figures:

* handling delay p99: the client's parse of an event minus the emitter's send stamp
  (for Ray, the actor's stamp moved onto this host's timeline: it includes the
  alignment error, which here, one kernel, is the half round trip);
* events lost: sent by the emitter, in no record (must be 0);
* client CPU per stream: every client process's CPU (this one, the pool's workers,
  the Ray actors) over the wall time, per stream, in millicores;
* the achieved open-loop rate against the asked one (dispatches over their span).

Each figure is the median of ROUNDS rounds (``STRATA_BENCH_SCALE_ROUNDS``, 3); each
round runs every mode back to back, the order rotating, so they share the host's
background load.

Ray modes need root, Ray (``bash scripts/setup.sh --ray``) and about a minute to start
a 3-node cluster of network namespaces (tests/raylab.py); without them they are left
out and say why. Run::

    pytest benchmarks/test_scale.py -s -p no:cacheprovider

On this machine every "host" shares the same 2 cores with the emitter (and other
tenants), so more nodes cannot add CPU: read the ratios and the per-actor figures; on
separate hosts each actor has its own cores and the per-actor figures are what scales.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from strata_plugin.analysis.stats import percentile
from strata_plugin.configure.load_spec import LoadSpec
from strata_plugin.load.client import RequestSpec, Timeouts
from strata_plugin.load.generator import Job, LoadParams, LoadResult, open_rate, run_load
from strata_plugin.testing.emitter import emitter_process, sent_stamps

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

STREAMS = tuple(int(x) for x in os.environ.get("STRATA_BENCH_SCALE_STREAMS",
                                               "256,1024,2048").split(",") if x)
MODES = tuple(os.environ.get("STRATA_BENCH_SCALE_MODES",
                             "loop,pool,ray1,ray2,ray3").split(","))
ROUNDS = int(os.environ.get("STRATA_BENCH_SCALE_ROUNDS", "3"))  # modes rotate each round
EVENTS = 20
INTERVAL_S = 0.1
TIMEOUTS = Timeouts(connect_s=30, read_s=60)


@dataclass(frozen=True)
class Row:
    mode: str
    n: int
    p50_ms: float
    p99_ms: float
    lost: int
    mcores_per_stream: float
    cores: float
    rate_asked: float
    rate_achieved: float
    per_actor: str
    wall_s: float


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _jobs(n: int) -> list[Job]:
    extra = (("emit_interval_s", INTERVAL_S),)
    rate = n / (EVENTS * INTERVAL_S)
    return [Job(RequestSpec(f"b{i}", "scale", "measured", EVENTS, prompt="x", extra_body=extra),
                i / rate) for i in range(2 * n)]


def _row(mode: str, n: int, res: LoadResult, cpu_here: float, wall: float) -> Row:
    delays = []
    got = 0
    for r in res.records:
        sent = sent_stamps(r.output_text)
        got += len(sent)
        delays.extend((e.handled_ns - s) / 1e6 for s, e in zip(sent, r.events, strict=False)
                      if e.handled_ns)
    sc = res.self_check
    # The pool's and the actors' CPU (their own rusage over their own wall time), with
    # this process's (one loop; the pool's and Ray's driver).
    workers = sc.client_cpu_total_cores if sc.engine in ("pool", "ray") else 0.0
    cores = cpu_here / wall + (workers or 0.0)
    asked, achieved = open_rate(res.records)
    per = "; ".join(
        f"{p.get('host') or p.get('process')}: {p.get('client_cpu_cores')} cores, own lag p99 "
        f"{_f(p.get('loop_own_lag_p99_ms'))} ms"
        + (f", clock offset {_f(p['clock_offset_ms'])} ± {_f(p['clock_error_ms'])} ms"
           if p.get("clock_offset_ms") is not None else "")
        + (", client-bound" if p.get("client_bound") else "") for p in sc.per_process)
    return Row(mode, n, percentile(delays, 50), percentile(delays, 99),
               len(res.records) * EVENTS - got, 1000 * cores / n, cores, asked or 0.0,
               achieved or 0.0, per, wall)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _median(rows: list[Row]) -> list[Row]:
    """Per (mode, N): the median of each figure over the rounds (per-actor text: the
    median round's by p99)."""
    out = []
    keys = list(dict.fromkeys((r.mode, r.n) for r in rows))
    for mode, n in keys:
        rs = sorted((r for r in rows if (r.mode, r.n) == (mode, n)), key=lambda r: r.p99_ms)
        med = rs[len(rs) // 2]

        def m(attr: str, rs: list[Row] = rs) -> float:
            return statistics.median(getattr(r, attr) for r in rs)

        out.append(Row(mode, n, m("p50_ms"), m("p99_ms"), max(r.lost for r in rs),
                       m("mcores_per_stream"), m("cores"), m("rate_asked"),
                       m("rate_achieved"), f"[{len(rs)} rounds] {med.per_actor}",
                       m("wall_s")))
    return out


def _print(rows: list[Row]) -> None:
    print("\n| N | client | p50 ms | p99 ms | lost | cores | mcores/stream | rate asked/s | "
          "achieved/s | error | p99 / loop's |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = {r.n: r.p99_ms for r in rows if r.mode == "loop"}
    for r in rows:
        ratio = f"{r.p99_ms / base[r.n]:.2f}" if base.get(r.n) else ""
        print(f"| {r.n} | {r.mode} | {r.p50_ms:.3g} | {r.p99_ms:.3g} | {r.lost} | "
              f"{r.cores:.2f} | {r.mcores_per_stream:.3f} | {r.rate_asked:.1f} | "
              f"{r.rate_achieved:.1f} | {100 * (r.rate_achieved / r.rate_asked - 1):+.2f}% | "
              f"{ratio} |")
    print()
    for r in rows:
        if r.per_actor:
            print(f"{r.mode} N={r.n}: {r.per_actor}")


def test_scale_side_by_side(tmp_path_factory) -> None:
    lab = None
    ray_modes = [m for m in MODES if m.startswith("ray")]
    why = ""
    if ray_modes:
        try:
            import ray  # noqa: F401
            from raylab import RayLab

            if os.geteuid() != 0:
                raise RuntimeError("not root (network namespaces)")
            lab = RayLab.create(tmp_path_factory.mktemp("raylab"), nodes=3)
            lab.start_ray()
        except Exception as e:  # a figure left out, said so
            why = f"{type(e).__name__}: {e}"
            if lab is not None:
                lab.close()
            lab = None
    if lab is None and ray_modes:
        print(f"\nRay modes left out: {why or 'not asked'}")
    rows: list[Row] = []
    host = lab.head_addr if lab is not None else "127.0.0.1"
    try:
        with emitter_process(host) as em:
            for rnd, n in [(k, n) for n in STREAMS for k in range(ROUNDS)]:
                for mode in MODES[rnd % len(MODES):] + MODES[:rnd % len(MODES)]:
                    if mode.startswith("ray") and lab is None:
                        continue
                    jobs = _jobs(n)
                    cpu0, t0 = _cpu(), time.monotonic()
                    if mode.startswith("ray"):
                        from strata_plugin.load.ray_engine import run_load_on_ray

                        spec = LoadSpec(engine="ray", address=lab.address, num_cpus=1.0,
                                        nodes=int(mode[3:]), workers_per_node=1)
                        res = run_load_on_ray(jobs, spec=spec, base_url=em.url, api="chat",
                                              concurrency=len(jobs), timeouts=TIMEOUTS)
                    else:
                        res = run_load(jobs, LoadParams(
                            base_url=em.url, api="chat", concurrency=len(jobs),
                            timeouts=TIMEOUTS, processes=1 if mode == "loop" else 2,
                            streams=n))
                    wall = (res.end_ns - res.start_ns) / 1e9
                    rows.append(_row(mode, n, res, _cpu() - cpu0, wall))
                    print(f"{mode} N={n}: p99 {rows[-1].p99_ms:.3g} ms, lost {rows[-1].lost}, "
                          f"{time.monotonic() - t0:.0f} s", flush=True)
    finally:
        if lab is not None:
            lab.close()
    order = {m: i for i, m in enumerate(MODES)}
    _print(sorted(_median(rows), key=lambda r: (r.n, order[r.mode])))
    assert all(r.lost == 0 for r in rows), [(r.mode, r.n, r.lost) for r in rows if r.lost]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-s", "-p", "no:cacheprovider"]))

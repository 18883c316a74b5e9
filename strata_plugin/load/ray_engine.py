"""The load over hosts: the pool's worker loop as Ray actors on the user's cluster.

``[load] engine = "ray"`` (configure/load_spec.py). Strata is a driver on a cluster
that is the user's (``ray start`` on each host, or KubeRay): it connects with
``ray.init(address=...)`` (``ray://head:10001`` is Ray Client, Ray's way in from outside
the cluster), reserves one bundle per actor in a placement group spread over the nodes
(``strategy="SPREAD"``), starts :class:`strata_plugin.load.ray_actor.LoadActor` in each,
and on every path kills its actors, removes its placement group and, if it connected,
disconnects: the cluster is left as it was found. Nothing is shipped by hand: the nodes
have the package, or ``ship_package = true`` lets Ray's runtime_env carry it.

Time. Each host has its own CLOCK_MONOTONIC, so each actor's offset to this process's is
measured as the agents' are (agent/handle.py: round trips, the midpoint of the shortest
wins, its half round trip the uncertainty), before the load and after it. Open-loop
arrivals are dealt out round-robin as offsets from one start, which each actor is told on
its own clock, so the offered rate is the sum across actors and keeps the arrival
process's times; records, token marks and windows are moved onto this host's timeline
before anything reads them, and the self-check states the alignment error (the worst
actor's uncertainty plus how far its offset moved during the load).

Ctrl-C. The actors stop at once and their requests in flight are recorded with the
error class ``interrupted`` and the events they had (for up to INTERRUPT_GRACE_S), as
one loop's are; then the actors and the placement group are removed as on every path.

Loss. An actor that dies, or whose node is lost, or that does not answer a poll for
LOST_AFTER_S: its unfinished requests become ``client`` errors naming it and the reason,
the self-check says the load was incomplete, and the run goes on.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, overload

from strata_plugin.configure.load_spec import LoadSpec
from strata_plugin.errors import StrataError
from strata_plugin.formats.records import RequestRecord, TokenEvent
from strata_plugin.load import pool
from strata_plugin.load.client.spec import Timeouts
from strata_plugin.load.generator import (
    Counters,
    Job,
    LoadResult,
    Progress,
    ShardView,
    sharded_check,
    window_end,
)
from strata_plugin.load.pool_worker import Batch, ShardReport

INSTALL = 'pip install "strata[ray]" (Ray core and its client, ray[client])'
#: An actor whose poll (answered within 0.25 s by a live one) is this late is lost.
LOST_AFTER_S = 15.0
#: Placement group and actors must be up within this (a cluster short of the bundle's
#: resources never gets there: the error names what it asked and what the cluster has).
PLACE_TIMEOUT_S = 120.0
#: The actors are told to start this long after the driver's start, so that the go
#: message (one RPC) reaches every one before the first arrival is due.
LEAD_S = 0.2
CLOCK_ROUNDS = 8
#: Connecting through Ray Client: the head's proxy starts a server process for each
#: driver, and on a busy head that start can fail ("Starting Ray client server failed",
#: "Proxy failed to Connect to backend": one CI run in two on a shared 2-core host) where
#: the next attempt succeeds. Those two answers (the head's, not the address's: a wrong
#: address or a refused port fails at once) are retried every CONNECT_RETRY_S for up to
#: CONNECT_TIMEOUT_S; then the error says how many attempts failed and the last answer.
CONNECT_TIMEOUT_S = 90.0
CONNECT_RETRY_S = 2.0
TRANSIENT_CONNECT = ("Starting Ray client server failed", "Proxy failed to Connect to backend")
#: How long a Ctrl-C waits for the actors' records of their requests in flight. Longer
#: than the local pool's: the interrupt and the records each cross the Ray Client proxy
#: and the actors' nodes, and on a crowded host 5 s lost one actor's records in a CI run
#: (tests/test_ray_cluster.py, the Ctrl-C test). A second Ctrl-C ends the wait at once.
INTERRUPT_GRACE_S = 15.0
#: The ``strata_plugin`` folder, which ``ship_package`` hands Ray's runtime_env. Found
#: from this file rather than by importing the package: ``strata_plugin/__init__.py``
#: names the case runner, which runs this engine (no import circle, tests/test_import_cycles.py).
PACKAGE_DIR = Path(__file__).parent.parent


class InterruptLatch:
    """Ctrl-C (and SIGTERM/SIGHUP, which the run turns into it) while the driver pumps
    the actors' messages: the signal sets a flag the pump reads between its waits, and
    the pump raises KeyboardInterrupt itself, outside Ray's code.

    Raised from the handler, the interrupt lands wherever the main thread is, and that is
    mostly inside Ray Client's gRPC calls. Instrumented runs of the Ctrl-C test
    (tests/test_ray_cluster.py, under a CPU hog) caught it in `ray.get`'s object
    iterator, in `_call_stub` and in the channel's `integrated_call` while a
    `poll.remote()` was being sent. In the last the driver then hung for minutes in the
    next gRPC call (a lock of the channel left held) until killed. An interrupted `get`
    or `poll` drops what that poll dequeued on the actor: one actor's records of its
    requests in flight never came, in a CI run and in one of ten runs here. A second
    signal goes to the handler that was there before. The grace for the actors' records
    is latched by a latch of its own, so a second Ctrl-C ends it at once, between waits.
    Main thread only; elsewhere the handlers stay as they are."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.fired: int | None = None
        self._prev: dict[int, Any] = {}

    def __enter__(self) -> InterruptLatch:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                prev = signal.getsignal(sig)
                if callable(prev):  # a Python handler that raises: latch it
                    self._prev[sig] = prev
                    signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.fired is None:
            self.fired = signum
            return
        self._prev[signum](signum, frame)

    def check(self) -> None:
        """Raise the latched interrupt, once (the handlers given back first)."""
        if self.fired is not None and self._prev:
            self.restore()
            raise KeyboardInterrupt

    def restore(self) -> None:
        for sig, prev in self._prev.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, prev)
        self._prev.clear()

    def __exit__(self, *exc: object) -> None:
        self.restore()


class RayUnavailable(StrataError, RuntimeError):
    """Ray is not installed, or the cluster cannot take the load (with what to do)."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable(f'[load] engine = "ray" needs Ray installed: {INSTALL}') from None
    return ray


@dataclass(frozen=True)
class ActorClock:
    """``actor_monotonic - driver_monotonic`` (ns), within ``± error_ns``."""

    offset_ns: int
    error_ns: int


def measure_clock(ray: Any, actor: Any, rounds: int = CLOCK_ROUNDS) -> ActorClock:
    best: tuple[int, int] | None = None  # (rtt, offset)
    for _ in range(rounds):
        t0 = time.monotonic_ns()
        remote = ray.get(actor.clock.remote(), timeout=30)
        t1 = time.monotonic_ns()
        if best is None or t1 - t0 < best[0]:
            best = (t1 - t0, remote - (t0 + t1) // 2)
    assert best is not None
    return ActorClock(best[1], best[0] // 2)


def shift_record(rec: RequestRecord, delta_ns: int) -> RequestRecord:
    """``rec`` with every CLOCK_MONOTONIC stamp moved by ``delta_ns`` (0 stays 0: unset)."""
    @overload
    def s(t: int) -> int: ...
    @overload
    def s(t: int | None) -> int | None: ...
    def s(t: int | None) -> int | None:
        return t + delta_ns if t else t

    extra = {k: (v + delta_ns if k.endswith("_ns") and isinstance(v, int) and v else v)
             for k, v in rec.extra.items()}
    events = tuple(TokenEvent(e.t_ns + delta_ns, e.n_tokens, e.kind,
                              e.handled_ns + delta_ns if e.handled_ns else 0)
                   for e in rec.events)
    return replace(rec, scheduled_ns=s(rec.scheduled_ns), dispatched_ns=s(rec.dispatched_ns),
                   first_byte_ns=s(rec.first_byte_ns), done_ns=s(rec.done_ns), events=events,
                   extra=extra)


def connect(ray: Any, spec: LoadSpec, runtime_env: dict[str, Any],
            timeout_s: float = CONNECT_TIMEOUT_S, retry_s: float = CONNECT_RETRY_S,
            clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep) -> None:
    """``ray.init`` on ``spec.address``, retrying the head's transient answers
    (``TRANSIENT_CONNECT``) until ``timeout_s``; anything else fails at once."""
    deadline = clock() + timeout_s
    attempts = 0
    while True:
        attempts += 1
        try:
            ray.init(address=spec.address, namespace=spec.namespace,
                     runtime_env=runtime_env or None, log_to_driver=False,
                     logging_level="WARNING")
            return
        except Exception as e:
            transient = any(t in str(e) for t in TRANSIENT_CONNECT)
            with contextlib.suppress(Exception):
                ray.shutdown()  # a half-made client connection is not reused
            if transient and clock() + retry_s < deadline:
                sleep(retry_s)
                continue
            if transient:
                why = (f"the head's Ray Client server did not start a server for this driver "
                       f"in {attempts} attempts over {timeout_s:.0f} s (its "
                       f"ray_client_server_*.err, in the head's session logs, says why)")
            else:
                why = "not retried: not a transient answer of the head"
            raise RayUnavailable(
                f"[load] address = {spec.address!r}: could not connect to the Ray cluster "
                f"({type(e).__name__}: {e}); {why}") from e


class RayActors:
    """Connected to the cluster, a placement group and its actors; all undone on exit."""

    def __init__(self, spec: LoadSpec, wanted: int) -> None:
        self.spec, self.wanted = spec, wanted
        self.ray = import_ray()
        self.connected_here = False
        self.pg: Any = None
        self.actors: list[Any] = []
        self.where: list[dict[str, Any]] = []
        self.nodes = 0

    def __enter__(self) -> RayActors:
        ray, spec = self.ray, self.spec
        try:
            if not ray.is_initialized():
                env: dict[str, Any] = {}
                if spec.ship_package:
                    env["py_modules"] = [str(PACKAGE_DIR)]
                connect(ray, spec, env)
                self.connected_here = True
            alive = [n for n in ray.nodes() if n.get("Alive")]
            self.nodes = min(spec.nodes or len(alive), len(alive))
            n = max(1, min(self.wanted, self.nodes * spec.workers_per_node))
            bundle = {"CPU": spec.num_cpus, **dict(spec.resources)}
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            self.pg = placement_group([dict(bundle) for _ in range(n)], strategy="SPREAD",
                                      name=f"strata-load-{time.time_ns()}")
            ready, _ = ray.wait([self.pg.ready()], timeout=PLACE_TIMEOUT_S)
            if not ready:
                raise RayUnavailable(
                    f"[load] the Ray cluster at {spec.address} could not place {n} load "
                    f"actors of {bundle} each within {PLACE_TIMEOUT_S:.0f} s (it has "
                    f"{ray.cluster_resources()}); lower workers_per_node or num_cpus, or "
                    "add nodes")
            from strata_plugin.load.ray_actor import LoadActor

            cls = ray.remote(max_concurrency=4)(LoadActor)
            for i in range(n):
                self.actors.append(cls.options(
                    num_cpus=spec.num_cpus, resources=dict(spec.resources) or None,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self.pg, placement_group_bundle_index=i)).remote())
            self.where = ray.get([a.where.remote() for a in self.actors],
                                 timeout=PLACE_TIMEOUT_S)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        ray = self.ray
        for a in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        self.actors = []
        if self.pg is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(self.pg)
            self.pg = None
        if self.connected_here:
            with contextlib.suppress(Exception):
                ray.shutdown()
            self.connected_here = False


def run_load_on_ray(
    jobs: Sequence[Job],
    *,
    spec: LoadSpec,
    base_url: str,
    api: str,
    concurrency: int,
    timeouts: Timeouts,
    headers: dict[str, str] | None = None,
    counters: Counters | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    progress: Progress | None = None,
    on_token_mark: Callable[[str, int], None] | None = None,
    token_mark: int = 1,
    keep_alive: bool = False,
) -> LoadResult:
    """``generator.run_load``'s contract, over Ray actors. ``counters`` (the server's
    /proc, on this host) are not read: the actors run elsewhere."""
    hdrs = dict(headers or {})
    if not keep_alive:
        hdrs["Connection"] = "close"

    def record(rec: RequestRecord) -> None:
        if on_record:
            on_record(rec)
        if progress:
            progress.add(rec)

    with RayActors(spec, max(1, min(concurrency, len(jobs)))) as ra:
        return _run(ra, jobs, base_url, api, concurrency, timeouts, hdrs, record,
                    on_token_mark, token_mark)


def _run(ra: RayActors, jobs: Sequence[Job], base_url: str, api: str, concurrency: int,
         timeouts: Timeouts, headers: dict[str, str], record: Callable[[RequestRecord], None],
         on_token_mark: Callable[[str, int], None] | None, token_mark: int) -> LoadResult:
    ray = ra.ray
    n = len(ra.actors)
    clocks = [measure_clock(ray, a) for a in ra.actors]
    offsets = [(j.spec, None if j.offset_s is None else int(j.offset_s * 1e9)) for j in jobs]
    parts, shares = pool.deal(len(jobs), concurrency, n)
    lost: dict[int, str] = {}
    names = [f"actor {k} on {w.get('ip') or w.get('host')}" for k, w in enumerate(ra.where)]
    for k in range(len(parts)):
        batch = Batch([offsets[i] for i in parts[k]], base_url, api, shares[k], timeouts,
                      headers, token_mark if on_token_mark is not None else None, None, True)
        ra.actors[k].start.remote(batch)
    polls: dict[Any, int] = {}
    heard = [time.monotonic() for _ in parts]
    done: set[int] = set()
    reports: dict[int, ShardReport] = {}
    out: list[RequestRecord | None] = [None] * len(jobs)
    prepared: set[int] = set()
    start_ns = 0
    interrupted = [False]

    def handle(k: int, msg: Any) -> None:
        off = clocks[k].offset_ns
        if msg == "done":
            done.add(k)
        elif msg[0] == "prepared":
            prepared.add(k)
        elif msg[0] == "recs":
            for local_i, rec in msg[1]:
                if interrupted[0] and not rec.dispatched_ns:
                    continue  # never sent: not a request the server saw
                rec = shift_record(rec, -off)
                out[parts[k][local_i]] = rec
                record(rec)
        elif msg[0] == "mark":
            if on_token_mark is not None:
                on_token_mark(msg[1], msg[2] - off)
        elif msg[0] == "stats":
            rep: ShardReport = msg[1]
            reports[k] = replace(rep, start_ns=rep.start_ns - off, end_ns=rep.end_ns - off)
        elif msg[0] == "error":
            lost[k] = f"{names[k]} failed: {msg[1]}"

    def pump(until: Callable[[], bool]) -> None:
        for k in range(len(parts)):
            if k not in done and k not in lost and k not in polls.values():
                polls[ra.actors[k].poll.remote(0.25)] = k
        while not until() and polls:
            latch.check()
            ready, _ = ray.wait(list(polls), num_returns=1, timeout=0.5)
            for ref in ready:
                k = polls.pop(ref)
                try:
                    msgs = ray.get(ref)
                except Exception as e:  # (RayActorError, node lost, ...)
                    lost[k] = f"{names[k]} lost mid-case: {type(e).__name__}: " \
                              f"{str(e).splitlines()[0][:200] if str(e) else ''}"
                    continue
                heard[k] = time.monotonic()
                for m in msgs:
                    handle(k, m)
                if k not in done and k not in lost:
                    polls[ra.actors[k].poll.remote(0.25)] = k
            now = time.monotonic()
            for ref, k in list(polls.items()):
                if now - heard[k] > LOST_AFTER_S:
                    lost[k] = f"{names[k]} lost mid-case: no answer for {LOST_AFTER_S:.0f} s"
                    del polls[ref]

    latch = InterruptLatch()
    pump(lambda: all(k in prepared or k in lost for k in range(len(parts))))
    start_ns = time.monotonic_ns() + int(LEAD_S * 1e9)
    for k in range(len(parts)):
        if k not in lost:
            ra.actors[k].go.remote(start_ns + clocks[k].offset_ns)
    try:
        with latch:
            pump(lambda: all(k in done or k in lost for k in range(len(parts))))
            latch.check()  # a signal during the last wait
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM: keep what the actors saw, as one loop does
        interrupted[0] = True
        # the grace latched too: a second Ctrl-C ends it between waits, not inside a
        # gRPC call that the cleanup after it needs
        latch = InterruptLatch()
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        with contextlib.suppress(KeyboardInterrupt), latch:
            for k in range(len(parts)):
                if k not in done and k not in lost:
                    ra.actors[k].interrupt.remote()
            pump(lambda: time.monotonic() > deadline
                 or all(k in done or k in lost for k in range(len(parts))))
        silent = [names[k] for k in range(len(parts)) if k not in done and k not in lost]
        if silent:  # their requests in flight have no record: say so, in the user's terms
            print(f"strata: interrupted; no records came from {', '.join(silent)} within "
                  f"{INTERRUPT_GRACE_S:.0f} s: their requests in flight are not recorded",
                  file=sys.stderr, flush=True)
        raise
    end_ns = time.monotonic_ns()
    after = {}
    for k in range(len(parts)):
        if k not in lost:
            with contextlib.suppress(Exception):
                after[k] = measure_clock(ray, ra.actors[k], 4)
    records = []
    for i, rec in enumerate(out):
        if rec is None:
            k = i % len(parts)
            rec = pool.lost_record(offsets[i], api, lost.get(k, f"{names[k]} sent no record"),
                                   start_ns)
            record(rec)
        records.append(rec)
    errors_ns = [c.error_ns + (abs(after[k].offset_ns - c.offset_ns) if k in after else 0)
                 for k, c in enumerate(clocks)]
    views = [ShardView(f"actor {k}", ra.where[k].get("ip") or ra.where[k].get("host", ""),
                        shares[k], tuple(records[i] for i in parts[k]), reports.get(k),
                        lost.get(k)) for k in range(len(parts))]
    node_ids = {w.get("node_id") or w.get("ip") for w in ra.where}
    check = sharded_check(records, views, engine="ray",
                          placement=(f"{len(parts)} actors on {len(node_ids)} of {ra.nodes} "
                                     f"Ray nodes ({ra.spec.workers_per_node} a node at most, "
                                     f"placement group SPREAD) at {ra.spec.address}"),
                          hosts=len(node_ids), clock_error_ms=max(errors_ns) / 1e6,
                          open_loop=any(j.offset_s is not None for j in jobs))
    for k, p in enumerate(check.per_process):
        p.update(clock_offset_ms=clocks[k].offset_ns / 1e6, clock_error_ms=errors_ns[k] / 1e6,
                 node_id=ra.where[k].get("node_id"))
    return LoadResult(tuple(records), start_ns, window_end(records, end_ns), check)

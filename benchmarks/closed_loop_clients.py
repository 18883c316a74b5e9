"""The closed-loop shape of the capacity benchmark, and the two reference clients.

A real closed loop opens new streams all the time while others stream: when a
request ends, the next one is sent at once. Here ``2 x N`` requests run N at a
time against the loopback emitter, which starts streaming as soon as it reads a
request (events 20 ms apart, each carrying its send time); each request asks for
50-150 events (seeded), so streams end, and new ones open, throughout the run,
and the first N open together (the ramp). Handling delay = when the client had
parsed an event minus when the emitter sent it (one CLOCK_MONOTONIC).

Clients, all closed loops of the same jobs with a connection per request:

* ``loop``: Strata's ``generator.run_load`` (one loop sends and reads every stream);
* ``pool``: Strata's ``ShardedStreamRunner`` (that loop in ``default_processes(N)``
  worker processes, started before the run);
* ``threads``: a plain thread-per-stream client, ``requests`` + ``sseclient-py``;
* ``aiohttp``: a single asyncio loop (aiohttp, ``async for line in resp.content``).
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import requests
from sseclient import SSEClient

from strata_plugin.load.client import RequestSpec, Timeouts
from strata_plugin.load.generator import Job, LoadParams, run_load
from strata_plugin.testing.emitter import sent_stamps
from strata_plugin.testing.stream_pool import ShardedStreamRunner

INTERVAL_S = 0.02
EVENTS = (50, 150)  # per request, uniform
TIMEOUTS = Timeouts(connect_s=30, read_s=30)


@dataclass(frozen=True)
class Run:
    """What one client run gave: (sent_ns, handled_ns) per event, the events asked for."""

    pairs: list[tuple[int, int]]
    expected: int
    errors: int
    cpu_s: float
    wall_s: float
    self_check: object | None = None  # ours: the load generator's SelfCheck


def specs(n_requests: int, seed: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    extra = (("emit_interval_s", INTERVAL_S),)
    return [
        RequestSpec(f"c{i}", "closed", "measured", rng.randint(*EVENTS), prompt="x",
                    extra_body=extra)
        for i in range(n_requests)
    ]


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _ours(recs: Sequence, expected: int, cpu: float, wall: float, sc: object = None) -> Run:
    pairs = []
    errors = 0
    for r in recs:
        errors += r.error is not None
        sent = sent_stamps(r.output_text)
        pairs.extend((s, e.handled_ns) for s, e in zip(sent, r.events, strict=False))
    return Run(pairs, expected, errors, cpu, wall, sc)


def run_loop(url: str, jobs: list[RequestSpec], n: int) -> Run:
    cpu0, t0 = _cpu(), time.monotonic()
    res = run_load([Job(s) for s in jobs], LoadParams(base_url=url, api="chat", concurrency=n,
                                                      timeouts=TIMEOUTS))
    return _ours(res.records, sum(s.max_tokens for s in jobs), _cpu() - cpu0,
                 time.monotonic() - t0, res.self_check)


def run_pool(runner: ShardedStreamRunner, url: str, jobs: list[RequestSpec], n: int) -> Run:
    cpu0, t0 = _cpu() + runner.cpu_s(), time.monotonic()
    recs = runner.run([(s, 0) for s in jobs], url, "chat", concurrency=n, timeouts=TIMEOUTS,
                      headers={"Connection": "close"})
    cpu = _cpu() + runner.cpu_s() - cpu0
    stats = getattr(runner, "loop_stats", None)
    return _ours(recs, sum(s.max_tokens for s in jobs), cpu, time.monotonic() - t0, stats)


def _body(spec: RequestSpec) -> dict:
    return {"model": "emitter", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": spec.max_tokens, "stream": True, "emit_interval_s": INTERVAL_S}


def _stamps(data: str, now: int, out: list[tuple[int, int]]) -> None:
    obj = json.loads(data)
    for ch in obj.get("choices") or ():
        text = (ch.get("delta") or {}).get("content")
        if text:
            out.extend((s, now) for s in sent_stamps(text))


def run_threads(url: str, jobs: list[RequestSpec], n: int) -> Run:
    """A thread per in-flight stream: requests (stream=True) and sseclient-py."""
    cpu0, t0 = _cpu(), time.monotonic()
    it = iter(jobs)
    lock = threading.Lock()
    per: list[list[tuple[int, int]]] = []
    errors = [0]

    def slot() -> None:
        got: list[tuple[int, int]] = []
        per.append(got)
        with requests.Session() as s:
            while True:
                with lock:
                    spec = next(it, None)
                if spec is None:
                    return
                try:
                    with s.post(url + "/v1/chat/completions", json=_body(spec), stream=True,
                                headers={"Connection": "close"},
                                timeout=(TIMEOUTS.connect_s, TIMEOUTS.read_s)) as resp:
                        for ev in SSEClient(resp.iter_content(chunk_size=None)).events():
                            if ev.data == "[DONE]":
                                break
                            _stamps(ev.data, time.monotonic_ns(), got)
                except (requests.RequestException, ValueError):
                    errors[0] += 1

    threads = [threading.Thread(target=slot, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pairs = [p for got in per for p in got]
    return Run(pairs, sum(s.max_tokens for s in jobs), errors[0], _cpu() - cpu0,
               time.monotonic() - t0)


def run_aiohttp(url: str, jobs: list[RequestSpec], n: int) -> Run:
    """One asyncio loop: n aiohttp tasks, each reading its stream line by line."""
    import aiohttp

    cpu0, t0 = _cpu(), time.monotonic()
    got: list[tuple[int, int]] = []
    errors = [0]

    async def main() -> None:
        it = iter(jobs)
        conn = aiohttp.TCPConnector(limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(sock_connect=TIMEOUTS.connect_s,
                                        sock_read=TIMEOUTS.read_s)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:

            async def slot() -> None:
                for spec in it:
                    try:
                        async with s.post(url + "/v1/chat/completions", json=_body(spec)) as resp:
                            async for line in resp.content:
                                if not line.startswith(b"data: "):
                                    continue
                                data = line[6:].strip()
                                if data == b"[DONE]":
                                    break
                                _stamps(data.decode(), time.monotonic_ns(), got)
                    except (aiohttp.ClientError, TimeoutError, ValueError):
                        errors[0] += 1

            await asyncio.gather(*(slot() for _ in range(n)))

    asyncio.run(main())
    return Run(got, sum(s.max_tokens for s in jobs), errors[0], _cpu() - cpu0,
               time.monotonic() - t0)

"""The serving engine's own Prometheus ``/metrics``, scraped each interval in a thread.

The text exposition format is parsed with the standard library. Known names of
llama.cpp (``llamacpp:``), vLLM (``vllm:``) and SGLang (``sglang:``) are mapped
onto common names (:data:`ALIASES`: ``running_requests``, ``waiting_requests``,
``kv_cache_usage`` (0..1), ``prompt_tokens_total``, ``generation_tokens_total``,
``ttft_seconds_*``...). Each common name lists several candidates, first
present wins, and ``:`` and ``_`` are interchangeable after the prefix, so a
renamed metric still lands; every unknown metric is kept under its raw name.

Labels become the device, ``k=v`` joined with ``;`` and sorted (``model_name``
is dropped from it and reported once in an ``info`` line). Counters,
histogram buckets/sums/counts are ``counter``; everything else ``gauge``.
Samples are stamped with the midpoint of the HTTP request.

A scrape reads at most :data:`PROM_BODY_BYTES_MAX` bytes of the body, within
``timeout_s`` in all: an endless or trickling body fails the scrape with its reason
("no samples: ... exceeded N bytes"), which reaches unavailable.json and the report,
instead of growing the agent without bound (to 7.3 GB in 9 s on 449ac52, here).
"""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .base import Collector, Emit, Missing, Unavailable

if TYPE_CHECKING:
    import argparse

    from ..targets import ProcessTargets

ALIASES: dict[str, dict[str, tuple[str, ...]]] = {
    "llamacpp": {
        "prompt_tokens_total": ("llamacpp:prompt_tokens_total",),
        "generation_tokens_total": ("llamacpp:tokens_predicted_total",),
        "prompt_seconds_total": ("llamacpp:prompt_seconds_total",),
        "generation_seconds_total": ("llamacpp:tokens_predicted_seconds_total",),
        "decode_calls_total": ("llamacpp:n_decode_total",),
        "busy_slots_per_decode": ("llamacpp:n_busy_slots_per_decode",),
        "prompt_tokens_per_s": ("llamacpp:prompt_tokens_seconds",),
        "generation_tokens_per_s": ("llamacpp:predicted_tokens_seconds",),
        "running_requests": ("llamacpp:requests_processing",),
        "waiting_requests": ("llamacpp:requests_deferred",),
        "kv_cache_usage": ("llamacpp:kv_cache_usage_ratio",),
        "kv_cache_tokens": ("llamacpp:kv_cache_tokens",),
    },
    "vllm": {
        "running_requests": ("vllm:num_requests_running",),
        "waiting_requests": ("vllm:num_requests_waiting",),
        "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "prompt_tokens_total": ("vllm:prompt_tokens_total",),
        "generation_tokens_total": ("vllm:generation_tokens_total",),
        "cached_prompt_tokens_total": ("vllm:prompt_tokens_cached_total",),
        "preemptions_total": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
        "prefix_cache_queries_total": (
            "vllm:prefix_cache_queries_total",
            "vllm:gpu_prefix_cache_queries_total",
        ),
        "prefix_cache_hits_total": (
            "vllm:prefix_cache_hits_total",
            "vllm:gpu_prefix_cache_hits_total",
        ),
        "iteration_tokens": ("vllm:iteration_tokens_total",),
        "ttft_seconds": ("vllm:time_to_first_token_seconds",),
        "itl_seconds": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        "e2e_seconds": ("vllm:e2e_request_latency_seconds",),
        "queue_time_seconds": ("vllm:request_queue_time_seconds",),
        "prefill_time_seconds": ("vllm:request_prefill_time_seconds",),
        "decode_time_seconds": ("vllm:request_decode_time_seconds",),
        "requests_finished_total": ("vllm:request_success_total",),
    },
    "sglang": {
        "running_requests": ("sglang:num_running_reqs",),
        "waiting_requests": ("sglang:num_queue_reqs",),
        "kv_cache_usage": ("sglang:token_usage",),
        "kv_cache_tokens": ("sglang:num_used_tokens",),
        "prompt_tokens_total": ("sglang:prompt_tokens_total",),
        "generation_tokens_total": ("sglang:generation_tokens_total",),
        "cached_prompt_tokens_total": ("sglang:cached_tokens_total",),
        "retracted_requests_total": ("sglang:num_retracted_requests_total",),
        "requests_finished_total": ("sglang:num_requests_total",),
        "generation_tokens_per_s": ("sglang:gen_throughput",),
        "ttft_seconds": ("sglang:time_to_first_token_seconds",),
        "itl_seconds": ("sglang:inter_token_latency_seconds",),
        "e2e_seconds": ("sglang:e2e_request_latency_seconds",),
        "queue_time_seconds": ("sglang:queue_time_seconds",),
    },
}
#: Bytes of one /metrics body. vLLM 0.32's (CPU build, one engine) measured 52,818 bytes
#: (430 samples); eight engines, each series once per ``engine`` label, about 0.4 MB: the
#: bound is 10x that. The agent parses 90 to 185 ms a MiB on the 2-core development VM, so
#: a scrape at the bound costs under a second of one core. Stated here, not in
#: strata_plugin/limits.py, which lists it: the agent ships as a standard-library zip
#: that cannot import the package.
PROM_BODY_BYTES_MAX = 4 << 20
HIST_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created", "_gcount", "_gsum")
DROP_LABELS = frozenset({"model_name"})
_LABEL_RX = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True)
class PromSample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    family: str
    type: str  # counter | gauge | histogram | summary | untyped


def _unescape(v: str) -> str:
    if "\\" not in v:
        return v
    return v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def _family(name: str, types: dict[str, str]) -> str:
    if name in types:
        return name
    for suf in HIST_SUFFIXES:
        if name.endswith(suf) and name[: -len(suf)] in types:
            return name[: -len(suf)]
    return name


def parse_exposition(text: str) -> list[PromSample]:
    """Parse Prometheus text exposition (0.0.4); malformed lines are skipped."""
    types: dict[str, str] = {}
    rows: list[tuple[str, tuple[tuple[str, str], ...], float]] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            if line.startswith("# TYPE "):
                parts = line.split()
                if len(parts) >= 4:
                    types[parts[2]] = parts[3]
            continue
        brace = line.find("{")
        space = line.find(" ")
        labels: list[tuple[str, str]] = []
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            pos = brace + 1
            while True:
                m = _LABEL_RX.match(line, pos)
                if not m:
                    break
                labels.append((m.group(1), _unescape(m.group(2))))
                pos = m.end()
            close = line.find("}", pos)
            if close == -1:
                continue
            rest = line[close + 1 :].split()
        else:
            parts = line.split()
            name, rest = parts[0], parts[1:]
        if not rest:
            continue
        try:
            value = float(rest[0])
        except ValueError:
            continue
        rows.append((name.strip(), tuple(labels), value))
    out = []
    for name, row_labels, value in rows:
        fam = _family(name, types)
        out.append(PromSample(name, row_labels, value, fam, types.get(fam, "untyped")))
    return out


def _norm(name: str) -> str:
    return name.replace(":", "_")


def detect_engine(samples: list[PromSample]) -> str:
    counts = {e: 0 for e in ALIASES}
    for s in samples:
        prefix = s.name.split(":", 1)[0] if ":" in s.name else s.name.split("_", 1)[0]
        if prefix in counts:
            counts[prefix] += 1
    best = max(counts, key=lambda e: counts[e])
    return best if counts[best] else "unknown"


def kind_of(s: PromSample) -> str:
    if s.type in ("counter", "histogram"):
        return "counter"
    if s.type == "summary":
        return "counter" if s.name.endswith(("_sum", "_count")) else "gauge"
    if s.type == "untyped" and s.name.endswith("_total"):
        return "counter"
    return "gauge"


class NameMapper:
    """Raw family -> common name, first present candidate winning."""

    def __init__(self) -> None:
        self._map: dict[str, str] = {}
        self._families: frozenset[str] = frozenset()

    def update(self, families: set[str]) -> dict[str, str]:
        if families <= self._families:
            return self._map
        self._families = frozenset(families)
        by_norm = {_norm(f): f for f in families}
        mapping: dict[str, str] = {}
        for engine_map in ALIASES.values():
            for common, candidates in engine_map.items():
                if common in mapping.values():
                    continue
                for cand in candidates:
                    raw = by_norm.get(_norm(cand))
                    if raw is None and cand.endswith("_total"):
                        # OpenMetrics style: family "x" with sample "x_total"
                        raw = by_norm.get(_norm(cand[: -len("_total")]))
                    if raw is not None and raw not in mapping:
                        mapping[raw] = common
                        break
        self._map = mapping
        return mapping

    def name(self, s: PromSample, mapping: dict[str, str]) -> str:
        common = mapping.get(s.family)
        if common is None:
            return s.name
        suffix = s.name[len(s.family) :]
        if suffix == "_total" and common.endswith("_total"):
            suffix = ""
        return common + suffix


class BodyRefused(ValueError):
    """An HTTP body past its byte limit or its time: the message says which."""


def read_bounded(resp: Any, max_bytes: int, deadline: float | None = None,
                 what: str = "body") -> bytes:
    """At most ``max_bytes`` of ``resp`` (an http.client response), read a piece at a time
    (``read1``: whatever one read brings, so ``deadline`` is checked between reads);
    BodyRefused past either. A ``Content-Length`` over the limit is refused unread."""
    length = resp.headers.get("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) > max_bytes:
        raise BodyRefused(f"{what} exceeded {max_bytes} bytes (Content-Length {int(length)})")
    parts: list[bytes] = []
    n = 0
    while True:
        piece = resp.read1(65536)
        if not piece:
            return b"".join(parts)
        n += len(piece)
        if n > max_bytes:
            raise BodyRefused(f"{what} exceeded {max_bytes} bytes")
        parts.append(piece)
        if deadline is not None and time.monotonic() > deadline:
            raise BodyRefused(f"{what} still arriving after the scrape's timeout "
                              f"({n} bytes read)")


#: The environment variable that carries the ``Authorization`` value of the scrape (a
#: server reached with ``http://user:pw@host``): by environment, never by argv, which
#: every local user can read (/proc/PID/cmdline); the environment only its owner.
AUTH_ENV = "STRATA_PROM_AUTHORIZATION"


def scrape(url: str, timeout_s: float, authorization: str | None = None,
           max_bytes: int = PROM_BODY_BYTES_MAX) -> str:
    """The body of ``url``: at most ``max_bytes``, all of it within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    headers = {"Accept": "text/plain"}
    if authorization:
        headers["Authorization"] = authorization
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        body = read_bounded(resp, max_bytes, deadline, "/metrics body")
    return body.decode("utf-8", errors="replace")


class PromCollector(Collector):
    source = "prom"

    def __init__(self, url: str, interval_s: float = 0.5, timeout_s: float | None = None) -> None:
        super().__init__()
        self.url = url
        self.authorization = os.environ.get(AUTH_ENV) or None
        self.interval_s = interval_s
        self.timeout_s = timeout_s if timeout_s is not None else max(0.2, min(5.0, interval_s * 4))
        self.mapper = NameMapper()
        self.engine = "unknown"
        self._queue: deque[Emit] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error: str | None = None
        self._announced = False

    def probe(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise Unavailable(f"--prom-url must be http(s)://...: {self.url!r}")
        self._thread = threading.Thread(target=self._loop, name="prom-scrape", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            self.scrape_once()
            next_t += self.interval_s
            now = time.monotonic()
            if next_t < now:
                next_t = now + self.interval_s
            self._stop.wait(next_t - now)

    def scrape_once(self) -> None:
        t0 = time.time_ns()
        m0 = time.monotonic()
        try:
            text = scrape(self.url, self.timeout_s, self.authorization)
        except urllib.error.HTTPError as e:
            hint = {404: " (llama.cpp serves /metrics only with --metrics)",
                    401: " (it wants credentials: give them in the server's URL, "
                    "http://user:password@host:port)" if not self.authorization else
                    " (the credentials given were refused)"}.get(e.code, "")
            self._fail(f"HTTP {e.code} from {self.url}{hint}", t0)
            return
        except BodyRefused as e:
            self._fail(f"no samples: {e} ({self.url}; the agent reads at most "
                       f"{PROM_BODY_BYTES_MAX} bytes in {self.timeout_s:g} s a scrape)", t0)
            return
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            self._fail(f"{self.url}: {reason}", t0)
            return
        wall = (t0 + time.time_ns()) // 2
        dur = time.monotonic() - m0
        samples = parse_exposition(text)
        mapping = self.mapper.update({s.family for s in samples})
        if not self._announced and samples:
            self._announced = True
            self.engine = detect_engine(samples)
            models = sorted({v for s in samples for k, v in s.labels if k == "model_name"})
            self.info(
                kind="prom",
                source=self.source,
                engine=self.engine,
                url=self.url,
                mapping=mapping,
                model_names=models,
            )
        q = self._queue
        for s in samples:
            if s.name.endswith("_created"):
                continue
            dev = ";".join(f"{k}={v}" for k, v in sorted(s.labels) if k not in DROP_LABELS)
            q.append((wall, dev, self.mapper.name(s, mapping), s.value, kind_of(s)))
        q.append((wall, "", "scrape_ok", 1, "gauge"))
        q.append((wall, "", "scrape_s", dur, "gauge"))
        self._last_error = None

    def _fail(self, reason: str, wall: int) -> None:
        self._queue.append((wall, "", "scrape_ok", 0, "gauge"))
        if reason != self._last_error:
            self._last_error = reason
            self.mark_unavailable("scrape", reason)
            self.event(kind="scrape_error", source=self.source, wall_ns=wall, reason=reason)

    def sample(self, wall_ns: int) -> list[Emit]:
        out = []
        q = self._queue
        while q:
            out.append(q.popleft())
        return out

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 1)


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory (``registry.py``): the agent's options -> this collector."""
    if not args.prom_url:
        return Missing(PromCollector.source, "no --prom-url given")
    return PromCollector(args.prom_url, args.prom_interval or args.interval)

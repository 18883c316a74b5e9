"""Workloads: what one case asks of the server, and the exact prompts it sends.

Prompts are token-ID lists where the API takes them, so the input length is
exact, not approximated through a tokenizer; on the chat API they are text built to the
server's own templated count (load/chat_prompts.py), or the user's own texts. A cold
prefix gives every request its own random tokens from the first position (no
prompt-cache hit possible);
a shared prefix starts every request with the same N tokens. Arrival is a
closed loop at a concurrency, or an open loop at a rate (Poisson, or gamma with
vLLM's burstiness: shape = burstiness, mean gap = 1 / rate).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from strata_plugin.limits import (
    MAX_ISL,
    MAX_OSL,
    MAX_REQUESTS,
    PREPARED_BYTES_MAX,
    prepared_bytes,
)

ARRIVALS = ("closed", "poisson", "gamma")
PREFIX_MODES = ("cold", "shared")


@dataclass(frozen=True)
class Workload:
    name: str
    isl: int
    osl: int
    concurrency: int = 1
    requests: int = 1  # measured requests
    warmups: int = 0
    seed: int = 0
    prefix: str = "cold"
    shared_prefix_tokens: int = 0
    arrival: str = "closed"
    rate: float | None = None  # requests/s for open loops
    burstiness: float = 1.0
    expect_stop: bool = False  # True: the case expects a natural stop, not the length cap
    #: a JSONL file of the user's own prompts or conversations (load/chat_prompts.py,
    #: docs/writing-cases.md), sent in order, round-robin; ``isl`` is then 0: each
    #: prompt's length is its own, as the server counts it
    texts: str | None = None

    def __post_init__(self) -> None:
        if self.texts is not None:
            if self.isl != 0:
                raise ValueError(f"{self.name}: with texts, each prompt's length is its own: "
                                 f"set isl=0 (got isl={self.isl})")
            if self.prefix == "shared":
                raise ValueError(f"{self.name}: texts are sent as written: no shared prefix")
        elif self.isl < 1:
            raise ValueError(f"{self.name}: isl and osl must be >= 1")
        if self.osl < 1:
            raise ValueError(f"{self.name}: isl and osl must be >= 1")
        if self.concurrency < 1 or self.requests < 1 or self.warmups < 0:
            raise ValueError(f"{self.name}: concurrency/requests must be >= 1, warmups >= 0")
        if self.prefix not in PREFIX_MODES:
            raise ValueError(f"{self.name}: prefix must be one of {PREFIX_MODES}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"{self.name}: arrival must be one of {ARRIVALS}")
        if self.arrival != "closed" and not (self.rate and self.rate > 0):
            raise ValueError(f"{self.name}: an open-loop arrival needs rate > 0")
        if self.prefix == "shared" and not 0 < self.shared_prefix_tokens <= self.isl:
            raise ValueError(f"{self.name}: shared prefix needs 0 < shared_prefix_tokens <= isl")
        if self.rate is not None and not math.isfinite(self.rate):
            raise ValueError(f"{self.name}: rate={self.rate} is not a finite number of requests "
                             "a second; to send every request at once use arrival=closed with "
                             "concurrency=requests")
        if not (math.isfinite(self.burstiness) and self.burstiness > 0):
            raise ValueError(f"{self.name}: burstiness must be a finite number > 0, got "
                             f"{self.burstiness}")
        self._check_limits()

    def _check_limits(self) -> None:
        """The input limits (strata_plugin/limits.py), checked before a prompt is built:
        each key against its ceiling, then the phases' prepared size."""
        for key, value, ceiling, limit in (
                ("isl", self.isl, MAX_ISL, "MAX_ISL"), ("osl", self.osl, MAX_OSL, "MAX_OSL"),
                ("requests", self.requests, MAX_REQUESTS, "MAX_REQUESTS"),
                ("warmups", self.warmups, MAX_REQUESTS, "MAX_REQUESTS")):
            if value > ceiling:
                raise ValueError(f"{self.name}: {key}={value} is more than {ceiling} "
                                 f"(limits.{limit})")
        n = max(self.requests, self.warmups)
        size = prepared_bytes(n, self.isl)
        if size > PREPARED_BYTES_MAX:
            raise ValueError(
                f"{self.name}: {n} requests of isl={self.isl} would take about "
                f"{size / 2**30:.1f} GiB prepared, more than {PREPARED_BYTES_MAX >> 30} GiB "
                "(limits.PREPARED_BYTES_MAX: every request of a phase is prepared before its "
                "clock starts); run fewer requests a case, or shorter prompts")

    def scaled(self, *, context: float = 1.0, concurrency: float = 1.0,
               output: float = 1.0) -> Workload:
        """The same workload shrunk (or grown) to what a target can hold."""
        return replace(
            self,
            isl=0 if self.texts is not None else max(1, round(self.isl * context)),
            osl=max(1, round(self.osl * output)),
            concurrency=max(1, round(self.concurrency * concurrency)),
            shared_prefix_tokens=max(0, round(self.shared_prefix_tokens * context)),
        )

    def params(self) -> dict:
        return {k: v for k, v in self.__dict__.items()
                if k != "name" and not (k == "texts" and v is None)}


@dataclass(frozen=True)
class TokenSpace:
    """Which token ids are safe to put in a random prompt (no BOS/EOS/specials)."""

    low: int
    high: int  # exclusive


def prompt_tokens(w: Workload, index: int, space: TokenSpace, *, salt: str = "") -> tuple[int, ...]:
    """The exact prompt of request ``index`` of a workload: deterministic per seed.

    ``salt`` separates runs that must not share a prompt cache (e.g. the run id),
    so a second run of the same seed is still cold.
    """
    if w.prefix == "shared":
        shared_rng = random.Random(f"{w.seed}:shared:{salt}")
        head = [shared_rng.randrange(space.low, space.high) for _ in range(w.shared_prefix_tokens)]
    else:
        head = []
    rng = random.Random(f"{w.seed}:{index}:{salt}")
    tail = [rng.randrange(space.low, space.high) for _ in range(w.isl - len(head))]
    return tuple(head + tail)


def arrival_offsets_s(w: Workload, n: int) -> list[float] | None:
    """Send times (seconds from case start) for an open loop; None for a closed loop."""
    if w.arrival == "closed":
        return None
    rng = random.Random(f"{w.seed}:arrivals")
    assert w.rate is not None
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        if w.arrival == "poisson":
            t += rng.expovariate(w.rate)
        else:  # gamma with shape = burstiness and mean 1/rate, as vLLM defines it
            t += rng.gammavariate(w.burstiness, 1.0 / (w.rate * w.burstiness))
    return out

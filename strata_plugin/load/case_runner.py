"""Running one case: warm-ups, measured requests, windows, and the checks.

This is what a test in ``cases/`` calls through the ``strata`` fixture. It
keeps every record on disk as it arrives, marks the case / warm-up / measured
windows on the timeline, and checks that the server did what was asked (ISL,
OSL, cold prefix) so a number is never reported for the wrong workload.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from strata_plugin.analysis.metrics import CaseMetrics, case_metrics, headline
from strata_plugin.analysis.sufficiency import SampleTarget
from strata_plugin.configure.load_spec import LoadSpec
from strata_plugin.errors import StrataError
from strata_plugin.formats.cases import CaseLine
from strata_plugin.formats.printable import printable
from strata_plugin.formats.records import ERROR_CLASSES, RequestRecord
from strata_plugin.limits import max_phase_requests
from strata_plugin.load.client import RequestSpec, Timeouts
from strata_plugin.load.generator import (
    Job,
    LoadParams,
    LoadResult,
    Progress,
    SelfCheck,
    run_load,
)
from strata_plugin.load.workload import TokenSpace, Workload, arrival_offsets_s, prompt_tokens

if TYPE_CHECKING:
    from strata_plugin.analysis.expectations import ABExpectation
    from strata_plugin.load.chat_prompts import ChatPrompter
    from strata_plugin.load.sweep import CapacitySweep, SweepResult
    from strata_plugin.load.trace import TraceWorkload


class NoTokens(StrataError, RuntimeError):
    """Every stream of a phase sent events and none parsed as a token: the profile's
    ``server.api`` is not what the server speaks. The message is the client's, with the
    raw first event."""


def no_tokens(records: tuple[RequestRecord, ...]) -> NoTokens | None:
    """The phase's error when no request got a token and one said why (``no_tokens``)."""
    if not records or any(r.events for r in records):
        return None
    why = next((r.error for r in records if r.error and r.error.cls == "no_tokens"), None)
    return NoTokens(why.message) if why else None


@dataclass(frozen=True)
class CaseSetup:
    """What a case needs from the session: where to send, how, and where to record."""

    base_url: str
    api: str
    config_id: str
    token_space: TokenSpace
    timeouts: Timeouts
    headers: dict[str, str] = field(default_factory=dict)
    salt: str = ""  # the run id: keeps a rerun of the same seed cold
    model: str | None = None
    scale: tuple[tuple[str, float], ...] = ()  # profile scaling of the nominal matrix
    block_id: str = ""  # the server process this case ran in (A/B blocks)
    engine: str = ""  # the profile's server.engine: how its prefix cache is flushed
    startup_s: float | None = None  # that server's start-up time, apart from measurements
    load: LoadSpec = field(default_factory=LoadSpec)  # [load]: one loop, the pool or Ray


INJECT_AFTER = ("first_tokens", "start")


@dataclass(frozen=True)
class Injection:
    """One extra request injected into the measured load (mixed A/B).

    With ``after="first_tokens"`` (the default) it is sent ``offset_s`` after every
    stream of the load (the first ``min(concurrency, requests)`` measured requests) has
    its first token: in steady-state decode, not during the load's own prefills, which
    at the seed's sizes (C=32 x 1K-token prompts) last long enough to swallow a fixed
    offset from the start. ``at_output`` moves that moment to when every stream has
    that share of its output (0.25: a quarter of the load's OSL): a point in decode
    progress rather than in seconds, so it lands inside the first round of streams
    whatever the machine's speed or the profile's scaling of the OSL. A fixed offset in
    seconds does not: where the load is several rounds of streams that start and end
    together, it lands on a round boundary on one repetition and mid-decode on the
    next. ``after="start"`` counts ``offset_s`` from the start of the measured load.
    The rule is the same in every repetition, so control and treatment differ only by
    the injected request; the moments it was placed and sent are in ``markers.csv``
    (events ``decode_steady`` and ``inject:<request id>``) and in the case's
    ``cases.jsonl`` line.
    """

    workload: Workload
    offset_s: float
    after: str = "first_tokens"
    at_output: float = 0.0

    def __post_init__(self) -> None:
        if self.after not in INJECT_AFTER:
            raise ValueError(f"Injection(after={self.after!r}): one of {', '.join(INJECT_AFTER)}")
        if self.offset_s < 0:
            raise ValueError(f"Injection offset_s must be >= 0, got {self.offset_s}")
        if not 0 <= self.at_output < 1:
            raise ValueError(f"Injection at_output is a share of the load's output, in [0, 1), "
                             f"got {self.at_output}")
        if self.at_output and self.after != "first_tokens":
            raise ValueError("Injection at_output counts the load's output tokens: it needs "
                             "after='first_tokens'")

    def token_mark(self, load_osl: int) -> int:
        """The output tokens every stream of a load of ``load_osl`` must have first."""
        return max(1, math.ceil(self.at_output * load_osl))

    def fields(self, load_osl: int) -> dict[str, object]:
        """Where it is placed, for the case line and the dry run's plan."""
        out: dict[str, object] = {"params": self.workload.params(), "offset_s": self.offset_s,
                                  "after": self.after}
        if self.after == "first_tokens":
            out.update(at_output=self.at_output, token_mark=self.token_mark(load_osl))
        return out

    @staticmethod
    def placement(fields: dict) -> str:
        """``+0.0 s after every stream has 16 output tokens``, from :meth:`fields`."""
        if fields.get("after") == "start":
            return f"+{fields['offset_s']} s after the load starts"
        n = fields.get("token_mark", 1)
        what = "its first token" if n == 1 else f"{n} output tokens"
        return f"+{fields['offset_s']} s after every stream has {what}"


class _InjectionClock:
    """Counts the load's streams that reached ``token_mark`` tokens; ``ready`` is set
    when every stream has."""

    def __init__(self, n_streams: int, token_mark: int = 1) -> None:
        self.n_streams = max(1, n_streams)
        self.token_mark = token_mark
        self.ready = threading.Event()
        self.load_done = threading.Event()
        self.ready_ns: int | None = None
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def mark(self, request_id: str, t_ns: int) -> None:
        with self._lock:
            if self.ready.is_set() or request_id in self._seen:
                return
            self._seen.add(request_id)
            if len(self._seen) >= self.n_streams:
                self.ready_ns = t_ns
                self.ready.set()

    def record(self, rec: RequestRecord) -> None:
        """A finished record counts too (a stream read outside the multiplexer)."""
        n = 0
        for e in rec.events:
            n += e.n_tokens
            if e.n_tokens > 0 and n >= self.token_mark:
                self.mark(rec.request_id, e.t_ns)
                return

    @property
    def seen(self) -> int:
        with self._lock:
            return len(self._seen)


@dataclass(frozen=True)
class ABArm:
    """This case is one arm of an A/B comparison: the report pairs arms by ``group``.

    ``repetition`` numbers the repetitions of an arm, the unit the report resamples.
    """

    group: str
    arm: str
    repetition: int | None = None

    def fields(self) -> dict[str, object]:
        out: dict[str, object] = {"ab_group": self.group, "ab_arm": self.arm}
        if self.repetition is not None:
            out["repetition"] = self.repetition
        return out


@dataclass(frozen=True)
class CaseResult:
    case_id: str
    workload: Workload | TraceWorkload
    config_id: str
    records: tuple[RequestRecord, ...]  # measured phase only
    warmup_records: tuple[RequestRecord, ...]
    metrics: CaseMetrics
    self_check: SelfCheck
    problems: tuple[str, ...]  # failed checks, each with its numbers
    window_ns: tuple[int, int]
    warmup_s: float
    injected: tuple[RequestRecord, ...] = ()
    validation: tuple[tuple[str, int, int], ...] = ()  # (validator, passed, total)
    ab: ABArm | None = None
    #: failed requests the case expects: True (any), or these error classes
    allow_errors: bool | tuple[str, ...] = False

    def unexpected_errors(self) -> dict[str, int]:
        """Failed requests (warm-up, measured, injected) the case did not allow, by class."""
        if self.allow_errors is True:
            return {}
        allowed = () if self.allow_errors is False else self.allow_errors
        out: dict[str, int] = {}
        for r in (*self.warmup_records, *self.records, *self.injected):
            if r.error is not None and r.error.cls not in allowed:
                out[r.error.cls] = out.get(r.error.cls, 0) + 1
        return dict(sorted(out.items()))

    @property
    def headline(self) -> dict[str, float | int | str]:
        out = dict(headline(self.metrics))
        out["client_bound"] = int(self.self_check.client_bound)
        out["warmup_s"] = round(self.warmup_s, 3)
        return out


def build_specs(w: Workload, setup: CaseSetup, case_id: str, phase: str,
                count: int, first_index: int,
                extra_body: tuple[tuple[str, object], ...] = (),
                salt: str | None = None,
                prompter: ChatPrompter | None = None) -> list[RequestSpec]:
    """The requests ``first_index ..`` of a phase: exact token-ID prompts; on the chat API
    prompts built to the server's templated count (``prompter``, load/chat_prompts.py;
    ``isl`` None on the record where it cannot count); or the user's own texts."""
    salt = setup.salt if salt is None else salt
    chat = setup.api == "chat"
    texts = _texts(w.texts) if w.texts is not None else None
    if chat and setup.engine == "llamacpp" and w.prefix == "cold" and not any(
            k == "cache_prompt" for k, _ in extra_body):
        # llama.cpp's slots keep the last prompt: the template's opening tokens would be
        # reused from it (cached_tokens > 0) in a cold case
        extra_body = (*extra_body, ("cache_prompt", False))
    if setup.api in ("chat", "completions") and setup.engine == "llamacpp" and not any(
            k == "timings_per_token" for k, _ in extra_body):
        # llama.cpp's OpenAI routes stamp every chunk with its timings when asked: the
        # server's token clock (its native route asks in load/client/llamacpp.py)
        extra_body = (*extra_body, ("timings_per_token", True))
    specs = []
    for i in range(count):
        index = first_index + i
        prompt: dict[str, Any]  # RequestSpec's prompt field, by name
        isl: int | None = w.isl
        if texts is not None:
            conv = texts[index % len(texts)]
            isl = None
            if chat:
                prompt = {"messages": conv}
            elif len(conv) == 1 and conv[0][0] == "user":
                prompt = {"prompt": conv[0][1]}
            else:
                raise ValueError(f"{w.texts}: a conversation ('messages') needs the chat API; "
                                 f"this server's api is {setup.api}")
        elif chat:
            if prompter is None:
                raise ValueError("chat prompts need the case runner's chat prompter")
            cp = prompter.prompt(w.isl, f"{w.seed}:{index}:{salt}",
                                 shared_tokens=w.shared_prefix_tokens if w.prefix == "shared"
                                 else 0, shared_key=f"{w.seed}:{salt}")
            prompt = {"messages": cp.messages}
            isl = w.isl if cp.n_tokens is not None else None
        else:
            prompt = {"prompt_token_ids": prompt_tokens(w, index, setup.token_space, salt=salt)}
        specs.append(RequestSpec(
            request_id=f"{case_id}/{phase}/{index}", case_id=case_id, phase=phase,
            max_tokens=w.osl, ignore_eos=not w.expect_stop,
            temperature=0.0, seed=w.seed, cache_prompt=(w.prefix == "shared"), isl=isl,
            model=setup.model, extra_body=extra_body, **prompt))
    return specs


_TEXTS: dict[str, list] = {}


def _texts(path: str) -> list:
    """The user's prompts file, read once per run (load/chat_prompts.user_texts)."""
    from strata_plugin.load.chat_prompts import user_texts

    if path not in _TEXTS:
        _TEXTS[path] = user_texts(path)
    return _TEXTS[path]


def merge_loads(results: list[LoadResult]) -> LoadResult:
    """Batches of one measured phase as one: every record, one window, the worst self-check."""
    if len(results) == 1:
        return results[0]
    checks = [r.self_check for r in results]
    merged = SelfCheck(
        client_cpu_cores=max(c.client_cpu_cores for c in checks),
        dispatch_lateness_p99_ms=max(c.dispatch_lateness_p99_ms for c in checks),
        handling_lag_p99_ms=max(c.handling_lag_p99_ms for c in checks),
        client_bound=any(c.client_bound for c in checks),
        reasons=tuple(dict.fromkeys(x for c in checks for x in c.reasons)),
        late_requests=sum(c.late_requests for c in checks),
        late_events=sum(c.late_events for c in checks),
        dispatch_delay_share=max(c.dispatch_delay_share for c in checks),
        handling_lag_share=max(c.handling_lag_share for c in checks),
        # where the batches ran (load/pool.py, load/ray_engine.py): the widest spread
        processes=max(c.processes for c in checks), hosts=max(c.hosts for c in checks),
        engine=checks[-1].engine, placement=checks[-1].placement,
        per_process=max((c.per_process for c in checks), key=len),
        incomplete="; ".join(c.incomplete for c in checks if c.incomplete) or None,
    )
    return LoadResult(tuple(r for res in results for r in res.records),
                      min(r.start_ns for r in results), max(r.end_ns for r in results), merged)


def check_case(w: Workload, records: tuple[RequestRecord, ...],
               exact_isl: bool = True) -> list[str]:
    """Compare what the server reported with what the case asked for. ``exact_isl``
    False (chat without a tokenizer endpoint, the user's own texts): the server's prompt
    count is then the measurement, not a check."""
    problems = []
    for r in records:
        if not r.ok:
            assert r.error is not None
            problems.append(f"{r.request_id}: {r.error.cls}: {printable(r.error.message)}")
            continue
        u = r.usage
        if exact_isl and u.prompt_tokens is not None and u.prompt_tokens != w.isl:
            problems.append(f"{r.request_id}: prompt tokens {u.prompt_tokens} != ISL {w.isl}")
        if not w.expect_stop and u.completion_tokens is not None and u.completion_tokens != w.osl:
            problems.append(
                f"{r.request_id}: completion tokens {u.completion_tokens} != OSL {w.osl}")
        if w.expect_stop and r.finish_reason == "length":
            problems.append(f"{r.request_id}: finish_reason 'length' where a stop was expected")
        if w.prefix == "cold" and u.cached_tokens:
            problems.append(
                f"{r.request_id}: {u.cached_tokens} cached prompt tokens on a cold prefix")
    return problems


def cold_prefix_status(w: Workload, records: tuple[RequestRecord, ...]) -> str | None:
    """Whether a cold-prefix case was verified cold from what the server reported."""
    if w.prefix != "cold":
        return None
    ok = [r for r in records if r.ok]
    if not ok:
        return "cold prefix not verified: no successful request"
    counted = [r.usage.cached_tokens for r in ok if r.usage.cached_tokens is not None]
    if len(counted) < len(ok):
        return (f"cold prefix not verifiable: the server reported no cached-token count "
                f"for {len(ok) - len(counted)} of {len(ok)} requests")
    hits = sum(counted)
    if hits:
        return f"NOT cold: {hits} cached prompt tokens in {len(ok)} requests"
    return f"verified cold: 0 cached prompt tokens in {len(ok)} requests"


def isl_fields(note: str | None, records: tuple[RequestRecord, ...]) -> dict[str, object]:
    """``isl_exact`` and ``isl_note`` for the case line (nothing for token-ID prompts): where
    the input lengths were not exact, what the server counted (min / median / max)."""
    if note is None:
        return {}
    exact = note.startswith("exact")
    if not exact:
        counts = sorted(r.usage.prompt_tokens for r in records
                        if r.ok and r.usage.prompt_tokens is not None)
        if counts:
            note += (f"; counted: min {counts[0]}, median {counts[len(counts) // 2]}, max "
                     f"{counts[-1]} over {len(counts)} requests")
        else:
            note += "; no request reported its prompt tokens"
    return {"isl_exact": exact, "isl_note": note}


def validate(validators, records: tuple[RequestRecord, ...]) -> tuple[tuple[str, int, int], ...]:
    """Pass counts per validator, summed over the successful requests of a case."""
    out = []
    for v in validators:
        passed = total = 0
        for r in records:
            if r.ok:
                verdict = v(r.output_text)
                passed, total = passed + verdict.passed, total + verdict.total
        out.append((getattr(v, "__name__", "validator"), passed, total))
    return tuple(out)


@dataclass(frozen=True)
class RunOptions:
    """How one case runs: ``CaseRunner.run``'s keywords as one object (``run_with``)."""

    case_id: str | None = None  # default: the test's node id
    scale: bool = True  # scale the workload by the profile
    inject: Injection | None = None
    ab: ABArm | None = None
    extra: dict | None = None  # more fields of the case's cases.jsonl line
    extra_body: dict | None = None  # more fields of every request's body
    validators: tuple = ()
    allow_errors: bool | tuple[str, ...] = False
    until: SampleTarget | None = None
    timeslice_s: float | None = None

    def checked_allow_errors(self) -> bool | tuple[str, ...]:
        """``allow_errors`` as a bool or a tuple of known classes, once ``timeslice_s`` is
        checked too; a ValueError names what is wrong."""
        if self.timeslice_s is not None and not self.timeslice_s > 0:
            raise ValueError(f"timeslice_s must be > 0 seconds, got {self.timeslice_s!r}")
        allow_errors = self.allow_errors
        if not isinstance(allow_errors, bool):
            allow_errors = tuple(allow_errors)
            unknown = sorted(set(allow_errors) - set(ERROR_CLASSES))
            if unknown:
                raise ValueError(f"allow_errors: unknown error class(es) {unknown}; "
                                 f"the classes are {', '.join(ERROR_CLASSES)}")
        return allow_errors


@dataclass(frozen=True)
class _Case:
    """One case as it runs: its id, the workload as sent, its prompts' salt, its line's
    extra fields and A/B arm, the requests' extra body, and when it began (monotonic ns)."""

    case_id: str
    w: Workload
    salt: str
    extra: dict
    ab: ABArm | None
    body: tuple
    t_ns: int


def _ab_from_extra(extra: dict | None, ab: ABArm | None) -> tuple[dict, ABArm | None]:
    """``extra`` without the older ``ab_group``/``ab_arm`` keys, read as an ``ABArm``."""
    extra = dict(extra or {})
    if ab is None and "ab_group" in extra:
        rep = extra.pop("repetition", None)
        ab = ABArm(str(extra.pop("ab_group")), str(extra.pop("ab_arm", "")), rep)
    return extra, ab


class CaseRunner:
    """Runs workloads against one server; bound to one test by the ``strata`` fixture."""

    def __init__(self, setup: CaseSetup, *, record: Callable[[RequestRecord], None],
                 mark: Callable[[str, str, str, int, int], object],
                 add_case: Callable[[CaseLine], None],
                 counters: Callable[[], tuple[float, int, int]] | None = None,
                 progress_line: Callable[[str, bool], None] | None = None,
                 default_case_id: str = "case", history: dict | None = None,
                 repetitions: dict | None = None) -> None:
        self.setup = setup
        self._record, self._mark, self._add_case = record, mark, add_case
        self._counters = counters
        self._progress_line = progress_line
        self.default_case_id = default_case_id
        self.results: list[CaseResult] = []
        self.case_lines: dict[str, CaseLine] = {}  # as written to cases.jsonl, for the outcome
        #: Results by A/B group, shared across the session's tests (blocks); read it with
        #: ``ab_results(group)``.
        self.history: dict[str, list[CaseResult]] = history if history is not None else {}
        #: How often each workload ran (per A/B arm), across the session: the salt of its
        #: prompts, so that no repetition reuses an earlier one's prefix.
        self.repetitions: dict[tuple[str, str, str], int] = (
            repetitions if repetitions is not None else {})
        self._chat: ChatPrompter | None = None  # built on the first chat case
        #: the A/B expectations this test judged (``expect_ab``), judged at its end
        self.expectations: list[ABExpectation] = []

    def chat_prompter(self) -> ChatPrompter | None:
        """On the chat API: the prompter, with the server's tokenizer endpoint where it
        has one (found once per runner; load/chat_prompts.py). None on other APIs."""
        if self.setup.api != "chat":
            return None
        if self._chat is None:
            from strata_plugin.load.chat_prompts import ChatPrompter, find_counter

            s = self.setup
            counter, how = find_counter(s.base_url, s.engine, model=s.model, headers=s.headers)
            self._chat = ChatPrompter(counter, how)
        return self._chat

    def isl_exact(self, w: Workload) -> bool:
        chat = self.chat_prompter()
        return w.texts is None and (chat is None or chat.exact)

    def isl_note(self, w: Workload) -> str | None:
        """The case line's word on its input lengths, where they are not exact token IDs."""
        if w.texts is not None:
            return (f"the user's own texts ({w.texts}): each prompt's length is its own, "
                    "as the server counted it (usage.prompt_tokens)")
        chat = self.chat_prompter()
        return chat.note() if chat is not None else None

    def repetition_salt(self, w: Workload, ab: ABArm | None) -> str:
        """The run's salt plus this workload's repetition number (within its A/B arm, so
        the k-th repetitions of two arms send the same prompts and pair by output)."""
        key = (ab.group, ab.arm, w.name) if ab else ("", "", w.name)
        k = self.repetitions.get(key, 0)
        self.repetitions[key] = k + 1
        return f"{self.setup.salt}/{w.name}/{k}"

    def _load(self, jobs: list[Job], w: Workload, phase_progress: Progress | None,
              clock: _InjectionClock | None = None) -> LoadResult:
        in_flight = w.concurrency if w.arrival == "closed" else max(w.concurrency, len(jobs))
        on_record = self._record
        if clock is not None:
            def on_record(rec: RequestRecord) -> None:
                self._record(rec)
                clock.record(rec)
        load = LoadParams(base_url=self.setup.base_url, api=self.setup.api,
                          concurrency=min(in_flight, 1024), timeouts=self.setup.timeouts,
                          headers=self.setup.headers, counters=self._counters,
                          on_record=on_record, progress=phase_progress,
                          on_token_mark=clock.mark if clock else None,
                          token_mark=clock.token_mark if clock else 1,
                          processes=self.setup.load.processes, streams=w.concurrency)
        if self.setup.load.engine == "ray":  # the same loop as Ray actors (load/ray_engine.py)
            from strata_plugin.load.ray_engine import run_load_on_ray

            return run_load_on_ray(jobs, spec=self.setup.load,
                                   **load.common())  # type: ignore[arg-type]  # by name
        return run_load(jobs, load)

    def scaled(self, w: Workload) -> Workload:
        """The nominal (seed-sized) workload as this profile runs it."""
        s = dict(self.setup.scale)
        if not s:
            return w
        return w.scaled(context=s.get("context", 1.0), output=s.get("output", 1.0),
                        concurrency=s.get("concurrency", 1.0))

    def run(self, w: Workload, *, case_id: str | None = None, scale: bool = True,
            inject: Injection | None = None, ab: ABArm | None = None,
            extra: dict | None = None, extra_body: dict | None = None,
            validators: tuple = (),
            allow_errors: bool | tuple[str, ...] = False,
            until: SampleTarget | None = None,
            timeslice_s: float | None = None) -> CaseResult:
        """Run warm-ups then measured requests of ``w`` (scaled by the profile).

        A failed request fails the test at its teardown, with the failures counted by
        class, unless ``allow_errors`` is True or names its class (a fault case).
        ``until`` runs more measured requests, in batches, until the percentiles it names
        are supported by the successful count (analysis/sufficiency.py), within its bounds.
        ``timeslice_s`` asks the report for fixed timeslices of the measured window.

        ``ab`` makes the case one arm of an A/B group; ``extra`` adds fields to its
        ``cases.jsonl`` line (the older ``extra={"ab_group": ..., "ab_arm": ...}`` form is
        still read as an ``ab``). The keywords are a :class:`RunOptions` (``run_with``).
        """
        return self.run_with(w, RunOptions(
            case_id=case_id, scale=scale, inject=inject, ab=ab, extra=extra,
            extra_body=extra_body, validators=validators, allow_errors=allow_errors,
            until=until, timeslice_s=timeslice_s))

    def run_with(self, w: Workload, opts: RunOptions) -> CaseResult:
        """``run``, its options as one object: checked, warm-ups, the measured load, the
        checks, then the case's line and result."""
        case_id = opts.case_id or self.default_case_id
        allow_errors = opts.checked_allow_errors()
        extra, ab = _ab_from_extra(opts.extra, opts.ab)
        # the test's extra= is checked now, not once the load has run (nor in the middle of
        # a Ctrl-C): a value of the wrong type for a field it names is the test's error
        CaseLine.written({**extra, **(ab.fields() if ab else {})}, case_id=case_id)
        nominal = w
        w = self.scaled(w) if opts.scale else w
        case = _Case(case_id, w, self.repetition_salt(w, ab), extra, ab,
                     tuple(sorted((opts.extra_body or {}).items())), time.monotonic_ns())
        warm_res, t_warm_end = self._warmups(case)
        flush = None
        if w.prefix == "cold":  # after the warm-ups, before the measured window
            from strata_plugin.load.cache_flush import flush_prefix_cache

            flush = flush_prefix_cache(self.setup.engine, self.setup.base_url,
                                       self.setup.headers)
        res, target_line, injected, placed = self._measured(case, opts)
        self._mark("measured", case_id, case_id, res.start_ns, res.end_ns)
        self._mark("case", case_id, case_id, case.t_ns, res.end_ns)

        metrics = case_metrics(res.records, window_ns=(res.start_ns, res.end_ns))
        validation = validate(opts.validators, res.records)
        problems = self._problems(case, opts, res, validation, injected, placed)
        result = CaseResult(case_id, w, self.setup.config_id, res.records,
                            warm_res.records if warm_res else (), metrics, res.self_check,
                            problems, (res.start_ns, res.end_ns),
                            (t_warm_end - case.t_ns) / 1e9, tuple(injected), validation, ab,
                            allow_errors)
        # The test's extra= and the A/B arm come after the keys and win, then the sample
        # target and the timeslice (CaseLine.written's tail, ``_line``).
        tail: dict[str, object] = {}
        if target_line is not None:
            tail["sample_target"] = target_line
        if opts.timeslice_s is not None:
            tail["timeslice_s"] = float(opts.timeslice_s)
        inject = opts.inject
        self.case_lines[case_id] = line = self._line(
            case, tail, scaled_from=nominal.params() if nominal != w else None,
            server_startup_s=self.setup.startup_s,
            window_mono_ns=(res.start_ns, res.end_ns), warmup_s=result.warmup_s,
            self_check=res.self_check.__dict__, client_bound=res.self_check.client_bound,
            problems=problems, headline=result.headline,
            validation=[{"validator": n, "passed": p, "total": t} for n, p, t in validation],
            injection=({**inject.fields(w.osl), **placed} if inject else None),
            cache_flush=flush.as_dict() if flush else None,
            cold_prefix=cold_prefix_status(w, res.records),
            **isl_fields(self.isl_note(w), res.records),
            **({"allow_errors": allow_errors} if allow_errors else {}))
        self._add_case(line)
        self.results.append(result)
        if ab is not None:
            self.history.setdefault(ab.group, []).append(result)
        if (err := no_tokens(res.records)) is not None:
            raise err
        return result

    def _line(self, case: _Case, tail: dict[str, object], **keys: object) -> CaseLine:
        """The case's ``cases.jsonl`` line: who it is (case, workload, server, API, its
        prompts' salt) and ``keys``; then the test's ``extra=`` and the A/B arm, then
        ``tail`` (the sample target, the timeslice), which win."""
        return CaseLine.written(
            {**case.extra, **(case.ab.fields() if case.ab else {}), **tail},
            case_id=case.case_id, name=case.w.name, params=case.w.params(),
            config_id=self.setup.config_id, block_id=self.setup.block_id,
            api=self.setup.api, prompt_salt=case.salt, **keys)

    def _warmups(self, case: _Case) -> tuple[LoadResult | None, int]:
        """The warm-up requests, and when they ended; a warm-up load in which no stream
        got a token ends the case (no measured load is sent)."""
        warm = build_specs(case.w, self.setup, case.case_id, "warmup", case.w.warmups,
                           1_000_000, case.body, case.salt, self.chat_prompter())
        warm_res = self._load([Job(s) for s in warm], case.w, None) if warm else None
        t_warm_end = time.monotonic_ns()
        if warm_res:
            self._mark("warmup", case.case_id, case.case_id, case.t_ns, t_warm_end)
            if (err := no_tokens(warm_res.records)) is not None:
                raise err  # the warm-ups already show it: no measured load is sent
        return warm_res, t_warm_end

    def _measured(self, case: _Case, opts: RunOptions
                  ) -> tuple[LoadResult, dict | None, list[RequestRecord], dict[str, object]]:
        """The measured requests (more of them with ``until``), with the injected one
        beside them and the progress ticker: (the load, the sample target's line, the
        injected records, where the injection was placed). A Ctrl-C writes the case's
        line, marked interrupted, before it goes on."""
        w, case_id, inject = case.w, case.case_id, opts.inject
        specs = build_specs(w, self.setup, case_id, "measured", w.requests, 0, case.body,
                            case.salt, self.chat_prompter())
        offsets = arrival_offsets_s(w, len(specs))
        jobs = [Job(s, None if offsets is None else offsets[i]) for i, s in enumerate(specs)]
        progress = Progress(len(jobs))
        stop = threading.Event()
        ticker = self._start_ticker(progress, stop)
        injected: list[RequestRecord] = []
        placed: dict[str, object] = {}
        clock = (_InjectionClock(min(w.concurrency, len(jobs)), inject.token_mark(w.osl))
                 if inject else None)
        injector = (self._start_injection(inject, case_id, injected, opts.scale, clock,
                                          placed, case.salt)
                    if inject and clock else None)
        try:
            with self._measured_window(case_id):
                res = self._load(jobs, w, progress, clock)
                target_line = None
                if opts.until is not None:
                    res, target_line = self._until_supported(res, w, opts.until, case_id,
                                                             case.body, progress, case.salt)
        except KeyboardInterrupt:  # the records so far are on disk (generator.py): the
            now = time.monotonic_ns()  # case's window and line say it was cut short
            self._mark("case", case_id, case_id, case.t_ns, now)
            self._add_case(self._line(case, {}, interrupted=True))
            raise
        finally:
            if clock:
                clock.load_done.set()
            if injector:
                injector.join()
            stop.set()
            if ticker:
                ticker.join()
        return res, target_line, injected, placed

    def _problems(self, case: _Case, opts: RunOptions, res: LoadResult,
                  validation: tuple[tuple[str, int, int], ...],
                  injected: list[RequestRecord], placed: dict[str, object]
                  ) -> tuple[str, ...]:
        """The checks that failed, each with its numbers: ISL, OSL and cold prefix of the
        measured load and of the injected request, the validators, an injection not sent."""
        w, inject = case.w, opts.inject
        problems = tuple(check_case(w, res.records, self.isl_exact(w)))
        problems += tuple(f"{name}: {passed}/{total} passed" for name, passed, total in validation
                          if passed != total)
        if inject:
            iw = self.scaled(inject.workload) if opts.scale else inject.workload
            problems += tuple(check_case(iw, tuple(injected), self.isl_exact(iw)))
            if placed.get("skipped"):
                problems += (f"injection not sent: {placed['skipped']}",)
        return problems

    def constrain(self, *, json_schema: dict | None = None,
                  grammar: str | None = None) -> dict:
        """``extra_body`` asking this server's engine for output matching a JSON schema or
        a GBNF grammar (load/constraints.py spells it per engine)."""
        from strata_plugin.load.constraints import constraint_body

        return constraint_body(self.setup.engine, json_schema=json_schema, grammar=grammar,
                               api=self.setup.api)

    def _until_supported(self, first: LoadResult, w: Workload, target: SampleTarget,
                         case_id: str, body: tuple, progress: Progress, salt: str
                         ) -> tuple[LoadResult, dict]:
        """More measured requests until ``target`` is met, or its count or time runs out.

        Each batch asks for what is still missing, trimmed to what the pace so far fits
        into the time left, so the case ends near ``max_s`` rather than a batch past it,
        and to what one phase may prepare at once (limits.max_phase_requests): a target
        of more requests than that is built batch by batch, never all at once.
        """
        results = [first]
        n = len(first.records)
        stopped = "supported"
        while True:
            ok = sum(1 for res in results for r in res.records if r.ok)
            elapsed_s = (results[-1].end_ns - first.start_ns) / 1e9
            if ok >= target.needed:
                break
            if n >= target.max_requests:
                stopped = "max_requests"
                break
            if elapsed_s >= target.max_s:
                stopped = "max_s"
                break
            batch = min(target.needed - ok, target.max_requests - n,
                        max_phase_requests(w.isl))
            per_request_s = elapsed_s / n if n else 0.0
            if per_request_s > 0:
                fit = int((target.max_s - elapsed_s) / per_request_s)
                batch = max(1, min(batch, max(fit, w.concurrency)))
            specs = build_specs(w, self.setup, case_id, "measured", batch, n, body, salt,
                                self.chat_prompter())
            offsets = arrival_offsets_s(w, n + batch)
            base = offsets[n] if offsets is not None else 0.0
            jobs = [Job(s, None if offsets is None else offsets[n + i] - base)
                    for i, s in enumerate(specs)]
            progress.total += batch
            results.append(self._load(jobs, w, progress))
            n += batch
        ok = sum(1 for res in results for r in res.records if r.ok)
        line = {"percentiles": list(target.percentiles), "confidence": target.confidence,
                "needed": target.needed, "max_requests": target.max_requests,
                "max_s": target.max_s, "measured": n, "ok": ok, "batches": len(results),
                "met": ok >= target.needed, "stopped_by": stopped}
        return merge_loads(results), line

    def replay(self, tw: TraceWorkload, *, case_id: str | None = None,
               allow_errors: bool | tuple[str, ...] = False) -> CaseResult:
        """Replay a trace (load/trace.py) as one case at its own, or scaled, timing."""
        from strata_plugin.load.replay import check_trace, trace_jobs

        case_id = case_id or self.default_case_id
        setup = self.setup
        if setup.api == "chat":
            raise ValueError("trace replay sends token-ID prompts: it needs the completions, "
                             "llamacpp or sglang API, not chat")
        jobs = trace_jobs(tw, case_id, setup.token_space, salt=setup.salt, model=setup.model)
        convs = tw.conversations()
        in_conv = {i for ids in convs.values() for i in ids}
        singles = [j for i, j in enumerate(jobs) if i not in in_conv]
        t_case = time.monotonic_ns()
        loads: list[LoadResult] = []

        def load(js: list[Job], conc: int) -> LoadResult:
            return run_load(js, LoadParams(base_url=setup.base_url, api=setup.api,
                                           concurrency=conc, timeouts=setup.timeouts,
                                           headers=setup.headers, counters=self._counters,
                                           on_record=self._record))

        def conversation(ids: list[int]) -> None:
            """Turn 1 at its trace time; each later turn after the previous answer."""
            wait = t_case / 1e9 + tw.requests[ids[0]].t_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            for k, i in enumerate(ids):
                if k and tw.requests[i].think_s > 0:
                    time.sleep(tw.requests[i].think_s)
                loads.append(load([Job(jobs[i].spec, None)], 1))

        threads = [threading.Thread(target=conversation, args=(ids,), daemon=True,
                                    name="strata-conversation") for ids in convs.values()]
        for t in threads:
            t.start()
        if singles:
            loads.append(load(singles, min(tw.max_in_flight, len(singles), 1024)))
        for t in threads:
            t.join()
        res = merge_loads(sorted(loads, key=lambda x: x.start_ns))
        self._mark("measured", case_id, case_id, res.start_ns, res.end_ns)
        self._mark("case", case_id, case_id, t_case, res.end_ns)
        metrics = case_metrics(res.records, window_ns=(res.start_ns, res.end_ns))
        problems = tuple(check_trace(jobs, res.records, tw.expect_stop))
        result = CaseResult(case_id, tw, setup.config_id, res.records, (), metrics,
                            res.self_check, problems, (res.start_ns, res.end_ns), 0.0,
                            allow_errors=allow_errors)
        self.case_lines[case_id] = line = CaseLine.written(
            case_id=case_id, name=tw.name, params=tw.params(), scaled_from=None,
            config_id=setup.config_id, block_id=setup.block_id,
            server_startup_s=setup.startup_s, api=setup.api,
            window_mono_ns=(res.start_ns, res.end_ns), warmup_s=0.0,
            self_check=res.self_check.__dict__, client_bound=res.self_check.client_bound,
            problems=problems, headline=result.headline, validation=[], injection=None)
        self._add_case(line)
        self.results.append(result)
        return result

    def sweep(self, sweep: CapacitySweep, *, case_id: str | None = None) -> SweepResult:
        """A capacity sweep (load/sweep.py): rate steps to saturation, refined at the knee."""
        from strata_plugin.load.sweep import run_sweep

        return run_sweep(self, sweep, case_id or self.default_case_id)

    def _measured_window(self, case_id: str) -> contextlib.AbstractContextManager:
        """Wraps exactly the measured requests (warm-ups excluded): the diagnostic round
        (``run/diagnostic_round.py``) captures its trace here."""
        return contextlib.nullcontext()

    def expect_ab(self, group: str, metric: str, direction: str, *,
                  effects: Callable[[list[CaseResult], list[CaseResult]], list],
                  run_arm: Callable[[str, int], object], control: str = "control",
                  treatment: str = "treatment",
                  max_repetitions: int | None = None) -> ABExpectation:
        """Judge "``treatment`` moves ``metric`` in ``direction``" on the group's runs so far
        (analysis/expectations.py); while the interval holds zero, run one more repetition
        of each arm (``run_arm(arm, index)``, ``index`` counting the group's runs, in a
        balanced order: treatment first, then control first, ...) up to ``max_repetitions``
        per arm (default: the ``ab_max_repetitions`` threshold). ``effects(control_runs,
        treatment_runs)`` gives the effects (e.g. ``mixed_effects``).

        The test's end judges what this returns (plugin/case_teardown.py): a contradicted
        expectation fails the test, one not established is the test's own outcome, "not
        established", in JUnit, the terminal and the report, and does not fail it."""
        from strata_plugin.analysis.expectations import DIRECTIONS, ABExpectation
        from strata_plugin.analysis.thresholds import value

        if direction not in DIRECTIONS:
            raise ValueError(f"expect_ab: direction {direction!r}: expected one of {DIRECTIONS}")
        bound = int(value("ab_max_repetitions")) if max_repetitions is None else max_repetitions

        def judged(initial: int) -> tuple[int, ABExpectation]:
            arms = self.ab_results(group)
            c, t = arms.get(control, []), arms.get(treatment, [])
            e = (next((x for x in effects(c, t) if x.metric == metric), None)
                 if c and t else None)
            return len(c) + len(t), ABExpectation.of(group, metric, direction, e,
                                                     initial=initial, bound=bound,
                                                     runs=min(len(c), len(t)))

        arms = self.ab_results(group)
        initial = min(len(arms.get(control, [])), len(arms.get(treatment, [])))
        runs, exp = judged(initial)
        added = 0
        # bounded by the runs made, not the effect's count of defined values (a metric
        # a repetition does not define would never reach the bound)
        while not exp.decided and initial + added < bound:
            order = (treatment, control) if added % 2 == 0 else (control, treatment)
            for arm in order:
                run_arm(arm, runs)
                runs += 1
            added += 1
            runs, exp = judged(initial)
        self.expectations.append(exp)
        return exp

    def ab_results(self, group: str) -> dict[str, list[CaseResult]]:
        """The results of an A/B group so far in this session, by arm, in run order."""
        out: dict[str, list[CaseResult]] = {}
        for r in self.history.get(group, []):
            assert r.ab is not None
            out.setdefault(r.ab.arm, []).append(r)
        return out

    def _start_injection(self, inject: Injection, case_id: str, out: list[RequestRecord],
                         scale: bool, clock: _InjectionClock,
                         placed: dict[str, object], salt: str) -> threading.Thread:
        """Send the injected request where ``inject`` places it; ``placed`` says where."""
        w = self.scaled(inject.workload) if scale else inject.workload
        spec = build_specs(w, self.setup, case_id, "injected", 1, 2_000_000, (), salt,
                           self.chat_prompter())[0]
        t0 = time.monotonic_ns()

        def send() -> None:
            if inject.after == "first_tokens":
                while not clock.ready.wait(0.02):
                    if clock.load_done.is_set():
                        placed["skipped"] = (
                            f"only {clock.seen} of {clock.n_streams} streams had "
                            f"{clock.token_mark} output token(s) "
                            "before the load ended")
                        return
                assert clock.ready_ns is not None
                anchor = clock.ready_ns
                placed["steady_mono_ns"] = anchor
                placed["token_mark"] = clock.token_mark
                self._mark("event", "decode_steady", case_id, anchor, anchor)
            else:
                anchor = t0
            due = anchor + int(inject.offset_s * 1e9)
            while (left := (due - time.monotonic_ns()) / 1e9) > 0:
                if clock.load_done.wait(min(left, 0.05)):
                    break
            if clock.load_done.is_set():
                placed["skipped"] = f"the load ended before its offset ({inject.offset_s} s)"
                return
            res = run_load([Job(spec)], LoadParams(
                base_url=self.setup.base_url, api=self.setup.api, concurrency=1,
                timeouts=self.setup.timeouts, headers=self.setup.headers, counters=None,
                on_record=self._record))
            out.extend(res.records)
            for r in res.records:
                first = min((e.t_ns for e in r.events if e.n_tokens > 0), default=None)
                end = first or r.done_ns or r.dispatched_ns
                placed.update(request_id=r.request_id, dispatched_mono_ns=r.dispatched_ns,
                              first_token_mono_ns=first)
                self._mark("event", f"inject:{r.request_id}", case_id, r.dispatched_ns,
                           max(end, r.dispatched_ns))

        t = threading.Thread(target=send, name="strata-inject", daemon=True)
        t.start()
        return t

    def _start_ticker(self, progress: Progress, stop: threading.Event) -> threading.Thread | None:
        """Live progress about once a second, and the final count (``emit(line, final)``;
        plugin/progress.py decides what reaches the terminal)."""
        if self._progress_line is None:
            return None
        emit = self._progress_line

        def tick() -> None:
            while not stop.wait(1.0):
                emit(progress.line(), False)
            emit(progress.line(), True)

        t = threading.Thread(target=tick, name="strata-progress", daemon=True)
        t.start()
        return t


class PlanEnds(StrataError, RuntimeError):
    """A planned (dry-run) test cannot go on without measured results or a running server:
    it stops there, and the dry run reports how far it planned."""


class PlanningRunner(CaseRunner):
    """The dry run's runner: each ``run`` writes the case as it would run, sends nothing.

    The plan line holds the nominal and the scaled workload, the injection (its
    workload as sent and its offset), the A/B arm and the server block, in the order
    the tests ask for them. The result it returns has no records: a test whose checks
    need measured results stops there, and the dry run reports how far it planned.
    """

    def __init__(self, setup: CaseSetup, *, plan: Callable[[CaseLine], None],
                 default_case_id: str = "case", history: dict | None = None) -> None:
        super().__init__(setup, record=_not_recorded, mark=_not_recorded,
                         add_case=plan, default_case_id=default_case_id, history=history)

    def run_with(self, w: Workload, opts: RunOptions) -> CaseResult:
        case_id = opts.case_id or self.default_case_id
        extra, ab = _ab_from_extra(opts.extra, opts.ab)
        CaseLine.written({**extra, **(ab.fields() if ab else {})}, case_id=case_id)
        until, timeslice_s, allow_errors = opts.until, opts.timeslice_s, opts.allow_errors
        inject, scale = opts.inject, opts.scale
        scaled = self.scaled(w) if scale else w
        if until is not None:
            extra["sample_target"] = {"percentiles": list(until.percentiles),
                                      "max_requests": until.max_requests, "max_s": until.max_s}
        if timeslice_s is not None:
            extra["timeslice_s"] = timeslice_s
        if allow_errors:
            extra["allow_errors"] = allow_errors if isinstance(allow_errors, bool) else list(
                allow_errors)
        injected = None
        if inject is not None:
            iw = self.scaled(inject.workload) if scale else inject.workload
            injected = {**inject.fields(scaled.osl), "name": iw.name, "params": iw.params(),
                        "scaled_from": (inject.workload.params() if iw != inject.workload
                                        else None)}
        line = CaseLine.written(
            {**extra, **(ab.fields() if ab else {})},
            planned=True, case_id=case_id, name=scaled.name,
            params=scaled.params(), scaled_from=w.params() if scaled != w else None,
            config_id=self.setup.config_id, block_id=self.setup.block_id,
            api=self.setup.api, injection=injected,
            extra_body_keys=sorted(opts.extra_body or {}),
            validators=[getattr(v, "__name__", "validator") for v in opts.validators])
        self.case_lines[case_id] = line
        self._add_case(line)
        empty = case_metrics((), window_ns=(0, 0))
        unchecked = SelfCheck(0.0, 0.0, 0.0, False, ("planned, not run",))
        result = CaseResult(case_id, scaled, self.setup.config_id, (), (), empty, unchecked,
                            (), (0, 0), 0.0, (), (), ab)
        self.results.append(result)
        if ab is not None:
            self.history.setdefault(ab.group, []).append(result)
        return result


    def replay(self, tw: TraceWorkload, *, case_id: str | None = None,
               allow_errors: bool | tuple[str, ...] = False) -> CaseResult:
        case_id = case_id or self.default_case_id
        line = CaseLine.written(planned=True, case_id=case_id, name=tw.name,
                                params=tw.params(), config_id=self.setup.config_id,
                                block_id=self.setup.block_id, api=self.setup.api, replay=True)
        self.case_lines[case_id] = line
        self._add_case(line)
        raise PlanEnds("a trace replay is planned as one case; its requests are sent only "
                       "in a real run")

    def sweep(self, sweep: CapacitySweep, *, case_id: str | None = None) -> SweepResult:
        case_id = case_id or self.default_case_id
        line = CaseLine.written(
            planned=True, case_id=case_id, name=sweep.workload.name,
            params=sweep.workload.params(), config_id=self.setup.config_id,
            block_id=self.setup.block_id, api=self.setup.api,
            sweep={"start_rate": sweep.start_rate, "factor": sweep.factor,
                   "max_steps": sweep.max_steps, "refine": sweep.refine})
        self.case_lines[case_id] = line
        self._add_case(line)
        raise PlanEnds("a capacity sweep's later steps depend on the measured ones: only its "
                       "first step is known before a real run")


def _not_recorded(*_args: object) -> None:
    raise AssertionError("a planned case records nothing")

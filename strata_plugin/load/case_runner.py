"""Running one case: warm-ups, measured requests, windows, and the checks.

This is what a test in ``cases/`` calls through the ``strata`` fixture. It
keeps every record on disk as it arrives, marks the case / warm-up / measured
windows on the timeline, and checks that the server did what was asked (ISL,
OSL, cold prefix) so a number is never reported for the wrong workload.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from strata_plugin.analysis.metrics import CaseMetrics, case_metrics, headline
from strata_plugin.formats.records import RequestRecord
from strata_plugin.load.client import RequestSpec, Timeouts
from strata_plugin.load.generator import Job, LoadResult, Progress, SelfCheck, run_load
from strata_plugin.load.workload import TokenSpace, Workload, arrival_offsets_s, prompt_tokens


class NoTokens(RuntimeError):
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
    startup_s: float | None = None  # that server's start-up time, apart from measurements


INJECT_AFTER = ("first_tokens", "start")


@dataclass(frozen=True)
class Injection:
    """One extra request injected into the measured load (mixed A/B).

    With ``after="first_tokens"`` (the default) it is sent ``offset_s`` after every
    stream of the load (the first ``min(concurrency, requests)`` measured requests) has
    its first token: in steady-state decode, not during the load's own prefills, which
    at the seed's sizes (C=32 x 1K-token prompts) last long enough to swallow a fixed
    offset from the start. ``after="start"`` counts ``offset_s`` from the start of the
    measured load. The rule is the same in every repetition, so control and treatment
    differ only by the injected request; the moments it was placed and sent are in
    ``markers.csv`` (events ``decode_steady`` and ``inject:<request id>``) and in the
    case's ``cases.jsonl`` line.
    """

    workload: Workload
    offset_s: float
    after: str = "first_tokens"

    def __post_init__(self) -> None:
        if self.after not in INJECT_AFTER:
            raise ValueError(f"Injection(after={self.after!r}): one of {', '.join(INJECT_AFTER)}")
        if self.offset_s < 0:
            raise ValueError(f"Injection offset_s must be >= 0, got {self.offset_s}")


class _InjectionClock:
    """Counts the load's first tokens; ``ready`` is set when every stream has one."""

    def __init__(self, n_streams: int) -> None:
        self.n_streams = max(1, n_streams)
        self.ready = threading.Event()
        self.load_done = threading.Event()
        self.ready_ns: int | None = None
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def first_token(self, request_id: str, t_ns: int) -> None:
        with self._lock:
            if self.ready.is_set() or request_id in self._seen:
                return
            self._seen.add(request_id)
            if len(self._seen) >= self.n_streams:
                self.ready_ns = t_ns
                self.ready.set()

    def record(self, rec: RequestRecord) -> None:
        """A finished record counts too (a stream read outside the multiplexer)."""
        t = min((e.t_ns for e in rec.events if e.n_tokens > 0), default=None)
        if t is not None:
            self.first_token(rec.request_id, t)

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
    workload: Workload
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

    @property
    def headline(self) -> dict[str, float | int | str]:
        out = dict(headline(self.metrics))
        out["client_bound"] = int(self.self_check.client_bound)
        out["warmup_s"] = round(self.warmup_s, 3)
        return out


def build_specs(w: Workload, setup: CaseSetup, case_id: str, phase: str,
                count: int, first_index: int,
                extra_body: tuple[tuple[str, object], ...] = ()) -> list[RequestSpec]:
    specs = []
    for i in range(count):
        index = first_index + i
        tokens = prompt_tokens(w, index, setup.token_space, salt=setup.salt)
        specs.append(RequestSpec(
            request_id=f"{case_id}/{phase}/{index}", case_id=case_id, phase=phase,
            max_tokens=w.osl, prompt_token_ids=tokens, ignore_eos=not w.expect_stop,
            temperature=0.0, seed=w.seed, cache_prompt=(w.prefix == "shared"), isl=w.isl,
            model=setup.model, extra_body=extra_body))
    return specs


def check_case(w: Workload, records: tuple[RequestRecord, ...]) -> list[str]:
    """Compare what the server reported with what the case asked for."""
    problems = []
    for r in records:
        if not r.ok:
            assert r.error is not None
            problems.append(f"{r.request_id}: {r.error.cls}: {r.error.message}")
            continue
        u = r.usage
        if u.prompt_tokens is not None and u.prompt_tokens != w.isl:
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
                 add_case: Callable[[dict], None],
                 counters: Callable[[], tuple[float, int, int]] | None = None,
                 progress_line: Callable[[str], None] | None = None,
                 default_case_id: str = "case", history: dict | None = None) -> None:
        self.setup = setup
        self._record, self._mark, self._add_case = record, mark, add_case
        self._counters = counters
        self._progress_line = progress_line
        self.default_case_id = default_case_id
        self.results: list[CaseResult] = []
        self.case_lines: dict[str, dict] = {}  # as written to cases.jsonl, for the outcome
        #: Results by A/B group, shared across the session's tests (blocks); read it with
        #: ``ab_results(group)``.
        self.history: dict[str, list[CaseResult]] = history if history is not None else {}

    def _load(self, jobs: list[Job], w: Workload, phase_progress: Progress | None,
              clock: _InjectionClock | None = None) -> LoadResult:
        in_flight = w.concurrency if w.arrival == "closed" else max(w.concurrency, len(jobs))
        on_record = self._record
        if clock is not None:
            def on_record(rec: RequestRecord) -> None:
                self._record(rec)
                clock.record(rec)
        return run_load(jobs, base_url=self.setup.base_url, api=self.setup.api,
                        concurrency=min(in_flight, 1024), timeouts=self.setup.timeouts,
                        headers=self.setup.headers, counters=self._counters,
                        on_record=on_record, progress=phase_progress,
                        on_first_token=clock.first_token if clock else None)

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
            validators: tuple = ()) -> CaseResult:
        """Run warm-ups then measured requests of ``w`` (scaled by the profile).

        ``ab`` makes the case one arm of an A/B group; ``extra`` adds fields to its
        ``cases.jsonl`` line (the older ``extra={"ab_group": ..., "ab_arm": ...}`` form is
        still read as an ``ab``).
        """
        case_id = case_id or self.default_case_id
        extra, ab = _ab_from_extra(extra, ab)
        self._require_token_ids()
        nominal = w
        w = self.scaled(w) if scale else w
        t_case = time.monotonic_ns()
        body = tuple(sorted((extra_body or {}).items()))
        warm = build_specs(w, self.setup, case_id, "warmup", w.warmups, 1_000_000, body)
        warm_res = self._load([Job(s) for s in warm], w, None) if warm else None
        t_warm_end = time.monotonic_ns()
        if warm_res:
            self._mark("warmup", case_id, case_id, t_case, t_warm_end)
            if (err := no_tokens(warm_res.records)) is not None:
                raise err  # the warm-ups already show it: no measured load is sent

        specs = build_specs(w, self.setup, case_id, "measured", w.requests, 0, body)
        offsets = arrival_offsets_s(w, len(specs))
        jobs = [Job(s, None if offsets is None else offsets[i]) for i, s in enumerate(specs)]
        progress = Progress(len(jobs))
        stop = threading.Event()
        ticker = self._start_ticker(progress, stop)
        injected: list[RequestRecord] = []
        placed: dict[str, object] = {}
        clock = _InjectionClock(min(w.concurrency, len(jobs))) if inject else None
        injector = (self._start_injection(inject, case_id, injected, scale, clock, placed)
                    if inject and clock else None)
        try:
            res = self._load(jobs, w, progress, clock)
        finally:
            if clock:
                clock.load_done.set()
            if injector:
                injector.join()
            stop.set()
            if ticker:
                ticker.join()
        self._mark("measured", case_id, case_id, res.start_ns, res.end_ns)
        self._mark("case", case_id, case_id, t_case, res.end_ns)

        metrics = case_metrics(res.records, window_ns=(res.start_ns, res.end_ns))
        problems = tuple(check_case(w, res.records))
        validation = validate(validators, res.records)
        problems += tuple(f"{name}: {passed}/{total} passed" for name, passed, total in validation
                          if passed != total)
        if inject:
            problems += tuple(check_case(self.scaled(inject.workload) if scale
                                         else inject.workload, tuple(injected)))
            if placed.get("skipped"):
                problems += (f"injection not sent: {placed['skipped']}",)
        result = CaseResult(case_id, w, self.setup.config_id, res.records,
                            warm_res.records if warm_res else (), metrics, res.self_check,
                            problems, (res.start_ns, res.end_ns), (t_warm_end - t_case) / 1e9,
                            tuple(injected), validation, ab)
        self.case_lines[case_id] = line = {
            "case_id": case_id, "name": w.name, "params": w.params(),
            "scaled_from": nominal.params() if nominal != w else None,
            "config_id": self.setup.config_id, "block_id": self.setup.block_id,
            "server_startup_s": self.setup.startup_s, "api": self.setup.api,
            "window_mono_ns": [res.start_ns, res.end_ns], "warmup_s": result.warmup_s,
            "self_check": res.self_check.__dict__, "client_bound": res.self_check.client_bound,
            "problems": list(problems), "headline": result.headline,
            "validation": [{"validator": n, "passed": p, "total": t} for n, p, t in validation],
            "injection": ({"params": inject.workload.params(), "offset_s": inject.offset_s,
                           "after": inject.after, **placed} if inject else None),
            **extra, **(ab.fields() if ab else {}),
        }
        self._add_case(line)
        self.results.append(result)
        if ab is not None:
            self.history.setdefault(ab.group, []).append(result)
        if (err := no_tokens(res.records)) is not None:
            raise err
        return result

    def _require_token_ids(self) -> None:
        if self.setup.api == "chat":
            raise ValueError(
                "the chat API takes text, and its template adds tokens: exact input lengths "
                "need a token-ID API (profile server.api = completions, llamacpp or sglang)")

    def ab_results(self, group: str) -> dict[str, list[CaseResult]]:
        """The results of an A/B group so far in this session, by arm, in run order."""
        out: dict[str, list[CaseResult]] = {}
        for r in self.history.get(group, []):
            assert r.ab is not None
            out.setdefault(r.ab.arm, []).append(r)
        return out

    def _start_injection(self, inject: Injection, case_id: str, out: list[RequestRecord],
                         scale: bool, clock: _InjectionClock,
                         placed: dict[str, object]) -> threading.Thread:
        """Send the injected request where ``inject`` places it; ``placed`` says where."""
        w = self.scaled(inject.workload) if scale else inject.workload
        spec = build_specs(w, self.setup, case_id, "injected", 1, 2_000_000)[0]
        t0 = time.monotonic_ns()

        def send() -> None:
            if inject.after == "first_tokens":
                while not clock.ready.wait(0.02):
                    if clock.load_done.is_set():
                        placed["skipped"] = (
                            f"only {clock.seen} of {clock.n_streams} streams had a first token "
                            "before the load ended")
                        return
                assert clock.ready_ns is not None
                anchor = clock.ready_ns
                placed["steady_mono_ns"] = anchor
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
            res = run_load([Job(spec)], base_url=self.setup.base_url,
                           api=self.setup.api, concurrency=1, timeouts=self.setup.timeouts,
                           headers=self.setup.headers, counters=None, on_record=self._record)
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
        """Print live progress every few seconds for cases that run that long."""
        if self._progress_line is None:
            return None
        emit = self._progress_line

        def tick() -> None:
            while not stop.wait(5.0):
                emit(progress.line())

        t = threading.Thread(target=tick, name="strata-progress", daemon=True)
        t.start()
        return t


class PlanningRunner(CaseRunner):
    """The dry run's runner: each ``run`` writes the case as it would run, sends nothing.

    The plan line holds the nominal and the scaled workload, the injection (its
    workload as sent and its offset), the A/B arm and the server block, in the order
    the tests ask for them. The result it returns has no records: a test whose checks
    need measured results stops there, and the dry run reports how far it planned.
    """

    def __init__(self, setup: CaseSetup, *, plan: Callable[[dict], None],
                 default_case_id: str = "case", history: dict | None = None) -> None:
        super().__init__(setup, record=_not_recorded, mark=_not_recorded,
                         add_case=plan, default_case_id=default_case_id, history=history)

    def run(self, w: Workload, *, case_id: str | None = None, scale: bool = True,
            inject: Injection | None = None, ab: ABArm | None = None,
            extra: dict | None = None, extra_body: dict | None = None,
            validators: tuple = ()) -> CaseResult:
        case_id = case_id or self.default_case_id
        extra, ab = _ab_from_extra(extra, ab)
        self._require_token_ids()
        scaled = self.scaled(w) if scale else w
        injected = None
        if inject is not None:
            iw = self.scaled(inject.workload) if scale else inject.workload
            injected = {"name": iw.name, "params": iw.params(), "offset_s": inject.offset_s,
                        "scaled_from": (inject.workload.params() if iw != inject.workload
                                        else None)}
        line = {
            "planned": True, "case_id": case_id, "name": scaled.name,
            "params": scaled.params(), "scaled_from": w.params() if scaled != w else None,
            "config_id": self.setup.config_id, "block_id": self.setup.block_id,
            "api": self.setup.api, "injection": injected,
            "extra_body_keys": sorted(extra_body or {}),
            "validators": [getattr(v, "__name__", "validator") for v in validators],
            **extra, **(ab.fields() if ab else {}),
        }
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


def _not_recorded(*_args: object) -> None:
    raise AssertionError("a planned case records nothing")

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


@dataclass(frozen=True)
class Injection:
    """One extra request sent at a fixed offset into the measured window (mixed A/B).

    The offset is the same in every repetition, so control and treatment differ
    only by the injected request, as in the seed's prefill-into-decode blocks.
    """

    workload: Workload
    offset_s: float


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
                extra_body: tuple[tuple[str, object], ...] = (),
                salt: str | None = None) -> list[RequestSpec]:
    specs = []
    for i in range(count):
        index = first_index + i
        tokens = prompt_tokens(w, index, setup.token_space,
                               salt=setup.salt if salt is None else salt)
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
                 default_case_id: str = "case", history: dict | None = None,
                 repetitions: dict | None = None) -> None:
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
        #: How often each workload ran (per A/B arm), across the session: the salt of its
        #: prompts, so that no repetition reuses an earlier one's prefix.
        self.repetitions: dict[tuple[str, str, str], int] = (
            repetitions if repetitions is not None else {})

    def repetition_salt(self, w: Workload, ab: ABArm | None) -> str:
        """The run's salt plus this workload's repetition number (within its A/B arm, so
        the k-th repetitions of two arms send the same prompts and pair by output)."""
        key = (ab.group, ab.arm, w.name) if ab else ("", "", w.name)
        k = self.repetitions.get(key, 0)
        self.repetitions[key] = k + 1
        return f"{self.setup.salt}/{w.name}/{k}"

    def _load(self, jobs: list[Job], w: Workload, phase_progress: Progress | None) -> LoadResult:
        in_flight = w.concurrency if w.arrival == "closed" else max(w.concurrency, len(jobs))
        return run_load(jobs, base_url=self.setup.base_url, api=self.setup.api,
                        concurrency=min(in_flight, 1024), timeouts=self.setup.timeouts,
                        headers=self.setup.headers, counters=self._counters,
                        on_record=self._record, progress=phase_progress)

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
        salt = self.repetition_salt(w, ab)
        t_case = time.monotonic_ns()
        body = tuple(sorted((extra_body or {}).items()))
        warm = build_specs(w, self.setup, case_id, "warmup", w.warmups, 1_000_000, body, salt)
        warm_res = self._load([Job(s) for s in warm], w, None) if warm else None
        t_warm_end = time.monotonic_ns()
        if warm_res:
            self._mark("warmup", case_id, case_id, t_case, t_warm_end)
        flush = None
        if w.prefix == "cold":  # after the warm-ups, before the measured window
            from strata_plugin.load.cache_flush import flush_prefix_cache

            flush = flush_prefix_cache(self.setup.engine, self.setup.base_url,
                                       self.setup.headers)

        specs = build_specs(w, self.setup, case_id, "measured", w.requests, 0, body, salt)
        offsets = arrival_offsets_s(w, len(specs))
        jobs = [Job(s, None if offsets is None else offsets[i]) for i, s in enumerate(specs)]
        progress = Progress(len(jobs))
        stop = threading.Event()
        ticker = self._start_ticker(progress, stop)
        injected: list[RequestRecord] = []
        injector = (self._start_injection(inject, case_id, injected, scale, salt)
                    if inject else None)
        try:
            res = self._load(jobs, w, progress)
        finally:
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
            "injection": ({"params": inject.workload.params(), "offset_s": inject.offset_s}
                          if inject else None),
            "prompt_salt": salt,
            "cache_flush": flush.as_dict() if flush else None,
            "cold_prefix": cold_prefix_status(w, res.records),
            **extra, **(ab.fields() if ab else {}),
        }
        self._add_case(line)
        self.results.append(result)
        if ab is not None:
            self.history.setdefault(ab.group, []).append(result)
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
                         scale: bool, salt: str) -> threading.Thread:
        """Send the injected request ``offset_s`` after the measured load starts."""
        w = self.scaled(inject.workload) if scale else inject.workload
        spec = build_specs(w, self.setup, case_id, "injected", 1, 2_000_000, (), salt)[0]
        t0 = time.monotonic_ns()

        def send() -> None:
            res = run_load([Job(spec, inject.offset_s)], base_url=self.setup.base_url,
                           api=self.setup.api, concurrency=1, timeouts=self.setup.timeouts,
                           headers=self.setup.headers, counters=None, on_record=self._record)
            out.extend(res.records)
            self._mark("event", f"inject:{spec.request_id}", case_id,
                       t0 + int(inject.offset_s * 1e9), t0 + int(inject.offset_s * 1e9))

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

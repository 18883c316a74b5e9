"""Drives every writer of a ``cases.jsonl`` line with fixed inputs, so the bytes can be
compared with the line main's code wrote for the same inputs (tests/test_case_line.py).

The case runner, the planning runner, the sweep, the run recorder and the dry-run plan
are the real ones. What is replaced is the boundary a byte comparison cannot have: the
load generator's ``run_load`` (the server's answers: fabricated records, FAKE, with
fixed times) and the case runner's monotonic clock (a counter), so that two runs of the
same cases write the same numbers. ``tests/data/case_lines_main.json`` holds what main's
code wrote through this driver before ``formats/cases.py`` existed (see
``record_main_fixture``).
"""

from __future__ import annotations

import json
import threading
import types
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from strata_plugin.analysis.metrics import Slo
from strata_plugin.analysis.sufficiency import SampleTarget
from strata_plugin.formats.records import ClockAnchor, RequestRecord, TokenEvent, Usage
from strata_plugin.load import case_runner as cr
from strata_plugin.load.cache_flush import Flush
from strata_plugin.load.case_runner import (
    ABArm,
    CaseRunner,
    CaseSetup,
    Injection,
    PlanEnds,
    PlanningRunner,
)
from strata_plugin.load.chat_prompts import ChatPrompter
from strata_plugin.load.client import Timeouts
from strata_plugin.load.generator import LoadParams, LoadResult, SelfCheck
from strata_plugin.load.sweep import CapacitySweep
from strata_plugin.load.workload import TokenSpace, Workload
from strata_plugin.run.dry_run import DryRunPlan
from strata_plugin.run.run_folder import RunRecorder

MS = 1_000_000
SELF_CHECK = SelfCheck(0.12, 1.5, 0.7, False, ("fixed by the driver",), late_requests=1,
                       loop_lag_p99_ms=0.25)


class FakeLoad:
    """FAKE ``run_load``: every job answers ``max_tokens`` one-token events, 2 ms apart,
    at times fixed by the first request id (no clock, no thread order). A measured load
    that has an injected request waits until the injection was sent, as a real load
    that lasts longer than the offset does. ``interrupt`` names case ids whose measured
    load is cut short (Ctrl-C)."""

    def __init__(self, interrupt: tuple[str, ...] = ()) -> None:
        self.interrupt = interrupt
        self.injected = threading.Event()
        self.wait_for_injection = False

    def __call__(self, jobs, load: LoadParams) -> LoadResult:
        on_record = load.on_record
        first = jobs[0].spec
        if first.phase == "measured" and first.case_id in self.interrupt:
            raise KeyboardInterrupt
        if first.phase == "measured" and self.wait_for_injection:
            self.injected.wait(10)
        base = 10**15 + (zlib.crc32(first.request_id.encode()) % 10**6) * MS
        recs = []
        for i, job in enumerate(jobs):
            s = job.spec
            t0 = base + i * 5 * MS
            events = tuple(TokenEvent(t0 + (k + 1) * 2 * MS, 1, handled_ns=t0 + (k + 1) * 2 * MS
                                      + 1000) for k in range(s.max_tokens))
            rec = RequestRecord(s.request_id, s.case_id, s.phase, "completions", t0, t0,
                                first_byte_ns=t0 + MS, events=events,
                                done_ns=events[-1].t_ns + MS,
                                usage=Usage(s.isl, s.max_tokens, 0, "usage"),
                                finish_reason="length", isl=s.isl, osl=s.max_tokens)
            recs.append(rec)
            if on_record is not None:
                on_record(rec)
        if first.phase == "injected":
            self.injected.set()
        return LoadResult(tuple(recs), recs[0].dispatched_ns, max(r.done_ns for r in recs),
                          SELF_CHECK)


def _clock() -> types.SimpleNamespace:
    """The case runner's ``time``, with a monotonic clock that counts 1 ms a read."""
    n = [10**14]

    def monotonic_ns() -> int:
        n[0] += MS
        return n[0]

    return types.SimpleNamespace(monotonic_ns=monotonic_ns, monotonic=lambda: n[0] / 1e9,
                                 sleep=lambda _s: None)


def _flush(*_a: Any, **_k: Any) -> Flush:
    return Flush("POST /slots/0?action=erase", True, "erased slot 0 (driver)")


def _setup(api: str = "completions", scale: tuple = ()) -> CaseSetup:
    return CaseSetup("http://127.0.0.1:9", api, "cfg-a", TokenSpace(300, 1000),
                     Timeouts(read_s=10), salt="run-1", scale=scale, block_id="blk-1",
                     engine="llamacpp", startup_s=3.25)


def _shared(name: str, isl: int, osl: int, **kw: Any) -> Workload:
    return Workload(name, isl, osl, prefix="shared", shared_prefix_tokens=16, **kw)


def half_valid(text: str):
    """A validator (its name is written): passes every other request."""
    from strata_plugin.load.validators import Verdict

    return Verdict(1 if len(text) % 2 == 0 else 0, 1)


def drive(tmp: Path, patch: Callable[[object, str, object], None],
          teardown: Callable[[RunRecorder, Any, str, str, dict], None]) -> dict[str, str]:
    """Every kind of line, written through the real writers into ``tmp``. Returns the
    written files: ``cases.jsonl``, ``dry_run.json``, ``dry_run.md``.

    ``patch(obj, name, value)`` sets an attribute for the test (pytest's monkeypatch);
    ``teardown(recorder, line, outcome, nodeid, extra)`` writes the case's line again
    with its outcome, as ``plugin/case_teardown.finish_case`` does."""
    import strata_plugin.load.cache_flush as cache_flush

    load = FakeLoad(interrupt=("t::interrupted",))
    patch(cr, "run_load", load)
    patch(cr, "time", _clock())
    patch(cache_flush, "flush_prefix_cache", _flush)
    run_dir = tmp / "run"
    run_dir.mkdir()
    rec = RunRecorder(run_dir, ClockAnchor(10**14, 1_700_000_000 * 10**9), {"run_id": "r"})
    marks: list = []
    runner = CaseRunner(_setup(scale=(("context", 0.5), ("output", 0.5))), record=lambda r: None,
                        mark=lambda *a: marks.append(a), add_case=rec.add_case)
    warm = _shared("decode", 64, 8, concurrency=2, requests=4, warmups=1)
    runner.run(warm, case_id="t::plain")
    runner.run(warm, case_id="t::unscaled", scale=False, ab=ABArm("g", "treat", 2),
               extra={"note": "kept as written", "where": Path("/x/y"),
                      "diagnostic_of": "t::plain", "traces": ["sched"], "escalated": "named"},
               allow_errors=("timeout",), timeslice_s=2, validators=(half_valid,))
    runner.run(Workload("cold", 64, 4, requests=2, prefix="cold"), case_id="t::cold",
               allow_errors=True)
    runner.run(warm, case_id="t::old-ab", extra={"ab_group": "h", "ab_arm": "ref"},
               until=SampleTarget((50.0,), max_requests=12))
    load.wait_for_injection = True
    runner.run(warm, case_id="t::inject",
               inject=Injection(_shared("probe", 32, 2), offset_s=0.0,
                                after="start"))
    load.wait_for_injection = False
    try:
        runner.run(warm, case_id="t::interrupted", ab=ABArm("g", "ref"))
    except KeyboardInterrupt:
        pass
    chat = CaseRunner(_setup(api="chat"), record=lambda r: None, mark=lambda *a: None,
                      add_case=rec.add_case)
    chat._chat = ChatPrompter(None, "no tokenizer endpoint (driver)")
    chat.run(_shared("chatty", 64, 4, requests=2), case_id="t::chat")
    runner.sweep(CapacitySweep(_shared("cap", 32, 2), Slo(ttft_ms=500),
                               start_rate=4.0, max_steps=2, refine=0, step_s=1.0,
                               min_requests=3), case_id="t::sweep")
    for cid, line in runner.case_lines.items():
        extra: dict = ({"verdict": {"classes": ["decode_bound"], "evidence": [],
                                    "notes": ["driver"]}} if cid == "t::plain" else {})
        if cid == "t::cold":
            extra["telemetry_flushed"] = False
        teardown(rec, line, "passed", cid, extra)
    rec.close()

    plan = DryRunPlan(run_dir, "prof", {}, {}, {})
    planner = PlanningRunner(_setup(scale=(("concurrency", 2.0),)), plan=plan.add_case)
    planner.run(warm, case_id="p::run", ab=ABArm("g", "treat", 0),
                inject=Injection(Workload("probe", 32, 2), offset_s=1.5, at_output=0.25),
                extra={"note": "n"}, extra_body={"top_k": 1, "min_p": 0.1},
                validators=(half_valid,), allow_errors=("timeout", "reset"),
                until=SampleTarget((90.0, 99.0)), timeslice_s=5)
    planner.run(warm, case_id="p::bare", scale=False)
    try:
        planner.sweep(CapacitySweep(Workload("cap", 32, 2), Slo(ttft_ms=500)), case_id="p::sw")
    except PlanEnds:
        pass
    return {name: (run_dir / name).read_text()
            for name in ("cases.jsonl", "dry_run.json", "dry_run.md")}


def main_teardown(rec: RunRecorder, line: Any, outcome: str, nodeid: str, extra: dict) -> None:
    """What main's ``finish_case`` wrote (plugin/case_teardown.py before CaseLine)."""
    rec.add_case({**line, "outcome": outcome, "nodeid": nodeid, **extra})


def record_main_fixture(out: Path) -> None:
    """Run on main's code (before formats/cases.py): writes the fixture the test
    compares with. ``python -m tests.case_line_driver`` from the repository root."""
    import tempfile

    saved: list[tuple[object, str, object]] = []

    def patch(obj: object, name: str, value: object) -> None:
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    with tempfile.TemporaryDirectory() as tmp:
        try:
            files = drive(Path(tmp), patch, main_teardown)
        finally:
            for obj, name, value in reversed(saved):
                setattr(obj, name, value)
    out.write_text(json.dumps(files, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    record_main_fixture(Path(__file__).parent / "data" / "case_lines_main.json")

"""Replaying a trace as one case: the jobs and the checks (``CaseRunner.replay`` runs them).

The open loop sends request ``i`` at ``t_s`` after the case starts, whatever the server
is doing (as the trace's users did), up to ``max_in_flight`` open at once; the load
generator's self-check says whether the client kept to the times. Every record is
checked against its own trace line (input and output length).
"""

from __future__ import annotations

from strata_plugin.formats.records import RequestRecord
from strata_plugin.load.client import RequestSpec
from strata_plugin.load.generator import Job
from strata_plugin.load.trace import TraceRequest, TraceWorkload, trace_prompt
from strata_plugin.load.workload import TokenSpace


def trace_jobs(tw: TraceWorkload, case_id: str, space: TokenSpace, *, salt: str,
               model: str | None) -> list[Job]:
    """One open-loop job per trace request, at its scaled time."""
    jobs = []
    for i, q in enumerate(tw.requests):
        spec = RequestSpec(
            request_id=f"{case_id}/measured/{i}", case_id=case_id, phase="measured",
            max_tokens=q.osl, prompt_token_ids=trace_prompt(q, i, space, seed=tw.seed,
                                                            salt=salt),
            ignore_eos=not tw.expect_stop, temperature=0.0, seed=tw.seed, cache_prompt=True,
            isl=q.isl, model=model)
        jobs.append(Job(spec, q.t_s))
    return jobs


def check_trace(reqs: tuple[TraceRequest, ...], records: tuple[RequestRecord, ...],
                expect_stop: bool) -> list[str]:
    """Each record against its own trace line."""
    problems = []
    for r in records:
        q = reqs[int(r.request_id.rsplit("/", 1)[1])]
        if not r.ok:
            assert r.error is not None
            problems.append(f"{r.request_id}: {r.error.cls}: {r.error.message}")
            continue
        u = r.usage
        if u.prompt_tokens is not None and u.prompt_tokens != q.isl:
            problems.append(f"{r.request_id}: prompt tokens {u.prompt_tokens} != {q.isl}")
        if not expect_stop and u.completion_tokens is not None and u.completion_tokens != q.osl:
            problems.append(f"{r.request_id}: completion tokens {u.completion_tokens} != {q.osl}")
    return problems

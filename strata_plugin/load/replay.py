"""Replaying a trace as one case: the jobs and the checks (``CaseRunner.replay`` runs them).

The open loop sends request ``i`` at ``t_s`` after the case starts, whatever the server
is doing (as the trace's users did), up to ``max_in_flight`` open at once; the load
generator's self-check says whether the client kept to the times. Every record is
checked against its own trace line (input and output length).
"""

from __future__ import annotations

from strata_plugin.formats.printable import printable
from strata_plugin.formats.records import RequestRecord
from strata_plugin.load.client import RequestSpec
from strata_plugin.load.generator import Job
from strata_plugin.load.trace import TraceWorkload, conversation_prompts, trace_prompt
from strata_plugin.load.workload import TokenSpace


def trace_jobs(tw: TraceWorkload, case_id: str, space: TokenSpace, *, salt: str,
               model: str | None) -> list[Job]:
    """One job per trace request, at its scaled time (a conversation's later turns are
    sent by the caller after the previous answer; their offsets are not used)."""
    conv = conversation_prompts(tw, space, salt=salt)
    jobs = []
    for i, q in enumerate(tw.requests):
        tokens = conv.get(i) or trace_prompt(q, i, space, seed=tw.seed, salt=salt)
        spec = RequestSpec(
            request_id=f"{case_id}/measured/{i}", case_id=case_id, phase="measured",
            max_tokens=q.osl, prompt_token_ids=tokens, ignore_eos=not tw.expect_stop,
            temperature=0.0, seed=tw.seed, cache_prompt=True, isl=len(tokens), model=model)
        jobs.append(Job(spec, q.t_s))
    return jobs


def check_trace(jobs: list[Job], records: tuple[RequestRecord, ...],
                expect_stop: bool) -> list[str]:
    """Each record against its own job: the prompt sent, the output asked for."""
    problems = []
    for r in records:
        spec = jobs[int(r.request_id.rsplit("/", 1)[1])].spec
        want_in, want_out = spec.isl, spec.max_tokens
        if not r.ok:
            assert r.error is not None
            problems.append(f"{r.request_id}: {r.error.cls}: {printable(r.error.message)}")
            continue
        u = r.usage
        if u.prompt_tokens is not None and u.prompt_tokens != want_in:
            problems.append(f"{r.request_id}: prompt tokens {u.prompt_tokens} != {want_in}")
        if not expect_stop and u.completion_tokens is not None and u.completion_tokens != want_out:
            problems.append(
                f"{r.request_id}: completion tokens {u.completion_tokens} != {want_out}")
    return problems

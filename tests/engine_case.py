"""Cases run against a live packaged engine server (tests/engine_target.py): a runner for
it, and the exact, cold case both engines' live tests begin with."""

from __future__ import annotations

from strata_plugin.configure.profile import Profile
from strata_plugin.formats.cases import CaseLine
from strata_plugin.load.case_runner import CaseResult, CaseRunner, CaseSetup
from strata_plugin.load.client import Timeouts
from strata_plugin.load.workload import TokenSpace, Workload
from strata_plugin.run.server import Server


def case_runner(server: Server, profile: Profile, api: str, engine: str, salt: str = "it",
                cases: list[CaseLine] | None = None) -> CaseRunner:
    """A runner of cases against ``server`` over ``api``, prompts drawn from the profile's
    token ids for its model; nothing recorded but the case lines, appended to ``cases``."""
    lo, hi = profile.server.token_id_range
    setup = CaseSetup(server.base_url, api, "it", TokenSpace(lo, hi),
                      Timeouts(read_s=120), salt=salt, engine=engine,
                      model=profile.server.model_name)
    return CaseRunner(setup, record=lambda r: None, mark=lambda *a: None,
                      add_case=(cases.append if cases is not None else lambda c: None))


def exact_cold_case(server: Server, profile: Profile, api: str, engine: str,
                    flush_how: str) -> CaseResult:
    """Four requests of 300 prompt and 17 output tokens, two at a time after a warm-up,
    asserted exact and cold: the prefix cache flushed (``flush_how``) after the warm-up,
    and usage proving the measured requests had no cached prompt token."""
    w = Workload("it", isl=300, osl=17, concurrency=2, requests=4, warmups=1, seed=7)
    cases: list[CaseLine] = []
    res = case_runner(server, profile, api, engine, cases=cases).run(w, scale=False)
    assert res.problems == ()
    # the flush ran after the warm-up, and usage proved the measured requests cold
    assert cases[0].cache_flush["how"] == flush_how
    assert cases[0].cache_flush["ok"], cases[0].cache_flush
    assert cases[0].cold_prefix == "verified cold: 0 cached prompt tokens in 4 requests"
    for r in res.records:
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (300, 17)
        assert r.usage.cached_tokens == 0
        assert sum(e.n_tokens for e in r.events) == 17
        assert r.finish_reason == "length"
    return res

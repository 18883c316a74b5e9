"""Prefill-decode interference: a decode load with one long prefill injected.

Control and treatment alternate (C T T C C T) on one server. The injection is
placed in steady-state decode, when every stream of the decode load has a quarter of
its output, the same point of decode in every treatment repetition. The seed measured
-24.08% output tokens/s and +66.55% TPOT p95 on its two-node deployment.
"""

import pytest

from cases import matrix
from strata_plugin import ABArm, Injection, mixed_effects

ORDER = ("control", "treatment", "treatment", "control", "control", "treatment")
#: Sent when every stream of the decode load has a quarter of its output: inside the
#: first round of streams, mid-decode, at the same point of decode in every repetition
#: whatever the machine speed or the profile's scaling (a fixed delay in seconds landed
#: on a round boundary in one repetition of three on the embedded target).
INJECT_AT_OUTPUT = 0.25


@pytest.mark.mixed
@pytest.mark.smoke
def test_prefill_injected_into_decode(strata, record_property):
    runs = {"control": [], "treatment": []}

    def run_arm(arm: str, i: int):
        inject = (Injection(matrix.MIXED_INJECT, 0.0, at_output=INJECT_AT_OUTPUT)
                  if arm == "treatment" else None)
        result = strata.run(matrix.MIXED_DECODE, case_id=f"mixed/{arm}/{i}", inject=inject,
                            ab=ABArm("mixed", arm, repetition=i))
        assert not result.problems, "\n".join(result.problems)
        if inject:
            assert len(result.injected) == 1 and result.injected[0].ok
        runs[arm].append(result)
        return result

    for i, arm in enumerate(ORDER):
        run_arm(arm, i)
    # The tail, per repetition: the whole 95% interval over repetitions shows the rise on
    # every engine on a quiet host (vLLM CPU: +203% .. +358% at 3/3). On a busy one the
    # interval can hold zero (-75% .. +19578% at 3/3, issue 32): repetitions are added,
    # one per arm at a time, up to the bound (`ab_max_repetitions`), and an effect still
    # undecided is "not established", the test's own outcome; only an interval wholly
    # below zero (the data say the tail fell) fails it. The throughput change and the
    # stalls are recorded, not expected: how much of a run one injected prefill costs is
    # the engine's answer, not the harness's (quiet embedded llama.cpp: -29% tok/s,
    # interval -44% .. -11%; vLLM with chunked prefill, its 2K-token prefill 0.23 s inside
    # a 2.5 s run: +0% .. +7%, ~160 tokens lost per treatment, under the spread of its
    # repetitions). A control's stall time with a prefill in flight is near zero (vLLM:
    # 0.35, 0, 0.92 ms), so a ratio to it has no bounded interval and the report says so.
    expected = strata.expect_ab("mixed", "tpot_p95_ms", "increase", effects=mixed_effects,
                                run_arm=run_arm)
    print(expected.line())
    arms = strata.ab_results("mixed")
    assert arms == runs
    n = expected.repetitions
    assert len(runs["control"]) == len(runs["treatment"]) == n
    assert 3 <= n <= expected.max_repetitions
    if expected.outcome == "not established":  # undecided only once the bound is reached
        assert n == expected.max_repetitions, expected.line()
    effects = {e.metric: e for e in mixed_effects(arms["control"], arms["treatment"])}
    for e in effects.values():
        print(e.line())
        if e.change_pct is not None:  # None: a zero control value (e.g. TPOT p50 0 ms)
            record_property(f"mixed_{e.metric}_change_pct", round(e.change_pct, 2))
        record_property(f"mixed_{e.metric}_interval", f"{e.interval} ({e.interval_label})")
    for e in (effects["output_tok_s"], effects["tpot_p95_ms"],
              effects["stall_with_prefill_ms_per_request"]):
        assert (e.unit, e.n_control, e.n_treatment) == ("repetition", n, n), e.line()

"""Configuration sweeps: counterbalanced A/B blocks, speculative decoding, prefill batch.

Each server configuration is a parameter of the session-scoped server fixture, so
it boots once per block; in each server process the case runs its warm-ups (two
full ones, as in the seed) before the measured repetitions (three).
"""

import pytest

from cases import matrix
from strata_plugin import ABArm, Injection, Workload, effect, outputs_identical
from strata_plugin.analysis.metrics import acceptance, request_metrics

AB_WORKLOAD = Workload("ab_prefill_32k_1_c1", isl=32 * 1024, osl=16, concurrency=1,
                       requests=3, warmups=2, seed=31)


def _ttfts(results):
    return [m.ttft_ms for r in results for m in map(request_metrics, r.records)]


@pytest.mark.sweep
@pytest.mark.prefill
@pytest.mark.smoke
@pytest.mark.strata_blocks("default", "ub128", repeats=2, optional=True)
def test_ab_prefill_batch(strata, strata_server, record_property):
    """A B B A blocks of the default micro-batch against -ub 128."""
    arm = strata_server.config_id
    result = strata.run(AB_WORKLOAD, ab=ABArm("prefill_batch", arm),
                        extra={"block": strata_server.block_id})
    assert not result.problems, "\n".join(result.problems)
    arms = strata.ab_results("prefill_batch")
    if sorted(len(v) for v in arms.values()) == [2, 2] and set(arms) == {"default", "ub128"}:
        a, b = arms["default"], arms["ub128"]
        ttft = effect("ttft_mean_ms", _ttfts(a), _ttfts(b))
        print(ttft.line())
        record_property("ab_ttft_change_pct", round(ttft.change_pct, 2))
        record_property("ab_ttft_ci95", f"{ttft.ci_lo_pct:+.2f}..{ttft.ci_hi_pct:+.2f}")
        record_property("ab_outputs_identical", str(outputs_identical(a, b)))


SPEC_LENGTHS = {"spec_l15": 1.5, "spec_l25": 2.5, "spec_l35": 3.5}
SPEC_WORKLOAD = Workload("mtp_decode", isl=32, osl=256, concurrency=1, requests=4, warmups=1,
                         seed=41)
#: |measured - expected| acceptance allowed, with >= ~800 drafted tokens per config
#: (binomial spread about 0.02; the draft length also varies near the end of a request).
ACCEPTANCE_TOLERANCE = 0.07


@pytest.mark.mtp
@pytest.mark.smoke
@pytest.mark.strata_configs("spec_l15", "spec_l25", "spec_l35", optional=True)
def test_speculative_acceptance(strata, strata_server, record_property):
    """Acceptance = sum(accepted) / sum(drafted), against llama.cpp's synthetic setting."""
    result = strata.run(SPEC_WORKLOAD, scale=False,
                        ab=ABArm("mtp", strata_server.config_id))
    assert not result.problems, "\n".join(result.problems)
    length = SPEC_LENGTHS[strata_server.config_id]
    expected = (length - 1) / 3  # 3 drafts per step, geometric acceptance (llama.cpp)
    measured = acceptance(result.records)
    drafted = sum(r.timings.draft_n or 0 for r in result.records)
    record_property("spec_expected_acceptance", round(expected, 4))
    record_property("spec_drafted", drafted)
    print(f"L={length}: acceptance {measured:.3f} (expected {expected:.3f}, "
          f"{drafted} drafted), decode {result.metrics.server_decode_tok_s:.0f} tok/s")
    assert drafted >= 500
    assert measured == pytest.approx(expected, abs=ACCEPTANCE_TOLERANCE)


@pytest.mark.sweep
@pytest.mark.prefill
@pytest.mark.strata_configs("ub128", "default", "ub2048", optional=True)
def test_prefill_batch_sweep(strata, strata_server, record_property):
    """TTFT and prefill tok/s per micro-batch, and the interference on running decodes."""
    prefill = strata.run(matrix.PREFILL_128K_C1, case_id=f"sweep/prefill/{strata_server.config_id}")
    assert not prefill.problems, "\n".join(prefill.problems)
    control = strata.run(matrix.MIXED_DECODE, case_id=f"sweep/control/{strata_server.config_id}")
    treated = strata.run(matrix.MIXED_DECODE, case_id=f"sweep/inject/{strata_server.config_id}",
                         inject=Injection(matrix.MIXED_INJECT, 0.5))
    assert not control.problems and not treated.problems
    c95, t95 = control.metrics.tpot.p95, treated.metrics.tpot.p95
    record_property("interference_tpot_p95_change_pct", round(100 * (t95 / c95 - 1), 2))
    print(f"{strata_server.config_id}: TTFT p50 {prefill.metrics.ttft.p50:.0f} ms, "
          f"prefill {prefill.metrics.server_prefill_tok_s:.0f} tok/s, "
          f"decode TPOT p95 {c95:.1f} -> {t95:.1f} ms with the prefill injected")

"""The attribution matrix: prefill, decode and long-context cases, one test each."""

import pytest

from cases import matrix


def _assert_as_asked(result):
    """ISL, OSL and the cold prefix were checked against what the server reported."""
    assert not result.problems, "\n".join(result.problems)
    assert result.metrics.n_ok == result.workload.requests


@pytest.mark.prefill
@pytest.mark.smoke
@pytest.mark.parametrize("workload", [matrix.PREFILL_128K_C1, matrix.PREFILL_32K_C16],
                         ids=lambda w: w.name)
def test_prefill(strata, workload):
    result = strata.run(workload)
    _assert_as_asked(result)
    assert result.metrics.ttft.p50 > 0


@pytest.mark.decode
@pytest.mark.smoke
@pytest.mark.parametrize("workload", [matrix.DECODE_1K_1K_C32, matrix.DECODE_1K_4K_C16],
                         ids=lambda w: w.name)
def test_decode(strata, workload):
    result = strata.run(workload)
    _assert_as_asked(result)
    assert result.metrics.tpot.p50 > 0


@pytest.mark.long_context
@pytest.mark.decode
@pytest.mark.smoke
def test_long_context(strata):
    result = strata.run(matrix.LONG_128K_1K_C1)
    _assert_as_asked(result)
    assert result.metrics.ttft.p50 > result.metrics.tpot.p50

"""First cases: one prefill-heavy and one decode-heavy workload.

Workloads are written at the seeds' nominal sizes; the profile's [scale] table
shrinks them to what the target holds, and the report shows both.
"""

import pytest

from strata_plugin.workload import Workload

PREFILL = Workload("prefill_128k_c1", isl=131072, osl=1, concurrency=1, requests=3, warmups=1)
DECODE = Workload("decode_1k_1k_c32", isl=1024, osl=1024, concurrency=32, requests=8,
                  warmups=1)


def _assert_clean(result):
    assert not result.problems, "\n".join(result.problems)
    assert result.metrics.n_ok == result.workload.requests


@pytest.mark.prefill
@pytest.mark.smoke
def test_prefill(strata):
    result = strata.run(PREFILL)
    _assert_clean(result)
    assert result.metrics.ttft.p50 is not None


@pytest.mark.decode
@pytest.mark.smoke
def test_decode(strata):
    result = strata.run(DECODE)
    _assert_clean(result)
    assert result.metrics.tpot.p50 is not None

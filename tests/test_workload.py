"""Workloads: exact prompt lengths, cold vs shared prefixes, arrival processes."""

import itertools
import statistics

import pytest

from strata_plugin.load.workload import TokenSpace, Workload, arrival_offsets_s, prompt_tokens

SPACE = TokenSpace(300, 1000)


def test_prompts_are_exact_and_deterministic():
    w = Workload("w", isl=777, osl=4, seed=3)
    a, b = prompt_tokens(w, 0, SPACE), prompt_tokens(w, 0, SPACE)
    assert len(a) == 777 and a == b
    assert all(300 <= t < 1000 for t in a)
    assert prompt_tokens(w, 1, SPACE)[:8] != a[:8]  # cold: differs from the first token
    assert prompt_tokens(w, 0, SPACE, salt="run2")[:8] != a[:8]  # a rerun stays cold


def test_shared_prefix():
    w = Workload("w", isl=100, osl=1, prefix="shared", shared_prefix_tokens=60)
    a, b = prompt_tokens(w, 0, SPACE), prompt_tokens(w, 1, SPACE)
    assert a[:60] == b[:60] and a[60:] != b[60:]


def test_scaling_rounds_and_floors():
    w = Workload("w", isl=131072, osl=1024, concurrency=32)
    s = w.scaled(context=1 / 64, output=1 / 16, concurrency=1 / 8)
    assert (s.isl, s.osl, s.concurrency) == (2048, 64, 4)
    assert Workload("w", isl=1, osl=1).scaled(context=0.001).isl == 1


def _gaps(offsets):
    return [b - a for a, b in itertools.pairwise(offsets)]


def test_poisson_and_gamma_rates():
    w = Workload("w", isl=1, osl=1, arrival="poisson", rate=50.0, seed=1)
    gaps = _gaps(arrival_offsets_s(w, 4001))
    assert statistics.mean(gaps) == pytest.approx(1 / 50, rel=0.08)
    bursty = Workload("w", isl=1, osl=1, arrival="gamma", rate=50.0, burstiness=0.25, seed=1)
    bgaps = _gaps(arrival_offsets_s(bursty, 4001))
    assert statistics.mean(bgaps) == pytest.approx(1 / 50, rel=0.15)
    # Burstiness < 1 means a larger spread of gaps than Poisson at the same rate.
    assert statistics.pstdev(bgaps) > 1.5 * statistics.pstdev(gaps)
    assert arrival_offsets_s(Workload("w", isl=1, osl=1), 3) is None


@pytest.mark.parametrize("kwargs", [dict(isl=0, osl=1), dict(isl=1, osl=1, arrival="poisson"),
                                    dict(isl=1, osl=1, prefix="warm"),
                                    dict(isl=10, osl=1, prefix="shared",
                                         shared_prefix_tokens=11)])
def test_invalid_workloads(kwargs):
    with pytest.raises(ValueError):
        Workload("w", **kwargs)

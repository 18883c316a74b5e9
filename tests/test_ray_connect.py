"""Connecting to a Ray cluster (load/ray_engine.connect): the head's transient answers
are retried within a bound, everything else fails at once, and the error says which.

A fake ``ray`` whose ``init`` fails a set number of times, on a fake clock: no Ray needed.
"""

from __future__ import annotations

import pytest

from strata_plugin.configure.load_spec import LoadSpec
from strata_plugin.load.ray_engine import (
    CONNECT_RETRY_S,
    CONNECT_TIMEOUT_S,
    RayUnavailable,
    connect,
)

SPEC = LoadSpec(engine="ray", address="ray://10.0.0.2:10001")
# What Ray Client's proxy answered on a busy head (ray/util/client/server/proxier.py)
STARTING = RuntimeError("Starting Ray client server failed. See ray_client_server_23000.err "
                        "for detailed logs.")


class FakeRay:
    def __init__(self, failures: int, error: Exception = STARTING) -> None:
        self.failures, self.error = failures, error
        self.inits = self.shutdowns = 0

    def init(self, **kw) -> None:
        self.inits += 1
        assert kw["address"] == SPEC.address
        if self.inits <= self.failures:
            raise self.error

    def shutdown(self) -> None:
        self.shutdowns += 1


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def _connect(ray: FakeRay, clock: Clock) -> None:
    connect(ray, SPEC, {}, clock=clock, sleep=clock.sleep)


#: attempts within the bound: at t = 0, 2, ..., 88 s (one more would start at 90 s, the bound)
FITS = 45


def test_the_bound_is_stated_and_a_few_attempts_fit():
    assert (CONNECT_TIMEOUT_S, CONNECT_RETRY_S) == (90.0, 2.0)


def test_a_client_server_that_failed_to_start_is_tried_again_until_it_connects():
    ray, clock = FakeRay(failures=3), Clock()
    _connect(ray, clock)
    assert (ray.inits, ray.shutdowns, clock.t) == (4, 3, 3 * CONNECT_RETRY_S)


def test_the_last_attempt_that_fits_the_bound_connects():
    ray, clock = FakeRay(failures=FITS - 1), Clock()
    _connect(ray, clock)
    assert ray.inits == FITS and clock.t < CONNECT_TIMEOUT_S


def test_one_failure_more_is_an_error_that_says_how_many_attempts_and_why():
    ray, clock = FakeRay(failures=FITS), Clock()
    with pytest.raises(RayUnavailable) as err:
        _connect(ray, clock)
    assert ray.inits == FITS
    msg = str(err.value)
    assert "could not connect to the Ray cluster (RuntimeError: Starting Ray client" in msg
    assert f"did not start a server for this driver in {FITS} attempts over 90 s" in msg
    assert "ray_client_server_*.err" in msg


@pytest.mark.parametrize("error", [ConnectionError("ray client connection timeout"),
                                   ValueError("bad address")])
def test_any_other_answer_fails_at_once(error):
    ray, clock = FakeRay(failures=1, error=error), Clock()
    with pytest.raises(RayUnavailable, match="not retried: not a transient answer") as err:
        _connect(ray, clock)
    assert (ray.inits, clock.t) == (1, 0.0)
    assert str(error) in str(err.value)


def test_the_proxys_other_transient_answer_is_retried_too():
    ray, clock = FakeRay(failures=1, error=RuntimeError(
        "Proxy failed to Connect to backend! Check `ray_client_server.err`")), Clock()
    _connect(ray, clock)
    assert ray.inits == 2

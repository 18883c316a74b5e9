"""Ctrl-C while the Ray driver pumps its actors' messages (load/ray_engine.InterruptLatch):
the signal is latched and raised by the pump itself, between its waits, so that no
library the main thread is inside of at that instant (Ray Client's gRPC calls) can lose
it; a second signal goes straight to the handler that was there. Real signals to this
process; no Ray needed (the live test is tests/test_ray_cluster.py, the Ctrl-C test)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from strata_plugin.load.ray_engine import InterruptLatch

pytestmark = pytest.mark.usefixtures("sigint_as_at_a_terminal")


def _swallowing_call() -> bool:
    """What a library that catches everything does with an interrupt raised inside it;
    whether it caught one."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs between bytecodes, in here
            pass
    except BaseException:  # the library's, not ours
        return True
    return False


def test_without_the_latch_an_interrupt_inside_a_library_is_lost() -> None:
    assert _swallowing_call()  # raised in there, and the caller never sees it


def test_a_latched_interrupt_survives_the_library_and_is_raised_by_the_pump() -> None:
    with InterruptLatch() as latch:
        assert not _swallowing_call()
        assert latch.fired == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            latch.check()
        # raised once: the grace for the actors' records pumps on
        latch.check()
        # the handler before it is back: a second Ctrl-C ends the grace at once
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_signal_before_the_pump_looked_goes_to_the_old_handler() -> None:
    with InterruptLatch() as latch, pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
        assert latch.fired == signal.SIGINT
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_no_signal_no_interrupt_and_the_handlers_given_back() -> None:
    before = {s: signal.getsignal(s) for s in InterruptLatch.SIGNALS}
    with InterruptLatch() as latch:
        latch.check()
    assert {s: signal.getsignal(s) for s in InterruptLatch.SIGNALS} == before


def test_off_the_main_thread_nothing_is_installed() -> None:
    seen: list[object] = []

    def run() -> None:
        with InterruptLatch() as latch:
            seen.append(signal.getsignal(signal.SIGINT))
            latch.check()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [signal.default_int_handler]

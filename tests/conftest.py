"""Fixtures shared by the harness's own tests."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from built_once import built_once

from strata_plugin.formats.records import RequestRecord
from strata_plugin.load.client import send_streaming
from strata_plugin.load.client.mux import StreamMux

Send = Callable[..., RequestRecord]


@pytest.fixture(params=["thread", "mux"])
def send(request: pytest.FixtureRequest) -> Iterator[Send]:
    """Every client scenario through both drivers: a reading thread, and the selector loop."""
    if request.param == "thread":
        yield send_streaming
        return
    with StreamMux() as mux:
        yield mux.send_streaming


@pytest.fixture
def confinable() -> None:
    """Model-written code can be confined here (load/sandbox.probe, a real run), or skip."""
    from strata_plugin.load import sandbox

    reason = sandbox.probe()
    if reason:
        pytest.skip(f"this machine cannot confine model-written code: {reason}")


def _cpu_report(folder: Path) -> Path:
    from bundle_factory import cpu_run

    from strata_plugin.report import write_report

    run = cpu_run(folder)
    write_report(run)
    return run


@pytest.fixture(scope="session")
def cpu_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bundle_factory's CPU run with its report written, once per session (both workers
    of ``-n 2`` included): the report tests and the CI-file tests only read it, and drawing
    its 14 plots is the costliest step of the fast lane."""
    return built_once(tmp_path_factory, "cpu_report", _cpu_report)


@pytest.fixture
def sigint_as_at_a_terminal() -> Iterator[None]:
    """Python's own Ctrl-C handler for the test, as a terminal session has it. A test run
    started in the background of a script (``cmd &``) inherits SIGINT ignored, and a
    signal to this process or ``_thread.interrupt_main()`` then does nothing: ten Ray
    runs in a loop started so failed every time with "the interrupt was lost". (A child
    the test signals: ``default_signals.restore`` as its ``preexec_fn``.)"""
    prev = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, prev)

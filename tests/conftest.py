"""Fixtures shared by the harness's own tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def cpu_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bundle_factory's CPU run with its report written, once per session: the report
    tests and the CI-file tests only read it, and drawing its 14 plots is the costliest
    step of the fast lane."""
    from bundle_factory import cpu_run

    from strata_plugin.report import write_report

    run = cpu_run(tmp_path_factory.mktemp("cpu_report"))
    write_report(run)
    return run

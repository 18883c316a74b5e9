"""Fixtures shared by the harness's own tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

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

"""A folder its tests only read, built once for the whole test session."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import pytest


def built_once(factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], Path]) -> Path:
    """What ``build`` makes in a folder of its own, made once for the whole session: with
    pytest-xdist the workers share their base folder's parent, and the first to take the
    lock builds while the others wait for it (pytest-xdist's documented recipe, "Making
    session-scoped fixtures execute only once"). For what its tests only read."""
    root = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder, done = root / name, root / f"{name}.built"
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            folder.mkdir(exist_ok=True)
            done.write_text(str(build(folder)))
    return Path(done.read_text())

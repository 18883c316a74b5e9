"""SIGINT for a harness a test interrupts: whatever this test run inherited.

A test run started in the background of a script (``cmd &``) inherits SIGINT ignored, and
a child process it starts keeps ignoring it: a test that presses Ctrl-C on a harness in a
subprocess would then see nothing happen. (The fixture for this process's own handler is
``sigint_as_at_a_terminal`` in conftest.py.)"""

from __future__ import annotations

import signal


def sigint_default() -> None:
    """``preexec_fn``: SIGINT's default action in the child, so that its Python installs
    its Ctrl-C handler as at a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

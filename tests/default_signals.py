"""Children that a test signals start with the default dispositions.

A process started in the background by a non-interactive shell (``cmd &``) or under
``nohup`` inherits SIGINT (and SIGHUP) ignored, and so would every child the tests start:
a test that sends Ctrl-C to a child pytest then watches a run that never sees it (the
whole signal suite failed that way when the CI command was started with ``nohup ... &``).
Pass :func:`restore` as ``preexec_fn`` where a test delivers those signals itself.
"""

from __future__ import annotations

import signal

SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)


def restore() -> None:
    """In the child, before exec: the signals the tests send act by default."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)

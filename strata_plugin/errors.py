"""The root of every exception Strata raises: ``except StrataError`` catches them all.

Each of Strata's exception classes keeps the builtin base it always had (``ProfileError``
is still a ``ValueError``, ``ServerDown`` still a ``RuntimeError``), with ``StrataError``
beside it, so code that catches the builtin sees no change. This module imports nothing,
so any layer can use it without an import cycle.

Not under it: the sampling agent's errors (``strata_plugin/agent/``), because the agent
ships to other nodes as a standard-library-only zip that cannot import this package, and
``load/sandbox_child.py``'s, which run only inside the sandbox, never in the harness.
"""

from __future__ import annotations


class StrataError(Exception):
    """Anything Strata raises on purpose: bad input, a machine that cannot do what was
    asked, a server or run folder that failed. The message is meant for the user."""

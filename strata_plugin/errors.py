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


def failure_words(exc: BaseException) -> str:
    """An unexpected exception as one line a report can carry in place of what it broke:
    its type, where it was raised (the innermost frame: module file and function; and
    Strata's own innermost frame when that was in a library) and its message, so the
    reader of a report with one part missing sees which code to blame without a
    traceback."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        path = code.co_filename.replace("\\", "/")
        at = path.rfind("/strata_plugin/")
        frames.append((at >= 0, f"{path[at + 1:] if at >= 0 else path.rsplit('/', 1)[-1]} "
                                f"{code.co_name}"))
        tb = tb.tb_next
    where = ""
    if frames:
        where = f" in {frames[-1][1]}"
        own = [f for mine, f in frames if mine]
        if not frames[-1][0] and own:
            where += f" (from {own[-1]})"
    words = " ".join(str(exc).split())
    if len(words) > 300:  # a message can quote its input; the reason stays one short line
        words = words[:300] + "..."
    return f"{type(exc).__name__}{where}: {words}" if words else f"{type(exc).__name__}{where}"

"""Credentials in URLs, hidden: ``http://user:pw@host`` -> ``http://***@host``.

The one redaction function of Strata (``configure/credentials.py`` takes it from here).
It lives in the agent because the agent, standard library only and shipped alone to
remote nodes, writes other processes' command lines (the server's, its parents') into
the run folder, and a command line may hold a URL with a password in it.
"""

from __future__ import annotations

import re

#: What stands in for the credentials of a URL in everything Strata writes or shows.
HIDDEN = "***"
#: ``scheme://userinfo@``: the userinfo is everything up to the last ``@`` before the
#: host's end (``/``, ``?``, ``#``, whitespace, a quote or the text's end), as
#: ``urllib.parse.urlsplit`` takes it, so a password holding ``@`` or ``:`` is hidden whole.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s\"'<>]*)@")


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``:
    ``http://user:pw@host:8000/x`` -> ``http://***@host:8000/x``; text without a URL
    is returned as is."""
    if "@" not in text or "://" not in text:
        return text
    return _USERINFO.sub(lambda m: m.group("scheme") + HIDDEN + "@", text)


#: Options whose value is a secret as often as not (``--token X``, ``--api-key=X``,
#: ``--password X``, ``--env {...}``): hidden in the *other* processes' command lines the
#: agent names (collectors/allowance.py), which are not the user's to show. The server's
#: own command line is the user's and keeps them (the report shows how it was run).
_SECRET_WORDS = r"token|secret|passw|pwd|api[-_]?key|private[-_]?key|auth|credential|cookie|env"
_SECRET_OPTION = re.compile(rf"^--?[\w.-]*(?:{_SECRET_WORDS})[\w.-]*$", re.I)
_SECRET_ASSIGN = re.compile(rf"^[A-Za-z_]\w*(?:{_SECRET_WORDS})\w*=|^(?:{_SECRET_WORDS})\w*=",
                            re.I)


def redact_argv(argv: list[str]) -> list[str]:
    """``argv`` with URL credentials hidden (:func:`redact`) and the values of options and
    ``NAME=value`` words that look like secrets (:data:`_SECRET_OPTION`) replaced by
    ``***``: ``--token abc`` -> ``--token ***``, ``--api-key=abc`` -> ``--api-key=***``,
    ``HF_TOKEN=abc`` -> ``HF_TOKEN=***``."""
    out: list[str] = []
    hide_next = False
    for a in argv:
        if hide_next:
            hide_next = False
            if not a.startswith("-"):
                out.append(HIDDEN)
                continue
        name, eq, _value = a.partition("=")
        if a.startswith("-") and _SECRET_OPTION.match(name):
            out.append(f"{name}={HIDDEN}" if eq else a)
            hide_next = not eq
        elif not a.startswith("-") and eq and _SECRET_ASSIGN.match(a):
            out.append(f"{name}={HIDDEN}")
        else:
            out.append(redact(a))
    return out

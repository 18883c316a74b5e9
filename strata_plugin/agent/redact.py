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

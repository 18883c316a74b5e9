"""Credentials in URLs (``http://user:password@host:port``): accepted, sent, never
written or shown.

Why: a server behind a proxy that wants Basic auth is reached as
``--strata-server-url http://user:pw@host:8000``, as curl and ``requests`` accept it
(RFC 3986 section 3.2.1 calls the userinfo deprecated for that reason, but clients send
it as Basic auth: RFC 7617). Such a URL used to land in the manifest, the report,
summary.json, cases.jsonl, the agent's command files and its argv (``ps`` shows every
local user another process's argv, ``proc(5)``, /proc/PID/cmdline), events.jsonl and the
terminal. So the URL is split where it enters: the credentials go into an
``Authorization`` header that the client, the health poll and the agent's ``/metrics``
scrape send (the agent gets it through its environment, which only its owner can read,
``proc(5)`` /proc/PID/environ), and the URL Strata keeps has none. What Strata writes
that it did not build itself (the command line it was started with, a profile's
commands and URLs, other processes' command lines the agent records) goes through
:func:`redact`, the one function that hides them (agent/redact.py).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

# The one redaction function: the agent's (it records other processes' command lines).
from strata_plugin.agent.redact import HIDDEN, redact

__all__ = ["HIDDEN", "UrlAuth", "redact", "redact_argv", "redact_json", "split_credentials"]

def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line with every URL's credentials hidden (:func:`redact` per word)."""
    return [redact(str(a)) for a in argv]


def redact_json(value: Any) -> Any:
    """Every string of a JSON-like value through :func:`redact` (dict keys too)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k) if isinstance(k, str) else k: redact_json(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_json(v) for v in value]
    return value


@dataclass(frozen=True)
class UrlAuth:
    """The user and password a URL carried; shown as ``***`` in any repr."""

    user: str = field(repr=False)
    password: str = field(repr=False)

    def header(self) -> str:
        """The ``Authorization`` value: Basic auth (RFC 7617), as ``requests`` sends it."""
        text = f"{self.user}:{self.password}"
        try:
            raw = text.encode("latin-1")  # as requests encodes it
        except UnicodeEncodeError:
            raw = text.encode("utf-8")  # RFC 7617 section 2.1's charset="UTF-8"
        token = base64.b64encode(raw)
        return "Basic " + token.decode("ascii")

    def headers(self) -> dict[str, str]:
        return {"Authorization": self.header()}

    def __repr__(self) -> str:
        return f"UrlAuth({HIDDEN})"


def split_credentials(url: str) -> tuple[str, UrlAuth | None]:
    """``url`` without its userinfo, and the credentials it held (percent-decoded, as
    ``requests.utils.get_auth_from_url`` reads them), or None where it had none."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    bare = urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment))
    return bare, UrlAuth(unquote(user), unquote(password))

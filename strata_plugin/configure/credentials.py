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
import binascii
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

# The one redaction function: the agent's (it records other processes' command lines).
from strata_plugin.agent.redact import HIDDEN, redact

__all__ = ["HIDDEN", "UrlAuth", "redact", "redact_argv", "redact_json", "secret_values",
           "split_credentials"]

#: A request header that carries a credential, by its name: ``Authorization`` (the
#: profile's API key as a bearer token, a URL's user and password as Basic auth),
#: ``Proxy-Authorization``, ``Cookie``, and the API-key headers gateways take
#: (``X-API-Key``, ``api-key``, ``X-Auth-Token``). Only these values are secrets; the
#: others (``Connection: close``, ``Accept``) are words an error message may well hold.
_CREDENTIAL_HEADER = re.compile(r"auth|key|token|secret|passw|cookie|credential", re.I)
#: A part of a credential shorter than this (a one-letter password, a cookie's "1") is
#: not looked for in messages: it would hide the same letters in every word. The whole
#: header value is always hidden, whatever its length.
_PART_CHARS_MIN = 4

def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line with every URL's credentials hidden (:func:`redact` per word)."""
    return [redact(str(a)) for a in argv]


def secret_values(headers: Mapping[str, str]) -> tuple[str, ...]:
    """The secrets among request ``headers``, to be hidden from any message: each
    credential header's value (:data:`_CREDENTIAL_HEADER`), the token after its scheme
    word (``Bearer``, ``Basic``), a Basic token's ``user:password`` and password, and a
    cookie's values; longest first, so a value is hidden whole before its parts."""
    out: set[str] = set()
    for name, value in headers.items():
        if not value or not _CREDENTIAL_HEADER.search(name):
            continue
        out.add(value)
        parts = [value]
        scheme, _, token = value.strip().partition(" ")
        if token:
            parts.append(token.strip())
            if scheme.lower() == "basic":
                try:
                    pair = base64.b64decode(token.strip(), validate=True).decode("utf-8")
                except (binascii.Error, UnicodeDecodeError):
                    pair = ""
                parts += [pair, pair.partition(":")[2]] if ":" in pair else []
        if "cookie" in name.lower():
            parts += [c.partition("=")[2].strip() for c in value.split(";")]
        out.update(p for p in parts if len(p) >= _PART_CHARS_MIN)
    return tuple(sorted(out, key=lambda s: (-len(s), s)))


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

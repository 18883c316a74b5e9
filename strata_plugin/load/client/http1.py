"""HTTP/1.1 by hand for the loop: a prepared request's bytes, and a response head.

The loop owns its sockets (non-blocking), so it cannot use http.client. The
request is still built by ``requests`` (``Session.prepare_request``: the same
headers, body and auth as a ``Session.send``); this module only writes it out
as urllib3 would and reads back the status line and headers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import requests
from urllib3.util import parse_url

from strata_plugin.errors import StrataError

MAX_HEAD_BYTES = 64 * 1024


class HeadError(StrataError, ValueError):
    """The response head is not HTTP/1.x."""


@dataclass(frozen=True)
class Target:
    """Where a request goes: what the loop connects to, and whether it can."""

    scheme: str
    host: str
    port: int


def target_of(url: str) -> Target:
    u = parse_url(url)
    scheme = (u.scheme or "http").lower()
    port = u.port or (443 if scheme == "https" else 80)
    return Target(scheme, (u.host or "").strip("[]"), port)


def request_bytes(prep: requests.PreparedRequest, target: Target) -> bytes:
    """The request on the wire: request line, Host (as urllib3 adds it), headers, body."""
    host = f"[{target.host}]" if ":" in target.host else target.host
    default = 443 if target.scheme == "https" else 80
    lines = [f"{prep.method} {prep.path_url} HTTP/1.1"]
    if "host" not in prep.headers:
        lines.append(f"Host: {host}" if target.port == default else f"Host: {host}:{target.port}")
    body = prep.body or b""
    if isinstance(body, str):
        body = body.encode()
    if not isinstance(body, bytes):
        raise ValueError("the loop sends bytes bodies only")
    lines.extend(f"{k}: {v}" for k, v in prep.headers.items())
    if body and "content-length" not in prep.headers:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass(frozen=True)
class Head:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    framing: str  # "chunked" | "length" | "close"
    length: int | None
    keep_alive: bool


def parse_head(buf: bytes) -> tuple[Head | None, int]:
    """The final (non-1xx) head at the start of ``buf`` and the bytes it took; (None, 0) if
    it is not complete yet. Raises HeadError on a malformed or oversized head."""
    pos = 0
    while True:
        end = buf.find(b"\r\n\r\n", pos)
        if end < 0:
            if len(buf) - pos > MAX_HEAD_BYTES:
                raise HeadError("response head larger than 64 KiB")
            return None, 0
        lines = buf[pos:end].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        # RFC 9112 section 4: status-code = 3DIGIT, ASCII digits only ("2\u00b20".isdigit()
        # is True, int() of it a ValueError).
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not _is_digits(parts[1], 3):
            raise HeadError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(parts[1])
        pos = end + 4
        if 100 <= status < 200 and status != 101:
            continue  # 100 Continue and friends: the real head follows
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, sep, v = line.partition(":")
            if not sep:
                raise HeadError(f"bad header line {line[:80]!r}")
            name, v = k.strip().lower(), v.strip()
            if name == "content-length" and name in headers:  # as http.client joins them
                v = f"{headers[name]}, {v}"
            headers[name] = v
        conn = headers.get("connection", "").lower()
        keep = parts[0] == "HTTP/1.1" and "close" not in conn
        te = headers.get("transfer-encoding", "").lower()
        if "chunked" in te:
            return Head(status, headers, "chunked", None, keep), pos
        if "content-length" in headers and status not in (204, 304):
            length = content_length(headers["content-length"])
            if length is None:
                raise HeadError(f"bad Content-Length {headers['content-length'][:40]!r}")
            return Head(status, headers, "length", length, keep), pos
        if status in (204, 304):
            return Head(status, headers, "length", 0, keep), pos
        return Head(status, headers, "close", None, False), pos


_DIGITS = frozenset("0123456789")


def _is_digits(s: str, n: int | None = None) -> bool:
    """``s`` is ASCII digits only (``n`` of them, when given)."""
    return bool(s) and (n is None or len(s) == n) and _DIGITS.issuperset(s)


def content_length(value: str) -> int | None:
    """A Content-Length value, or None if it is not one: RFC 9110 section 8.6, ``1*DIGIT``
    (``int()`` also takes ``+5``, `` 5``, ``5_0``), or a list of one number repeated."""
    values = {v.strip() for v in value.split(",")}
    if len(values) != 1:
        return None
    v = values.pop()
    return int(v) if _is_digits(v) else None


def head_problem(headers: Mapping[str, str], defects: Sequence[str] = ()) -> str | None:
    """Why a 2xx head cannot carry the stream we asked for, or None; both drivers ask.

    A ``Content-Encoding`` other than identity was not asked for (every request sends
    ``Accept-Encoding: identity``: a compressed stream is decoded in blocks, which would
    delay events); it is refused, not decoded. A header line http.client could not read
    (``defects``; the loop's :func:`parse_head` raises instead) and a Content-Length that
    is not digits (http.client would read such a body to EOF) are malformed too.
    """
    if defects:
        return f"a response header line is not a header ({', '.join(defects)})"
    enc = (headers.get("content-encoding") or "identity").strip().lower()
    if enc != "identity":
        return (f"Content-Encoding {enc[:40]} not requested (the request sent "
                "Accept-Encoding: identity)")
    cl = headers.get("content-length")
    te = (headers.get("transfer-encoding") or "").lower()
    if cl is not None and "chunked" not in te and content_length(cl) is None:
        return f"bad Content-Length {cl[:40]!r}"
    return None

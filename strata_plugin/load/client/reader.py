"""The blocking driver: timestamped ``read1`` calls on one response, in the caller's thread.

``iter_content`` can hold an event back until the next one arrives (a fixed
chunk size) or read to EOF (an unframed body), which would add an inter-token
interval to TTFT. ``read1`` returns whatever bytes one socket read delivered
(http.client undoes the chunked framing), so each read is stamped when it
actually arrived.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from urllib3.exceptions import ProtocolError, ReadTimeoutError

from strata_plugin.load.client.core import StreamCore
from strata_plugin.load.client.errors import StreamError

READ_SIZE = 64 * 1024
DRAIN_S = 1.0  # after the terminal event: wait this long for the end of the body
DRAIN_BYTES = 64 * 1024  # and read at most this much of it
#: An unframed body (no length, no chunks: it ends at the close) that ended before its
#: first byte. http.client takes a head cut short by EOF as complete, so the thread
#: driver cannot tell this from an EOF inside the head: both are a ``reset`` in both drivers.
NO_BODY = "the connection closed before the first body byte (or inside the response head)"


def socket_of(raw: Any) -> socket.socket | None:
    """The socket under a urllib3 response, when it can be found."""
    conn = getattr(raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    return sock if isinstance(sock, socket.socket) else None


def read_blocking(raw: Any, core: StreamCore, read_s: float, deadline_ns: int | None,
                  unframed: bool = False) -> None:
    """Read ``raw`` (a urllib3 response) to its end into ``core``; raises StreamError.

    Every read waits at most ``read_s`` (the socket timeout requests set), and
    the socket timeout is shortened as ``deadline_ns`` (total_s) approaches.
    After the terminal event the rest of the body is drained briefly so the
    connection can be reused; a slow or endless tail is cut off, not an error.
    (A shortened socket timeout needs no restoring: a connection read to its
    end goes back to the pool, where urllib3 sets its timeouts afresh.)
    """
    read1 = raw.read1
    sock = socket_of(raw)
    mono = time.monotonic_ns
    timeout = read_s
    drained = 0
    while True:
        if core.done:
            if drained > DRAIN_BYTES:
                return
            if sock is not None and DRAIN_S < timeout:
                timeout = DRAIN_S
                sock.settimeout(timeout)
        elif deadline_ns is not None:
            left = (deadline_ns - mono()) / 1e9
            if left <= 0:
                raise StreamError("timeout", "the request ran past total_s")
            if sock is not None and left < timeout:
                timeout = left
                sock.settimeout(timeout)
        try:
            chunk = read1(READ_SIZE)
        except (ReadTimeoutError, TimeoutError):
            if core.done:
                return
            if timeout < read_s:
                raise StreamError("timeout", "the request ran past total_s") from None
            raise StreamError("timeout", f"no data for read_s={read_s:g} s") from None
        except ProtocolError as e:
            if core.done:
                return
            raise StreamError("reset", f"connection broken mid-stream: {_cause(e)}") from None
        except OSError as e:
            if core.done:
                return
            raise StreamError("reset", f"connection error mid-stream: {_cause(e)}") from None
        now = mono()
        if not chunk:
            if unframed and not core.n_bytes:
                raise StreamError("reset", NO_BODY)
            core.end_of_body(now)
            return
        if core.done:
            drained += len(chunk)
        core.feed(chunk, now)


def _cause(e: BaseException) -> str:
    """The innermost reason, without repr noise; never includes request headers."""
    args = getattr(e, "args", ())
    inner = args[-1] if args else None
    if isinstance(inner, BaseException):
        return f"{type(inner).__name__}: {inner}"
    return str(e)

"""Incremental HTTP/1.1 chunked transfer decoding for the multiplexing loop.

The loop reads sockets itself (non-blocking), so it cannot use http.client's
blocking chunk reader. Only framing bytes are buffered here (a size line, a
CRLF); chunk data passes straight through.
"""

from __future__ import annotations

from strata_plugin.errors import StrataError

_SIZE, _DATA, _CRLF, _TRAILER, _DONE = range(5)
_MAX_LINE = 4096


class ChunkError(StrataError, ValueError):
    """The chunked framing is broken."""


_HEX = b"0123456789abcdefABCDEF"


def chunk_size(line: bytes) -> int:
    """The size in a chunk-size line (its CRLF cut off); ChunkError unless it is hex.

    RFC 9112 section 7.1: ``chunk-size = 1*HEXDIG``, then optional extensions after
    ``;`` (with optional whitespace before it). ``int(x, 16)`` alone also takes
    ``+1a``, `` 1a``, ``0x1a`` and ``1_a``.
    """
    size = line.split(b";", 1)[0].rstrip(b" \t")
    if not size or size.lstrip(_HEX):
        raise ChunkError(f"bad chunk size line {line[:40]!r}")
    return int(size, 16)


class ChunkedDecoder:
    def __init__(self) -> None:
        self._state = _SIZE
        self._left = 0
        self._buf = b""
        self.complete = False  # the last chunk and trailers were read
        self.extra = 0  # bytes seen after the end of the body

    def feed(self, data: bytes) -> bytes:
        """Raw bytes in, body bytes out (possibly empty)."""
        if self._state == _SIZE and not self._buf:
            # The common read: exactly one whole chunk (what a streaming server
            # writes per event). Same result as the general path below, in a third
            # of its time; anything else (extensions, partial or several chunks,
            # the last chunk) takes the general path.
            j = data.find(b"\r\n", 0, 10)
            # bytes.isalnum is ASCII-only; of the alphanumeric strings int(x, 16) takes,
            # only hex digits are a chunk size, not a "0x" prefix.
            if j > 0 and data[:j].isalnum() and (j < 2 or data[1] not in b"xX"):
                try:
                    size = int(data[:j], 16)
                except ValueError:
                    size = 0
                if size > 0 and len(data) == j + size + 4 and data.endswith(b"\r\n"):
                    return data[j + 2 : j + 2 + size]
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        pos, n = 0, len(buf)
        while pos < n:
            state = self._state
            if state == _DATA:
                take = min(self._left, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    self._state = _CRLF
            elif state == _CRLF:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise ChunkError("chunk data not followed by CRLF")
                pos += 2
                self._state = _SIZE
            elif state in (_SIZE, _TRAILER):
                j = buf.find(b"\n", pos)
                if j < 0:
                    if n - pos > _MAX_LINE:
                        raise ChunkError("chunk size line too long")
                    break
                line = buf[pos:j].rstrip(b"\r")
                pos = j + 1
                if state == _TRAILER:
                    if not line:
                        self._state = _DONE
                        self.complete = True
                    continue
                size = chunk_size(line)
                if size == 0:
                    self._state = _TRAILER
                else:
                    self._left = size
                    self._state = _DATA
            else:  # _DONE
                self.extra += n - pos
                pos = n
        self._buf = buf[pos:]
        return out[0] if len(out) == 1 else b"".join(out)

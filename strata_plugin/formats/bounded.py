"""Files read from paths Strata was handed (a model's files, a cache): opened without
blocking, only when they are regular files, and read only within a size bound.

Why: a path can name a FIFO (its ``open`` waits for a writer for ever) or a device, and a
file can be corrupt or hostile (a 4 GB ``config.json``). ``open`` with ``O_NONBLOCK``
returns at once for a FIFO, and ``fstat`` on what was opened (not on the name, which may
change in between) says whether it is a regular file; the size is checked before a byte
is read. JSON is checked for nesting before anything reads into it.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from strata_plugin.errors import StrataError
from strata_plugin.limits import MODEL_JSON_DEPTH_MAX


class BoundedReadError(StrataError, ValueError):
    """A file that is not a regular file, is larger than its bound, or is not JSON of a
    bounded nesting; the message names the file and the bound."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


@contextlib.contextmanager
def open_regular(path: Path | str) -> Iterator[tuple[IO[bytes], int]]:
    """``(file, size)`` of a regular file, opened for reading without waiting on it; a FIFO,
    a device or a folder raises BoundedReadError naming what it is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BoundedReadError(f"{path}: {_kind(st.st_mode)}, not a regular file "
                                   "(not read: reading it could wait for ever)")
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f, st.st_size


def read_bytes(path: Path | str, max_bytes: int, limit_name: str) -> bytes:
    """The whole of a regular file of at most ``max_bytes`` (``limit_name`` in
    strata_plugin/limits.py), else BoundedReadError before any byte is read."""
    with open_regular(path) as (f, size):
        if size > max_bytes:
            raise BoundedReadError(f"{path}: {size} bytes, past {limit_name} ({max_bytes} "
                                   "bytes): not read")
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:  # it grew while read
        raise BoundedReadError(f"{path}: past {limit_name} ({max_bytes} bytes): not read")
    return raw


def depth_within(value: Any, max_depth: int) -> bool:
    """Whether no list or object in ``value`` nests deeper than ``max_depth`` levels."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            children: Any = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if d > max_depth:
            return False
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return True


def parse_json(raw: bytes, where: str) -> Any:
    """JSON nested at most MODEL_JSON_DEPTH_MAX levels, else BoundedReadError naming
    ``where`` (never a RecursionError). Its values are the caller's to check."""
    deep = f"{where}: JSON nested past MODEL_JSON_DEPTH_MAX ({MODEL_JSON_DEPTH_MAX} levels)"
    try:
        value = json.loads(raw)
    except RecursionError:
        raise BoundedReadError(deep) from None
    except ValueError as e:  # JSONDecodeError, bad UTF-8, an integer of 4300+ digits
        raise BoundedReadError(f"{where}: not JSON ({e})") from None
    if not depth_within(value, MODEL_JSON_DEPTH_MAX):
        raise BoundedReadError(deep)
    return value


def read_json(path: Path | str, max_bytes: int, limit_name: str) -> Any:
    """A bounded JSON file (read_bytes, then parse_json)."""
    return parse_json(read_bytes(path, max_bytes, limit_name), str(path))

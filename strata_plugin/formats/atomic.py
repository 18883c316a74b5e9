"""Whole-file writes a crash cannot tear: a temporary file in the same folder, fsynced,
then renamed over the final name.

Readers (a CI step, a dashboard, the next report) see the previous file or the new one,
never half of one: ``os.replace`` is atomic within a file system (POSIX ``rename(2)``),
which is why the temporary file lives in the target's own folder. The temporary file is
created like ``open(path, "w")`` would create the final one (mode 0o666 less the umask),
so a run folder written under a private umask stays private. A write that fails or is
interrupted by an exception removes its temporary file; one whose process is killed
leaves it, named ``.<name>.<random>.tmp``, and the final name untouched.

Append-only streams (``requests.jsonl``, ``samples/*.csv``, the server log) are not
written this way: their readers skip a torn last line instead.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

TMP_SUFFIX = ".tmp"


def temp_name(path: Path) -> Path:
    """A fresh temporary name beside ``path`` (hidden, so folder listings skip it)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}{TMP_SUFFIX}")


def atomic_open(path: Path | str, mode: str = "w", *, encoding: str = "utf-8",
                newline: str | None = None) -> contextlib.AbstractContextManager[IO[Any]]:
    """``with atomic_open(p) as fh: fh.write(...)``: the file appears under ``p`` only
    when the block ends without an exception, complete and fsynced."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', not {mode!r}")
    return _atomic(Path(path), mode, encoding, newline)


@contextlib.contextmanager
def _atomic(path: Path, mode: str, encoding: str, newline: str | None) -> Iterator[IO[Any]]:
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                 0o666)  # the umask applies, as for open(path, "w")
    try:
        if mode == "wb":
            fh: IO[Any] = os.fdopen(fd, "wb")
        else:
            fh = os.fdopen(fd, "w", encoding=encoding, newline=newline)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    try:
        with fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_dir(path.parent)


def _sync_dir(folder: Path) -> None:
    """Make the rename itself durable (best effort: not every file system allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: Path | str, text: str, *, encoding: str = "utf-8") -> None:
    """``Path.write_text``, atomically (newlines written as given)."""
    with atomic_open(path, "w", encoding=encoding, newline="") as fh:
        fh.write(text)


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """``Path.write_bytes``, atomically."""
    with atomic_open(path, "wb") as fh:
        fh.write(data)

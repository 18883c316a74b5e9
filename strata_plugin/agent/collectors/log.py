"""Follow the server's log file and turn regex matches into samples and events.

Patterns are ``NAME=REGEX`` with named groups. For every matching line:

* counter ``NAME.count`` (matches so far);
* for each numeric group ``g``: gauge ``NAME.g`` (this line's value) and counter
  ``NAME.g_total`` (running sum, so a window's delta is exact even when several
  lines land in one tick);
* a pattern without numeric groups, or with text groups, also writes an
  ``event`` (a marker: name, wall time, groups, the line).

Samples carry the wall time the agent read the line (at most one interval
after the server wrote it); matches within one tick get consecutive ns.
The file is followed across truncation and rotation (a new inode is read from
its start) and may appear after the agent started.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from .base import Collector, Emit, Missing, Unavailable

if TYPE_CHECKING:
    import argparse

    from ..targets import ProcessTargets

#: llama.cpp server per-request timing lines (print_timing), old and new layouts.
LLAMACPP_PATTERNS: dict[str, str] = {
    "llama_prompt": r"prompt eval time\s*=\s*(?P<ms>[\d.]+) ms\s*/\s*(?P<tokens>\d+) tokens",
    "llama_eval": r"(?<!prompt )eval time\s*=\s*(?P<ms>[\d.]+) ms\s*/\s*(?P<tokens>\d+) "
    r"(?:tokens|runs)",
    "llama_total": r"total time\s*=\s*(?P<ms>[\d.]+) ms\s*/\s*(?P<tokens>\d+) tokens",
    "llama_draft": r"draft acceptance rate\s*=\s*(?P<rate>[\d.]+)\s*\(\s*(?P<accepted>\d+) "
    r"accepted\s*/\s*(?P<generated>\d+) generated",
}
HEAD_BYTES = 64
MAX_READ = 4 << 20  # bytes per tick; the rest waits for the next tick
_NAME_RX = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def parse_pattern(spec: str) -> tuple[str, re.Pattern[str]]:
    """``NAME=REGEX`` -> (name, compiled); ValueError with the reason otherwise."""
    name, sep, rx = spec.partition("=")
    if not sep or not _NAME_RX.match(name):
        raise ValueError(
            f"log pattern must be NAME=REGEX with NAME like [A-Za-z_][\\w.]*: {spec!r}"
        )
    try:
        return name, re.compile(rx)
    except re.error as e:
        raise ValueError(f"log pattern {name!r}: bad regex: {e}") from None


def _number(text: str | None) -> float | int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None


class LogFollower:
    """Reads what was appended to a file since the last call, line by line."""

    def __init__(self, path: str, from_start: bool = False) -> None:
        self.path = path
        self.fd: int | None = None
        self.ino: int | None = None
        self.pos = 0
        self.partial = b""
        self.head = b""  # the file's first bytes as last seen, to notice a rewrite
        self._first = True
        self._from_start = from_start

    def _open(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            self._first = False  # a file that appears later is read from its start
            return False
        st = os.fstat(fd)
        self.fd, self.ino = fd, st.st_ino
        self.pos = st.st_size if (self._first and not self._from_start) else 0
        self._first = False
        self.partial = b""
        self.head = os.pread(fd, min(HEAD_BYTES, self.pos), 0)
        return True

    def lines(self) -> list[str]:
        if self.fd is None and not self._open():
            return []
        assert self.fd is not None
        out = self._drain()
        try:
            st = os.stat(self.path)
            rotated = st.st_ino != self.ino
        except OSError:
            rotated = False  # removed: keep the old fd until a new file appears
        if rotated:
            os.close(self.fd)
            self.fd = None
            if self._open():
                out += self._drain()
        return out

    def _drain(self) -> list[str]:
        assert self.fd is not None
        size = os.fstat(self.fd).st_size
        # Truncated in place: smaller than what we read, or (truncated and regrown
        # between two ticks) its first bytes are no longer the ones we saw.
        if size < self.pos or (self.head and os.pread(self.fd, len(self.head), 0) != self.head):
            self.pos = 0
            self.partial = b""
            self.head = b""
        if size == self.pos:
            return []
        data = os.pread(self.fd, min(size - self.pos, MAX_READ), self.pos)
        if self.pos == 0 or len(self.head) < HEAD_BYTES:
            self.head = os.pread(self.fd, min(HEAD_BYTES, self.pos + len(data)), 0)
        self.pos += len(data)
        data = self.partial + data
        parts = data.split(b"\n")
        self.partial = parts.pop()
        return [p.decode("utf-8", errors="replace").rstrip("\r") for p in parts]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class LogCollector(Collector):
    source = "log"

    def __init__(
        self,
        path: str,
        patterns: dict[str, str] | None = None,
        defaults: bool = True,
        from_start: bool = False,
    ) -> None:
        super().__init__()
        specs = dict(LLAMACPP_PATTERNS) if defaults else {}
        specs.update(patterns or {})
        self.patterns = [(name, re.compile(rx)) for name, rx in specs.items()]
        self.follower = LogFollower(path, from_start=from_start)
        self.counts: dict[str, int] = {}
        self.sums: dict[str, float] = {}

    def probe(self) -> None:
        if not self.patterns:
            raise Unavailable("no log patterns given")
        directory = os.path.dirname(os.path.abspath(self.follower.path))
        if not os.path.isdir(directory):
            raise Unavailable(f"log directory does not exist: {directory}")
        if not os.path.exists(self.follower.path):
            self.info(
                kind="waiting",
                source=self.source,
                detail=f"{self.follower.path} does not exist yet",
            )
        elif not os.access(self.follower.path, os.R_OK):
            raise Unavailable(f"cannot read {self.follower.path}: permission denied")
        self.follower.lines()  # position at the end (or start) now, not at the first tick
        self.info(
            kind="log",
            source=self.source,
            path=self.follower.path,
            patterns={n: p.pattern for n, p in self.patterns},
        )

    def close(self) -> None:
        self.follower.close()

    def sample(self, wall_ns: int) -> list[Emit]:
        out: list[Emit] = []
        t = wall_ns
        for line in self.follower.lines():
            for name, rx in self.patterns:
                m = rx.search(line)
                if m is None:
                    continue
                self.counts[name] = self.counts.get(name, 0) + 1
                out.append((t, "", f"{name}.count", self.counts[name], "counter"))
                texts = {}
                for g, text in m.groupdict().items():
                    val = _number(text)
                    if val is None:
                        if text is not None:
                            texts[g] = text
                        continue
                    key = f"{name}.{g}"
                    self.sums[key] = self.sums.get(key, 0) + val
                    out.append((t, "", key, val, "gauge"))
                    out.append((t, "", f"{key}_total", self.sums[key], "counter"))
                if texts or not m.groupdict():
                    self.event(
                        kind="log_match",
                        source=self.source,
                        name=name,
                        wall_ns=t,
                        groups=texts,
                        line=line[:500],
                    )
                t += 1
        return out


def from_args(args: argparse.Namespace, targets: ProcessTargets) -> Collector:
    """The registry's factory (``registry.py``): the agent's options -> this collector."""
    if not args.log_file:
        return Missing(LogCollector.source, "no --log-file given")
    patterns = dict((n, rx.pattern) for n, rx in (parse_pattern(s) for s in args.log_pattern))
    return LogCollector(args.log_file, patterns, defaults=not args.no_default_log_patterns,
                        from_start=args.log_from_start)

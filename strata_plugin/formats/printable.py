"""Text from outside, made safe to show: the one function every renderer calls where a
server's, a file's or a plugin's words enter the terminal or report.md.

Why: an error body, a model's architecture name, an engine's log line or a plugin's
output is whatever its sender chose. Written raw, an escape sequence clears the screen,
sets the window title or moves the cursor (ECMA-48: ESC, CSI, OSC, and their 8-bit C1
forms), a CR or LF fakes a line of Strata's own output or breaks a markdown table row,
and a bidirectional override (Unicode UAX #9: the embeddings, overrides and isolates,
the marks) shows the reader text in an order other than the one it has. Each such
character is written as its escape instead (``\\x1b``, ``\\r``, ``\\u202e``): visible,
and the same on a terminal, in a CI log and in report.md. Everything else, other
scripts and emoji included, is kept as it is.
"""

from __future__ import annotations

import re
from typing import Any

#: Unicode's bidirectional formatting characters (UAX #9, "Explicit Directional
#: Embeddings/Overrides/Isolates" and the implicit marks): LRE RLE PDF LRO RLO, LRI RLI FSI
#: PDI, LRM RLM, ALM; and the line and paragraph separators, which some viewers break at.
_BIDI_AND_BREAKS = "\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\u2028\u2029"
#: C0 controls (tab, CR, LF and ESC among them), DEL, C1 controls (U+0080-U+009F: 8-bit
#: CSI is U+009B), and the characters above.
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI_AND_BREAKS}]")
#: The same but for LF and tab: a block's lines and its indentation (a tab moves the
#: cursor to the next stop, it overwrites nothing).
_UNSAFE_KEEPING_LINES = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI_AND_BREAKS}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def printable(text: Any, *, keep_lines: bool = False) -> str:
    """``text`` (any value, as ``str()`` shows it) with every control character and
    bidirectional formatting character written as its escape, so it is shown, not
    obeyed: one line stays one line. ``keep_lines``: a block of lines (a log tail, a
    plugin's output, report.md) keeps its line feeds and tabs and shows every other
    control (a CR before a LF included, as ``\\r``)."""
    s = text if isinstance(text, str) else str(text)
    pattern = _UNSAFE_KEEPING_LINES if keep_lines else _UNSAFE
    return pattern.sub(_escape, s)

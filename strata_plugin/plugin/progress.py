"""The live progress line of a running case, written past pytest's output capture.

While a test runs, pytest captures file descriptors 1 and 2, so a line written through
the terminal reporter lands in the test's captured output (seen only with ``-s``).
The line is written with capture suspended for the moment of writing, the way pytest's
own live logging does (``CaptureManager.global_and_fixture_disabled``). On a terminal
the case's one line is rewritten in place; where nobody watches (``CI`` set, or output
not a terminal) it stays silent unless asked for (``--strata-progress on``), and then
prints a plain line every few seconds and the final count, for logs.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Mapping

from strata_plugin.formats.printable import printable
from strata_plugin.plugin.options import PROGRESS_SETTINGS as SETTINGS
from strata_plugin.plugin.options import progress_setting

#: Seconds between lines where the line cannot be rewritten in place (CI logs).
LOG_EVERY_S = 10.0


def in_ci(env: Mapping[str, str]) -> bool:
    """``CI`` set to anything but false/0 (GitHub Actions, GitLab CI, Buildkite, ... set
    ``CI=true``), or this repository's own ``CI_NO_PROGRESS``."""
    ci = env.get("CI", "").strip().lower()
    return (ci not in ("", "0", "false", "no")) or bool(env.get("CI_NO_PROGRESS"))


def progress_mode(setting: str, *, isatty: bool, ci: bool, quiet: bool) -> str:
    """``"live"`` (one line rewritten in place), ``"lines"`` (a line now and then, for
    logs) or ``"off"``. ``auto``: live on a terminal outside CI, else off; ``on``: always,
    live where the terminal allows; ``off``: never."""
    if setting not in SETTINGS:
        raise ValueError(f"expected one of {', '.join(SETTINGS)}, got {setting!r}")
    if setting == "off":
        return "off"
    if setting == "on":
        return "live" if isatty else "lines"
    return "live" if isatty and not ci and not quiet else "off"


class ProgressLine:
    """``emit(line, final)``: the case runner's progress callback (load/case_runner.py),
    called from its ticker thread about once a second and once at the end."""

    def __init__(self, reporter, capture, mode: str, label: str) -> None:
        self._tr, self._capman, self._mode, self._label = reporter, capture, mode, label
        self._lock = threading.Lock()
        self._shown = False  # live: the line is on screen, to be rewritten
        self._last = 0.0

    def _write(self, text: str, final: bool) -> None:
        if self._mode == "live":
            width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
            text = text[:width]
            if not self._shown:
                self._tr.ensure_newline()
                self._tr.write(text, flush=True)
                self._shown = True
            else:
                self._tr.rewrite(text, erase=True)
                self._tr.flush()
            if final:
                self._tr.write("\n", flush=True)
                self._shown = False
        else:
            self._tr.write_line(text)
            self._tr.flush()

    def __call__(self, line: str, final: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if self._mode == "lines" and not final and now - self._last < LOG_EVERY_S:
                return
            self._last = now
            text = printable(f"  [strata {self._label}] {line}{' (done)' if final else ''}")
            if self._capman is None:
                self._write(text, final)
                return
            with self._capman.global_and_fixture_disabled():
                self._write(text, final)


def progress_line(config, label: str) -> ProgressLine | None:
    """The progress callback for one test, or None where the mode is off."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is None:
        return None
    mode = progress_mode(progress_setting(config), isatty=bool(tr.isatty()),
                         ci=in_ci(os.environ), quiet=config.get_verbosity() < 0)
    if mode == "off":
        return None
    return ProgressLine(tr, config.pluginmanager.get_plugin("capturemanager"), mode, label)

"""Strata's part of pytest's terminal summary: the skipped cases, the results table.

The table itself is rendered by ``report/terminal.py`` from the run's ``summary.json``;
this module only decides what to print and writes it through the terminal reporter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strata_plugin.formats.printable import printable

if TYPE_CHECKING:
    import pytest

    from strata_plugin.plugin.state import RunState


def skip_reason(report: pytest.TestReport) -> str:
    """The reason a skipped test report gives, without pytest's ``Skipped: `` prefix."""
    rep = report.longrepr
    text = rep[2] if isinstance(rep, tuple) and len(rep) == 3 else str(rep or "")
    return text.removeprefix("Skipped: ")


def note_skip(state: RunState, report: pytest.TestReport) -> None:
    state.skipped.append((report.nodeid, skip_reason(report)))


def skipped_lines(skipped: list[tuple[str, str]]) -> list[str]:
    """Each skipped case and why, one line each (pytest's own ``-rs`` groups them)."""
    return [printable(f"skipped {nodeid}: {reason}") for nodeid, reason in skipped]


def write_summary(tr: pytest.TerminalReporter, state: RunState) -> None:
    sess = state.session
    if sess is None and not state.skipped:
        return
    tr.write_sep("-", "strata")
    for line in skipped_lines(state.skipped):
        tr.write_line(line)
    if sess is None:
        return
    cfg = sess.cfg
    target = cfg.server_url or "launched by Strata"
    tr.write_line(f"profile: {cfg.profile.name} ({cfg.profile.path}), server: {target}")
    tr.write_line(f"run folder: {sess.run_dir}")
    from strata_plugin.report.terminal import run_results

    table = None if cfg.dry_run else run_results(sess.run_dir)
    if table:
        tr.write_line("")
        for line in table.splitlines():
            tr.write_line(line)
    elif (sess.run_dir / "report.md").exists():
        tr.write_line(f"report: {sess.run_dir / 'report.md'}")
    if sess.incomplete_reason:
        tr.write_line(f"run incomplete: {printable(sess.incomplete_reason)}")

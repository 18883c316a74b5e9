"""report.md's sections, in the order the report shows them: the one list a new section
joins (docs/extending.md, "Adding a report section").

Each entry is a name and a function of the analysed run (:class:`ReportData`) that
returns the section's markdown ("" to leave it out). A section that needs files from
the run folder, or draws a plot, also has a ``prepare``: ``report/writer.py`` calls it
once before rendering, with the run and the plots folder, and the section finds what
it returned in ``d.prepared[name]``. Rendering itself reads no file and no clock, so
the same run gives the same text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata_plugin.report import (
    capacity_md,
    diagnostic,
    ledger_md,
    markdown,
    prefix_cache_md,
    roofline_md,
    steady_state_md,
    sufficiency_md,
)
from strata_plugin.report.markdown import ReportData


@dataclass(frozen=True)
class Section:
    #: the key of what ``prepare`` returned in ``ReportData.prepared``; unique in the list
    name: str
    render: Callable[[ReportData], str]
    #: reads files or draws plots (``plot_dir`` is the run's ``plots/``); called by the
    #: writer only, before any section renders
    prepare: Callable[[ReportData, Path], Any] | None = None


SECTIONS: tuple[Section, ...] = (
    Section("header", markdown.header),
    Section("summary", markdown.summary_section),
    Section("A/B comparisons", markdown.ab_section),
    Section("limits", markdown.limits),
    Section("environment", markdown.static_section),
    Section("cases at a glance", markdown.summary_table),
    Section("run details", markdown.run_details),
    Section("cases", markdown.cases_section),
    Section(diagnostic.TITLE, diagnostic.report_section, diagnostic.prepare),
    Section("run timeline", markdown.run_timeline),
    Section(sufficiency_md.TITLE, sufficiency_md.report_section),
    Section(steady_state_md.TITLE, steady_state_md.report_section),
    Section(prefix_cache_md.TITLE, prefix_cache_md.report_section),
    Section(capacity_md.TITLE, capacity_md.report_section, capacity_md.prepare),
    Section(ledger_md.TITLE, ledger_md.report_section, ledger_md.prepare),
    Section(roofline_md.TITLE, roofline_md.report_section),
    Section("thresholds", markdown.thresholds_section),
)


def _sections(sections: Sequence[Section] | None) -> Sequence[Section]:
    # Looked up when called, not when defined: a test (or a plugin of the user's) that
    # replaces SECTIONS is what both the writer and render see.
    return SECTIONS if sections is None else sections


def prepare(d: ReportData, plot_dir: Path, sections: Sequence[Section] | None = None
            ) -> ReportData:
    """``d`` with every section's ``prepare`` result under its name (the writer's step:
    the file reading and the drawing)."""
    secs = _sections(sections)
    names = [s.name for s in secs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"report sections named twice: {', '.join(dup)} "
                         "(strata_plugin/report/sections.py, SECTIONS)")
    return dataclasses.replace(
        d, prepared={**d.prepared,
                     **{s.name: s.prepare(d, plot_dir) for s in secs if s.prepare is not None}})


def render(d: ReportData, sections: Sequence[Section] | None = None) -> str:
    """report.md: read in a minute, the summary, then the A/B groups, then the details
    (collapsed). Pure: the same ``d`` gives the same text, and no file is opened."""
    return "".join(s.render(d) for s in _sections(sections))

"""report.md's sections, in the order the report shows them: Strata's own in
:data:`SECTIONS`, and another package's through the ``strata.report_sections``
entry-point group (docs/extending.md, "A report section"), placed before the closing
thresholds table.

Each entry is a name and a function of the analysed run (:class:`ReportData`) that
returns the section's markdown ("" to leave it out). A section that needs files from
the run folder, or draws a plot, also has a ``prepare``: ``report/writer.py`` calls it
once before rendering, with the run and the plots folder, and the section finds what
it returned in ``d.prepared[name]``. Rendering itself reads no file and no clock, so
the same run gives the same text.

No section can take the report down with it: an exception in a section's ``prepare``
or ``render`` becomes one line under its heading, with the reason ("Roofline: unavailable
(TypeError in ...: ...)"; a plugin's, "not rendered: ...", naming the plugin), and every
other section renders as before.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata_plugin import entry_points
from strata_plugin.errors import failure_words
from strata_plugin.formats.printable import printable
from strata_plugin.report import (
    capacity_md,
    diagnostic,
    engines_md,
    ledger_md,
    markdown,
    prefix_cache_md,
    roofline_md,
    steady_state_md,
    sufficiency_md,
)
from strata_plugin.report.report_data import ReportData


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
    Section(engines_md.TITLE, engines_md.report_section),
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


#: Where the plugins' sections go: before this one, the closing table of thresholds.
PLUGINS_BEFORE = "thresholds"


def plugin_sections() -> tuple[Section, ...]:
    """The ``strata.report_sections`` plugins' sections, checked (entry_points.
    PluginError naming the distribution and entry point otherwise), each guarded so an
    exception in it is one line of the report; loaded once, on first use."""
    return _checked(entry_points.load(entry_points.REPORT_SECTIONS))


@dataclass(frozen=True)
class _Failed:
    """What a section's ``prepare`` left when it raised."""

    why: str
    #: caught here, around a section that does not say its own failure (a plugin's
    #: guarded section does, naming the plugin)
    unsaid: bool = False


def _guarded(p: entry_points.Plugin) -> Section:
    sec: Section = p.obj
    who = f"plugin {p.name!r}" + (f" ({p.dist})" if p.dist else "")

    def failed(d: ReportData, why: str) -> str:
        return f"\n## {sec.name}\n\nnot rendered: {who} raised {printable(why)}\n"

    def render(d: ReportData) -> str:
        got = d.prepared.get(sec.name)
        if isinstance(got, _Failed):
            return failed(d, got.why)
        try:
            return sec.render(d)
        except Exception as e:  # the plugin's own code: the rest of the report stands
            return failed(d, f"{type(e).__name__}: {e}")

    prepare = None
    if sec.prepare is not None:
        def prepare(d: ReportData, plot_dir: Path, _prep=sec.prepare) -> Any:
            try:
                return _prep(d, plot_dir)
            except Exception as e:
                return _Failed(f"{type(e).__name__}: {e}")

    return Section(sec.name, render, prepare)


@functools.cache
def _checked(plugins: tuple[entry_points.Plugin, ...]) -> tuple[Section, ...]:
    own = {s.name for s in SECTIONS}
    seen: dict[str, entry_points.Plugin] = {}
    for p in plugins:
        sec = p.obj
        if not isinstance(sec, Section):
            raise p.error(f"a report section's entry point names a Section, not a "
                          f"{type(sec).__name__}")
        if sec.name in own:
            raise p.error(f"the section name {sec.name!r} is a built-in section of Strata's "
                          "report; a plugin's section takes a name of its own")
        if sec.name in seen:
            raise p.error(f"the section name {sec.name!r} is also {seen[sec.name].where()}'s")
        seen[sec.name] = p
    return tuple(_guarded(p) for p in plugins)


def all_sections() -> tuple[Section, ...]:
    """report.md's sections in order: Strata's, with the plugins' (by entry-point name)
    before the closing thresholds table."""
    plugins = plugin_sections()
    if not plugins:
        return SECTIONS
    at = next((i for i, s in enumerate(SECTIONS) if s.name == PLUGINS_BEFORE), len(SECTIONS))
    return (*SECTIONS[:at], *plugins, *SECTIONS[at:])


def _sections(sections: Sequence[Section] | None) -> Sequence[Section]:
    # Looked up when called, not when defined: a test that replaces SECTIONS (or a
    # plugin installed since) is what both the writer and render see.
    return all_sections() if sections is None else sections


def _unavailable(s: Section, why: str) -> str:
    """What a section that failed leaves in its place: its heading, and why."""
    return f"\n## {s.name}\n\n{s.name}: unavailable ({printable(why)})\n"


def _prepared(s: Section, d: ReportData, plot_dir: Path) -> Any:
    assert s.prepare is not None
    try:
        return s.prepare(d, plot_dir)
    except Exception as e:  # the other sections, and the other files, stand
        return _Failed(failure_words(e), unsaid=True)


def prepare(d: ReportData, plot_dir: Path, sections: Sequence[Section] | None = None
            ) -> ReportData:
    """``d`` with every section's ``prepare`` result under its name (the writer's step:
    the file reading and the drawing); a ``prepare`` that raised leaves the reason, and
    its section says it."""
    secs = _sections(sections)
    names = [s.name for s in secs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"report sections named twice: {', '.join(dup)} "
                         "(strata_plugin/report/sections.py, SECTIONS)")
    return dataclasses.replace(
        d, prepared={**d.prepared,
                     **{s.name: _prepared(s, d, plot_dir) for s in secs
                        if s.prepare is not None}})


def _rendered(s: Section, d: ReportData) -> str:
    got = d.prepared.get(s.name)
    if isinstance(got, _Failed) and got.unsaid:
        return _unavailable(s, got.why)
    try:
        return s.render(d)
    except Exception as e:  # the report stands without this section, saying why
        return _unavailable(s, failure_words(e))


def render(d: ReportData, sections: Sequence[Section] | None = None) -> str:
    """report.md: read in a minute, the summary, then the A/B groups, then the details
    (collapsed). Pure: the same ``d`` gives the same text, and no file is opened."""
    # The last guard: what a plugin's section or a place not escaped at its insertion
    # writes keeps its lines but shows its other controls (formats/printable.py).
    return printable("".join(_rendered(s, d) for s in _sections(sections)), keep_lines=True)

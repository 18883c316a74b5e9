"""The analysed run that every report.md section renders from (:class:`ReportData`),
and the A/B group it carries (:class:`AbGroup`).

Its own module so that a section (``report/sections.py``'s list, a plugin's
``strata.report_sections``) depends on the data it renders, not on the core sections.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strata_plugin.analysis.ab_groups import ArmDelta, ArmEffects, ShaPair
from strata_plugin.analysis.case_summary import CaseAnalysis, RunContext
from strata_plugin.analysis.expectations import ABExpectation
from strata_plugin.analysis.run_folder import RunBundle
from strata_plugin.analysis.static_diff import NodeStatic
from strata_plugin.analysis.timeline import SampleStore


@dataclass
class AbGroup:
    group: str
    arms: list[tuple[str, tuple[str, ...]]]
    deltas: list[ArmDelta]
    pairs: list[ShaPair]
    effects: list[ArmEffects] = field(default_factory=list)
    plot: str = ""  # plots/<name>: request timeline, inter-token ECDF, per repetition
    #: the expected effects the case judged (analysis/expectations.py), with outcomes
    expectations: list[ABExpectation] = field(default_factory=list)


@dataclass(frozen=True)
class ReportData:
    """The analysed run: everything a report section renders from, built once by
    ``report/writer.py`` (which does all the file reading and the drawing), so that
    rendering is a function of this alone."""

    bundle: RunBundle
    store: SampleStore
    ctx: RunContext
    analyses: list[CaseAnalysis]
    limits: list[str]
    case_plots: Mapping[str, tuple[str, list[str]]] = field(default_factory=dict)
    run_plot: tuple[str, list[str]] | None = None
    ab: list[AbGroup] = field(default_factory=list)
    static: list[NodeStatic] = field(default_factory=list)
    #: each case's reported percentiles with their counts (analysis/sufficiency.py)
    sufficiency: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    #: lines under a case's percentile table, by case id (e.g. sample sufficiency)
    case_notes: Mapping[str, list[str]] = field(default_factory=dict)
    #: what each section's ``prepare`` returned (``report/sections.py``), by section name:
    #: the files it read, the plots it drew
    prepared: Mapping[str, Any] = field(default_factory=dict)
    #: the line naming each case's slice of the run's timeline (report/trace_events.py)
    case_traces: Mapping[str, str] = field(default_factory=dict)
    #: why a plot was not drawn, by what it is (``case:<id>``, ``run``, ``ab:<group>``):
    #: a plot that failed costs its picture only, said in its place (report/writer.py)
    plot_failures: Mapping[str, str] = field(default_factory=dict)
    #: False: the report was written without its PNGs (``report --no-plots``)
    plots: bool = True

"""The names another package imports to add an engine, a rule or a report section to
Strata (docs/extending.md): public, documented, and the same objects Strata's own
engines, rules and sections are made of.

A plugin package declares what it adds in its pyproject.toml, one entry-point group per
kind (the group names: :mod:`strata_plugin.entry_points`)::

    [project.entry-points."strata.engines"]          # an EngineSpec
    [project.entry-points."strata.collectors"]       # a module with from_args(args, targets)
    [project.entry-points."strata.rules"]            # a RulePlugin
    [project.entry-points."strata.report_sections"]  # a Section

* An engine: :class:`EngineSpec` (its API is one of :data:`API_FLAVOURS`).
* A rule: :class:`RulePlugin` holding its :class:`Rule` row (group one of
  :data:`RULE_GROUPS`), its :class:`Threshold` rows and the function that computes its
  new signals from a window's :class:`HwView`; the rule function takes the window's
  :class:`WindowSignals` and returns an :class:`Outcome`, recording its comparisons
  with :class:`RuleCheck` and scoring with :func:`signal_margin` / :func:`margin`;
  ``unassessable`` names one of the ``TRACE_*`` finer traces (or any text that says what
  would measure it).
* A report section: :class:`Section` rendering from :class:`ReportData` (tables with
  :func:`md_table`).
* A collector's module imports from the agent alone,
  ``strata_plugin.agent.collectors.base`` (``Collector``, ``Emit``, ``Unavailable``,
  ``Missing``) and ``strata_plugin.agent.targets`` (``ProcessTargets``), never from
  here: it runs in the agent, on the standard library alone, on other nodes too.

:func:`check_plugins` loads and checks every installed plugin (what a run does first).

The names resolve lazily, as the package's own (``strata_plugin/__init__.py``), so a
plugin that imports one name does not pay for the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from strata_plugin.analysis.rules.outcome import Outcome, RuleCheck, margin, signal_margin
    from strata_plugin.analysis.rules.registry import RulePlugin
    from strata_plugin.analysis.rules.table import GROUPS as RULE_GROUPS
    from strata_plugin.analysis.rules.table import Rule
    from strata_plugin.analysis.rules.traces import (
        TRACE_BLOCK,
        TRACE_CLOCK,
        TRACE_CUDA,
        TRACE_GPM,
        TRACE_LEDGER,
        TRACE_MEM,
        TRACE_NCCL,
        TRACE_NET,
        TRACE_RUNSTATE,
        TRACE_SCHED,
        TRACE_SERVER,
    )
    from strata_plugin.analysis.rules.window import Evidence, Verdict, WindowSignals
    from strata_plugin.analysis.signals import HwView
    from strata_plugin.analysis.thresholds import Threshold, threshold, value
    from strata_plugin.analysis.timeline import HwStat
    from strata_plugin.configure.engines import API_FLAVOURS, EngineSpec
    from strata_plugin.entry_points import PluginError
    from strata_plugin.report.report_data import ReportData
    from strata_plugin.report.sections import Section
    from strata_plugin.report.tables import md_table

_WHERE = {
    "EngineSpec": "strata_plugin.configure.engines",
    "API_FLAVOURS": "strata_plugin.configure.engines",
    "Rule": "strata_plugin.analysis.rules.table",
    "RULE_GROUPS": ("strata_plugin.analysis.rules.table", "GROUPS"),
    "RulePlugin": "strata_plugin.analysis.rules.registry",
    "RuleCheck": "strata_plugin.analysis.rules.outcome",
    "Outcome": "strata_plugin.analysis.rules.outcome",
    "signal_margin": "strata_plugin.analysis.rules.outcome",
    "margin": "strata_plugin.analysis.rules.outcome",
    "WindowSignals": "strata_plugin.analysis.rules.window",
    "Evidence": "strata_plugin.analysis.rules.window",
    "Verdict": "strata_plugin.analysis.rules.window",
    "TRACE_BLOCK": "strata_plugin.analysis.rules.traces",
    "TRACE_CLOCK": "strata_plugin.analysis.rules.traces",
    "TRACE_CUDA": "strata_plugin.analysis.rules.traces",
    "TRACE_GPM": "strata_plugin.analysis.rules.traces",
    "TRACE_LEDGER": "strata_plugin.analysis.rules.traces",
    "TRACE_MEM": "strata_plugin.analysis.rules.traces",
    "TRACE_NCCL": "strata_plugin.analysis.rules.traces",
    "TRACE_NET": "strata_plugin.analysis.rules.traces",
    "TRACE_RUNSTATE": "strata_plugin.analysis.rules.traces",
    "TRACE_SCHED": "strata_plugin.analysis.rules.traces",
    "TRACE_SERVER": "strata_plugin.analysis.rules.traces",
    "Threshold": "strata_plugin.analysis.thresholds",
    "threshold": "strata_plugin.analysis.thresholds",
    "value": "strata_plugin.analysis.thresholds",
    "HwView": "strata_plugin.analysis.signals",
    "HwStat": "strata_plugin.analysis.timeline",
    "Section": "strata_plugin.report.sections",
    "ReportData": "strata_plugin.report.report_data",
    "md_table": "strata_plugin.report.tables",
    "PluginError": "strata_plugin.entry_points",
}

__all__ = [
    "API_FLAVOURS",
    "RULE_GROUPS",
    "TRACE_BLOCK",
    "TRACE_CLOCK",
    "TRACE_CUDA",
    "TRACE_GPM",
    "TRACE_LEDGER",
    "TRACE_MEM",
    "TRACE_NCCL",
    "TRACE_NET",
    "TRACE_RUNSTATE",
    "TRACE_SCHED",
    "TRACE_SERVER",
    "EngineSpec",
    "Evidence",
    "HwStat",
    "HwView",
    "Outcome",
    "PluginError",
    "ReportData",
    "Rule",
    "RuleCheck",
    "RulePlugin",
    "Section",
    "Threshold",
    "Verdict",
    "WindowSignals",
    "check_plugins",
    "margin",
    "md_table",
    "signal_margin",
    "threshold",
    "value",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = where if isinstance(where, tuple) else (where, name)
    import importlib

    obj = getattr(importlib.import_module(module), attr)
    globals()[name] = obj
    return obj


def __dir__() -> list[str]:
    return __all__


def check_plugins() -> dict[str, tuple[str, ...]]:
    """Load and check every installed plugin, group by group; ``{group: names}``.

    A run calls it when it reads its configuration, so a plugin that fails to import,
    refers to the wrong kind of thing or takes a name already taken stops the run in
    its first second (``PluginError`` naming the distribution and the entry point), not
    at the first verdict or the report. A group with nothing declared costs no import.
    """
    from strata_plugin import entry_points as ep

    if ep.declared(ep.ENGINES):
        from strata_plugin.configure.engines import plugin_engines

        plugin_engines()
    if ep.declared(ep.COLLECTORS):
        ep.collector_plugins()
    if ep.declared(ep.RULES):
        from strata_plugin.analysis.rules.registry import plugin_rules

        plugin_rules()
    if ep.declared(ep.REPORT_SECTIONS):
        from strata_plugin.report.sections import plugin_sections

        plugin_sections()
    return {g: ep.declared(g) for g in ep.GROUPS}

"""Where another package's engines, collectors, rules and report sections come in: four
entry-point groups, each read once, on first use, and loaded with a clear error.

Why entry points: a team that wants its own engine, collector, rule or report section
installs a package that declares it (``[project.entry-points."strata.rules"]`` in its
pyproject.toml) instead of editing Strata; pip records the declaration and
``importlib.metadata`` finds it wherever the package is installed (the Python packaging
guide, "Creating and discovering plugins", and its entry-points specification). pytest
finds Strata itself the same way (``pytest11``). docs/extending.md shows a whole plugin
package; :mod:`strata_plugin.extend` is the names its modules import.
Not pytest hooks (a conftest's ``pytest_...`` functions, as pytest-benchmark takes
its): the report is rebuilt offline without pytest (``python -m strata_plugin report
DIR``) and must render the same sections and verdicts, and a collector runs in the
agent, on nodes where neither pytest nor the repository's conftest is.

Each kind's table takes its plugins from here (and checks them against its built-ins):

* ``strata.engines``: an :class:`~strata_plugin.configure.engines.EngineSpec`
  (``configure/engines.py``, ``engines()``);
* ``strata.collectors``: a module with ``from_args(args, targets)``, as the agent's own
  collector modules have (:func:`collector_modules`; the agent is handed the modules by
  name, since on another node it cannot read this machine's entry points);
* ``strata.rules``: a :class:`~strata_plugin.analysis.rules.registry.RulePlugin`
  (``analysis/rules/registry.py``; its thresholds: ``analysis/thresholds.py``);
* ``strata.report_sections``: a :class:`~strata_plugin.report.sections.Section`
  (``report/sections.py``, ``all_sections()``).

Loading is once per process and group (``functools.cache``): the first reader imports
the group's plugins; ``strata_plugin.extend.check_plugins`` does it for every group
when a run's configuration is read, so a broken plugin stops the run in its first second, not at the
first case's verdict or the report. A plugin that fails to import, or refers to
something of the wrong kind, or takes a name a built-in (or another plugin) has, raises
:class:`PluginError` naming the distribution and the entry point.

This module imports nothing of Strata but the agent's collector registry (the
standard-library list of built-in collector names): every layer may read it.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from strata_plugin.agent.collectors import registry as collector_registry
from strata_plugin.errors import StrataError

ENGINES = "strata.engines"
COLLECTORS = "strata.collectors"
RULES = "strata.rules"
REPORT_SECTIONS = "strata.report_sections"
#: The entry-point groups, the one place their names are written.
GROUPS: tuple[str, ...] = (ENGINES, COLLECTORS, RULES, REPORT_SECTIONS)


class PluginError(StrataError, RuntimeError):
    """A plugin that cannot take part: it fails to import, is not what its group takes,
    or takes a name that is already taken. The message names the distribution and the
    entry point, and what to do."""


@dataclass(frozen=True, eq=False)
class Plugin:
    """One loaded entry point: where it was declared, and what it refers to. Compared
    and hashed by identity, whatever it refers to: the kinds cache their checked tables
    on the tuple :func:`load` returned."""

    group: str
    name: str
    #: ``module`` or ``module:attribute``, as the distribution declared it
    value: str
    #: the distribution that declared it, ``name version`` ("" when not known)
    dist: str
    obj: Any

    @property
    def module(self) -> str:
        return self.value.partition(":")[0].strip()

    def where(self) -> str:
        """The entry point in the words of the package that declared it."""
        of = f" of {self.dist}" if self.dist else ""
        return f"entry point {self.name!r} = {self.value!r} in group {self.group!r}{of}"

    def error(self, problem: str) -> PluginError:
        return PluginError(f"Strata plugin {self.where()}: {problem}")


def _dist(ep: importlib.metadata.EntryPoint) -> str:
    d = getattr(ep, "dist", None)  # Python 3.10+: the distribution that declared it
    if d is None:
        return ""
    return f"{d.metadata['Name']} {d.version}"


@functools.cache
def _declared() -> dict[str, tuple[importlib.metadata.EntryPoint, ...]]:
    """Every Strata group's entry points, read in one pass over the installed
    distributions (the metadata scan is the cost; importing is :func:`load`'s)."""
    out: dict[str, dict[tuple[str, str], importlib.metadata.EntryPoint]] = {
        g: {} for g in GROUPS}
    seen: set[str] = set()
    for dist in importlib.metadata.distributions():
        # the first of a distribution's copies on sys.path wins, as for its import
        key = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        for ep in dist.entry_points:
            if ep.group in out:
                out[ep.group].setdefault((ep.name, ep.value), ep)
    # sorted by name: the order plugins are listed and run in does not depend on the
    # order site-packages happens to be read in
    return {g: tuple(eps[k] for k in sorted(eps)) for g, eps in out.items()}


def declared(group: str) -> tuple[str, ...]:
    """The names declared in ``group``, without importing anything."""
    return tuple(ep.name for ep in _declared()[group])


@functools.cache
def load(group: str) -> tuple[Plugin, ...]:
    """Every entry point of ``group``, imported, in name order. Once per process: later
    calls return the same plugins (:func:`reset` forgets them, for tests)."""
    if group not in GROUPS:
        raise ValueError(f"not a Strata entry-point group: {group!r} (known: {GROUPS})")
    out = []
    for ep in _declared()[group]:
        stub = Plugin(group, ep.name, ep.value, _dist(ep), None)
        try:
            obj = ep.load()
        except Exception as e:  # the plugin's own code: any error it raises at import
            raise stub.error(
                f"failed to import: {type(e).__name__}: {e}. Fix or uninstall "
                f"{stub.dist.split(' ')[0] or 'the package that declares it'}") from e
        out.append(Plugin(group, ep.name, ep.value, stub.dist, obj))
    names = [p.name for p in out]
    for p in out:
        if names.count(p.name) > 1:
            others = [q.where() for q in out if q.name == p.name and q is not p]
            raise p.error(f"the name is also declared by {'; '.join(others)}")
    return tuple(out)


def check_names(plugins: Iterable[Plugin], taken: Iterable[str], what: str) -> None:
    """PluginError for a plugin whose name is one of Strata's own ``what``s."""
    own = set(taken)
    for p in plugins:
        if p.name in own:
            raise p.error(f"{p.name!r} is already a built-in {what} of Strata; a plugin "
                          "adds a new name and cannot replace a built-in")


def reset() -> None:
    """Forget what was loaded (tests that install or remove a plugin in-process). Each
    kind's checked table is cached on what :func:`load` returned, so it follows."""
    _declared.cache_clear()
    load.cache_clear()


# --- collectors: the one kind whose code runs in the agent --------------------------------


def collector_plugins() -> tuple[Plugin, ...]:
    """The ``strata.collectors`` plugins, checked: each a module with ``from_args``,
    named apart from the agent's built-in collectors."""
    return _checked_collectors(load(COLLECTORS))


@functools.cache
def _checked_collectors(plugins: tuple[Plugin, ...]) -> tuple[Plugin, ...]:
    check_names(plugins, collector_registry.names(), "collector")
    for p in plugins:
        if not isinstance(p.obj, ModuleType) or ":" in p.value:
            raise p.error("a collector's entry point names its module (`name = "
                          "\"package.module\"`), which the agent imports on each node")
        if not callable(getattr(p.obj, "from_args", None)):
            raise p.error("its module has no from_args(args, targets), the factory the "
                          "agent calls (docs/extending.md, \"A collector\")")
    return plugins


def collector_modules() -> dict[str, str]:
    """Plugin collector name -> its module's import name, in name order."""
    return {p.name: p.module for p in collector_plugins()}


def collector_names() -> tuple[str, ...]:
    """Every name a profile's ``telemetry.collectors`` may take: the agent's built-in
    collectors (registry order), then the plugins' (name order)."""
    return (*collector_registry.names(), *collector_modules())

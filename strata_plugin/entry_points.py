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

A plugin's import is its own code, run in Strata's process: it may raise anything
(``SystemExit`` and ``KeyboardInterrupt`` included), hang, or print without end. Each
entry point is therefore imported in a thread of its own (:func:`_import`), waited for
at most ``PLUGIN_IMPORT_S`` (limits.py), with what it prints kept to
``PLUGIN_OUTPUT_CHARS``. Whatever it raises refuses the plugin, named: a
``KeyboardInterrupt`` raised in that thread is the plugin's own (Python delivers a real
Ctrl-C to the main thread only), and a real Ctrl-C while the main thread waits goes
through as ever. A thread cannot be killed: a hung import's thread is left behind (a
daemon, so it does not hold the process's exit) and the plugin refused.

This module imports nothing of Strata but the agent's collector registry (the
standard-library list of built-in collector names), the limits table and
formats/printable.py: every layer may read it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import io
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from strata_plugin.agent.collectors import registry as collector_registry
from strata_plugin.errors import StrataError
from strata_plugin.formats.printable import printable
from strata_plugin.limits import PLUGIN_IMPORT_S, PLUGIN_OUTPUT_CHARS

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
    return printable(f"{d.metadata['Name']} {d.version}")  # the package's words, in messages


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
        out.append(Plugin(group, ep.name, ep.value, stub.dist, _import(ep, stub)))
    names = [p.name for p in out]
    for p in out:
        if names.count(p.name) > 1:
            others = [q.where() for q in out if q.name == p.name and q is not p]
            raise p.error(f"the name is also declared by {'; '.join(others)}")
    return tuple(out)


class _Output(io.TextIOBase):
    """What a plugin prints while it imports: the first ``PLUGIN_OUTPUT_CHARS``
    characters kept, the rest counted."""

    def __init__(self) -> None:
        self.kept: list[str] = []
        self.n_kept = 0
        self.n_total = 0

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]  # a print's caller may read it
        return "utf-8"

    def write(self, text: str) -> int:
        text = str(text)
        self.n_total += len(text)
        room = PLUGIN_OUTPUT_CHARS - self.n_kept
        if room > 0:
            self.kept.append(text[:room])
            self.n_kept += min(room, len(text))
        return len(text)

    def shown(self) -> str:
        """The output, its controls escaped (it goes to the terminal), the rest counted."""
        text = printable("".join(self.kept).rstrip("\n"), keep_lines=True)
        more = self.n_total - self.n_kept
        return text + (f"\n... ({more} more characters not shown)" if more > 0 else "")


@contextmanager
def _printed_to(out: _Output) -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` into ``out`` meanwhile (Python-level writes; a
    write to the file descriptors themselves is not seen). Put back only where nobody
    replaced them since."""
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    try:
        yield
    finally:
        if sys.stdout is out:
            sys.stdout = saved[0]
        if sys.stderr is out:
            sys.stderr = saved[1]


def _import(ep: importlib.metadata.EntryPoint, stub: Plugin) -> Any:
    """``ep.load()`` in a thread of its own, within ``PLUGIN_IMPORT_S``; whatever it
    raises, a hang or what it prints becomes a PluginError naming it (see the module's
    docstring for why a thread)."""
    got: dict[str, Any] = {}

    def run() -> None:
        try:
            got["obj"] = ep.load()
        except BaseException as e:  # the plugin's own code: SystemExit(0) refuses it too
            got["error"] = e

    fix = f"Fix or uninstall {stub.dist.split(' ')[0] or 'the package that declares it'}"
    out = _Output()
    thread = threading.Thread(target=run, name=f"strata plugin import {ep.name}", daemon=True)
    with _printed_to(out):
        thread.start()
        thread.join(PLUGIN_IMPORT_S)  # a real Ctrl-C here goes through: the main thread's
    said = f"; it printed:\n{out.shown()}" if out.n_total else ""
    if thread.is_alive():
        raise stub.error(
            f"did not finish importing within {PLUGIN_IMPORT_S:g} s (PLUGIN_IMPORT_S; its "
            f"import thread is left running). {fix}{said}")
    if "error" in got:
        e = got["error"]
        words = printable(e)
        raise stub.error(f"failed to import: {type(e).__name__}{': ' + words if words else ''}"
                         f". {fix}{said}") from e
    if out.n_total:
        sys.stderr.write(f"Strata plugin {stub.where()} printed at import:\n{out.shown()}\n")
    return got["obj"]


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

"""Rules from other packages, and the table the verdict runs: the built-in rows of
``table.py``, then the plugins'.

A package adds a rule through the ``strata.rules`` entry-point group
(docs/extending.md, "A rule"): the entry point names a :class:`RulePlugin`, which holds
what a built-in rule has in three places (its row in ``table.py``, its thresholds in
``analysis/thresholds.py``, its signals' lines in ``analysis/signals.py``), so that it
fits the same contracts without editing them:

* its :class:`~strata_plugin.analysis.rules.table.Rule` row: class (the entry point's
  name, new), group, function, and every signal it reads with its ``collector:metric``
  source (a built-in signal with the source the table gives it);
* its thresholds, each a :class:`~strata_plugin.analysis.thresholds.Threshold` with its
  source (the threshold table finds them by name, the report lists them);
* ``signals``: the window's new signals, from its telemetry summary (``HwView``, the
  server's node), None where not measured.

Checked when loaded (:func:`plugin_rules`), as ``tests/test_rule_table.py`` checks the
table: a class, signal or threshold name already taken, a source without its collector,
a function that reads a signal its row does not declare (or declares one it does not
read) is an ``entry_points.PluginError`` naming the distribution and entry point.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from strata_plugin import entry_points
from strata_plugin.analysis.rules import table
from strata_plugin.analysis.rules.outcome import Outcome
from strata_plugin.analysis.rules.table import Rule
from strata_plugin.analysis.rules.window import WindowSignals
from strata_plugin.analysis.thresholds import Threshold, plugin_thresholds

#: (the window's ``HwView``, the server's node or None) -> {new signal: value or None}
SignalsFn = Callable[[Any, "str | None"], Mapping[str, "float | None"]]


@dataclass(frozen=True)
class RulePlugin:
    """One rule of another package: its row, its thresholds, its new signals."""

    rule: Rule
    #: the thresholds its function compares against that Strata's table lacks
    thresholds: tuple[Threshold, ...] = ()
    #: computes the new signals its row declares (those ``WindowSignals`` lacks) from
    #: the window's summary: ``signals(view, node)`` -> {name: value or None}; ``view``
    #: is ``analysis/signals.HwView`` (``view.select(collector, metric, node)``)
    signals: SignalsFn | None = None


@dataclass(frozen=True)
class ActiveRules:
    """Everything the verdict machinery reads about the rules, built-in and plugin:
    ``table.py``'s derived tuples with the plugins' rows added after the built-ins (so
    a plugin's class breaks score ties after every built-in one)."""

    rules: tuple[Rule, ...]
    classes: tuple[str, ...]
    modifiers: tuple[str, ...]
    serving: tuple[str, ...]
    signal_sources: Mapping[str, str]
    gpu_rules: tuple[Callable[[WindowSignals], Outcome], ...]
    host_rules: tuple[Callable[[WindowSignals], Outcome], ...]
    cpu_server_rules: tuple[Callable[[WindowSignals], Outcome], ...]
    serving_rules: tuple[Callable[[WindowSignals], Outcome], ...]
    core_gpu: tuple[str, ...]
    core_cpu: tuple[str, ...]
    #: the window signals class: ``WindowSignals``, or a subclass with the plugins' new
    #: signals as fields (None by default)
    signals_class: type[WindowSignals]
    plugins: tuple[entry_points.Plugin, ...]


#: Fields of WindowSignals that describe the window, not a measured signal (those the
#: table gives no source: ``tests/test_rule_table.py`` holds every other field to one):
#: a rule reads them without declaring them.
CONTEXT = frozenset(f.name for f in dataclasses.fields(WindowSignals)
                    if f.name not in table.SIGNAL_SOURCES)
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


#: calls whose arguments name a signal the rule reads, and where: RuleCheck.need(*names),
#: RuleCheck.cmp(name, ...), signal_margin(s, name, ...), getattr(s, name)
_NAMING_CALLS = {"need": slice(None), "cmp": slice(0, 1), "signal_margin": slice(1, 2),
                 "_m": slice(1, 2), "getattr": slice(1, 2)}


def signals_read(fn: Callable[..., Any], known: frozenset[str] | set[str] = frozenset(),
                 _seen: set[str] | None = None) -> set[str] | None:
    """The signals a rule function reads: ``s.<name>`` on its window argument, the names
    it hands ``need``, ``cmp``, ``signal_margin`` and ``getattr``, any of the ``known``
    signal names it writes as a string (a loop over a tuple of them), and the same in
    the module's functions it passes the window to; the window's context fields left
    out. None when its source cannot be read. (``tests/test_rule_table.py`` holds the
    table's rows to the same declaration.)"""
    seen = set() if _seen is None else _seen
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    mod = inspect.getmodule(fn)
    fdef = tree.body[0]
    if not isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fdef.args.args:
        return None
    window = fdef.args.args[0].arg
    names: set[str] = set()
    for node in ast.walk(fdef):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == window):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
            names.add(node.value)
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) \
            else ""
        if called in _NAMING_CALLS:
            names.update(a.value for a in node.args[_NAMING_CALLS[called]]
                         if isinstance(a, ast.Constant) and isinstance(a.value, str))
        helper = getattr(mod, called, None) if isinstance(f, ast.Name) else None
        if (inspect.isfunction(helper) and called not in seen and inspect.getmodule(helper)
                is mod and any(isinstance(a, ast.Name) and a.id == window for a in node.args)):
            seen.add(called)
            names |= signals_read(helper, known, seen) or set()
    return names - CONTEXT


def plugin_rules() -> tuple[RulePlugin, ...]:
    """The ``strata.rules`` plugins, checked; loaded once, on first use."""
    return tuple(p.obj for p in active().plugins)


def active() -> ActiveRules:
    """The rules the verdict runs: the table's and the installed plugins'."""
    return _active(entry_points.load(entry_points.RULES))


def _check(p: entry_points.Plugin, fields: set[str]) -> dict[str, str]:
    """One plugin against the table's contracts; its new signals with their sources."""
    rp = p.obj
    if not isinstance(rp, RulePlugin):
        raise p.error(f"a rule's entry point names a RulePlugin, not a {type(rp).__name__}")
    r = rp.rule
    if not isinstance(r, Rule):
        raise p.error("RulePlugin.rule is a Rule(cls, group, fn, signals)")
    if r.cls != p.name:
        raise p.error(f"the rule's class is {r.cls!r}: name the entry point as the class")
    if not _NAME.match(r.cls):
        raise p.error(f"class {r.cls!r}: lower case letters, digits and _")
    new: dict[str, str] = {}
    for name, source in r.signals:
        collector, colon, metric = source.partition(":")
        if not (colon and collector.strip() and metric.strip()):
            raise p.error(f"signal {name!r}: its source {source!r} names no "
                          "'collector:metric' (what the verdict says is missing)")
        if name in fields:
            own = table.SIGNAL_SOURCES.get(name)
            if name in CONTEXT or own is None:
                raise p.error(f"{name!r} describes the window; it is not a signal to declare")
            if own != source:
                raise p.error(f"signal {name!r} is Strata's, with the source {own!r}; "
                              f"declare it so, not as {source!r}")
        elif not _NAME.match(name):
            raise p.error(f"signal {name!r}: lower case letters, digits and _")
        else:
            new[name] = source
    if new and rp.signals is None:
        raise p.error(f"its new signals {sorted(new)} need RulePlugin.signals, the "
                      "function that computes them from the window")
    declared = {n for n, _ in r.signals}
    read = signals_read(r.fn, (fields - CONTEXT) | declared)
    if read is None:
        raise p.error(f"the source of {getattr(r.fn, '__name__', r.fn)!r} cannot be read: "
                      "its row's signals are checked against what it reads")
    if read != declared:
        raise p.error(f"{r.fn.__name__} reads {sorted(read)} but the row declares "
                      f"{sorted(declared)}: declare exactly the signals it reads")
    return new


@functools.cache
def _active(plugins: tuple[entry_points.Plugin, ...]) -> ActiveRules:
    fields = {f.name for f in dataclasses.fields(WindowSignals)}
    taken_classes = set(table.CLASSES)
    entry_points.check_names(plugins, taken_classes, "verdict class")
    sources = dict(table.SIGNAL_SOURCES)
    new_fields: list[str] = []
    for p in plugins:
        for name, source in _check(p, fields).items():
            if name in sources and sources[name] != source:
                raise p.error(f"signal {name!r} is also another plugin's, with the source "
                              f"{sources[name]!r}")
            if name not in sources:
                new_fields.append(name)
            sources[name] = source
    plugin_thresholds()  # their thresholds checked too (analysis/thresholds.py)
    rows = tuple(p.obj.rule for p in plugins)
    run = {p.obj.rule.cls: guarded(p) for p in plugins}

    def of(*groups: str) -> tuple[Rule, ...]:
        return tuple(r for r in rows if r.group in groups)

    cls = WindowSignals
    if new_fields:
        cls = cast("type[WindowSignals]", dataclasses.make_dataclass(  # a subclass: bases=
            "WindowSignals", [(n, "float | None", dataclasses.field(default=None))
                              for n in new_fields],
            bases=(WindowSignals,), frozen=True))
        cls.__module__ = __name__
        cls.__doc__ = ("WindowSignals with the rule plugins' new signals: "
                       + ", ".join(new_fields))
    return ActiveRules(
        rules=(*table.RULES, *rows),
        classes=(*table.CLASSES, *(r.cls for r in rows)),
        modifiers=(*table.MODIFIERS, *(r.cls for r in of("modifier"))),
        serving=(*table.SERVING, *(r.cls for r in of("serving"))),
        signal_sources=sources,
        gpu_rules=(*table.GPU_RULES, *(run[r.cls] for r in of("gpu", "modifier"))),
        host_rules=(*table.HOST_RULES, *(run[r.cls] for r in of("host"))),
        cpu_server_rules=(*table.CPU_SERVER_RULES, *(run[r.cls] for r in of("cpu_server"))),
        serving_rules=(*table.SERVING_RULES, *(run[r.cls] for r in of("serving"))),
        core_gpu=(*table.CORE_GPU, *(r.cls for r in rows if "gpu" in r.core)),
        core_cpu=(*table.CORE_CPU, *(r.cls for r in rows if "cpu" in r.core)),
        signals_class=cls,
        plugins=plugins,
    )


def plugin_signals(view: Any, node: str | None
                   ) -> tuple[dict[str, float | None], tuple[tuple[str, str], ...]]:
    """The plugins' new signals for one window (None where a plugin measured nothing),
    and why a plugin's are missing where its own code failed: ``(node/collector,
    reason)`` entries for the window's ``unavailable``, which the verdict's missing-signal
    lines name. What ``analysis/signals.py`` adds to the built-in signals."""
    out: dict[str, float | None] = {}
    failed: list[tuple[str, str]] = []
    for p in active().plugins:
        rp: RulePlugin = p.obj
        sources = {n: src for n, src in rp.rule.signals if n not in _BUILTIN_FIELDS}
        if not sources or rp.signals is None:
            continue
        out.update(dict.fromkeys(sources))
        try:
            got = dict(rp.signals(view, node))
            extra = sorted(set(got) - set(sources))
            if extra:
                raise ValueError(f"it returned {extra}, which its row does not declare")
            out.update({n: None if (v := got.get(n)) is None else float(v) for n in sources})
        except Exception as e:  # the plugin's own code: its signals are unmeasured, and why
            why = (f"rule plugin {p.name!r}" + (f" ({p.dist})" if p.dist else "")
                   + f": its signals function failed: {type(e).__name__}: {e}")
            failed += sorted({(f"{node or '?'}/{src.split(':', 1)[0]}", why)
                              for src in sources.values()})
    return out, tuple(failed)


def guarded(p: entry_points.Plugin) -> Callable[[WindowSignals], Outcome]:
    """A plugin's rule function as the verdict runs it: an exception in it makes the rule
    unassessable, its trace saying what raised, instead of ending the case's analysis."""
    fn = p.obj.rule.fn
    cls = p.obj.rule.cls
    who = f"rule plugin {p.name!r}" + (f" ({p.dist})" if p.dist else "")

    def run(s: WindowSignals) -> Outcome:
        try:
            return fn(s)
        except Exception as e:  # the plugin's own code
            return Outcome(cls, assessable=False,
                           trace=f"{who} raised {type(e).__name__}: {e}")

    return functools.update_wrapper(run, fn)  # its name, and __wrapped__: the plugin's own


_BUILTIN_FIELDS = frozenset(f.name for f in dataclasses.fields(WindowSignals))

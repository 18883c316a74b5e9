"""The rule table (analysis/rules/table.py) is the one declaration of each rule: its class,
group and signals. These tests keep the declaration honest against the code."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from strata_plugin.analysis import rules
from strata_plugin.analysis.rules import CLASSES, RULES, SIGNAL_SOURCES, WindowSignals
from strata_plugin.analysis.rules.table import REPORTED_SIGNALS, Rule

#: Fields of WindowSignals that describe the window, not a measured signal.
CONTEXT = {"window", "duration_s", "gpu_present", "gpu_expected", "multi_node",
           "unavailable", "n_gpus", "concurrency", "queue_split", "ledger_metric",
           "ledger_shares", "ledger_residual_ms", "ledger_residual_part",
           "client_lateness_p99_ms", "client_cpu_fraction"}
#: the ledger by cause and the samples behind each collector (issue 30): context the
#: verdict reads, no rule
CONTEXT |= {"ledger_causes", "ledger_level1", "ledger_run_state", "ledger_run_cores",
            "ledger_runnable_cores", "ledger_runstate_samples", "collector_samples"}
SIGNALS = {f.name for f in dataclasses.fields(WindowSignals)} - CONTEXT


def _read_by(fn) -> set[str]:
    """The signals a rule function reads, and the helpers of its module it hands the
    signals to (``helper(s)`` or ``helper(s, ...)``), and theirs."""
    mod = inspect.getmodule(fn)
    todo, seen, src = [fn], set(), ""
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        body = inspect.getsource(f)
        src += body
        todo += [getattr(mod, h) for h in re.findall(r"\b(\w+)\(s[,)]", body)
                 if inspect.isfunction(getattr(mod, h, None))]
    return {n for n in SIGNALS if re.search(rf'["\.]{n}\b', src)}


@pytest.mark.parametrize("rule", RULES, ids=[r.cls for r in RULES])
def test_each_rule_declares_exactly_the_signals_it_reads(rule: Rule) -> None:
    assert {n for n, _ in rule.signals} == _read_by(rule.fn)


def test_every_signal_has_one_source_and_every_class_one_rule() -> None:
    declared = {n for r in RULES for n, _ in r.signals} | {n for n, _ in REPORTED_SIGNALS}
    assert declared == set(SIGNAL_SOURCES) == SIGNALS
    assert CLASSES == tuple(r.cls for r in RULES)  # headroom is no class (issue 30)
    assert len(set(CLASSES)) == len(CLASSES)


def test_a_new_class_is_one_entry_and_its_rule() -> None:
    """Add a class by its entry alone: the derived tuples pick it up."""
    with pytest.raises(ValueError, match="unknown group"):
        Rule("x", "nowhere", rules.rule_network, ())
    assert rules.GPU_RULES == tuple(r.fn for r in RULES if r.group in ("gpu", "modifier"))
    assert rules.SERVING == tuple(r.cls for r in RULES if r.group == "serving")
    assert "unexplained" in rules.CORE_CPU and "unexplained" in rules.CORE_GPU

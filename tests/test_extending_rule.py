"""docs/extending.md, "Adding a rule", steps 1 to 5 with the page's own code: if the page
and the rule machinery drift apart, this fails.

The example rule is registered in this test only: its signal on a subclass of
``WindowSignals``, its threshold in the table's lookup, its function in a module written
from the page with ``rules/host.py``'s own imports. The product's table has no
``file_handles``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from strata_plugin.analysis import thresholds
from strata_plugin.analysis.rules import GROUPS, RULES, SIGNAL_SOURCES, WindowSignals
from strata_plugin.analysis.rules import host as host_rules
from strata_plugin.analysis.rules.table import Rule
from strata_plugin.analysis.thresholds import THRESHOLDS, Threshold
from tests import test_rule_table, test_thresholds
from tests.test_attribution import CPU_CLEAN
from tests.test_extending_collector import RULE_SECTION, block
from tests.test_thresholds import Boundary, _values, one

CLS = "file_handles"


def _doc(where: str) -> str:
    return block(f"# {where}", RULE_SECTION)


@pytest.fixture
def signals():
    """Step 1: WindowSignals with the page's field (a subclass; the product's has none)."""
    (field,) = ast.parse(_doc("strata_plugin/analysis/rules/window.py, in WindowSignals")).body
    assert isinstance(field, ast.AnnAssign) and ast.unparse(field.value) == "None"
    name = field.target.id
    assert name not in {f.name for f in dataclasses.fields(WindowSignals)}
    cls = dataclasses.make_dataclass(
        "ExampleSignals", [(name, ast.unparse(field.annotation), dataclasses.field(default=None))],
        bases=(WindowSignals,), frozen=True)
    return name, cls


@pytest.fixture
def rule_module(tmp_path):
    """Step 2: the page's function, in a module with rules/host.py's imports."""
    src = Path(host_rules.__file__).read_text()
    header = src[: src.index("\ndef ")]
    path = tmp_path / "example_host_rules.py"
    path.write_text(header + "\n\n" + _doc("strata_plugin/analysis/rules/host.py"))
    spec = importlib.util.spec_from_file_location("example_host_rules", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # inspect.getsource finds it (the rule-table check reads it)
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


@pytest.fixture
def row(rule_module):
    """Step 3: the page's Rule row, with ``host`` its module."""
    text = _doc("strata_plugin/analysis/rules/table.py, in RULES").strip().rstrip(",")
    r = eval(text, {"Rule": Rule, "host": rule_module})
    assert isinstance(r, Rule) and r.cls == CLS and r.group in GROUPS
    assert r.cls not in {x.cls for x in RULES}
    return r


@pytest.fixture
def example_threshold(monkeypatch):
    """Step 4: the page's threshold row, looked up by name as the table's are."""
    text = _doc("strata_plugin/analysis/thresholds.py, in THRESHOLDS").strip().rstrip(",")
    t = eval(text, {"Threshold": Threshold})
    assert isinstance(t, Threshold) and t.name not in {x.name for x in THRESHOLDS}
    assert t.source.startswith("[inferred] Linux kernel docs, admin-guide/sysctl/fs.rst")
    monkeypatch.setitem(thresholds._BY_NAME, t.name, t)
    return t


@pytest.fixture
def boundary():
    """Step 5: the page's boundary row, built as tests/test_thresholds.py builds its own."""
    text = _doc("tests/test_thresholds.py, in CASES").strip().rstrip(",")
    b = eval(text, {"Boundary": Boundary, "CPU_CLEAN": CPU_CLEAN, "one": one})
    assert isinstance(b, Boundary) and b.cls == CLS
    return b


def test_the_row_declares_what_its_function_reads(signals, row, monkeypatch):
    name, _ = signals
    monkeypatch.setattr(test_rule_table, "SIGNALS", test_rule_table.SIGNALS | {name})
    assert {n for n, _ in row.signals} == test_rule_table._read_by(row.fn) == {name}
    # its source names the page's collector and metrics, and no signal gets a second one
    assert dict(row.signals)[name] == "files:files_open/files_max"
    assert name not in SIGNAL_SOURCES


def test_the_rule_flips_at_its_threshold(signals, row, example_threshold, boundary):
    name, cls = signals
    assert boundary.threshold == example_threshold.name and boundary.op == ">="
    base = cls(**{f.name: getattr(boundary.base, f.name)
                  for f in dataclasses.fields(WindowSignals)})
    short, past = _values(boundary)
    assert past == example_threshold.value and short == pytest.approx(
        example_threshold.value * (1 - test_thresholds.STEP))

    quiet = row.fn(dataclasses.replace(base, **boundary.at(short)))
    assert quiet.assessable and not quiet.fired
    fired = row.fn(dataclasses.replace(base, **boundary.at(past)))
    assert fired.fired and fired.cls == CLS and fired.score == 0.0  # at the threshold
    (ev,) = fired.evidence
    assert (ev.metric, ev.op, ev.threshold, ev.threshold_value, ev.source, ev.met) == (
        name, ">=", example_threshold.name, example_threshold.value, example_threshold.source,
        True)
    full = row.fn(dataclasses.replace(base, **boundary.at(past * 1.25)))
    assert full.fired and full.score == 1.0  # a full margin past it (full_margin: 0.25)


def test_unmeasured_it_is_unassessable_and_names_its_signal(signals, row, example_threshold):
    name, cls = signals
    base = cls(**{f.name: getattr(CPU_CLEAN, f.name) for f in dataclasses.fields(WindowSignals)})
    o = row.fn(base)
    assert not o.fired and not o.assessable and o.missing == [name]
    assert "files collector" in o.trace

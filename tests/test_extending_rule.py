"""docs/extending.md, "A rule", with the page's own code: if the page and the rule
machinery drift apart, this fails.

The page's package is installed in this process as pip would leave it
(``tests/plugin_package.py``): its rule runs in the real verdict (``classify``), after
Strata's own, with its threshold in the table and its signal computed by the analysis
(``analysis/signals.build_signals``). It is held to the contracts the table's rows are
(``tests/test_rule_table.py``, ``tests/test_thresholds.py``): declared signals and their
sources, a threshold with its source, flipping a step under and at it. Each broken
variant of it is refused when it loads, naming the distribution and the entry point.
"""

from __future__ import annotations

import dataclasses

import pytest
from plugin_package import forget, install_here, uninstall

from strata_plugin.analysis.rules import RULES, SIGNAL_SOURCES, WindowSignals, classify
from strata_plugin.analysis.rules.registry import CONTEXT, active, plugin_rules, signals_read
from strata_plugin.analysis.signals import build_signals
from strata_plugin.analysis.thresholds import THRESHOLDS, all_thresholds, threshold
from strata_plugin.analysis.timeline import HwStat
from strata_plugin.entry_points import PluginError
from tests import test_rule_table
from tests.test_attribution import CPU_CLEAN
from tests.test_thresholds import STEP

CLS = "fd_exhaustion"
SIGNAL = "fd_used_frac"
FIELDS = {f.name for f in dataclasses.fields(WindowSignals)}


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    yield install_here(tmp_path / "pkg", monkeypatch)
    forget()


def window(**kw) -> WindowSignals:
    """The clean CPU window of the attribution tests, in the class with the plugins'
    signals (the one the analysis builds), with ``kw`` changed."""
    base = {f.name: getattr(CPU_CLEAN, f.name) for f in dataclasses.fields(WindowSignals)}
    return active().signals_class(**{**base, **kw})


def test_the_rule_joins_the_table_the_verdict_runs(plugin):
    (rp,) = plugin_rules()
    t = active()
    assert t.rules == (*RULES, rp.rule) and t.classes[-1] == CLS
    ran = [getattr(f, "__wrapped__", None) for f in (*t.host_rules, *t.gpu_rules)]
    assert ran.count(rp.rule.fn) == 1 and t.host_rules[-1].__wrapped__ is rp.rule.fn  # "host"
    assert t.signal_sources[SIGNAL] == "fds:fds_open/fds_max"
    assert SIGNAL not in SIGNAL_SOURCES and SIGNAL not in FIELDS  # Strata's own: unchanged
    assert {f.name for f in dataclasses.fields(t.signals_class)} == FIELDS | {SIGNAL}
    assert issubclass(t.signals_class, WindowSignals)
    (th,) = rp.thresholds
    assert threshold(SIGNAL) is th and all_thresholds() == (*THRESHOLDS, th)
    assert th.source.startswith("[inferred] getrlimit(2), RLIMIT_NOFILE")


def test_the_row_declares_what_its_function_reads(plugin):
    """The table's contract, read two ways: the check the plugin met when it loaded, and
    tests/test_rule_table.py's own reading of a row's function."""
    (rp,) = plugin_rules()
    declared = {n for n, _ in rp.rule.signals}
    assert declared == {SIGNAL}
    assert signals_read(rp.rule.fn, FIELDS - CONTEXT) == declared
    signals = test_rule_table.SIGNALS | {SIGNAL}
    with pytest.MonkeyPatch.context() as mp:  # the table test's SIGNALS, with the new one
        mp.setattr(test_rule_table, "SIGNALS", signals)
        assert test_rule_table._read_by(rp.rule.fn) == declared


def test_the_check_the_plugin_meets_holds_for_every_built_in_row():
    """The reading a plugin's row is held to agrees with every row of Strata's table."""
    known = FIELDS - CONTEXT
    assert {r.cls: signals_read(r.fn, known) for r in RULES} == {
        r.cls: {n for n, _ in r.signals} for r in RULES}


def test_it_flips_at_its_threshold_in_the_verdict(plugin):
    t = threshold(SIGNAL).value
    under = classify(window(fd_used_frac=t * (1 - STEP)))
    assert CLS not in under.past_threshold
    at = classify(window(fd_used_frac=t))
    assert CLS in at.past_threshold
    (ev,) = [e for e in at.evidence if e.cls == CLS]
    assert (ev.metric, ev.value, ev.op, ev.threshold, ev.threshold_value, ev.source, ev.met) \
        == (SIGNAL, t, ">=", SIGNAL, t, threshold(SIGNAL).source, True)
    (rp,) = plugin_rules()
    assert rp.rule.fn(window(fd_used_frac=t)).score == 0.0  # at the threshold
    assert rp.rule.fn(window(fd_used_frac=t * 1.25)).score == 1.0  # full_margin past it
    alone = classify(window(fd_used_frac=0.99))
    assert alone.classes == (CLS,) and not alone.inconclusive, alone


def test_unmeasured_the_verdict_names_its_signal_and_source(plugin):
    v = classify(window())
    assert f"{SIGNAL} <- fds:fds_open/fds_max (no samples in the window)" in v.missing_signals
    (rp,) = plugin_rules()
    o = rp.rule.fn(window())
    assert not o.fired and not o.assessable and o.missing == [SIGNAL]
    assert "the fds collector" in o.trace


def test_the_analysis_computes_its_signal_from_the_window(plugin):
    def row(metric: str, mean: float, mx: float) -> HwStat:
        return HwStat("c", "node0", "fds", "pid7", metric, "gauge", 10, 1.0, mean=mean,
                      max=mx)

    sig = build_signals(window="c", duration_s=1.0, start_ns=0, end_ns=10**9,
                        hw=[row("fds_open", 200.0, 240.0), row("fds_max", 256.0, 256.0)],
                        requests=None, gpu_present=False, gpu_expected=False,
                        multi_node=False, unavailable=())
    assert type(sig) is active().signals_class and sig.fd_used_frac == 240 / 256
    bare = build_signals(window="c", duration_s=1.0, start_ns=0, end_ns=10**9, hw=[],
                         requests=None, gpu_present=False, gpu_expected=False,
                         multi_node=False, unavailable=())
    assert bare.fd_used_frac is None


def test_uninstalled_nothing_of_it_is_left(plugin):
    uninstall(plugin)
    assert plugin_rules() == () and active().signals_class is WindowSignals
    assert active().classes[-1] != CLS and all_thresholds() == THRESHOLDS


BROKEN = '''
import dataclasses

from strata_example.rules import FD_EXHAUSTION, fd_signals

from strata_plugin.extend import Rule, RuleCheck, Threshold

R = FD_EXHAUSTION.rule


def reads_more(s):
    r = RuleCheck("fd_exhaustion", s)
    r.need("fd_used_frac", "server_cpu_cores")
    return r.o


def _changed(**kw):
    return dataclasses.replace(FD_EXHAUSTION, **kw)


UNDECLARED = _changed(rule=dataclasses.replace(R, signals=()))
MORE = _changed(rule=dataclasses.replace(R, fn=reads_more))
MORE_OWN_SOURCE = _changed(rule=dataclasses.replace(R, fn=reads_more, signals=(
    *R.signals, ("server_cpu_cores", "proc:cpu"))))
NO_COLLECTOR = _changed(rule=dataclasses.replace(R, signals=(("fd_used_frac", "fds_open"),)))
NO_SIGNALS_FN = _changed(signals=None)
NO_SOURCE = _changed(thresholds=(Threshold("fd_used_frac", 0.9, "ratio", " "),))
TAKEN_THRESHOLD = _changed(thresholds=(Threshold("steal_frac", 0.9, "ratio", "[inferred] x"),))
NOT_A_THRESHOLD = _changed(thresholds=({"fd_used_frac": 0.9},))
BUILT_IN_CLASS = _changed(rule=dataclasses.replace(R, cls="cpu_compute"))
JUST_A_ROW = R
EXTRA_SIGNAL = _changed(signals=lambda view, node: {**fd_signals(view, node), "other": 1.0})


def boom(*args):
    raise ZeroDivisionError("the plugin's own bug")


def rule_raises(s):
    r = RuleCheck("fd_exhaustion", s)
    r.need("fd_used_frac")
    return boom(r)


SIGNALS_RAISE = _changed(signals=boom)
RULE_RAISES = _changed(rule=dataclasses.replace(R, fn=rule_raises))
'''


@pytest.mark.parametrize(("name", "value", "says"), [
    (CLS, "UNDECLARED", "rule_fd_exhaustion reads ['fd_used_frac'] but the row declares []"),
    (CLS, "MORE", "reads_more reads ['fd_used_frac', 'server_cpu_cores'] but the row "
                  "declares ['fd_used_frac']"),
    (CLS, "MORE_OWN_SOURCE", "signal 'server_cpu_cores' is Strata's, with the source "
                             "'proc:cpu_user_s/cpu_system_s'; declare it so"),
    (CLS, "NO_COLLECTOR", "signal 'fd_used_frac': its source 'fds_open' names no "
                          "'collector:metric'"),
    (CLS, "NO_SIGNALS_FN", "its new signals ['fd_used_frac'] need RulePlugin.signals"),
    (CLS, "NO_SOURCE", "threshold 'fd_used_frac' has no source"),
    (CLS, "TAKEN_THRESHOLD", "threshold 'steal_frac' is already Strata's"),
    (CLS, "NOT_A_THRESHOLD", "its thresholds are Threshold rows, not dict"),
    ("cpu_compute", "BUILT_IN_CLASS", "'cpu_compute' is already a built-in verdict class"),
    (CLS, "JUST_A_ROW", "a rule's entry point names a RulePlugin, not a Rule"),
    ("fd_other", "UNDECLARED", "the rule's class is 'fd_exhaustion': name the entry point "
                               "as the class"),
])
def test_a_rule_that_breaks_a_contract_is_refused_when_it_loads(tmp_path, monkeypatch, name,
                                                                 value, says):
    pkg = install_here(tmp_path / "pkg", monkeypatch, drop=("strata.rules",), extra_groups={
        "strata.rules": {name: f"strata_example.broken:{value}"}})
    (pkg / "strata_example" / "broken.py").write_text(BROKEN)
    try:
        with pytest.raises(PluginError) as err:
            plugin_rules()
        assert says in str(err.value)
        assert str(err.value).startswith(
            f"Strata plugin entry point {name!r} = 'strata_example.broken:{value}' in group "
            "'strata.rules' of strata-example 0.1.0: ")
    finally:
        forget()


@pytest.mark.parametrize(("value", "why"), [
    ("EXTRA_SIGNAL", "ValueError: it returned ['other'], which its row does not declare"),
    ("SIGNALS_RAISE", "ZeroDivisionError: the plugin's own bug"),
])
def test_a_signals_function_that_fails_leaves_its_signal_unmeasured_and_says_why(
        tmp_path, monkeypatch, value, why):
    """The plugin's own code failing in a window does not end the case's analysis: its
    signal is unmeasured, and the verdict's missing-signal line says why."""
    pkg = install_here(tmp_path / "pkg", monkeypatch, drop=("strata.rules",), extra_groups={
        "strata.rules": {CLS: f"strata_example.broken:{value}"}})
    (pkg / "strata_example" / "broken.py").write_text(BROKEN)
    try:
        sig = build_signals(window="c", duration_s=1.0, start_ns=0, end_ns=1, hw=[],
                            requests=None, gpu_present=False, gpu_expected=False,
                            multi_node=False, unavailable=())
        reason = (f"rule plugin 'fd_exhaustion' (strata-example 0.1.0): its signals "
                  f"function failed: {why}")
        assert sig.fd_used_frac is None and sig.unavailable == (("?/fds", reason),)
        missing = classify(sig).missing_signals
        assert (f"{SIGNAL} <- fds:fds_open/fds_max (unavailable: ?/fds: {reason})"
                in missing), missing
    finally:
        forget()


def test_a_rule_that_raises_is_unassessable_saying_so(tmp_path, monkeypatch):
    pkg = install_here(tmp_path / "pkg", monkeypatch, drop=("strata.rules",), extra_groups={
        "strata.rules": {CLS: "strata_example.broken:RULE_RAISES"}})
    (pkg / "strata_example" / "broken.py").write_text(BROKEN)
    try:
        v = classify(window(fd_used_frac=0.99))
        assert CLS not in v.past_threshold
        assert ("rule plugin 'fd_exhaustion' (strata-example 0.1.0) raised ZeroDivisionError: "
                "the plugin's own bug") in v.finer_trace, v
    finally:
        forget()

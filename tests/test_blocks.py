"""A/B blocks: counterbalanced order, one boot per block, warm-ups kept apart."""

from pathlib import Path

import pytest

from strata_plugin.analysis.ab_groups import outputs_identical
from strata_plugin.analysis.effects import effect
from strata_plugin.analysis.metrics import acceptance, case_metrics
from strata_plugin.configure.blocks import (
    MissingConfigs,
    UnknownConfigs,
    counterbalanced,
    server_params,
    split_param,
)
from strata_plugin.formats.records import RequestRecord, Timings, TokenEvent, Usage
from strata_plugin.load.case_runner import check_case
from strata_plugin.load.workload import Workload

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]


def test_counterbalanced_forward_then_reverse():
    assert counterbalanced(["A", "B"], 2) == ["A@1", "B@1", "B@2", "A@2"]
    assert counterbalanced(["A", "B", "C"], 3) == [
        "A@1", "B@1", "C@1", "C@2", "B@2", "A@2", "A@3", "B@3", "C@3"]
    assert split_param("B@2") == ("B", "B@2") and split_param("A") == ("A", "A")


class _Marker:
    def __init__(self, *args, name="strata_configs", **kwargs):
        self.args, self.kwargs, self.name = args, kwargs, name


def test_server_params_from_markers():
    ids = ["default", "b", "c"]
    assert server_params(ids, None, None, attached=False) == ["default"]
    assert server_params(ids, _Marker("*"), None, attached=False) == ids
    assert server_params(ids, None, _Marker("b", "c", repeats=1), attached=False) == ["b@1",
                                                                                     "c@1"]
    assert server_params(ids, _Marker("b", "c"), None, attached=True) == ["b"]
    with pytest.raises(MissingConfigs, match="no configuration zzz"):  # skipped, said why
        server_params(ids, _Marker("zzz", optional=True), None, attached=False)


def test_a_config_id_the_profile_lacks_is_an_error_unless_marked_optional():
    """A misspelled id must not pass CI as a skip: without optional=True it is an error
    that names the marker, the id, what the profile has and the way out."""
    ids = ["default", "ub128"]
    for marker in (_Marker("ub218"), _Marker("ub218", optional=False),
                   _Marker("ub218", optional="yes")):  # only True makes it optional
        with pytest.raises(UnknownConfigs) as err:
            server_params(ids, marker, None, attached=False)
        assert not isinstance(err.value, MissingConfigs)
        assert str(err.value) == (
            "strata_configs(...) names 'ub218', which the profile has no configuration of "
            "(it has default, ub128); fix the id, or mark the test strata_configs(..., "
            "optional=True) if it is meant for profiles that have it (it is then skipped here)")
    with pytest.raises(UnknownConfigs, match=r"strata_blocks\(\.\.\.\) names 'x'"):
        server_params(ids, None, _Marker("default", "x", name="strata_blocks"), attached=True)
    assert server_params(ids, _Marker("ub128", optional=True), None, attached=False) == ["ub128"]


@pytest.mark.integration
def test_blocks_run_in_order_and_boot_once_each(pytester, monkeypatch):
    """Through pytest: the blocks' order, and one server fixture setup per block."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest("""
import pytest
BOOTS = []

@pytest.fixture(scope="session")
def strata_server(request):  # stands in for the real one: records each boot
    BOOTS.append(request.param)
    yield request.param

def pytest_sessionfinish(session):
    print("BOOTS=" + ",".join(BOOTS))
""")
    (pytester.path / "p.toml").write_text("""
name = "p"
[server]
engine = "llamacpp"
api = "llamacpp"
argv = ["x"]
[server.configs.A]
[server.configs.B]
""")
    pytester.makepyfile(test_ab="""
import pytest

@pytest.mark.strata_blocks("A", "B", repeats=2)
def test_one(strata_server):
    print("RAN", strata_server)

@pytest.mark.strata_blocks("A", "B", repeats=2)
def test_two(strata_server):
    pass

@pytest.mark.strata_configs("B")
def test_plain_b(strata_server):
    pass
""")
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider",
                                           f"--strata-profile={pytester.path / 'p.toml'}")
    result.assert_outcomes(passed=9)
    line = next(line for line in result.outlines if "BOOTS=" in line)
    boots = line[line.index("BOOTS="):]
    # Each parameter boots once, in order of first appearance; the blocks keep A B B A.
    assert boots == "BOOTS=A@1,B@1,B@2,A@2,B"


def _rec(i, phase, *, draft=None, acc=None, sha="x", prompt=8, completion=4, cached=0):
    ev = tuple(TokenEvent(t_ns=1_000_000 * (10 + k), n_tokens=1) for k in range(completion))
    return RequestRecord(
        request_id=f"c/{phase}/{i}", case_id="c", phase=phase, api="llamacpp", scheduled_ns=0,
        dispatched_ns=0, first_byte_ns=1, events=ev, done_ns=ev[-1].t_ns,
        usage=Usage(prompt, completion, cached, "timings"),
        timings=Timings(prompt_n=prompt, draft_n=draft, draft_n_accepted=acc),
        output_sha256=sha)


def test_warmups_are_kept_apart_from_measurements():
    recs = [_rec(0, "warmup"), _rec(1, "warmup"), _rec(0, "measured"), _rec(1, "measured")]
    cm = case_metrics(recs)
    assert cm.n_requests == 2 and cm.n_warmup == 2


def test_acceptance_is_a_ratio_of_sums_on_recorded_data():
    # A short request with perfect acceptance must not outweigh a long poor one.
    recs = [_rec(0, "measured", draft=3, acc=3), _rec(1, "measured", draft=300, acc=30)]
    assert acceptance(recs) == pytest.approx(33 / 303)
    assert acceptance(recs) != pytest.approx((1.0 + 0.1) / 2)


def test_case_checks_report_numbers():
    w = Workload("w", isl=8, osl=4)
    assert check_case(w, (_rec(0, "measured"),)) == []
    problems = check_case(w, (_rec(0, "measured", prompt=9, completion=3, cached=5),))
    assert any("prompt tokens 9 != ISL 8" in p for p in problems)
    assert any("completion tokens 3 != OSL 4" in p for p in problems)
    assert any("5 cached prompt tokens on a cold prefix" in p for p in problems)


def test_effect_and_identical_outputs():
    e = effect("x", [10.0, 11.0, 9.0, 10.0], [15.0, 16.0, 14.0, 15.0])
    assert e.change_pct == pytest.approx(50.0, abs=0.5)  # ratio of geometric means
    assert 30 < e.ci_lo_pct < 50 < e.ci_hi_pct < 75

    class Run:
        def __init__(self, recs):
            self.records = recs

    a = [Run([_rec(0, "measured", sha="s0"), _rec(1, "measured", sha="s1")])]
    assert outputs_identical(a, [Run([_rec(0, "measured", sha="s0")])]) is True
    assert outputs_identical(a, [Run([_rec(1, "measured", sha="zz")])]) is False

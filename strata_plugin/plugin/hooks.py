"""Strata's pytest hooks. Thin: each reads the run state and calls a plain module.

Inert until used: a hook touches the profile only for a test that asks for a Strata
fixture, and registers only Strata's own markers (the workload markers such as
``prefill`` belong to the repository's ``pytest.ini``, next to its cases).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import pytest

from strata_plugin.plugin.options import add_options, adhoc_workload
from strata_plugin.plugin.state import phase_reports_key, run_state

if TYPE_CHECKING:
    from strata_plugin.load.case_runner import CaseRunner
    from strata_plugin.run.server import Server

#: The markers of Strata's own API (docs/writing-cases.md).
MARKERS = {
    "strata_configs(*ids, optional=False)": "run this test only against these server "
    "configurations; optional=True: skip it where the profile lacks one (else an error)",
    "strata_blocks(*ids, repeats=2, optional=False)": "counterbalanced A/B blocks: A B B A "
    "..., one boot each; optional=True as for strata_configs",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    if adhoc_workload(config) is not None:
        _collect_adhoc_case(config)


def _collect_adhoc_case(config: pytest.Config) -> None:
    """``--strata-workload``: collect the generated case (plugin/adhoc_case.py).

    Alone when no test paths were given (not the repository's whole matrix), else
    beside the paths given.
    """
    from strata_plugin.plugin import adhoc_case

    path = adhoc_case.__file__
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        config.args.append(path)
    else:
        config.args[:] = [path]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize the session server by configuration, so each boots once per block.

    A test that names configurations its profile lacks is skipped with the reason when its
    marker says ``optional=True`` (a llama.cpp sweep on a vLLM profile); without it, a
    usage error naming the test and the id, once collection ends (a typo is not a skip).
    Against an attached server taken for the primary configuration the fixture is not
    parametrized: there is one server, and the test ids carry no configuration.
    """
    if "strata_server" not in metafunc.fixturenames:
        return
    from strata_plugin.configure.blocks import MissingConfigs, server_params

    state = run_state(metafunc.config)
    try:
        cfg = state.config
    except pytest.UsageError as exc:
        state.usage_error = exc
        return
    try:
        ids = server_params(
            [c.config_id for c in cfg.profile.server.configs],
            metafunc.definition.get_closest_marker("strata_configs"),
            metafunc.definition.get_closest_marker("strata_blocks"),
            attached=bool(cfg.server_url))
    except MissingConfigs as exc:
        reason = f"profile {cfg.profile.name} has {exc} for this test"
        metafunc.parametrize("strata_server", [pytest.param("-", marks=pytest.mark.skip(
            reason=reason))], ids=["missing-config"], indirect=True, scope="session")
        return
    except ValueError as exc:
        state.config_errors.append(f"{metafunc.definition.nodeid}: {exc}")
        return
    if cfg.server_url and ids == [c.config_id for c in cfg.profile.server.configs[:1]]:
        return  # one server we did not start: the fixture takes the primary configuration
    metafunc.parametrize("strata_server", ids, indirect=True, scope="session")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from strata_plugin.configure.blocks import group_by_server

    state = run_state(config)
    if state.usage_error is not None:
        raise state.usage_error  # pytest prints "ERROR: bad Strata profile: ..." and exits 4
    if state.config_errors:
        raise pytest.UsageError("\n".join(state.config_errors))

    group_by_server(items)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Keep each phase's report of a Strata test, so its teardown knows the outcome."""
    report = yield
    if "strata" in getattr(item, "fixturenames", ()):
        item.stash.setdefault(phase_reports_key, {})[report.when] = report
        if report.when == "call":
            from strata_plugin.plugin.case_teardown import call_problems_key, mark_not_established

            problems = item.stash.get(call_problems_key, None)
            if problems:
                report.sections.append(("strata: why the case failed", problems))
            mark_not_established(item, report)
    if getattr(report, "strata_not_established", False):
        return report  # an outcome of its own, not a skip
    if report.skipped and "strata_server" in getattr(item, "fixturenames", ()):
        from strata_plugin.plugin.summary import note_skip

        note_skip(run_state(item.config), report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """In a dry run a Strata test plans its cases and ends as a skip saying how far it
    got: its checks need measured results, so whatever stops it is not a failure."""
    sess = run_state(pyfuncitem.config).session
    # the value of Strata's own fixture (plugin/fixtures.py): the test's case runner
    runner = cast("CaseRunner | None", pyfuncitem.funcargs.get("strata"))
    if sess is None or runner is None:
        return (yield)
    if sess.dry_plan is None:  # a real case: judged once, when its body ends
        from strata_plugin.plugin.case_teardown import judge_call

        failure = None
        try:
            result = yield
        except (Exception, pytest.fail.Exception) as exc:
            failure = exc
        server = cast("Server", pyfuncitem.funcargs["strata_server"])  # the fixture's
        judge_call(pyfuncitem, sess, server, runner, failure)
        return result
    stopped = reason = ""
    try:
        yield
    except Exception as exc:
        from strata_plugin.load.case_runner import PlanEnds

        first = str(exc).splitlines()[0] if str(exc) else ""
        stopped = f"{type(exc).__name__}: {first}".rstrip(": ")
        reason = (f"; {first}: the rest is known only in a real run"
                  if isinstance(exc, PlanEnds) else
                  f"; the plan ends where the test checks measured results ({type(exc).__name__})")
    planned = len(runner.case_lines)
    sess.dry_plan.end_test(pyfuncitem.nodeid, runner.setup.block_id, planned, stopped)
    raise pytest.skip.Exception(f"dry run: {planned} case(s) planned, nothing started{reason}",
                                _use_item_location=True)


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    """An A/B expectation its data could not decide: "N", counted as "not established"."""
    if getattr(report, "strata_not_established", False):
        return "not established", "N", ("NOT ESTABLISHED", {"yellow": True})
    return None


def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo) -> None:
    # Called before session teardown: the run is then written as incomplete.
    from strata_plugin.run.reaper import INTERRUPTED

    INTERRUPTED.set()


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int):
    """The run's outcome decides the exit status too: a run whose report could not be
    written (or whose raw data is torn) fails, though every test passed."""
    result = yield
    sess = run_state(session.config).session
    if sess is not None and sess.outcome.fails_run and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from strata_plugin.plugin.summary import write_summary

    write_summary(terminalreporter, run_state(terminalreporter.config))

"""Strata's pytest fixtures: the run, the server per configuration, and the case runner.

Lifetimes: ``strata_session`` spans the pytest session (run folder, report at
the end); ``strata_server`` is session-scoped and parametrized by server
configuration, so pytest groups the tests of one configuration and boots it
once; ``strata`` is per test and attaches the case's headline metrics to the
test's ``user_properties`` (and so to JUnit XML).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from strata_plugin.configure.profile import StrataConfig
from strata_plugin.plugin.state import run_state

if TYPE_CHECKING:
    from strata_plugin.run.server import Server
    from strata_plugin.run.session import StrataSession


def _cfg(request: pytest.FixtureRequest) -> StrataConfig:
    return run_state(request.config).config


@pytest.fixture(scope="session")
def strata_config(request: pytest.FixtureRequest) -> StrataConfig:
    """The frozen run configuration (options + pytest.ini + profile)."""
    return _cfg(request)


@pytest.fixture(scope="session")
def strata_session(request: pytest.FixtureRequest) -> Iterator[object]:
    """The live run: creates ``reports/<RUN_ID>/`` and writes the report at the end."""
    from strata_plugin.run.deployment import PreflightFailed
    from strata_plugin.run.reaper import INTERRUPTED, install_sigterm_handler
    from strata_plugin.run.session import StrataSession

    install_sigterm_handler()  # only now: a repository not running Strata keeps its own
    sess = StrataSession(_cfg(request), list(sys.argv))
    run_state(request.config).session = sess
    _junit_suite_properties(request.config, sess)
    if sess.cfg.dry_run:
        from strata_plugin.run.dry_run import write_dry_run

        sess.dry_plan = write_dry_run(sess)
    else:
        try:
            sess.deployment.preflight()
        except PreflightFailed as exc:
            sess.add_reason("preflight_failed", str(exc))
            sess.finish(interrupted=True)
            pytest.exit(f"strata preflight failed, nothing was started:\n{exc}", returncode=3)
    try:
        yield sess
    finally:
        sess.finish(interrupted=INTERRUPTED.is_set())


@pytest.fixture(scope="session")
def strata_server(request: pytest.FixtureRequest,
                  strata_session: StrataSession) -> Iterator[object]:
    """A server for one configuration (``request.param``), up for its block of tests."""
    from strata_plugin.configure.blocks import split_param

    sess = strata_session
    param = getattr(request, "param", sess.cfg.profile.server.configs[0].config_id)
    config_id, block_id = split_param(param)
    if sess.cfg.dry_run:
        from strata_plugin.run.dry_run import planned_server

        yield planned_server(sess, config_id, block_id)
        return
    from strata_plugin.run.server import ServerStartError

    try:
        server = sess.deployment.start_server(config_id, block_id)
    except ServerStartError as exc:  # the user's problem in their words, not our traceback
        why = f"server {block_id or config_id}: {exc}"
    else:
        why = ""
    if why:
        sess.server_failed(why.splitlines()[0])
        pytest.fail(why, pytrace=False)
    block = sess.begin_block(server)
    try:
        yield server
    finally:
        sess.end_block(block)


@pytest.fixture
def strata(request: pytest.FixtureRequest, strata_server: Server) -> Iterator[object]:
    """A case runner bound to this test's server; its results land on user_properties."""
    sess: StrataSession = request.getfixturevalue("strata_session")
    from strata_plugin.run.deployment import ServerDown

    if sess.cfg.dry_run:  # a planning runner: plugin/hooks.py ends the test as a skip
        yield sess.case_runner(strata_server, request.node.nodeid, None)
        return
    try:
        server = sess.deployment.ensure_alive(strata_server)
    except ServerDown as exc:
        pytest.skip(str(exc))
    for line in sess.recover_agents(server):  # lost since the last case ended
        _warn(request, line)
    from strata_plugin.plugin.progress import progress_line

    runner = sess.case_runner(server, request.node.nodeid,
                              progress_line(request.config, request.node.name))
    yield runner
    from strata_plugin.plugin.case_teardown import finish_case

    finish_case(request.node, sess, server, runner)


def _warn(request: pytest.FixtureRequest, line: str) -> None:
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(f"  [strata] {line}")


def _junit_suite_properties(config: pytest.Config, sess) -> None:
    """The run id and profile as JUnit testsuite properties, for CI dashboards."""
    from _pytest.junitxml import xml_key

    xml = config.stash.get(xml_key, None)
    if xml is not None:
        xml.add_global_property("strata_run_id", sess.cfg.run_id)
        xml.add_global_property("strata_profile", sess.cfg.profile.name)

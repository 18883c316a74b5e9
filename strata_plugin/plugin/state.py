"""The plugin's state for one pytest run, under one stash key that lives with it.

Nothing is read or created until a test asks for a Strata fixture: a repository
that merely has the plugin installed never has its profile resolved, a run folder
made or a signal handler installed. The profile is loaded on first use (the
parametrization of a test that uses ``strata_server``, or a fixture), the
session on the first ``strata_session``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from strata_plugin.configure.profile import ProfileError
from strata_plugin.entry_points import PluginError
from strata_plugin.extend import check_plugins
from strata_plugin.plugin.options import build_config

if TYPE_CHECKING:
    from strata_plugin.configure.profile import StrataConfig
    from strata_plugin.run.session import StrataSession


class RunState:
    """The config (built on first use) and the live session (once started)."""

    def __init__(self, config: pytest.Config) -> None:
        self._pytest_config = config
        self._cfg: StrataConfig | None = None
        self.session: StrataSession | None = None
        #: A bad profile met during collection, raised once collection ends (a UsageError
        #: raised inside collection would be reported as one test module's error).
        self.usage_error: pytest.UsageError | None = None
        #: Configuration markers naming ids the profile lacks (not optional), raised as one
        #: usage error once collection ends.
        self.config_errors: list[str] = []
        #: (node id, reason) of each Strata test that was skipped, for the terminal summary.
        self.skipped: list[tuple[str, str]] = []

    @property
    def config(self) -> StrataConfig:
        if self._cfg is None:
            try:
                # Every installed plugin first: a broken one is this run's usage error
                # now, not a failure at the first verdict or at the report.
                check_plugins()
                self._cfg = build_config(self._pytest_config)
            except ProfileError as exc:
                raise pytest.UsageError(f"bad Strata profile: {exc}") from None
            except PluginError as exc:
                raise pytest.UsageError(str(exc)) from None
        return self._cfg

    @property
    def config_if_loaded(self) -> StrataConfig | None:
        return self._cfg


run_state_key = pytest.StashKey[RunState]()
#: Each phase's report of a test, so the ``strata`` fixture's teardown knows the outcome.
phase_reports_key = pytest.StashKey[dict]()


def run_state(config: pytest.Config) -> RunState:
    state = config.stash.get(run_state_key, None)
    if state is None:
        state = config.stash[run_state_key] = RunState(config)
    return state

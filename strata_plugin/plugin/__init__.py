"""The pytest plugin (entry point ``pytest11: strata``): hooks and fixtures.

The only package of Strata that imports pytest. Everything it does is a call into
``configure``, ``run``, ``load``, ``analysis`` and ``report``.
"""

from strata_plugin.plugin.fixtures import strata, strata_config, strata_server, strata_session
from strata_plugin.plugin.hooks import (
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_generate_tests,
    pytest_keyboard_interrupt,
    pytest_pyfunc_call,
    pytest_report_teststatus,
    pytest_runtest_makereport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

__all__ = [
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_generate_tests",
    "pytest_keyboard_interrupt",
    "pytest_pyfunc_call",
    "pytest_report_teststatus",
    "pytest_runtest_makereport",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
    "strata",
    "strata_config",
    "strata_server",
    "strata_session",
]

"""Loads the Strata plugin for every test run from this repository."""

pytest_plugins = ["strata_plugin.plugin"]

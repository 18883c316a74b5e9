"""Strata's pytest hooks and fixtures. Hooks stay thin: logic lives in plain modules."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from strata_plugin.config import ProfileError, StrataConfig, load_profile

config_key = pytest.StashKey[StrataConfig]()
session_key = pytest.StashKey["object"]()  # the StrataSession, created on first use
INTERRUPTED = threading.Event()
phase_reports_key = pytest.StashKey[dict]()

MARKERS = {
    "prefill": "prefill-heavy workloads (long input, short output)",
    "decode": "decode-heavy workloads (short input, long output)",
    "long_context": "long-context workloads",
    "mixed": "mixed prefill/decode A/B workloads",
    "mtp": "speculative decoding / MTP sweeps",
    "sweep": "server-configuration sweeps",
    "smoke": "the quick subset that runs the whole local matrix in minutes",
    "fault": "fault-injection scenarios",
    "soak": "long load-holding cases",
    "quality": "output-quality cases with validators",
    "strata_configs(*ids)": "run this test only against these server configurations",
    "strata_blocks(*ids, repeats=2)": "counterbalanced A/B blocks: A B B A ..., one boot each",
}

_OPTIONS = (
    # (option, ini, help, default)
    ("--strata-profile", "strata_profile", "deployment profile (TOML)",
     "fixtures/profiles/local.toml"),
    ("--strata-server-url", "strata_server_url",
     "attach to a running server at URL instead of launching one", ""),
    ("--strata-reports-dir", "strata_reports_dir", "where run folders go", "reports"),
    ("--strata-run-id", "strata_run_id", "run id (default: UTC time + random suffix)", ""),
    ("--strata-baseline", "strata_baseline",
     "a previous run folder to gate regressions against", ""),
    ("--strata-max-regression", "strata_max_regression",
     "percent a metric may worsen vs the baseline before a test fails", "10"),
    ("--strata-regression-metrics", "strata_regression_metrics",
     "comma-separated request metrics the baseline gate checks", "ttft_ms,tpot_ms"),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("strata", "Strata LLM-serving benchmarks")
    for opt, ini, help_text, default in _OPTIONS:
        group.addoption(opt, dest=ini, default=None, help=f"{help_text} (ini: {ini})")
        parser.addini(ini, help_text, default=default)
    group.addoption("--strata-dry-run", action="store_true", dest="strata_dry_run",
                    help="write every command that would run into the run folder; start nothing")


def _value(config: pytest.Config, ini: str) -> str:
    """Command-line option wins over pytest.ini."""
    opt = config.getoption(ini)
    return str(opt) if opt is not None else str(config.getini(ini))


def build_config(config: pytest.Config) -> StrataConfig:
    from strata_plugin.rundir import new_run_id

    root = Path(config.rootpath)
    profile_path = Path(_value(config, "strata_profile"))
    if not profile_path.is_absolute():
        profile_path = root / profile_path
    try:
        max_reg = float(_value(config, "strata_max_regression"))
    except ValueError:
        raise pytest.UsageError("--strata-max-regression: expected a number (percent)") from None
    baseline = _value(config, "strata_baseline")
    reports = Path(_value(config, "strata_reports_dir"))
    return StrataConfig(
        profile=load_profile(profile_path),
        reports_dir=reports if reports.is_absolute() else root / reports,
        run_id=_value(config, "strata_run_id") or new_run_id(),
        server_url=_value(config, "strata_server_url"),
        dry_run=bool(config.getoption("strata_dry_run")),
        baseline_dir=Path(baseline) if baseline else None,
        max_regression_pct=max_reg,
        regression_metrics=tuple(m.strip() for m in
                                 _value(config, "strata_regression_metrics").split(",")
                                 if m.strip()),
        rootdir=root,
    )


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    try:
        config.stash[config_key] = build_config(config)
    except ProfileError as exc:
        raise pytest.UsageError(f"bad Strata profile: {exc}") from None
    from strata_plugin.session import install_sigterm_handler

    install_sigterm_handler()


def pytest_sessionstart(session: pytest.Session) -> None:
    """The run id as a JUnit testsuite property, so CI dashboards can find the run folder."""
    from _pytest.junitxml import xml_key

    xml = session.config.stash.get(xml_key, None)
    cfg = session.config.stash.get(config_key, None)
    if xml is not None and cfg is not None:
        xml.add_global_property("strata_run_id", cfg.run_id)
        xml.add_global_property("strata_profile", cfg.profile.name)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize the session server by configuration, so each boots once per block."""
    if "strata_server" not in metafunc.fixturenames:
        return
    from strata_plugin.blocks import server_params

    cfg = metafunc.config.stash[config_key]
    try:
        ids = server_params(
            [c.config_id for c in cfg.profile.server.configs],
            metafunc.definition.get_closest_marker("strata_configs"),
            metafunc.definition.get_closest_marker("strata_blocks"),
            attached=bool(cfg.server_url))
    except ValueError as exc:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: {exc}") from None
    metafunc.parametrize("strata_server", ids, indirect=True, scope="session")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Keep each phase's report so the ``strata`` fixture knows the test's outcome."""
    report = yield
    item.stash.setdefault(phase_reports_key, {})[report.when] = report
    return report


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    from strata_plugin.blocks import group_by_server

    group_by_server(items)


def pytest_report_header(config: pytest.Config) -> str | None:
    cfg = config.stash.get(config_key, None)
    if cfg is None:
        return None
    configs = ", ".join(c.config_id for c in cfg.profile.server.configs)
    target = cfg.server_url or f"launch ({configs})"
    return f"strata: profile {cfg.profile.name} ({cfg.profile.path.name}), server {target}"


def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo) -> None:
    # Called before session teardown: the run is then written as incomplete.
    INTERRUPTED.set()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    sess = terminalreporter.config.stash.get(session_key, None)
    if sess is None:
        return
    terminalreporter.write_sep("-", "strata")
    terminalreporter.write_line(f"run folder: {sess.run_dir}")
    report = sess.run_dir / "report.md"
    if report.exists():
        terminalreporter.write_line(f"report: {report}")
    if sess.incomplete_reason:
        terminalreporter.write_line(f"run incomplete: {sess.incomplete_reason}")


from strata_plugin.fixtures import *  # noqa: E402, F403  (register the fixtures)

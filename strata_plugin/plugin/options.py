"""Command-line options and their ``pytest.ini`` twins (the option wins) -> StrataConfig."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata_plugin.configure.credentials import UrlAuth, split_credentials
from strata_plugin.configure.names import NAME_RULE, is_name
from strata_plugin.configure.profile import StrataConfig, load_profile, resolve_profile

OPTIONS = (
    # (option, ini, help, default)
    ("--strata-profile", "strata_profile",
     "deployment profile: a TOML path (relative to the project's folder: the rootdir) or "
     "a packaged name", "local"),
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
    ("--strata-api", "strata_api",
     "the server's API, replacing the profile's server.api: chat, completions, llamacpp "
     "or sglang", ""),
    ("--strata-escalate", "strata_escalate",
     "diagnostic round: re-run cases with a kernel trace over the measured window; 'auto' "
     "(inconclusive or ambiguous verdicts) and/or case ids or workload names, comma-separated",
     ""),
    ("--strata-engine-profile", "strata_engine_profile",
     "the engine's own profile (perf CPU samples of its threads) over a repetition's "
     "measured window, beside the timed case: case ids or workload names, comma-separated",
     ""),
    ("--strata-progress", "strata_progress",
     "live progress line per case: auto (on a terminal, not in CI), on, off", "auto"),
)


#: ``--strata-progress`` values (plugin/progress.py).
PROGRESS_SETTINGS = ("auto", "on", "off")


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("strata", "Strata LLM-serving benchmarks")
    for opt, ini, help_text, default in OPTIONS:
        group.addoption(opt, dest=ini, default=None, help=f"{help_text} (ini: {ini})")
        parser.addini(ini, help_text, default=default)
    group.addoption("--strata-dry-run", action="store_true", dest="strata_dry_run",
                    help="write every command that would run into the run folder; start nothing")
    group.addoption("--strata-workload", dest="strata_workload", default=None,
                    metavar="KEY=VALUE,...",
                    help="run one generated case with this workload, e.g. "
                         "isl=256,osl=64,concurrency=4,requests=40 (Workload's fields; "
                         "not scaled by the profile)")


def adhoc_workload(config: pytest.Config):
    """The ``--strata-workload`` workload, or None; a bad one is a usage error."""
    text = config.getoption("strata_workload", None)
    if text is None:
        return None
    if not text.strip(" ,"):  # given, but empty: not the whole matrix
        raise pytest.UsageError(f"--strata-workload {text!r} is empty: give the workload "
                                "as key=value pairs, e.g. isl=256,osl=64,concurrency=4,"
                                "requests=40")
    from strata_plugin.load.workload_spec import WorkloadSpecError, parse_workload

    try:
        return parse_workload(text)
    except WorkloadSpecError as exc:
        raise pytest.UsageError(f"--strata-workload: {exc}") from None


def progress_setting(config: pytest.Config) -> str:
    """``--strata-progress`` (auto, on, off); anything else is a usage error."""
    value = _value(config, "strata_progress").strip().lower() or "auto"
    if value not in PROGRESS_SETTINGS:
        raise pytest.UsageError(f"--strata-progress {value!r}: expected one of "
                                f"{', '.join(PROGRESS_SETTINGS)}")
    return value


def _with_api(profile, api: str):
    """The profile with its server's API replaced (``--strata-api``)."""
    import dataclasses

    from strata_plugin.load.client.spec import API_FLAVOURS

    if api not in API_FLAVOURS:
        raise pytest.UsageError(f"--strata-api {api!r}: expected one of {', '.join(API_FLAVOURS)}")
    return dataclasses.replace(profile, server=dataclasses.replace(profile.server, api=api))


def _server_url(url: str) -> tuple[str, UrlAuth | None]:
    """``--strata-server-url`` checked now: a malformed URL is a usage error, not a wait.
    Its credentials (``http://user:pw@host``) are taken apart here, so the URL the run
    keeps, writes and shows has none (configure/credentials.py)."""
    if not url.strip():
        return "", None
    from strata_plugin.run.server import check_server_url

    try:
        return split_credentials(check_server_url(url))
    except ValueError as exc:
        raise pytest.UsageError(f"--strata-server-url (ini: strata_server_url): {exc}") from None


def _value(config: pytest.Config, ini: str) -> str:
    """Command-line option wins over pytest.ini."""
    opt = config.getoption(ini)
    return str(opt) if opt is not None else str(config.getini(ini))


def _run_id(config: pytest.Config) -> str:
    """``--strata-run-id``: the run folder's name, one path component (``../x`` once made a
    folder outside the reports folder); "" = a new id."""
    value = _value(config, "strata_run_id")
    if value and not is_name(value):
        raise pytest.UsageError(f"--strata-run-id (ini: strata_run_id) {value!r}: expected "
                                f"{NAME_RULE}")
    return value


#: Files that make a folder a pytest project's root (pytest's own list, "rootdir"
#: docs): the name, and the section it must hold ("" = the file alone).
_PROJECT_FILES = (("pytest.ini", ""), (".pytest.ini", ""), ("pyproject.toml", ""),
                  ("tox.ini", "[pytest]"), ("setup.cfg", "[tool:pytest]"), ("setup.py", ""))


def _holds(path: Path, section: str) -> bool:
    try:
        with path.open("rb") as fh:  # a project file is a few KB: the head is enough
            return section.encode() in fh.read(1 << 20) if section else True
    except OSError:
        return False


def invoking_root(config: pytest.Config) -> Path:
    """The folder Strata's relative paths (the reports folder, a profile's path) are
    taken from: pytest's rootdir where a configuration file or ``--rootdir`` set it;
    else the nearest folder from the invocation directory up that holds a project file,
    else the invocation directory itself.

    Why not pytest's rootdir alone: without a configuration file found, pytest takes the
    command line's existing paths as hints for it, before the plugin's options are known,
    so the value of ``--strata-profile /x/p.toml`` (a separate argument) made ``/x`` the
    rootdir, and the run folder went to ``/x/reports``, outside the repository run from."""
    if config.inipath is not None or config.getoption("rootdir", None):
        return Path(config.rootpath)
    start = Path(config.invocation_params.dir)
    for folder in (start, *start.parents):
        if any((folder / name).is_file() and _holds(folder / name, section)
               for name, section in _PROJECT_FILES):
            return folder
    return start


def build_config(config: pytest.Config) -> StrataConfig:
    """Options + ini + profile, resolved against the invoking repository's root
    (:func:`invoking_root`)."""
    from strata_plugin.run.run_folder import new_run_id

    root = invoking_root(config)
    try:
        max_reg = float(_value(config, "strata_max_regression"))
    except ValueError:
        raise pytest.UsageError("--strata-max-regression: expected a number (percent)") from None
    baseline = _value(config, "strata_baseline")
    from strata_plugin.run.diagnostic_round import parse_escalate

    try:
        escalate = parse_escalate(_value(config, "strata_escalate"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:
        engine_profile = parse_escalate(_value(config, "strata_engine_profile"),
                                        "--strata-engine-profile")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    reports = Path(_value(config, "strata_reports_dir"))
    profile = load_profile(resolve_profile(_value(config, "strata_profile"), root))
    if profile.raw.get("allow_unsandboxed_code") is True:
        from strata_plugin.load import sandbox

        sandbox.allow_unconfined(f"profile {profile.name}: allow_unsandboxed_code = true")
    api = _value(config, "strata_api").strip()
    if api:
        profile = _with_api(profile, api)
    server_url, server_auth = _server_url(_value(config, "strata_server_url"))
    return StrataConfig(
        profile=profile,
        reports_dir=reports if reports.is_absolute() else root / reports,
        run_id=_run_id(config) or new_run_id(),
        server_url=server_url,
        server_auth=server_auth,
        dry_run=bool(config.getoption("strata_dry_run")),
        baseline_dir=Path(baseline) if baseline else None,
        max_regression_pct=max_reg,
        regression_metrics=tuple(m.strip() for m in
                                 _value(config, "strata_regression_metrics").split(",")
                                 if m.strip()),
        rootdir=root,
        escalate=escalate,
        engine_profile=engine_profile,
    )

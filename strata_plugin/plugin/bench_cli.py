"""``python -m strata_plugin bench URL --workload isl=256,osl=64,...``: one ad-hoc case.

The same run as ``pytest --strata-server-url URL --strata-workload ...`` (it is that
run: pytest is started in this process with those options), so the run folder, the
report and the CI files are the same. Arguments after ``--`` go to pytest unchanged.
"""

from __future__ import annotations

import argparse

USAGE_EPILOG = """example:
  python -m strata_plugin bench http://127.0.0.1:8000 --api completions \\
      --workload isl=256,osl=64,concurrency=4,requests=40
workload keys: Workload's fields (isl, osl, concurrency, requests, warmups, seed, prefix,
shared_prefix_tokens, arrival, rate, burstiness, expect_stop, name)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m strata_plugin bench", epilog=USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Measure one workload against a running server and write a report.")
    p.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--workload", required=True, metavar="KEY=VALUE,...",
                   help="the workload, e.g. isl=256,osl=64,concurrency=4,requests=40")
    p.add_argument("--api", default="", help="chat, completions, llamacpp or sglang "
                   "(default: the profile's server.api)")
    p.add_argument("--profile", default="", help="profile TOML or packaged name "
                   "(default: pytest.ini's strata_profile, else 'local')")
    p.add_argument("--reports-dir", default="", help="where the run folder goes")
    p.add_argument("--run-id", default="", help="the run folder's name")
    return p


def pytest_args(argv: list[str]) -> list[str]:
    """The pytest command line this bench command stands for."""
    ours, theirs = _split(argv)
    a = _parser().parse_args(ours)
    out = ["-p", "no:cacheprovider", f"--strata-server-url={a.url}",
           f"--strata-workload={a.workload}"]
    for opt, value in (("--strata-api", a.api), ("--strata-profile", a.profile),
                       ("--strata-reports-dir", a.reports_dir), ("--strata-run-id", a.run_id)):
        if value:
            out.append(f"{opt}={value}")
    return out + theirs


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def bench_main(argv: list[str]) -> int:
    import pytest

    return int(pytest.main(pytest_args(argv)))

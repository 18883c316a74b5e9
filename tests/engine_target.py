"""A packaged CPU engine target (vllm-cpu, sglang-cpu) for the tests that serve from it:
its setup's paths, or the test skipped saying how to set it up (failed instead where its
require variable is 1, as `bash scripts/test.sh --vllm --sglang` and CI set), and its
profile's server command expanded and served for one test module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from strata_plugin.configure.profile import Profile, expand_placeholders
from strata_plugin.embedded.llama_setup import cache_root
from strata_plugin.run.server import LaunchSpec, Server, free_port


@dataclass(frozen=True)
class Target:
    """An engine's CPU target: ``name`` as messages say it, ``flag`` its setup's
    (``setup --<flag>``, ``scripts/setup.sh --<flag>``), ``require`` the variable that
    turns a missing setup from a skip into a failure, ``profile`` the packaged profile."""

    name: str
    flag: str
    require: str
    profile: str


VLLM = Target("vLLM", "vllm", "STRATA_REQUIRE_VLLM", "vllm-cpu")
SGLANG = Target("SGLang", "sglang", "STRATA_REQUIRE_SGLANG", "sglang-cpu")


def setup_state(target: Target) -> dict | str:
    """The setup's paths when ``target`` is set up, else why not."""
    out = subprocess.run([sys.executable, "-m", "strata_plugin", "setup", f"--{target.flag}",
                          "--print-paths"], capture_output=True, text=True, check=False)
    return json.loads(out.stdout.splitlines()[-1]) if out.returncode == 0 else out.stderr.strip()


def engine_paths(target: Target) -> dict:
    """The setup's paths; without a setup the calling test skips, or fails where the
    target's require variable is 1 (a run that must serve from it)."""
    got = setup_state(target)
    if isinstance(got, str):
        msg = (f"the {target.name} CPU target is not set up ({got}); "
               f"`bash scripts/setup.sh --{target.flag}`")
        if os.environ.get(target.require) == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return got


def packaged_launch(profile: Profile, log: Path, run_dir: Path | None = None) -> LaunchSpec:
    """The profile's first server config on a free local port, its argv and env expanded
    with the profile's vars (over the cache root and, where given, the ``{run_dir}`` its
    server writes into), health-checked as the profile says."""
    port = free_port()
    values = {"host": "127.0.0.1", "port": str(port), "strata_cache": str(cache_root())}
    if run_dir is not None:
        values["run_dir"] = str(run_dir)
    values.update({k: v.format_map(values) for k, v in profile.vars})
    conf = profile.server.configs[0]
    return LaunchSpec("it", tuple(expand_placeholders(conf.argv, values)),
                      tuple((k, v.format_map(values)) for k, v in conf.env),
                      f"http://127.0.0.1:{port}", profile.server.health_path,
                      profile.server.health_timeout_s, 20, log)


def packaged_server(profile: Profile, log: Path, run_dir: Path | None = None) -> Server:
    """The server of ``packaged_launch``, not yet started."""
    spec = packaged_launch(profile, log, run_dir)
    return Server(spec, spec.base_url)


def serving(server: Server) -> Iterator[Server]:
    """``server`` started, for a module-scoped fixture to ``yield from``; stopped when the
    module's tests are done."""
    server.start()
    yield server
    server.stop()

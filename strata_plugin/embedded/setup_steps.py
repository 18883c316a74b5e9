"""The steps the engine setups (vllm_setup.py, sglang_setup.py) share: a step run with its
output kept for the error, a fresh virtualenv with its pip, the record file that says an
install finished (its requirement and what it found), and the command around them
(``python -m strata_plugin setup --<engine> [--print-paths]``).

Why a record: an install takes minutes and can stop half-way; a virtualenv without a record
of the current requirement is not trusted and is made again.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from strata_plugin.embedded.llama_setup import SetupError, cache_root, log

#: lines of a failed step's output the error keeps (pip's reason is near its end)
TAIL_LINES = 25


def run_step(cmd: list[str], what: str, env: dict | None = None) -> str:
    """``cmd``'s stdout; SetupError naming ``what``, the command and its output's tail if
    it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-TAIL_LINES:])
        raise SetupError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    return proc.stdout


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def read_record(venv: Path, record: str, requirement: str) -> dict | None:
    """The finished install's record, if it is for this requirement and the venv is there."""
    try:
        rec = json.loads((venv / record).read_text())
    except (OSError, ValueError):
        return None
    if rec.get("requirement") != requirement or not os.access(venv_python(venv), os.X_OK):
        return None
    return rec


def write_record(venv: Path, record: str, rec: dict) -> None:
    (venv / record).write_text(json.dumps(rec, indent=1) + "\n")


@dataclass(frozen=True)
class FreshVenv:
    """A virtualenv just made: its interpreter, its pip command and the environment to run
    pip in; ``started`` is when the install began (time.monotonic), for the record."""

    python: str
    pip: tuple[str, ...]
    env: dict[str, str]
    started: float

    def install_s(self) -> float:
        """Seconds since the install began, as the record keeps them."""
        return round(time.monotonic() - self.started, 1)


def fresh_venv(root: Path, venv: Path, name: str, cost: str) -> FreshVenv:
    """``venv`` made anew (whatever was there removed), pip's cache under ``root``.
    ``name`` is the engine's ("vLLM"), ``cost`` what the log line warns of."""
    # An unfinished venv (no record) is not trusted: start over.
    shutil.rmtree(venv, ignore_errors=True)
    started = time.monotonic()
    log(f"creating {venv} ({cost})")
    run_step([sys.executable, "-m", "venv", str(venv)], f"creating the {name} virtualenv")
    python = str(venv_python(venv))
    env = dict(os.environ)
    env.setdefault("PIP_CACHE_DIR", str(root / "pip"))
    return FreshVenv(python, (python, "-m", "pip", "--disable-pip-version-check"), env, started)


def require_set_up(name: str, flag: str, venv: Path, rec: dict | None, model: Path) -> None:
    """SetupError saying what of the ``name`` target is missing (its virtualenv's record,
    the generated checkpoint) and the command that makes it (``setup --<flag>``)."""
    missing = ([] if rec else [f"the {name} virtualenv ({venv})"]) + (
        [] if (model / "strata_model.json").exists() else [str(model)])
    if missing:
        raise SetupError(f"{name} not set up: missing " + ", ".join(missing)
                         + f"; run `python -m strata_plugin setup --{flag}` first")


def setup_parser(flag: str, name: str, doc: str | None) -> argparse.ArgumentParser:
    """``setup --<flag>``'s arguments: the flag itself and ``--print-paths``; an engine's
    own are added to it. The description is ``doc``'s first paragraph."""
    ap = argparse.ArgumentParser(prog=f"python -m strata_plugin setup --{flag}",
                                 description=(doc or "").split("\n\n")[0])
    ap.add_argument(f"--{flag}", action="store_true", required=True,
                    help=f"set up the {name} CPU target (this command)")
    ap.add_argument("--print-paths", action="store_true", help="no work; fail if not set up")
    return ap


def run_setup(flag: str, paths_only: bool, print_paths: Callable[[Path], None],
              set_up: Callable[[Path], str]) -> int:
    """The command's exit status: ``print_paths`` (no work), or ``set_up``, whose JSON paths
    are printed as the last line; a failure is said in one line on stderr, exit 1."""
    root = cache_root()
    try:
        if paths_only:
            print_paths(root)
            return 0
        print(set_up(root))
    except (SetupError, OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
        print(f"strata setup --{flag}: error: {exc}", file=sys.stderr)
        return 1
    return 0

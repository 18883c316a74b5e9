"""The worker-side agent on the oldest Python it promises (3.8, docs/multinode.md).

``vermin`` checks the minimum version of the agent package and of the remote side
(``run/remote.py``, shipped as ``strata_remote``) statically; where a Python 3.8 or 3.9
interpreter exists here (pyenv, or on PATH) the shipped zip really runs on it, from
memory, and loads NVML bindings (``pynvml``) from the zip when that Python has none.
"""

from __future__ import annotations

import glob
import io
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from strata_plugin.agent.handle import AgentHandle, agent_argv
from strata_plugin.run import remote

ROOT = Path(__file__).resolve().parents[1]
MIN_PYTHON = "3.8"


def test_vermin_finds_nothing_past_python_3_8():
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from vermin.main import main; sys.exit(main())",
         f"-t={MIN_PYTHON}-", "--violations", "--no-tips",
         "--no-parse-comments", str(ROOT / "strata_plugin" / "agent"),
         str(ROOT / "strata_plugin" / "run" / "remote.py")],
        capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def _old_pythons() -> list[str]:
    """A working Python 3.8 and 3.9, from ~/.pyenv or PATH (a pyenv shim may not run)."""
    found = []
    for v in ("3.8", "3.9"):
        pyenv = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{v}.*/bin/python{v}")))
        for exe in [*pyenv, shutil.which(f"python{v}")]:
            if exe and subprocess.run([exe, "-c", "pass"], capture_output=True,
                                      check=False).returncode == 0:
                found.append(exe)
                break
    return found


def test_the_zip_carries_pynvml_as_a_fallback():
    import pynvml

    names = zipfile.ZipFile(io.BytesIO(remote.agent_zip())).namelist()
    assert "pynvml.py" in names and "strata_agent/cli.py" in names
    assert Path(pynvml.__file__).name == "pynvml.py"


def _fake_ssh(tmp: Path) -> str:
    """An 'ssh' that runs the remote line with sh in an empty environment, like sshd."""
    path = tmp / "fakessh"
    path.write_text('#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done; shift 2\n'
                    'exec env -i PATH=/usr/bin:/bin HOME=/tmp sh -c "$1"\n')
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("python", _old_pythons() or ["none"])
def test_shipped_agent_runs_on_an_old_python(python, tmp_path):
    if python == "none":
        pytest.skip("no Python 3.8 or 3.9 interpreter here (PATH or ~/.pyenv); vermin "
                    "still checks the code statically")
    bare = subprocess.run([python, "-c", "import pynvml"], capture_output=True, check=False)
    argv = remote.remote_agent_argv(
        "fake", agent_argv("w", 0.2, collectors=["cpu", "net", "proc", "nvml"]),
        ssh_options=(), ssh=_fake_ssh(tmp_path), remote_python=python)
    h = AgentHandle.start("w", tmp_path / "w", argv)
    try:
        assert h.hello["python"].startswith(("3.8", "3.9")), h.hello["python"]
        assert h.hello["collectors"]["cpu"] == {"status": "ok"}
        nvml = h.hello["collectors"]["nvml"]
        # No GPU here: NVML itself is missing, but the bindings were found (from the zip
        # when this Python has none of its own).
        assert "pynvml" not in str(nvml.get("reason", "")), (bare.returncode, nvml)
        assert "NVML" in str(nvml.get("reason", "")) or nvml["status"] == "ok"
    finally:
        info = h.stop()
    assert info.expected, info

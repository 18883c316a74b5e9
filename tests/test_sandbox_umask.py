"""The sandbox's Python stays reachable whatever the harness's umask (load/sandbox_child.py).

A profile with ``[server.env]`` values makes the run private: the harness runs under
umask 077 (run/run_folder.private_umask), and the vLLM CPU profile's code check failed
with "the sandbox user cannot run .venv/bin/python: Permission denied" (issue 32).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FROZEN = REPO / "fixtures" / "quality" / "test_add.py"

RIGHT_ADD = "def add(a, b):\n    return a + b\n"
_UNDER_UMASK = """
import json, os, sys
os.umask(int(sys.argv[1], 8))
from strata_plugin.load import sandbox
o = sandbox.run_frozen_tests(sys.stdin.read(), open(sys.argv[2]).read())
print(json.dumps([o.passed, o.total, o.error, sorted(sandbox._python_dirs())]))
"""


@pytest.mark.parametrize("umask", ["022", "077"])
def test_a_private_umask_still_lets_the_sandbox_user_reach_its_python(confinable, tmp_path,
                                                                      umask):
    """A profile with ``[server.env]`` values makes the run private: the harness runs under
    umask 077 (run/run_folder.private_umask). The sandbox's mount points back to a Python
    in a hidden directory (here a virtualenv in /tmp, as a checkout made with mktemp -d;
    the base Python may live in /root too) were made under that umask, 0700, and the
    sandbox user got "cannot run .../python: Permission denied" (the vLLM CPU profile's
    code check, issue 32). Under 022 it always worked; under 077 it must too."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    (tmp_path / "venv").chmod(0o755)  # tmp_path's parents are 0700: as a mktemp -d clone
    py = venv / "bin" / "python"
    p = subprocess.run([str(py), "-c", _UNDER_UMASK, umask, str(FROZEN)], input=RIGHT_ADD,
                       capture_output=True, text=True, timeout=120, check=False,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stdout + p.stderr
    passed, total, error, exposed = json.loads(p.stdout.strip().splitlines()[-1])
    # the case this guards: a Python directory under one the sandbox hides
    assert any(d.startswith(("/tmp/", "/root/", "/home/")) for d in exposed), exposed
    assert (passed, total, error) == (10, 10, ""), error

"""System packages a test needs, installed on demand through scripts/install_system_deps.sh.

The main job needs no system package; a few of the harness's own tests do (sshd for the
two-node lab, Prometheus for the Prometheus source). Such a test calls ``require``: what
is installed is used; what is missing is installed when this process may (root, apt-get),
else the test is skipped saying what to install. A failed install fails the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install_system_deps.sh"


def installed(package: str) -> bool:
    out = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True,
                         text=True, check=False) if shutil.which("dpkg-query") else None
    return out is not None and out.returncode == 0 and "install ok installed" in out.stdout


def require(*packages: str) -> None:
    missing = [p for p in packages if not installed(p)]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        pytest.skip(f"needs {', '.join(missing)} (no apt-get here: install them by hand)")
    if os.geteuid() != 0 and shutil.which("sudo") is None:
        pytest.skip(f"needs {', '.join(missing)}: run `sudo bash {SCRIPT.name} "
                    f"{' '.join(missing)}` from scripts/")
    out = subprocess.run(["bash", str(SCRIPT), *missing], capture_output=True, text=True,
                         check=False, timeout=900)
    if out.returncode != 0:
        if os.geteuid() != 0:
            pytest.skip(f"needs {', '.join(missing)}; installing them needs root: "
                        f"{out.stderr.strip()[-300:]}")
        pytest.fail(f"installing {', '.join(missing)} failed (exit {out.returncode}):\n"
                    f"{out.stderr[-2000:]}", pytrace=False)

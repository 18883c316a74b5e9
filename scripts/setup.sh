#!/usr/bin/env bash
# Sets up everything the main job and the tests need, into a project virtualenv (.venv,
# no system site-packages, so a missing declaration fails here as it would for a user):
# Strata installed editable with its test extra, then llama-server and the generated
# models (built once, cached in ~/.cache/strata; `python -m strata_plugin setup --clean`
# removes that cache). No system package is installed here: the few tests that need one
# install it on demand (scripts/install_system_deps.sh).
#
# --vllm also sets up the opt-in second engine: a real vLLM server on the CPU in its own
# virtualenv with a generated model (~/.cache/strata/vllm-venv, models/tiny-llama-hf;
# minutes the first time, seconds once cached). Where pip's configured sources do not
# provide the CPU build of torch, set STRATA_TORCH_INDEX=https://download.pytorch.org/whl/cpu.
#
# --sglang also sets up the opt-in third engine: a real SGLang server on the CPU in its own
# virtualenv (~/.cache/strata/sglang-venv, ~9 GB: SGLang pins the CUDA build of torch)
# with the same generated model (about 5 minutes the first time, seconds once cached).
#
# --ray also installs the Ray extra (`strata[ray]`: ray with its client, a 79 MB wheel,
# ~240 MB installed, 1-3 minutes here) for the load over hosts (docs/scale.md) and its
# tests (tests/test_ray_cluster.py). --vllm implies it: CI runs those tests too.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM=0
SGLANG=0
EXTRAS="test,embedded"
for arg in "$@"; do
    case "$arg" in
        --vllm) VLLM=1; EXTRAS="test,embedded,ray" ;;
        --sglang) SGLANG=1 ;;
        --ray) EXTRAS="test,embedded,ray" ;;
        *) echo "usage: bash scripts/setup.sh [--vllm] [--sglang] [--ray]" >&2; exit 2 ;;
    esac
done
PY="${STRATA_PYTHON:-python3}"
# pip's download cache beside the build cache: setup writes nothing else outside the repo.
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-${STRATA_CACHE:-$HOME/.cache/strata}/pip}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$EXTRAS]" \
    2> >(grep -v "^WARNING: Location" >&2)
.venv/bin/python -m strata_plugin setup >/dev/null
if [ "$VLLM" = 1 ]; then
    .venv/bin/python -m strata_plugin setup --vllm \
        ${STRATA_TORCH_INDEX:+--torch-index "$STRATA_TORCH_INDEX"} >/dev/null
fi
if [ "$SGLANG" = 1 ]; then
    .venv/bin/python -m strata_plugin setup --sglang >/dev/null
fi

#!/usr/bin/env bash
# Sets up everything the main job and the tests need, into a project virtualenv (.venv,
# no system site-packages, so a missing declaration fails here as it would for a user):
# Strata installed editable with its test extra, then llama-server and the generated
# models (built once, cached in ~/.cache/strata; `python -m strata_plugin setup --clean`
# removes that cache). No system package is installed here: the few tests that need one
# install it on demand (scripts/install_system_deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${STRATA_PYTHON:-python3}"
# pip's download cache beside the build cache: setup writes nothing else outside the repo.
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-${STRATA_CACHE:-$HOME/.cache/strata}/pip}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test,embedded]" \
    2> >(grep -v "^WARNING: Location" >&2)
.venv/bin/python -m strata_plugin setup >/dev/null

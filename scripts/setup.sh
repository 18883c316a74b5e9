#!/usr/bin/env bash
# Sets up everything Strata needs on a fresh machine: Python packages, then
# llama-server and the generated models (built once, cached in ~/.cache/strata).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_system_deps.sh
python3 -m pip install --quiet --disable-pip-version-check -r requirements.txt
python3 scripts/setup_llama.py

#!/usr/bin/env bash
# Sets up, then runs the harness's own tests (unit, plugin and integration against
# the real llama-server) and lints the code.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python3 -m ruff check .
exec python3 -m pytest tests/ -q "$@"

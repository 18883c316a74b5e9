#!/usr/bin/env bash
# Sets up, then runs the harness's own tests (unit, plugin, packaging and integration
# against the real llama-server) and lints the code.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m ruff check .
exec .venv/bin/python -m pytest tests/ -q "$@"

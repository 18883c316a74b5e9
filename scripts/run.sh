#!/usr/bin/env bash
# Sets up, then runs the case matrix on the embedded default (llama-server on the
# CPU) and writes reports/<RUN_ID>/. Extra arguments go to pytest (e.g. -k prefill).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest cases/ -m smoke --junitxml=reports/junit.xml "$@"

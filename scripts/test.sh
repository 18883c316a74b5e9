#!/usr/bin/env bash
# Sets up, then runs the harness's own tests (unit, plugin, packaging and integration
# against the real llama-server) and lints the code.
#
# --vllm also sets up the vLLM CPU server (scripts/setup.sh --vllm) and requires the
# tests marked `vllm` to run against it (without --vllm they skip when it is not set up);
# it also installs the Ray extra and requires the tests marked `ray` to run (a real Ray
# cluster in network namespaces: tests/test_ray_cluster.py).
# --sglang likewise sets up the SGLang CPU server and requires the tests marked `sglang`.
# Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
SETUP=()
ARGS=()
for arg in "$@"; do
    case "$arg" in
        --vllm)
            SETUP+=(--vllm)
            export STRATA_REQUIRE_VLLM=1
            export STRATA_REQUIRE_RAY=1
            ;;
        --sglang)
            SETUP+=(--sglang)
            export STRATA_REQUIRE_SGLANG=1
            ;;
        *) ARGS+=("$arg") ;;
    esac
done
bash scripts/setup.sh "${SETUP[@]}"
# The sandbox for model-written code runs it as an unprivileged user (nobody), which must
# reach .venv/bin/python and strata_plugin/ in this checkout; a clone made in a private
# directory (mktemp -d: mode 0700) keeps it out, and the sandbox tests would then fail.
# As root, let others traverse (not list) the checkout's root.
if [ "$(id -u)" = 0 ] && [ -z "$(find . -maxdepth 0 -perm -o+x)" ]; then
    echo "[strata test] chmod o+x $(pwd): the sandbox's unprivileged user must reach the venv"
    chmod o+x .
fi
# The suite starts hundreds of Python processes that import strata_plugin (the agent, the
# CLI, the sandbox); without bytecode caches each compiles the package again, and each
# pytest worker rewrites every test module's asserts anew (collecting the fast lane took
# 12.3 s of CPU without caches, 3.1 s with them). The caches go to __pycache__/, which git
# ignores.
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m ruff check .
.venv/bin/python -m mypy  # over strata_plugin/ ([tool.mypy] in pyproject.toml)
exec .venv/bin/python -m pytest tests/ -q "${ARGS[@]}"

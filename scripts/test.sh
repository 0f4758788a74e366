#!/usr/bin/env bash
# Lint, type-check and run the whole test suite (unit + real vLLM CPU server tests).
# Usage: bash scripts/test.sh [pytest args]     (after bash scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
ruff check tuner tests scripts
mypy
python -m pytest -q "$@"

#!/usr/bin/env bash
# Lint, type-check and run the whole test suite (unit + real vLLM CPU server tests).
# Usage: bash scripts/test.sh [pytest args]     (after bash scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
ruff check tuner tests scripts benchmarks
mypy
# PostgreSQL (Debian package) and a Ray head, both on 127.0.0.1, for the scale-out tests.
eval "$(bash scripts/ci_services.sh start)"
trap 'bash scripts/ci_services.sh stop >/dev/null 2>&1 || true' EXIT
python -m pytest -q --durations=15 "$@"

#!/usr/bin/env bash
# Lint, type-check and run the whole test suite (unit + real vLLM CPU server tests).
# Usage: bash scripts/test.sh [pytest args]     (after bash scripts/setup.sh)
# Under CI (DSV4_CI=1, set by .ci/run) a service that does not start, or any required part that is
# missing (vLLM, torch, Ray, PostgreSQL: tests/ci_parts.py), stops the run here, before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
ruff check tuner tests scripts benchmarks
mypy
# PostgreSQL (Debian package) and a Ray head, both on 127.0.0.1, for the scale-out tests.
# (Not `eval "$(...)"` alone: eval of an empty string succeeds, so a failed start would go unnoticed.)
if services=$(bash scripts/ci_services.sh start); then
  eval "$services"
elif [ "${DSV4_CI:-}" = 1 ]; then
  echo "test.sh: scripts/ci_services.sh could not start PostgreSQL and Ray (its messages are above); under" \
       "DSV4_CI=1 the scale-out tests may not be skipped, so the run stops here" >&2
  exit 1
else
  echo "test.sh: warning: PostgreSQL/Ray did not start (see above); their tests will be skipped" >&2
fi
trap 'bash scripts/ci_services.sh stop >/dev/null 2>&1 || true' EXIT
if [ "${DSV4_CI:-}" = 1 ]; then
  python tests/ci_parts.py   # names every missing part and exits 1
fi
python -m pytest -q --durations=15 "$@"

#!/usr/bin/env bash
# Lint, type-check and run the whole test suite (unit + real vLLM CPU server tests).
# Usage: bash scripts/test.sh [pytest args]     (after bash scripts/setup.sh; each lane must still select a test)
# Under CI (DSV4_CI=1, set by .ci/run) a service that does not start, or any required part that is
# missing (vLLM, torch, Ray, PostgreSQL: tests/ci_parts.py), stops the run here, before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
. scripts/lanes.sh
lanes=$(mktemp -d)
# Lint and type checks run beside the services' start and the tests (one core is mostly idle while a vLLM
# server imports); their verdict is read at the end, and a failure fails the run.
( ruff check tuner tests scripts benchmarks && mypy ) > "$lanes/lint.log" 2>&1 &
lint_pid=$!
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
trap 'bash scripts/ci_services.sh stop >/dev/null 2>&1 || true; kill "$lint_pid" 2>/dev/null || true' EXIT
if [ "${DSV4_CI:-}" = 1 ]; then
  python tests/ci_parts.py   # names every missing part and exits 1
fi
# Two lanes, side by side (docs/decisions.md, "Two test lanes"):
# - servers: the tests that start a real vLLM (CPU build) server (marker `server`), one at a time, in this
#   terminal; two such launches on 2 cores would measure each other;
# - the rest: unit tests, the emulated node and its nights, beside them (their log is shown when they end).
# A lane with no tests fails (scripts/lanes.sh). DSV4_JUNIT_DIR: write each lane's junit XML there
# (servers.xml, rest.xml), for docs/evidence/ci-timing/collect.py.
started=$(date +%s)
junit() { if [ -n "${DSV4_JUNIT_DIR:-}" ]; then mkdir -p "$DSV4_JUNIT_DIR"; echo "--junitxml=$DSV4_JUNIT_DIR/$1.xml"; fi; }
set +e
python -m pytest -q --durations=15 -m "not server" -p no:cacheprovider --basetemp="$lanes/rest-tmp" \
  $(junit rest) "$@" > "$lanes/rest.log" 2>&1 &
rest_pid=$!
echo "test.sh: lane 'rest' (not server) runs beside this one; its log follows when it ends"
python -m pytest -q --durations=15 -m server --basetemp="$lanes/servers-tmp" $(junit servers) "$@"
servers_rc=$?
wait "$rest_pid"
rest_rc=$?
wait "$lint_pid"
lint_rc=$?
set -e
echo "=== lane 'rest' (not server) ==="
cat "$lanes/rest.log"
echo "=== ruff and mypy ==="
cat "$lanes/lint.log"
echo "tests took $(( $(date +%s) - started )) s (lanes: servers exit $servers_rc, rest exit $rest_rc; ruff and mypy exit $lint_rc)"
verdict=0
lane_verdict servers "$servers_rc" || verdict=1
lane_verdict rest "$rest_rc" || verdict=1
[ "$lint_rc" = 0 ] || { echo "test.sh: ruff or mypy failed (exit $lint_rc; their log is above)" >&2; verdict=1; }
if [ "$verdict" = 0 ]; then
  rm -rf "$lanes"
else
  echo "test.sh: the failed tests' files are kept under $lanes" >&2
  exit 1
fi

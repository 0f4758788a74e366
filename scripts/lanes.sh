# The verdict on one pytest lane of scripts/test.sh (sourced by it; tests/unit/test_ci_gate.py runs it too).
# lane_verdict NAME EXIT_CODE: 0 passes; anything else fails, and says why. Exit code 5 is pytest's "no
# tests collected": a lane with no tests fails, so a marker typo or a collection filter that empties a
# lane cannot pass CI by running nothing. (To run a few tests, call pytest directly.)
lane_verdict() {
  local name=$1 rc=$2
  case "$rc" in
    0) return 0 ;;
    5) echo "test.sh: lane '$name' collected no tests (pytest exit 5); a lane with no tests fails" >&2 ;;
    *) echo "test.sh: lane '$name' failed (pytest exit $rc)" >&2 ;;
  esac
  return 1
}

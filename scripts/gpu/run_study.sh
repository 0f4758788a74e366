#!/usr/bin/env bash
# The 1x H200 study, in two device calls of at most LIMIT seconds each (README.md: the budget).
#   call 3: bash scripts/gpu/stage.sh --need .gpu/3/moe.tar.xz .gpu/3/fa.tar.xz && bash scripts/gpu/run_study.sh start 545
#   call 4: bash scripts/gpu/run_study.sh finish 565
# start:  `dsv4-tune run` as a user runs it (--prevalidate auto, the objective's gate, --gpu-hour-usd), with
#         --budget set to end inside this call and the confirmation off for now (--confirm-top-k 0): the
#         tool's budget check stops screening between two trials, and no time is held back for a
#         confirmation that must wait for screening to finish anyway.
# finish: `dsv4-tune resume` to finish screening (the trial a cut-off call left is re-queued), then
#         `dsv4-tune resume --confirm-top-k 1 --confirm-repeats 2`: confirmation of the top trial (and its
#         control if it speculates), the report and the export; then `dsv4-tune verify` serves
#         best/serve.sh again and measures it; then everything is packed.
# The study writes its results as it goes; both calls pack them into $OUT even when cut off (<= 8 files).
# One call for both (a short device budget): NOPACK=1 bash scripts/gpu/run_study.sh start L1; bash scripts/gpu/run_study.sh finish L2
# HW, OBJ, MODEL, TRIALS, PRICE, READY, CONFIRM_S, VERIFY_S override the defaults (rehearse.sh: on CPU).
set -uo pipefail
source scripts/gpu/env.sh
mode=${1:?start or finish}; limit=${2:-565}
t0=$(date +%s); deadline=$(( t0 + limit ))
HW=${HW:-h200x1-tiny}; OBJ=${OBJ:-scripts/gpu/throughput-h200x1.yaml}; MODEL=${MODEL:-$STAGE/tiny-moe}
PRICE=${PRICE:-3.5}; READY=${READY:-180}
TRIALS=${TRIALS:-10}        # a cap: the budget decides how many launch (8 is the aim: README.md)
CONFIRM_S=${CONFIRM_S:-150} # the confirmation: one launch + 2 repeats of its window (a control: as much again)
VERIFY_S=${VERIFY_S:-110}   # the re-serve: one launch + 2 repeats of the confirmation's window
PACK_S=${PACK_S:-35}        # stop + report + pack at the end of a call
study=$RUNS/$STUDY
exec > >(tee -a "$OUT/$mode.log") 2>&1
left() { echo $(( deadline - $(date +%s) )); }
tune() { "$PY" -m tuner.cli "$@"; }
mark "$mode start (limit $limit s)"
dmon=
if command -v nvidia-smi >/dev/null; then
  nvidia-smi dmon -s pucm -d 5 -o T >> "$STAGE/dmon.txt" 2>&1 & dmon=$!
fi

pack() {
  mark "$mode pack"
  [ -n "$dmon" ] && kill $dmon 2>/dev/null
  if [ -d "$study" ]; then
    timeout 60 "$PY" -m tuner.cli report "$STUDY" --runs-dir "$RUNS" 2>&1 | tail -2
    timeout 30 "$PY" -m tuner.cli status "$STUDY" --runs-dir "$RUNS" > "$OUT/status.txt" 2>&1
    timeout 60 "$PY" scripts/gpu/pack.py "$study" "$OUT/study.tar.gz" --max-mib 15
  fi
  cp "$STAGE/dmon.txt" "$OUT/dmon.txt" 2>/dev/null
  mark "$mode end"
  cp "$STAGE/timeline.txt" "$OUT/timeline.txt"
  ls -la "$OUT"
}

launched() {  # screening launches so far (what --trials counts)
  "$PY" -c "import sys; from tuner.study import Study, launched_numbers
print(len(launched_numbers(Study.open(sys.argv[1], __import__('pathlib').Path(sys.argv[2])).optuna_study())))" \
    "$STUDY" "$RUNS" 2>/dev/null || echo 0
}

if [ "$mode" = start ]; then
  budget=$(( $(left) - PACK_S - 40 ))   # the tool's clock starts after its own start-up (~20 s)
  mark "study run (budget $budget s)"
  timeout -s INT -k 20 $(( budget + 30 )) "$PY" -m tuner.cli run --hw "$HW" --objective "$OBJ" --model "$MODEL" \
    --study "$STUDY" --runs-dir "$RUNS" --engine-cmd "$VLLM_CMD" --prevalidate auto --trials "$TRIALS" \
    --budget "${budget}s" --confirm-top-k 0 --confirm-repeats 2 --gpu-hour-usd "$PRICE" --ready-timeout "$READY" \
    --seed 0 --no-export
  rc=$?
  mark "study run exit $rc; launched $(launched)"
  echo "study run exit $rc after $(( $(date +%s) - t0 )) s"
  [ "${NOPACK:-0}" = 1 ] || pack   # NOPACK=1: `finish` follows in the same call and packs
  exit 0
fi

[ "$mode" = finish ] || { echo "usage: run_study.sh start|finish LIMIT_S"; exit 2; }
test -d "$STAGE/site/vllm" || { echo "machine went cold: $STAGE/site/vllm is gone"; exit 3; }
if [ ! -f "$study/study.json" ]; then   # a cold machine restaged: the study comes back from call 3's pack
  test -f .gpu/resume/study.tar.gz || { echo "no study at $study and no .gpu/resume/study.tar.gz"; exit 5; }
  mkdir -p "$RUNS" && tar -C "$RUNS" -xzf .gpu/resume/study.tar.gz && echo "study restored from call 3's pack"
fi
budget=$(( $(left) - CONFIRM_S - VERIFY_S - PACK_S - 15 ))
if [ "$budget" -ge 60 ]; then   # less than a launch's worth: straight to the confirmation
  mark "screening resume (budget $budget s)"
  timeout -s INT -k 30 $(( budget + 30 )) "$PY" -m tuner.cli resume "$STUDY" --runs-dir "$RUNS" --trials "$TRIALS" \
    --budget "${budget}s" --no-export
  rc=$?
  mark "screening resume exit $rc; launched $(launched)"
else
  mark "screening resume skipped (budget $budget s)"
fi
n=$(launched)
# Screening is over (--trials = what launched): straight to the confirmation. Its own planner keeps a
# whole ladder per repeat in hand, several times what one confirmation window takes, so the time box
# here is the call's, not --budget's.
timeout -s INT -k 30 $(( $(left) - VERIFY_S - PACK_S )) "$PY" -m tuner.cli resume "$STUDY" --runs-dir "$RUNS" \
  --trials "$n" --budget 3600s --confirm-top-k 1 --confirm-repeats 2
rc=$?
mark "confirmation resume exit $rc"
if [ ! -f "$study/best/serve.sh" ]; then   # no confirmed winner: export the best screening trial, labelled so
  if tune export --help 2>&1 | grep -q -- --accept-unconfirmed; then
    tune export "$STUDY" --runs-dir "$RUNS" --accept-unconfirmed
  else
    tune export "$STUDY" --runs-dir "$RUNS"
  fi
  mark "export (unconfirmed) exit $?"
fi
if [ -f "$study/best/serve.sh" ]; then
  mark "verify"
  timeout -s INT -k 20 $(( $(left) - PACK_S )) "$PY" -m tuner.cli verify "$STUDY" --runs-dir "$RUNS" --repeats 2
  mark "verify exit $?"
  cp "$study/verify/verify.json" "$OUT/verify.json" 2>/dev/null
fi
pack

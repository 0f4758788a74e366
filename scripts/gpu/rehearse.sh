#!/usr/bin/env bash
# Rehearse the device calls on this CPU machine: the same scripts, the same tool commands, on the CPU
# build of vLLM with the demo model, so that everything but the GPU itself is exercised before the
# device time is spent. Run under the vLLM lock (one real server at a time here):
#   flock /tmp/dsv4-vllm.lock bash scripts/gpu/rehearse.sh [DIR=/tmp/dsv4-rehearse]
# DIR gets out2/ (no capacity: no CUDA vLLM here), out3/ and out4/ as $OUT of calls 3 and 4, and
# evidence/ from scripts/gpu/collect.py, like docs/evidence/h200x1/ after the real run.
set -uo pipefail
dir=$(realpath -m "${1:-/tmp/dsv4-rehearse}")
rm -rf "$dir"; mkdir -p "$dir/stage/site/vllm" "$dir/out2" "$dir/out3" "$dir/out4"   # site/vllm: "staged"
export STAGE=$dir/stage PY=$PWD/.venv/bin/python VLLM_CMD="$PWD/.venv/bin/vllm" STUDY=rehearse
export HW=cpu OBJ=throughput MODEL=demo TRIALS=3 PRICE=3.5 READY=240 CONFIRM_S=100 VERIFY_S=100 PACK_S=30
source scripts/gpu/env.sh
echo "$(date +%s) call 3" >> "$STAGE/timeline.txt"
OUT=$dir/out3 bash scripts/gpu/run_study.sh start 300
echo "$(date +%s) call 4" >> "$STAGE/timeline.txt"
OUT=$dir/out4 bash scripts/gpu/run_study.sh finish 480
"$PY" scripts/gpu/probe_prevalidate.py "$RUNS/_models/demo" > "$dir/out2/prevalidate.txt" 2>&1
"$PY" scripts/gpu/collect.py --prepare "$dir/out2" --start "$dir/out3" --finish "$dir/out4" --out "$dir/evidence"
ls -la "$dir/out3" "$dir/out4" "$dir/evidence"

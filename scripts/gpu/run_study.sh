#!/usr/bin/env bash
# Third device call (after stage.sh --need .gpu/3/...): the dsv4-tune study on 2x H200, bounded to
# fit one command, then report + export, packed into $OUT. The validator probe runs beside it (CPU
# only) for evidence; the study uses --prevalidate off unless an earlier probe wrote "auto".
#   bash scripts/gpu/run_study.sh [STUDY_SECONDS]   (default 500: SIGINT then, resume-able)
#   EAGER=1 ... pins enforce-eager (no torch.compile / CUDA graphs), as the 2026-11-30 study
#   h200x2-tiny-eager did after the compile path hung (docs/evidence/h200.md); TRIALS, CONFIRM_K override.
set -uo pipefail
source scripts/gpu/env.sh
limit=${1:-500}
name=h200x2-tiny-gpu
hw=search_spaces/h200x2-tiny.yaml
if [ "${EAGER:-0}" = 1 ]; then
  name=h200x2-tiny-eager; hw=/tmp/h200x2-tiny-eager.yaml
  sed -e 's/enforce-eager: false,/enforce-eager: true,/' -e 's/ compilation-config.max_cudagraph_capture_size: 512,//' \
      -e 's/enforce-eager: {choices: \[false, true\]}/enforce-eager: {choices: [true]}/' search_spaces/h200x2-tiny.yaml > $hw
fi
runs=$STAGE/runs
mode=$(cat "$STAGE/prevalidate.mode" 2>/dev/null || echo off)
test -f "$STAGE/tiny-moe/config.json" || python3 scripts/gpu/make_tiny_moe.py "$STAGE/tiny-moe" > "$OUT/model.json"
nvidia-smi dmon -s um -d 5 > "$OUT/dmon.txt" 2>&1 &
dmon=$!
timeout 150 python3 scripts/gpu/probe_prevalidate.py "$STAGE/tiny-moe" > "$OUT/prevalidate.txt" 2>&1 &
t0=$(date +%s)
set -o pipefail
timeout -s INT -k 30 "$limit" python3 -m tuner.cli run --hw "$hw" \
  --objective scripts/gpu/throughput-h200.yaml --model "$STAGE/tiny-moe" --study $name --runs-dir "$runs" \
  --vllm-cmd "$VLLM_CMD" --prevalidate "$mode" --budget "$(( limit - 25 ))s" --trials "${TRIALS:-8}" \
  --confirm-top-k "${CONFIRM_K:-1}" --confirm-repeats 2 --ready-timeout 180 --seed 0 2>&1 | tee "$OUT/study.log"
rc=$?
echo "study exit $rc after $(( $(date +%s) - t0 )) s (prevalidate $mode)" | tee -a "$OUT/study.log"
kill $dmon 2>/dev/null
if [ $rc -ne 0 ] && [ -d "$runs/$name" ]; then   # stopped or no winner: still write what there is
  timeout 60 python3 -m tuner.cli report $name --runs-dir "$runs" 2>&1 | tail -3 | tee -a "$OUT/study.log"
  timeout 60 python3 -m tuner.cli export $name --runs-dir "$runs" 2>&1 | tail -3 | tee -a "$OUT/study.log"
fi
timeout 30 python3 -m tuner.cli status $name --runs-dir "$runs" > "$OUT/status.txt" 2>&1
cp "$runs/$name/trials.csv" "$runs/$name/report.md" "$OUT/" 2>/dev/null
tar -C "$runs" -czf "$OUT/study.tar.gz" $name
ls -la "$OUT"

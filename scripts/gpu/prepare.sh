#!/usr/bin/env bash
# Second device call (after stage.sh --need .gpu/2/...): machine facts, the tiny MoE (and the demo
# Llama) generated on the GPU, and one import of vLLM so the first trial starts from warm caches.
set -uo pipefail
source scripts/gpu/env.sh
t0=$(date +%s)
{ date -u; nproc; nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv;
  nvidia-smi topo -m; python3 -c 'import torch,sys;print(sys.version);print(torch.__version__, torch.cuda.device_count())'
} > "$OUT/machine.txt" 2>&1 &
( python3 -c 'import vllm.entrypoints.cli.main, vllm.entrypoints.openai.api_server, optuna, tuner.cli;
import vllm, optuna; print("vllm", vllm.__version__, "optuna", optuna.__version__)' > "$OUT/imports.txt" 2>&1 ) &
python3 scripts/gpu/make_tiny_moe.py "$STAGE/tiny-moe" --keep-demo "$STAGE/demo" > "$OUT/model.json" 2> "$OUT/model.err"
rc=$?
wait
cat "$OUT/machine.txt" "$OUT/imports.txt" "$OUT/model.json"; tail -3 "$OUT/model.err"
echo "prepare rc=$rc in $(( $(date +%s) - t0 )) s"
exit $rc

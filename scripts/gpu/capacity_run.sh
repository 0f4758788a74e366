#!/usr/bin/env bash
# Load-generator capacity against a real CUDA vLLM (the demo Llama on GPU 0: the fastest server there
# is, so the client is the limit), plus machine facts and the validator probe. Needs all of vLLM staged
# (stage.sh with every archive). Not run in the 2026-11-30 session: no device time was left for it.
#   CAPACITY=1 bash scripts/gpu/capacity_run.sh
# (scripts/bench_client_capacity.py has the stand-in comparison; it did not fit the device time.)
set -uo pipefail
source scripts/gpu/env.sh
log=$OUT/capacity_run.log; exec > >(tee -a "$log") 2>&1
{ date -u; nproc; nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv;
  nvidia-smi topo -m; python3 -c 'import torch,sys;print(sys.version);print(torch.__version__, torch.cuda.device_count())';
  python3 -c 'import vllm,optuna;print("vllm",vllm.__version__,"optuna",optuna.__version__)'; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
t0=$(date +%s)
test -f "$STAGE/demo/config.json" || python3 scripts/gpu/make_tiny_moe.py "$STAGE/tiny-moe" --keep-demo "$STAGE/demo" > "$OUT/model.json" || exit 4
echo "models built in $(( $(date +%s) - t0 )) s"
# the tool's validator (--prevalidate) against this vLLM: stock, then with the 0.26 module path aliased
timeout 120 python3 scripts/gpu/probe_prevalidate.py "$STAGE/tiny-moe" > "$OUT/prevalidate.txt" 2>&1 &
probe=$!
CAPACITY=${CAPACITY:-1}
# capacity: one vLLM on GPU 0, eager (no compile wait), four API-server processes (one if that fails)
port=8123; ok=0; srv=
for api in 4 1; do
  [ "$CAPACITY" = 1 ] || break
  CUDA_VISIBLE_DEVICES=0 setsid $VLLM_CMD serve "$STAGE/demo" --served-model-name demo --port $port \
    --host 127.0.0.1 --enforce-eager --max-num-seqs 2048 --max-num-batched-tokens 32768 --max-model-len 1024 \
    --api-server-count $api --disable-log-stats > "$OUT/capacity-server.log" 2>&1 &
  srv=$!; t1=$(date +%s)
  for _ in $(seq 1 150); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && { ok=1; break; }
    kill -0 $srv 2>/dev/null || break; sleep 1
  done
  echo "capacity server (api-server-count $api) ready=$ok after $(( $(date +%s) - t1 )) s"
  [ $ok = 1 ] && break
  kill -KILL -- -$srv 2>/dev/null; tail -5 "$OUT/capacity-server.log"
done
if [ $ok = 1 ]; then
  vocab=$(python3 -c "import json;print(json.load(open('$STAGE/tiny-moe/tiny-moe.json'))['vocab_size'])")
  timeout 120 python3 scripts/gpu/capacity.py --url "http://127.0.0.1:$port" --model demo --vocab-size "$vocab" \
    --runs 1x256 1x1024 4x1024 --label vllm-0.26-demo-llama-gpu0 --json "$OUT/capacity.json"
fi
[ -n "$srv" ] && { kill -INT -- -$srv 2>/dev/null; sleep 3; kill -KILL -- -$srv 2>/dev/null; }
wait $probe; cat "$OUT/prevalidate.txt"
echo "capacity_run done in $(( $(date +%s) - t0 )) s"

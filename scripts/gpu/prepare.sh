#!/usr/bin/env bash
# Call 2, after `stage.sh --need .gpu/2/cext.tar.xz`: machine facts, the models, the validator probe and
# the load generator's capacity against a real CUDA vLLM. Only vLLM's Python part and main kernel
# library are staged yet (no MoE kernels, no FlashAttention 3), so the capacity server is the demo
# Llama (dense) on Triton attention, eager, with 4 API-server processes: the fastest server there
# is, so the client is the limit. It measures one load-generator process and the pool of 4 that the
# study uses (scripts/gpu/throughput-h200x1.yaml: client_processes 4).
#   bash scripts/gpu/prepare.sh            (≈ 3 min; writes at most 8 files to $OUT)
# vLLM's model inspection imports vllm.vllm_flash_attn, which comes with call 3 (the uploads are full):
# before it is staged, the probe and the capacity server are skipped, and say so. After call 4, with
# everything staged, `MODELS=0 bash scripts/gpu/prepare.sh` runs only the probe and the capacity run.
set -uo pipefail
source scripts/gpu/env.sh
exec > >(tee -a "$OUT/prepare.log") 2>&1
mark "prepare start"
t0=$(date +%s)
if [ "${MODELS:-1}" = 1 ]; then
{ date -u; echo "cores: $(nproc)"; free -g | head -2
  nvidia-smi --query-gpu=index,name,memory.total,power.limit,clocks.max.sm,driver_version --format=csv
  nvidia-smi topo -m
  "$PY" -c 'import torch,sys;print(sys.version);print("torch", torch.__version__, "gpus", torch.cuda.device_count())'
  "$PY" -c 'import pynvml;pynvml.nvmlInit();h=pynvml.nvmlDeviceGetHandleByIndex(0);
print("nvml power W", pynvml.nvmlDeviceGetPowerUsage(h)/1000, "energy counter J",
      pynvml.nvmlDeviceGetTotalEnergyConsumption(h)/1000)'
  "$PY" -c 'import vllm, optuna; print("vllm", vllm.__version__, "optuna", optuna.__version__)'
  tail -2 "$STAGE/compileall.log" 2>/dev/null; pgrep -f compileall >/dev/null && echo "compileall still running"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
"$PY" scripts/gpu/make_tiny_moe.py "$STAGE/tiny-moe" --preset h200x1 --keep-demo "$STAGE/demo" \
  > "$OUT/model.json" 2> "$STAGE/model.err" || { tail -20 "$STAGE/model.err"; exit 4; }
mark "models built"
echo "models built in $(( $(date +%s) - t0 )) s: $(cat "$OUT/model.json")"
fi
probe=; apis="4 1"
if [ ! -d "$STAGE/site/vllm/vllm_flash_attn" ]; then   # vLLM's model inspection imports it
  echo "probe and capacity: skipped (vllm.vllm_flash_attn is staged in call 3; run MODELS=0 prepare.sh after it)"
  PROBE_S=0; apis=
fi
# the tool's validator against this vLLM (CPU work in this process; vLLM's config step in a child)
if [ "${PROBE_S:-150}" != 0 ]; then
  timeout "${PROBE_S:-150}" "$PY" scripts/gpu/probe_prevalidate.py "$STAGE/tiny-moe" > "$OUT/prevalidate.txt" 2>&1 &
  probe=$!
fi
port=8123; ok=0; srv=
# CAPACITY=0 skips the capacity server (a short device budget: the study's own windows still record the
# client's CPU and loop lag, and flag a saturated client)
[ "${CAPACITY:-1}" = 0 ] && apis= && echo "capacity: skipped (CAPACITY=0)"
for api in $apis; do
  CUDA_VISIBLE_DEVICES=0 setsid $VLLM_CMD serve "$STAGE/demo" --served-model-name demo --port $port \
    --host 127.0.0.1 --enforce-eager --attention-backend TRITON_ATTN --max-num-seqs 2048 \
    --max-num-batched-tokens 32768 --max-model-len 1024 --gpu-memory-utilization 0.3 \
    --api-server-count $api --disable-log-stats > "$STAGE/capacity-server.log" 2>&1 &
  srv=$!; t1=$(date +%s)
  for _ in $(seq 1 160); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null \
      && { ok=1; break; }
    kill -0 $srv 2>/dev/null || break; sleep 1
  done
  echo "capacity server (api-server-count $api) ready=$ok after $(( $(date +%s) - t1 )) s"
  mark "capacity server api=$api ready=$ok"
  [ $ok = 1 ] && break
  kill -KILL -- -$srv 2>/dev/null; tail -5 "$STAGE/capacity-server.log"
done
if [ $ok = 1 ]; then
  vocab=$("$PY" -c "import json;print(json.load(open('$STAGE/tiny-moe/tiny-moe.json'))['vocab_size'])")
  timeout 150 "$PY" scripts/gpu/capacity.py --url "http://127.0.0.1:$port" --model demo --vocab-size "$vocab" \
    --runs 1x256 1x1024 4x1024 --label "vllm-0.26-demo-llama-api$api" --json "$OUT/capacity.json"
fi
mark "capacity done"
if [ -n "$srv" ]; then   # SIGINT, then SIGKILL once it has had 15 s to go
  kill -INT -- -$srv 2>/dev/null
  for _ in $(seq 1 30); do kill -0 -- -$srv 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- -$srv 2>/dev/null
fi
[ -f "$STAGE/capacity-server.log" ] && tail -120 "$STAGE/capacity-server.log" > "$OUT/capacity-server.log"
if [ -n "$probe" ]; then wait $probe; grep -v "^INFO\|^(\|^WARNING" "$OUT/prevalidate.txt"; fi
mark "prepare end"
cp "$STAGE/timeline.txt" "$OUT/timeline-prepare.txt"
echo "prepare done in $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
# dsv4-tune export: study cpu-budget-6m, trial 0
# output_throughput = 1092.25 on workload 'throughput', SLOs {'p95_ttft_ms': 20000.0, 'p95_itl_ms': 2000.0}
# UNCONFIRMED: its confirmation did not run (out of time, or not run yet)
# exported with --accept-unconfirmed: no candidate was confirmed
# Secrets (HF_TOKEN, VLLM_API_KEY, ...) are taken from your environment; none is written here.
# Extra vllm flags may follow: ./serve.sh --port 9000
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export HF_HUB_OFFLINE=1
export VLLM_CPU_KVCACHE_SPACE=1
export VLLM_CPU_OMP_THREADS_BIND=0
export VLLM_HTTP_TIMEOUT_KEEP_ALIVE=120
VLLM_CMD=${VLLM_CMD:-vllm}
read -r -a vllm_argv <<< "$VLLM_CMD"
exec "${vllm_argv[@]}" serve --config "$here/profile.yaml" "$@"

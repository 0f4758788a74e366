#!/usr/bin/env bash
# dsv4-tune export: study cpu-budget-6m, trial 0
# output_throughput = 2422.32 (UNCONFIRMED (single screening run)) on workload 'throughput', SLOs {'p95_ttft_ms': 20000.0, 'p95_itl_ms': 2000.0}
# Secrets (HF_TOKEN, VLLM_API_KEY, ...) are taken from your environment; none is written here.
# Extra vllm flags may follow: ./serve.sh --port 9000
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export HF_HUB_OFFLINE=1
export VLLM_CPU_KVCACHE_SPACE=1
export VLLM_HTTP_TIMEOUT_KEEP_ALIVE=120
VLLM_CMD=${VLLM_CMD:-vllm}
read -r -a vllm_argv <<< "$VLLM_CMD"
exec "${vllm_argv[@]}" serve --config "$here/profile.yaml" "$@"

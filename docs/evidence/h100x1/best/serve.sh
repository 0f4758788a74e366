#!/usr/bin/env bash
# dsv4-tune export: study h100x1-tiny, trial 2
# output_throughput = 11556.99 on workload 'throughput-h200x1', SLOs {'p95_ttft_ms': 15000.0, 'p95_itl_ms': 250.0}
# confirmed: median of 2 repeats (11662.7 / 11451.2 output_throughput) at concurrency 1024, robust score 11451.23
# Secrets (HF_TOKEN, VLLM_API_KEY, LLAMA_API_KEY, ...) are taken from your environment; none is written here.
# Extra server flags may follow: ./serve.sh --port 9000
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=0
export NVSHMEM_DISABLE_NVLS=1
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm
export VLLM_USE_FLASHINFER_SAMPLER=0
VLLM_CMD=${VLLM_CMD:-'python3 -m vllm.entrypoints.cli.main'}
read -r -a server_argv <<< "$VLLM_CMD"
exec "${server_argv[@]}" serve --config "$here/profile.yaml" "$@"

#!/usr/bin/env bash
# dsv4-tune export: study h200x1-tiny, trial 0
# output_throughput = 5715.41 on workload 'throughput-h200x1', SLOs {'p95_ttft_ms': 15000.0, 'p95_itl_ms': 250.0}
# UNCONFIRMED: its confirmation did not run (out of time, or not run yet)
# exported with --accept-unconfirmed: no candidate was confirmed
# Secrets (HF_TOKEN, VLLM_API_KEY, ...) are taken from your environment; none is written here.
# Extra vllm flags may follow: ./serve.sh --port 9000
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=0
export NVSHMEM_DISABLE_NVLS=1
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm
export VLLM_USE_FLASHINFER_SAMPLER=0
VLLM_CMD=${VLLM_CMD:-'python3 -m vllm.entrypoints.cli.main'}
read -r -a vllm_argv <<< "$VLLM_CMD"
exec "${vllm_argv[@]}" serve --config "$here/profile.yaml" "$@"

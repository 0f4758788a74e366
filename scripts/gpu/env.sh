# Sourced by every scripts/gpu/*.sh on the H200 machine, from the repository root.
# vLLM 0.26 and the tool's own missing deps are unpacked under /root/stage/site (see stage.sh);
# the tool itself travels with the working tree, so the repo root goes on PYTHONPATH too.
STAGE=${STAGE:-/root/stage}
export PYTHONPATH="$STAGE/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
# NVLink multicast stays off: on a shared host it can take every GPU out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OUT=${OUT:-/tmp/gpu-out}
VLLM_CMD="python3 -m vllm.entrypoints.cli.main"
mkdir -p "$OUT"

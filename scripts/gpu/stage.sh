#!/usr/bin/env bash
# Unpack one of build-bundle.sh's archives into /root/stage/site (lasts while the machine is warm).
#   bash scripts/gpu/stage.sh .gpu/1/rest.tar.xz     (first call)
#   bash scripts/gpu/stage.sh --need .gpu/2/cext.tar.xz   (later calls: exit 3 if the machine went cold)
set -euo pipefail
if [ "${1:-}" = "--need" ]; then
  shift
  test -d /root/stage/site/vllm || { echo "machine went cold: /root/stage/site/vllm is gone; start again"; exit 3; }
fi
for a in "$@"; do bash "$(dirname "$a")/unpack.sh" "$a"; done

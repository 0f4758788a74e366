"""STAND-IN for a server start during which the disk fills up (used only by the "disk full" fault).

A real vLLM fills a disk only by luck (compile caches, logs). This process fills the filesystem of
its working directory (the trial folder) with ``filler.bin`` until the kernel says ENOSPC, prints
what a server would, and exits 1, so the tuner then has to write the trial's results to a full
disk. Any argv is accepted.
"""

from __future__ import annotations

import contextlib
import sys


def main() -> int:
    print("stand-in: compiling kernels into ./cache (filling the disk)", flush=True)
    block = b"\0" * (64 * 1024)
    with contextlib.suppress(OSError), open("filler.bin", "wb", buffering=0) as fh:
        while True:
            fh.write(block)
    with contextlib.suppress(OSError):
        print("OSError: [Errno 28] No space left on device: 'cache/compile'", flush=True)
    print("stand-in: disk is full", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())

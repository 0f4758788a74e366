"""STAND-IN for a vLLM server that hangs during startup (used only by the "hang before ready" fault).

A real vLLM cannot be made to wedge before /health on demand. This process behaves like one that
did: it starts a child (as ``vllm serve`` starts its engine core), the child ignores SIGTERM (a
wedged engine core), neither ever listens on the port, and both sleep forever. It takes any argv
(``serve MODEL --port N ...``) and writes ``{"parent": pid, "child": pid}`` to ``standin_pids.json``
in its working directory so the test can check that the whole group died.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def main() -> None:
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(3600)
    Path("standin_pids.json").write_text(json.dumps({"parent": os.getpid(), "child": child}))
    print(f"stand-in: pretending to load a model (argv {sys.argv[1:]})", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()

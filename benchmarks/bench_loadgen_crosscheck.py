"""Our load generator against ``vllm bench serve`` on the real vLLM CPU server: the committed cross-check data.

One vLLM CPU server (the one the load tests share: ``tests/cpu_server.py``; the demo model, prefix
caching on, block size 32, the server on every core but the last) and both clients on the last core.
Two workloads (``decode``: 128 prompt / 128 output tokens; ``prefill``: 512 / 32) at two concurrencies
(4 and 16) make four cells; ``--rounds`` rounds of each, the cells interleaved, each round running both
clients once in alternating order on prompts neither has sent before (``tests/loadcheck.py`` says how).
Writes ``docs/evidence/loadgen/crosscheck.json`` (per run: the clients' summary figures, the server's
own means over the run, its prefix-cache counters); ``docs/evidence/loadgen/tables.py`` builds the
tables of ``docs/loadgen.md`` from it.

    flock /tmp/dsv4-vllm.lock .venv/bin/python benchmarks/bench_loadgen_crosscheck.py --rounds 7
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import cpu_server  # noqa: E402
from tests.ci_parts import vllm_cli  # noqa: E402
from tests.loadcheck import Bench, Cell, Crosscheck  # noqa: E402

OUT = REPO / "docs" / "evidence" / "loadgen" / "crosscheck.json"
CELLS = (Cell("decode", 128, 128, 4, 32), Cell("decode", 128, 128, 16, 128),
         Cell("prefill", 512, 32, 4, 32), Cell("prefill", 512, 32, 16, 128))


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def machine() -> dict[str, Any]:
    import vllm

    return {"cpus": len(os.sched_getaffinity(0)), "cpu_model": _cpu_model(), "python": platform.python_version(),
            "vllm": vllm.__version__, "load_average_1m_at_start": round(os.getloadavg()[0], 2)}


def _small(value: Any) -> Any:
    """Floats to 5 significant digits (the data stays small and reads well)."""
    if isinstance(value, float):
        return float(f"{value:.5g}")
    if isinstance(value, dict):
        return {k: _small(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_small(v) for v in value]
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--model", type=Path, default=None,
                        help="model folder (default: the demo model, built as the tests build it)")
    args = parser.parse_args()
    cli = vllm_cli()
    if cli is None:
        print("vLLM is not installed: bash scripts/setup.sh", file=sys.stderr)
        return 2
    data: dict[str, Any] = {"what": __doc__.splitlines()[0], "date": dt.date.today().isoformat(),
                            "machine": machine(), "server_args": cpu_server.ARGS, "server_env": cpu_server.ENV,
                            "cells": [c.to_json() for c in CELLS], "rounds": []}
    with tempfile.TemporaryDirectory(prefix="crosscheck-") as tmp:
        root = Path(tmp)
        model = args.model
        if model is None:
            from tuner.demo_model import build_demo_model

            model = build_demo_model(root / "demo")
        started = time.monotonic()
        server = cpu_server.start(cli, model.resolve(), root / "server")
        data["server_ready_s"] = round(time.monotonic() - started, 1)
        data["split"] = server.split.to_json() if server.split else None
        data["model"] = {k: v for k, v in json.loads((model / "config.json").read_text()).items()
                         if k in ("architectures", "vocab_size", "hidden_size", "num_hidden_layers")}
        try:
            check = Crosscheck(server.base_url, cpu_server.SERVED, server.vocab_size, Bench(model), server.seed,
                               server.split.client if server.split else None)
            for cell in CELLS:
                check.warm_up(cell)
            for index, cell in itertools.product(range(args.rounds), CELLS):
                t0 = time.monotonic()
                result = _small(check.round(cell, index))
                result["cell"] = f"{cell.name} c{cell.concurrency}"
                data["rounds"].append(result)
                print(f"{cell.name} c{cell.concurrency} round {index}: ours "
                      f"{result['ours']['output_throughput']:.0f} tok/s, bench "
                      f"{result['bench']['output_throughput']:.0f} tok/s ({time.monotonic() - t0:.0f} s)",
                      file=sys.stderr)
                data["machine"]["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
                data["wall_s"] = round(time.monotonic() - started, 1)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(data, indent=1) + "\n")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

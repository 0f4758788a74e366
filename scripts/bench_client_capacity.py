#!/usr/bin/env python3
"""How many streamed events per second can the load generator take? (client capacity benchmark)

Starts the STAND-IN server (``tests/standins/stream_server.py``: no model, it only streams one SSE
event per token as fast as it can) and drives it with:

- ``ours-aiohttp`` / ``ours-httpx``: :func:`tuner.load.generator.run_window` in this process, each transport;
- ``ours-pool<N>``: :class:`tuner.load.pool.ClientPool` with N processes;
- ``vllm-bench``: ``vllm bench serve --backend vllm`` (its aiohttp client) on the same workload.

Each run sends ``4 × concurrency`` requests of ``--output-len`` tokens; events/s = streamed token
chunks / wall time of the measured window. On a machine where the stand-in shares the cores with
the client, the figures are a floor on the client's capacity, not a ceiling.

Usage: python scripts/bench_client_capacity.py [--concurrency 64 256 1024] [--modes ...] [--repeats N] [--json out.json]

The committed figures of the 2-core machine (``docs/evidence/loadgen/``; table in docs/loadgen.md):
python scripts/bench_client_capacity.py --concurrency 64 256 --repeats 3 \
    --json docs/evidence/loadgen/capacity.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tuner.load.generator import WindowPlan, run_window  # noqa: E402
from tuner.load.metrics import summarize  # noqa: E402
from tuner.load.pool import ClientPool  # noqa: E402
from tuner.load.workload import Workload  # noqa: E402

INPUT_LEN = 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"stand-in did not listen on {port} within {timeout_s} s")


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


def _ours(base_url: str, concurrency: int, output_len: int, backend: str, processes: int) -> dict[str, Any]:
    requests = 4 * concurrency
    workload = Workload(input_len=INPUT_LEN, output_len=output_len, num_prompts=requests, concurrency=concurrency,
                        warmup_prompts=0)
    plan = WindowPlan(0, requests, concurrency, None)
    if processes > 1:
        with ClientPool(processes, base_url=base_url, model="standin", workload=workload, vocab_size=4096,
                        request_timeout_s=120) as pool:
            pool.run_window(WindowPlan(10**6, concurrency, concurrency, None))  # connections, imports
            result = pool.run_window(plan)
    else:
        result = asyncio.run(run_window(base_url, "standin", workload, plan, vocab_size=4096,
                                        request_timeout_s=120, backend=backend))  # type: ignore[arg-type]
    summary = summarize(result)
    client = result.client.to_json() if result.client else {}
    return {"events_per_s": summary["output_throughput"], "completed": summary["completed"],
            "failed": summary["failed"], "median_itl_ms": summary["median_itl_ms"],
            "client_cpu_share": client.get("client_cpu_share"), "client_saturated": client.get("client_saturated"),
            "client_loop_lag_p99_ms": client.get("client_loop_lag_p99_ms")}


def _vllm_bench(base_url: str, concurrency: int, output_len: int, tokenizer: str, vllm: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out:
        argv = [vllm, "bench", "serve", "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
                "--model", "standin", "--tokenizer", tokenizer, "--dataset-name", "random",
                "--random-input-len", str(INPUT_LEN), "--random-output-len", str(output_len),
                "--random-range-ratio", "0", "--num-prompts", str(4 * concurrency),
                "--max-concurrency", str(concurrency), "--ignore-eos", "--disable-tqdm", "--num-warmups", "0",
                "--save-result", "--result-dir", out, "--result-filename", "r.json"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if proc.returncode != 0:
            return {"error": (proc.stdout + proc.stderr)[-500:]}
        data = json.loads((Path(out) / "r.json").read_text())
    return {"events_per_s": data["output_throughput"], "completed": data["completed"], "failed": data["failed"],
            "median_itl_ms": data.get("median_itl_ms")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--modes", nargs="+", default=["ours-aiohttp", "ours-httpx", "ours-pool2", "vllm-bench"])
    parser.add_argument("--standin-workers", type=int, default=1, help="stand-in processes (SO_REUSEPORT)")
    parser.add_argument("--tokenizer", help="for vllm-bench; default: the generated demo model")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every (concurrency, client) pair")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()

    vllm = shutil.which("vllm") or str(Path(sys.executable).parent / "vllm")
    tokenizer = args.tokenizer
    if "vllm-bench" in args.modes and tokenizer is None:
        from tuner.demo_model import build_demo_model

        tokenizer = str(build_demo_model(Path(tempfile.gettempdir()) / "dsv4-tune-capacity-model"))

    port = _free_port()
    standin = subprocess.Popen([sys.executable, str(REPO / "tests/standins/stream_server.py"), "--port", str(port),
                                "--workers", str(args.standin_workers)], start_new_session=True)
    rows: list[dict[str, Any]] = []
    try:
        _wait_port(port)
        base_url = f"http://127.0.0.1:{port}"
        print(f"# stand-in on {base_url} ({args.standin_workers} process(es)); {os.cpu_count()} CPUs; "
              f"output_len {args.output_len}; 4 x concurrency requests per run")
        print("| client | concurrency | events/s | completed | failed | client CPU | saturated |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for repeat, concurrency, mode in itertools.product(range(args.repeats), args.concurrency, args.modes):
            if mode == "vllm-bench":
                row = _vllm_bench(base_url, concurrency, args.output_len, str(tokenizer), vllm)
            elif mode.startswith("ours-pool"):
                row = _ours(base_url, concurrency, args.output_len, "aiohttp", int(mode[len("ours-pool"):]))
            else:
                row = _ours(base_url, concurrency, args.output_len, mode[len("ours-"):], 1)
            row.update({"client": mode, "concurrency": concurrency, "repeat": repeat,
                        "load_average_1m": round(os.getloadavg()[0], 2)})
            rows.append(row)
            cpu = row.get("client_cpu_share")
            print(f"| {mode} | {concurrency} | {row.get('events_per_s', float('nan')):,.0f} | "
                  f"{row.get('completed', '-')} | {row.get('failed', '-')} | "
                  f"{'-' if cpu is None else f'{cpu:.0%}'} | {row.get('client_saturated', '-')} |", flush=True)
    finally:
        os.killpg(standin.pid, signal.SIGTERM)  # the stand-in's forked workers too
        standin.wait(timeout=10)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"date": datetime.date.today().isoformat(), "cpus": os.cpu_count(),
                                         "cpu_model": _cpu_model() or platform.processor(),
                                         "output_len": args.output_len, "input_len": INPUT_LEN,
                                         "requests_per_run": "4 x concurrency", "standin_workers": args.standin_workers,
                                         "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()

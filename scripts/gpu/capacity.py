#!/usr/bin/env python3
"""Load-generator capacity against a REAL vLLM server (CUDA), in streamed chunks per second.

``scripts/bench_client_capacity.py`` measures the client against a stand-in that streams as fast
as it can. This script points the same client code (:func:`tuner.load.generator.run_window` in one
process, :class:`tuner.load.pool.ClientPool` with N processes) at a running vLLM, so the figure
includes a real server's pacing. One streamed chunk is one token here (no speculation), so
chunks/s = the summary's ``output_throughput``. The single-process ceiling seen earlier on the
H200 machine with a plain aiohttp client was ~14 k chunks/s.

    python3 scripts/gpu/capacity.py --url http://127.0.0.1:8000 --model NAME --vocab-size 4105 \\
        --runs 1x256 1x1024 2x1024 4x1024 --json out.json

Each run ``PxC`` uses P client processes at concurrency C and sends ``--requests-per-stream`` × C
requests of ``--input-len`` / ``--output-len`` tokens (ignore_eos), after a warm-up window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tuner.load.generator import WindowPlan, run_window  # noqa: E402
from tuner.load.metrics import summarize  # noqa: E402
from tuner.load.pool import ClientPool  # noqa: E402
from tuner.objective import Workload  # noqa: E402


def _row(result: Any, wall_s: float) -> dict[str, Any]:
    summary = summarize(result)
    client = result.client.to_json() if result.client else {}
    return {"chunks_per_s": summary["output_throughput"], "completed": summary["completed"],
            "failed": summary["failed"], "median_itl_ms": summary.get("median_itl_ms"),
            "p95_ttft_ms": summary.get("p95_ttft_ms"), "wall_s": round(wall_s, 2),
            "client_cpu_share": client.get("client_cpu_share"), "client_saturated": client.get("client_saturated"),
            "client_loop_lag_p99_ms": client.get("client_loop_lag_p99_ms")}


def run_one(url: str, model: str, vocab_size: int, processes: int, concurrency: int, args: argparse.Namespace,
            first_job: int) -> dict[str, Any]:
    requests = args.requests_per_stream * concurrency
    workload = Workload(input_len=args.input_len, output_len=args.output_len, num_prompts=requests,
                        concurrency=concurrency, warmup_prompts=0)
    warm = WindowPlan(first_job + 10**6, concurrency, concurrency, None)
    plan = WindowPlan(first_job, requests, concurrency, None)
    started = time.monotonic()
    if processes > 1:
        with ClientPool(processes, base_url=url, model=model, workload=workload, vocab_size=vocab_size,
                        request_timeout_s=args.timeout) as pool:
            pool.run_window(warm)
            started = time.monotonic()
            result = pool.run_window(plan)
    else:
        asyncio.run(run_window(url, model, workload, warm, vocab_size=vocab_size, request_timeout_s=args.timeout))
        started = time.monotonic()
        result = asyncio.run(run_window(url, model, workload, plan, vocab_size=vocab_size,
                                        request_timeout_s=args.timeout))
    return _row(result, time.monotonic() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True, help="served model name")
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--runs", nargs="+", default=["1x256", "1x1024", "2x1024", "4x1024"],
                        help="PROCESSESxCONCURRENCY")
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--requests-per-stream", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--label", default="vllm", help="what the server is, for the table")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    rows: list[dict[str, Any]] = []
    print(f"# {args.label} at {args.url}; {os.cpu_count()} CPUs; in {args.input_len} / out {args.output_len}; "
          f"{args.requests_per_stream} x concurrency requests per run", flush=True)
    print("| server | processes | concurrency | chunks/s | completed | failed | client CPU | saturated |")
    print("|---|---:|---:|---:|---:|---:|---:|---|", flush=True)
    first_job = 0
    for spec in args.runs:
        processes, concurrency = (int(x) for x in spec.lower().split("x"))
        try:
            row = run_one(args.url, args.model, args.vocab_size, processes, concurrency, args, first_job)
        except Exception as exc:  # one failed run should not lose the others
            row = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        first_job += 10 * concurrency * args.requests_per_stream
        row.update({"server": args.label, "processes": processes, "concurrency": concurrency})
        rows.append(row)
        cpu = row.get("client_cpu_share")
        print(f"| {args.label} | {processes} | {concurrency} | {row.get('chunks_per_s', float('nan')):,.0f} | "
              f"{row.get('completed', '-')} | {row.get('failed', '-')} | "
              f"{'-' if cpu is None else f'{cpu:.0%}'} | {row.get('client_saturated', row.get('error', '-'))} |",
              flush=True)
        if args.json:  # after every run, so a timeout keeps what was measured
            args.json.write_text(json.dumps({"cpus": os.cpu_count(), "label": args.label, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

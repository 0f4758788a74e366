"""Which KV connector the vLLM CPU build runs between two servers (issue 27): the committed measurement.

For each connector, one trial of a prefill/decode layout of two vLLM CPU servers (``tests/pd_cpu.py``: the
shipped demo model, one server per pool, vllm-router's P/D mode in front) runs the DSV4 tool-call and
reasoning gates through the router and the long-context objective's demo load. Recorded per connector:
whether the pair started and served, the gates' verdict, the goodput and latencies, both pools' figures
and what the decode pool's ``/metrics`` says about the transfer (NIXL's transfer histogram and failure
counter; any connector's ``vllm:external_prefix_cache_hits``), or the failure and the member's last log line.

NIXL is not a dependency of dsv4-tune (the ``nixl`` wheel pulls both CUDA variants, ~140 MB); install it
into a folder and point ``--nixl-path`` at it, which goes on the members' ``PYTHONPATH``::

    pip install --no-deps --target /tmp/nixl nixl==1.5.1 nixl-cu12==1.5.1
    flock /tmp/dsv4-vllm.lock .venv/bin/python benchmarks/bench_pd_cpu.py --nixl-path /tmp/nixl

Writes ``docs/evidence/pd/cpu-connectors.json``; ``docs/evidence/pd/tables.py`` renders it.
"""

from __future__ import annotations

import argparse
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

from tests.pd_cpu import run_layout  # noqa: E402

OUT = REPO / "docs" / "evidence" / "pd" / "cpu-connectors.json"
SUMMARY_KEYS = ("completed", "failed", "request_goodput", "p95_ttft_ms", "p95_itl_ms", "p95_queue_ms",
                "p95_prefill_queue_ms", "output_throughput")


def _round(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value


def measure(connector: str, root: Path, env: dict[str, str], *, prefix_caching: bool, trial: int) -> dict[str, Any]:
    started = time.monotonic()
    outcome, tdir = run_layout(root, "1p1d", connector=connector, env=env, prefix_caching=prefix_caching, trial=trial)
    guards = json.loads((tdir / "guards.json").read_text()) if (tdir / "guards.json").is_file() else {}
    metrics = json.loads((tdir / "server_metrics.json").read_text()) if (tdir / "server_metrics.json").is_file() \
        else {}
    pools = metrics.get("pools") or {}
    return {
        "connector": connector, "prefix_caching": prefix_caching, "served": outcome.ready_s is not None,
        "ok": outcome.ok,
        "failure_class": outcome.failure_class, "reason": outcome.reason[:400],
        "gates_passed": guards.get("passed"), "wall_s": round(time.monotonic() - started, 1),
        "summary": {k: _round(outcome.summary.get(k)) for k in SUMMARY_KEYS},
        "transfer": {k: _round(v) for k, v in (metrics.get("transfer") or {}).items()},
        "pools": {pool: {k: _round(v) for k, v in ((pools.get(pool) or {}).get("facts") or {}).items()}
                  for pool in ("prefill", "decode")},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nixl-path", type=Path, help="a folder holding the nixl and nixl-cu12 wheels' files")
    parser.add_argument("--connectors", default="ExampleConnector,NixlConnector,ExampleConnector+prefix-caching",
                        help="comma list; '+prefix-caching' turns prefix caching on for that row")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pd-cpu-") as tmp:
        for trial, row in enumerate(args.connectors.split(",")):
            connector, _, flag = row.partition("+")
            env = {"PYTHONPATH": str(args.nixl_path)} if connector.startswith("Nixl") and args.nixl_path else {}
            try:
                rows.append(measure(connector, Path(tmp), env, prefix_caching=flag == "prefix-caching", trial=trial))
            except Exception as exc:  # a connector that cannot even be set up is a row, with why
                rows.append({"connector": connector, "prefix_caching": flag == "prefix-caching", "served": False,
                             "ok": False, "failure_class": "setup",
                             "reason": f"{type(exc).__name__}: {exc}"[:400]})
            print(json.dumps(rows[-1])[:400], flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"vllm": _vllm_version(), "router": "vllm-router 0.1.17", "machine": _machine(),
                               "nixl": "nixl 1.5.1 + nixl-cu12 1.5.1 (UCX backend)" if args.nixl_path else None,
                               "connectors": rows}, indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


def _vllm_version() -> str:
    import importlib.metadata as md

    return md.version("vllm")


def _machine() -> str:
    cores = os.cpu_count() or 0
    return f"{cores} cores ({platform.processor() or platform.machine()})"


if __name__ == "__main__":
    sys.exit(main())

"""How long ``--prevalidate`` takes per launch on the CPU build: ``prevalidate.json`` beside this file.

    .venv/bin/python docs/evidence/prevalidate/measure.py

vLLM's own serve parser, then its engine-config step in a forked child (``tuner/engines/vllm/validate.py``,
``engine_check``), on the ``cpu`` profile's first baseline with the generated demo model: one call first
(it builds the parser and imports vLLM: once per tuner process), then ``--repeats`` timed calls, as a
study makes one per launch. Starts no server.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tuner.demo_model import build_demo_model  # noqa: E402
from tuner.engines.vllm.argv import options_to_argv  # noqa: E402
from tuner.engines.vllm.validate import engine_check  # noqa: E402
from tuner.search.profile import load_profile  # noqa: E402
from tuner.search.space import build_config  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    profile = load_profile("cpu")
    config = build_config(profile, profile.baselines[0].values)
    with tempfile.TemporaryDirectory(prefix="prevalidate-") as tmp:
        model = build_demo_model(Path(tmp) / "demo")
        argv = ["--model", str(model), *options_to_argv(dict(config.args))]
        started = time.monotonic()
        first = engine_check(argv, str(model))
        first_s = time.monotonic() - started
        runs = [engine_check(argv, str(model)) for _ in range(args.repeats)]
    data = {"date": dt.date.today().isoformat(), "cpus": len(os.sched_getaffinity(0)),
            "load_average_1m": round(os.getloadavg()[0], 2), "baseline": profile.baselines[0].name,
            "first_call_s": round(first_s, 2), "first_call_problems": list(first.problems),
            "calls_s": [round(r.seconds, 2) for r in runs], "isolated": [r.isolated for r in runs],
            "problems": sorted({p for r in runs for p in r.problems})}
    (HERE / "prevalidate.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())

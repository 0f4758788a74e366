"""Copy a rehearsed night's figures here, trimmed to what the tables show.

    python docs/evidence/emulated-night/collect.py NIGHT_JSON NAME           # a study's night.json
    python docs/evidence/emulated-night/collect.py --ci CHECKS_JSON           # scripts/ci_night.py's verdicts

Writes ``<NAME>.json`` (or ``ci-nights.json``) beside this file; ``tables.py`` renders them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PARAMS = ("topology", "moe-backend", "all2all-backend", "max-num-seqs", "max-num-batched-tokens",
          "gpu-memory-utilization", "compilation-config.cudagraph_mode", "enable-prefix-caching",
          "speculative.draft_tokens")


def _trial(t: dict[str, Any]) -> dict[str, Any]:
    return {"trial": t["trial"], "baseline": t["baseline"], "launched": t["launched"], "feasible": t["feasible"],
            "value": None if t["value"] is None else round(t["value"], 1), "failure_class": t["failure_class"],
            "knee_predicted": t.get("knee_predicted"), "knee_top_concurrency": t.get("knee_top_concurrency"),
            "knee_shown": t.get("knee_shown"), "max_concurrency": t.get("max_concurrency"),
            "params": {k: t["params"].get(k) for k in PARAMS if k in t["params"]},
            "duplicate_of": t.get("duplicate_of")}


def night(path: Path, name: str) -> None:
    d = json.loads(path.read_text())
    winner = d.get("winner")
    out = {k: d[k] for k in ("study", "hw", "objective", "metric", "direction", "slos", "engine", "units", "rehearsal",
                             "budget_node_s", "wall_s", "node_s", "guards", "launched", "refused_before_launch",
                             "winner_beats_baselines")}
    out["workload"] = {k: d["workload"][k] for k in ("kind", "input_len", "output_len", "ignore_eos")}
    out["trials"] = [_trial(t) for t in d["trials"]]
    out["winner"] = None if winner is None else {
        "trial": winner["trial"], "value": round(winner["value"], 1), "confirmed": winner["confirmed"],
        "baseline": winner.get("baseline"), "screening_value": round(winner["screening_value"], 1),
        "params": {k: winner["params"].get(k) for k in PARAMS if k in winner["params"]},
        "repeats": (winner.get("confirmation") or {}).get("values"),
        "confirmed_at_concurrency": (winner.get("confirmation") or {}).get("concurrency"),
        "confirmation_dir": (winner.get("confirmation") or {}).get("trial_dir")}
    (HERE / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")


def ci(path: Path) -> None:
    checks = json.loads(path.read_text())
    out = [{"night": c["night"], "exit_code": c["exit_code"], "wall_s": round(c["wall_s"]),
            "checks": {k: v.split(":", 1)[0] for k, v in c["checks"].items()}} for c in checks]
    (HERE / "ci-nights.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "--ci":
        ci(Path(sys.argv[2]))
    else:
        night(Path(sys.argv[1]), sys.argv[2])

"""Measure how many proposals in a row a normal night tells without a launch, per GPU hardware profile.

A night here is the real local loop (``Study.run``: the profile's baselines, the default constrained TPE,
the pre-launch checks with the prior feasibility model, duplicates, controls first) with launches
replaced by the feasibility model's own verdict: a launch reports the KV capacity the model predicts
(the node is the prior) and is worth the model's max concurrency (a stand-in for throughput that keeps
the sampler's infeasible regions where a night has them). ``runs`` launches per night, three seeds.

    .venv/bin/python docs/evidence/spin-stop/measure.py      # writes streaks.json beside this file
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

import tuner.study.step as step_mod  # noqa: E402
from tuner.objective import constraint_names  # noqa: E402
from tuner.search import feasibility  # noqa: E402
from tuner.search.space import ServeConfig  # noqa: E402
from tuner.study import Study, new_record  # noqa: E402
from tuner.study.confirm import ConfirmSpec  # noqa: E402
from tuner.trial import TrialContext, TrialOutcome  # noqa: E402

PROFILES = ["gh200x4", "h200x8", "h100x8", "b200x8", "gb300x4", "rtxpro6000x8", "mi325x1"]
SEEDS = [1, 2, 3]
RUNS = 40


def night(hw: str, seed: int, where: Path) -> dict[str, Any]:
    model = where / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": 129280}))
    record = new_record(name=f"{hw}-{seed}", hw=hw, objective="throughput", model=str(model), server_cmd=sys.executable,
                        port=None, trials=RUNS, budget_s=None, seed=seed, slo_overrides={}, ready_timeout_s=None,
                        prevalidate="off", confirm=ConfirmSpec(top_k=0, repeats=2), guards=[])
    study = Study.create(record, where / "runs")
    assert study.checkpoint is not None
    streaks: list[int] = []

    def fake_run_trial(ctx: TrialContext, config: ServeConfig, tdir: Path, **_: Any) -> TrialOutcome:
        verdict = feasibility.check(study.profile, config, study.checkpoint, study.objective.workload)  # type: ignore[arg-type]
        tdir.mkdir(parents=True, exist_ok=True)
        value = float(verdict.max_concurrency)
        return TrialOutcome(ok=True, value=value, constraints=tuple(-1.0 for _ in constraint_names(ctx.objective)),
                            failure_class=None, reason="model", summary={"output_throughput": value},
                            server_metrics={}, ready_s=1.0, duration_s=1.0, trial_dir=str(tdir),
                            config_key=config.key(), kv_cache_tokens=verdict.kv_tokens_per_rank or None)

    begin = step_mod.TrialStep.begin

    def counting_begin(self: step_mod.TrialStep, proposal: step_mod.Proposal) -> Path:
        streaks.append(self.idle.told)
        return begin(self, proposal)

    step_mod.run_trial = fake_run_trial  # type: ignore[assignment]
    step_mod.TrialStep.begin = counting_begin  # type: ignore[method-assign]
    try:
        ostudy = study.run()
    finally:
        step_mod.TrialStep.begin = begin  # type: ignore[method-assign]
    told = [t for t in ostudy.trials if t.state.name == "COMPLETE"]
    refused = sum(1 for t in told if t.user_attrs.get("launched") is False)
    dups = sum(1 for t in told if "duplicate_of" in t.user_attrs)
    return {"profile": hw, "seed": seed, "launches": len(streaks), "proposals": len(ostudy.trials),
            "refused": refused, "duplicates": dups, "longest_streak": max(streaks, default=0),
            "streaks": streaks}


def main() -> None:
    out = []
    for hw in PROFILES:
        for seed in SEEDS:
            with tempfile.TemporaryDirectory() as tmp:
                row = night(hw, seed, Path(tmp))
            print(hw, seed, {k: v for k, v in row.items() if k != "streaks"}, flush=True)
            out.append(row)
    (HERE / "streaks.json").write_text(json.dumps(
        {"runs_per_night": RUNS, "sampler": "tpe (the default)", "nights": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()

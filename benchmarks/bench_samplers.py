"""How many launches each sampler needs to reach 95 % of the feasible optimum of a known surface.

    .venv/bin/python benchmarks/bench_samplers.py --seeds 20 --launches 100
    PYTHONPATH=/path/with/scipy .venv/bin/python benchmarks/bench_samplers.py --samplers gp --seeds 10

The surface is ``benchmarks/surface.py`` (a synthetic 4-GPU DSV4-shaped space, drawn through the
study's own ``tuner.search.space.suggest``, with launch failures and an ITL SLO that binds at the optimum).
Every sampler is driven the way ``tuner.study.Study`` drives it: baseline first, duplicates not
launched, failed launches told COMPLETE with violated constraints. Rows are cached in a JSONL file
(``--cache``), so a long run can be resumed and slow samplers (GP) added later; the markdown table is
built from the cache.

"Reached" counts a launch whose *true* (noise-free) configuration is feasible and within 95 % of the
true feasible optimum, i.e. what the user would actually get from it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import surface  # noqa: E402


def make_sampler(seed: int, n_startup_trials: int = 4) -> optuna.samplers.BaseSampler:
    """The study's sampler (imported late: ``tuner.backends`` pulls in the whole tuner)."""
    from tuner.backends.storage import make_sampler as study_sampler

    return study_sampler(seed, n_startup_trials=n_startup_trials)


def _quiet(factory: Callable[[int], optuna.samplers.BaseSampler]) -> Callable[[int], optuna.samplers.BaseSampler]:
    def make(seed: int) -> optuna.samplers.BaseSampler:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return factory(seed)

    return make


@dataclass(frozen=True)
class Spec:
    name: str
    what: str
    make: Callable[[int], optuna.samplers.BaseSampler] | None = None
    failures: surface.FailureMode = "complete"
    order: str | None = None
    """'grid' or 'grid-shuffled': a fixed list of points instead of a sampler."""


SPECS: dict[str, Spec] = {s.name: s for s in [
    Spec("tpe-study", "the study's make_sampler: TPE multivariate+group, 4 startup", _quiet(make_sampler)),
    Spec("tpe-study-fail", "same, but failed launches told FAIL (Optuna drops them)", _quiet(make_sampler),
         failures="fail"),
    Spec("tpe-study-10", "make_sampler(n_startup_trials=10)", _quiet(lambda s: make_sampler(s, n_startup_trials=10))),
    Spec("tpe-independent", "TPE, univariate (multivariate=False), 4 startup",
         _quiet(lambda s: optuna.samplers.TPESampler(seed=s, multivariate=False, n_startup_trials=4))),
    Spec("tpe-multivariate", "TPE multivariate, no group (Optuna 5's default), 4 startup",
         _quiet(lambda s: optuna.samplers.TPESampler(seed=s, multivariate=True, n_startup_trials=4))),
    Spec("tpe-multivariate-10", "TPE multivariate, no group, 10 startup",
         _quiet(lambda s: optuna.samplers.TPESampler(seed=s, multivariate=True, n_startup_trials=10))),
    Spec("gp", "GPSampler (constraints via set_constraint), 4 startup; needs scipy",
         _quiet(lambda s: optuna.samplers.GPSampler(seed=s, n_startup_trials=4))),
    Spec("random", "RandomSampler", _quiet(lambda s: optuna.samplers.RandomSampler(seed=s))),
    Spec("grid", "sweep-style grid topology x max-num-seqs x max-num-batched-tokens, Cartesian order",
         order="grid"),
    Spec("grid-shuffled", "the same grid in a random order (Optuna GridSampler's behaviour)", order="grid-shuffled"),
]}
DEFAULT_SAMPLERS = ("tpe-study,tpe-study-fail,tpe-study-10,tpe-independent,tpe-multivariate,tpe-multivariate-10,gp,"
                    "random,grid,grid-shuffled")


def run_one(spec: Spec, seed: int, launches: int, noise: float, space: str = "large") -> dict[str, Any]:
    started = time.process_time()
    profile = surface.PROFILES[space]
    if spec.order is not None:
        points = surface.sweep_grid(profile)
        if spec.order == "grid-shuffled":
            random.Random(seed).shuffle(points)
        trace = surface.run_order(points, launches, profile)
        values, failed = list(trace), list(trace.failed)
    else:
        assert spec.make is not None
        result = surface.run_search(spec.make, seed, launches, failures=spec.failures, noise=noise, profile=profile)
        values, failed = list(result), list(result.failed)
    return {"sampler": spec.name, "surface": space, "seed": seed, "launches": launches, "noise": noise,
            "values": values, "failed": failed, "cpu_s": round(time.process_time() - started, 2)}


def load_cache(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        row.setdefault("surface", "large")
    return rows


@dataclass(frozen=True)
class Row:
    sampler: str
    seeds: int
    median_to_reach: float | None
    """Median launches to reach 95 % (None = the median seed never reached it)."""
    share_30: float
    share_50: float
    share_all: float
    median_best_30: float
    failed_30: float
    cpu_s: float


def summarize(rows: list[dict[str, Any]], sampler: str, launches: int, target: float, best: float) -> Row | None:
    mine = [r for r in rows if r["sampler"] == sampler and r["launches"] >= launches]
    if not mine:
        return None
    reach = [surface.trials_to_reach(r["values"][:launches], target) for r in mine]
    as_num = sorted(float(x) if x is not None else float("inf") for x in reach)
    median = statistics.median(as_num)
    return Row(
        sampler=sampler, seeds=len(mine), median_to_reach=None if median == float("inf") else median,
        share_30=sum(1 for x in reach if x is not None and x <= 30) / len(mine),
        share_50=sum(1 for x in reach if x is not None and x <= 50) / len(mine),
        share_all=sum(1 for x in reach if x is not None) / len(mine),
        median_best_30=statistics.median(max(r["values"][:30]) / best for r in mine),
        failed_30=statistics.mean(sum(r["failed"][:30]) for r in mine),
        cpu_s=statistics.mean(r["cpu_s"] for r in mine))


def table(rows: list[dict[str, Any]], samplers: list[str], launches: int, space: str = "large") -> str:
    profile = surface.PROFILES[space]
    best, _params, feasible_share, near_share = surface.optimum(profile)
    target = 0.95 * best
    rows = [r for r in rows if r["surface"] == space]
    lines = [
        f"surface {space!r} ({profile.name}): {sum(1 for _ in surface.all_params(profile))} configurations, "
        f"{feasible_share:.0%} feasible, {near_share:.3%} within 95 % of the feasible optimum ({best:.0f} tok/s; "
        f"unconstrained best {surface.unconstrained_best(profile):.0f}, infeasible under the ITL SLO)", "",
        f"| sampler | seeds | median launches to 95 % | ≤ 30 | ≤ 50 | ≤ {launches} | median best/opt after 30 "
        "| failed launches in first 30 (mean) | CPU s per run | what |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for name in samplers:
        row = summarize(rows, name, launches, target, best)
        if row is None:
            continue
        median = f"{row.median_to_reach:.0f}" if row.median_to_reach is not None else f"> {launches}"
        lines.append(f"| {name} | {row.seeds} | {median} | {row.share_30:.0%} | {row.share_50:.0%} | "
                     f"{row.share_all:.0%} | {row.median_best_30:.3f} | {row.failed_30:.1f} | {row.cpu_s:.1f} | "
                     f"{SPECS[name].what} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samplers", default=DEFAULT_SAMPLERS, help=f"comma-separated, from: {', '.join(SPECS)}")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed+seeds-1")
    parser.add_argument("--launches", type=int, default=100, help="launches per run (default 100)")
    parser.add_argument("--noise", type=float, default=0.03, help="log-normal sigma of every measurement")
    parser.add_argument("--surface", choices=sorted(surface.PROFILES), default="large",
                        help="large: the 4-GPU space with topology (default); small: the cpu profile's levers only")
    parser.add_argument("--cache", type=Path, default=HERE.parent / "runs" / "bench_samplers.jsonl")
    parser.add_argument("--table-only", action="store_true", help="print the table from the cache, run nothing")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.samplers.split(",") if n.strip()]
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        parser.error(f"unknown sampler(s) {unknown}; use {', '.join(SPECS)}")
    args.cache.parent.mkdir(parents=True, exist_ok=True)
    rows = load_cache(args.cache)
    if not args.table_only:
        done = {(r["sampler"], r["seed"]) for r in rows
                if r["launches"] >= args.launches and r["noise"] == args.noise and r["surface"] == args.surface}
        for name in names:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                if (name, seed) in done:
                    continue
                row = run_one(SPECS[name], seed, args.launches, args.noise, args.surface)
                rows.append(row)
                with args.cache.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                best = surface.optimum(surface.PROFILES[args.surface])[0]
                print(f"{name} seed {seed}: best/opt {max(row['values']) / best:.3f}, "
                      f"{row['cpu_s']:.1f} CPU s", file=sys.stderr, flush=True)
    rows = [r for r in rows if r["noise"] == args.noise]
    print(table(rows, names, args.launches, args.surface))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How many launches each search needs on an emulated DeepSeek-V4-Flash node whose truth its prior does not know.

    .venv/bin/python benchmarks/bench_search.py run --seeds 30            # the table (resumable cache)
    .venv/bin/python benchmarks/bench_search.py validate --samples 120    # the wave model vs the scheduler
    .venv/bin/python benchmarks/bench_search.py summarize --out docs/evidence/search-emulated

The node is ``search_truth.Truth``: the emulated node's performance model with its constants drawn
away from the model's (±30 % per kernel and backend, the Humming gain missing, one kind of
communication doubled), its failure and trap tables, and launch noise. The objective is the shipped
``throughput`` objective at the profile's scale (``tuner.search.envelope.objective_for``).

Every search but the grid runs as the study runs it (``tuner.study.local``): the recipe baselines
first, a duplicate told its earlier result without a launch, a configuration the feasibility model
refuses told as pruned (no launch), a speculative proposal's no-speculation control launched first,
a failed launch told COMPLETE with violated constraints. ``model`` is ``--prior model``: the same
loop with ``tuner.study.guided.GuidedSearch`` queueing the prior's picks and then the corrected
model's proposals. ``grid`` is what ``vllm bench sweep serve`` runs when given the Cartesian product of
the same levers: that list, in order, every item launched (it has no feasibility model, no controls).

A launch "reaches" X % when its true (noise-free) value is feasible and at least X % of the true
optimum: what the user would get if that launch were exported. The baselines count as launches.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import math
import os
import pickle
import statistics
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import search_truth  # noqa: E402

from tuner.objective import Objective, constraint_names  # noqa: E402
from tuner.predict import Guide, ObjectiveModel, Predictor, space_table, wave_bench  # noqa: E402
from tuner.predict.steptime import coefficient_arrays  # noqa: E402
from tuner.predict.table import descending, draft_tokens_of  # noqa: E402
from tuner.search.envelope import objective_for  # noqa: E402
from tuner.search.profile import (  # noqa: E402
    AGGREGATED,
    DISAGG_PARAM,
    TOPOLOGY_PARAM,
    HardwareProfile,
    bound_profile,
    draw_order,
    load_profile,
)
from tuner.search.space import build_config, suggest  # noqa: E402
from tuner.study.confirm import (  # noqa: E402
    NEXT_IN_LINE,
    ConfirmSpec,
    close_to_lead,
    following_in_line,
    judge,
    pick_winner,
)
from tuner.study.guided import GuidedSearch  # noqa: E402
from tuner.study.storage import ask_fixed, make_sampler  # noqa: E402

NODES = ("gh200x4", "h200x8")
TARGETS = (0.90, 0.95, 0.98)
CACHE = HERE.parent / "runs" / "bench-search"
MAX_DUPLICATES = 50


def _quiet(factory: Callable[[int], optuna.samplers.BaseSampler]) -> Callable[[int], optuna.samplers.BaseSampler]:
    def make(seed: int) -> optuna.samplers.BaseSampler:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return factory(seed)
    return make


@dataclass(frozen=True)
class Method:
    name: str
    what: str
    sampler: Callable[[int], optuna.samplers.BaseSampler] | None = None
    guided: bool = False
    learn: bool = True
    grid: bool = False
    explore: bool = True
    """--prior model: search by the measurements once the model is distrusted (False: the guide before issue 24)."""
    second_spread: bool = True
    """--prior model: once the model is distrusted, the second spread over topology × speculation first (False:
    the GP leads at once, as in issue 24's first step)."""
    spread: bool = True
    """--prior model: the first picks spread over topology × MoE kernel × batching (False: one per topology, MoE
    kernel and all2all class, before issue 24)."""
    incumbent: bool = True
    """The export confirms the best baseline beside the top screening values (False: as before issue 24's second
    step)."""
    cap: int = 40
    """Launches at most (the cheap searches run longer, so that their medians are measured, not censored)."""


METHODS: dict[str, Method] = {m.name: m for m in [
    Method("model", "--prior model: the baselines, the prior's 3 picks spread over topology x MoE kernel x batching, "
           "then the corrected model's expected improvement; once its residuals exceed its stated uncertainty, "
           "a second spread over topology x speculation, then a GP on the measurements around it that shares "
           "one offset per cell; the export confirms the best baseline beside the winner",
           _quiet(lambda s: make_sampler(s)), guided=True),
    Method("model-one-spread", "ablation: --prior model without issue 24's second spread (once the model is "
           "distrusted the GP leads at once; the GP that knows cells is kept) and without the confirmed baseline",
           _quiet(lambda s: make_sampler(s)), guided=True, second_spread=False, incumbent=False),
    Method("model-classpicks", "ablation: --prior model with the first picks as before issue 24 (one per topology, "
           "MoE kernel and all2all class)", _quiet(lambda s: make_sampler(s)), guided=True, spread=False),
    Method("model-trusting", "--prior model before issue 24: its first picks, and it keeps ranking by the corrected "
           "model when its residuals exceed its stated uncertainty", _quiet(lambda s: make_sampler(s)), guided=True,
           explore=False, spread=False),
    Method("model-prior", "ablation: --prior model without learning (the prior's ranking and the failure memory, "
           "no correction, no residual)", _quiet(lambda s: make_sampler(s)), guided=True, learn=False),
    Method("default", "--prior none before this change: TPE multivariate + group, 4 startup",
           _quiet(lambda s: optuna.samplers.TPESampler(seed=s, multivariate=True, group=True, n_startup_trials=4)),
           cap=100),
    Method("tpe", "TPE multivariate, no group, 4 startup: --prior none now (make_sampler)",
           _quiet(lambda s: optuna.samplers.TPESampler(seed=s, multivariate=True, n_startup_trials=4)), cap=100),
    Method("gp", "GPSampler, 4 startup (constraints through set_constraint)",
           _quiet(lambda s: optuna.samplers.GPSampler(seed=s, n_startup_trials=4)), cap=30),
    Method("random", "RandomSampler in the same study loop", _quiet(lambda s: optuna.samplers.RandomSampler(seed=s)),
           cap=200),
    Method("grid", "vllm bench sweep serve over the Cartesian product of the same levers, in order", grid=True,
           cap=200),
]}


# -- one node: its table, objective and model (cached on disk: the h200x8 table takes ~30 s) -----------------
@dataclass
class Node:
    name: str
    profile: HardwareProfile
    objective: Objective
    model: ObjectiveModel
    predictor: Predictor

    @property
    def table(self) -> Any:
        return self.predictor.table


def aggregated_only(profile: HardwareProfile) -> HardwareProfile:
    """``profile`` without its prefill/decode layouts and their baselines: one ``vllm serve`` per launch.

    Both truths read a launch as one server (the independent model parses one ``vllm serve``'s options; the
    wave model's node is one server too), and a layout is two pools and a router, which neither models: the
    independent model would fail every layout. The layouts came to h200x8 with issue 27, after the tables'
    first runs, which had none; the search over layouts is tested with the prior's own model of them
    (``tests/unit/test_disaggregation.py``)."""
    if profile.disaggregation is None:
        return profile
    return profile.model_copy(update={
        "disaggregation": profile.disaggregation.model_copy(update={"layouts": {}}),
        "baselines": [b for b in profile.baselines if b.values.get(DISAGG_PARAM, AGGREGATED) == AGGREGATED]})


def load_node(name: str, cache: Path = CACHE) -> Node:
    raw = load_profile(name)
    bound = bound_profile(raw, raw.server.checkpoint or "0731")
    profile, checkpoint = aggregated_only(bound.profile), bound.checkpoint
    objective = objective_for(raw, "throughput")
    model = ObjectiveModel.from_objective(objective)
    # the pickled Predictor is stale when the code that builds it changes: the model's rooms, whole
    code = b"".join(f.read_bytes() for room in ("predict", "perfmodel")
                    for f in sorted((HERE.parent / "tuner" / room).glob("*.py")))
    digest = hashlib.sha256((objective.model_dump_json() + profile.model_dump_json()).encode() + code).hexdigest()[:12]
    key = f"{name}-{digest}.pkl"
    path = cache / "nodes" / key
    if path.exists():
        with path.open("rb") as fh:
            predictor: Predictor = pickle.load(fh)  # noqa: S301 (our own cache, under runs/)
    else:
        table = space_table(profile, checkpoint, objective.workload)
        predictor = Predictor(table, model, seed=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as fh:
            pickle.dump(predictor, fh)
    return Node(name, profile, objective, model, predictor)


# -- one search ------------------------------------------------------------------------------------------------
@dataclass
class Run:
    node: str
    method: str
    seed: int
    optimum: float
    values: list[float]
    """True value of each launch, in order (0: failed, pruned launch of the grid, or an SLO miss)."""
    failed: list[bool]
    controls: int
    chance: list[float | None]
    """--prior model: the stop estimate after each launch (None: the model was distrusted, no estimate)."""
    wall_s: float
    cpu_s: float = 0.0
    measured: list[float | None] = dataclasses.field(default_factory=list)
    """What each launch measured (its screening value; None: it failed or missed an SLO)."""
    exported_12: float | None = None
    """True value of the winner the study exports after 12 launches (its top screening values confirmed)."""
    baseline_best: float = 0.0
    """True value of the best recipe baseline."""
    distrust_at: int | None = None
    """--prior model: the launch after which the guide stopped trusting the model (None: it never did)."""
    points: list[int] = dataclasses.field(default_factory=list)
    """The table point of each launch."""

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "method": self.method, "seed": self.seed, "optimum": round(self.optimum, 2),
                "values": [round(v, 2) for v in self.values], "failed": self.failed, "controls": self.controls,
                "chance": [None if c is None else round(c, 4) for c in self.chance], "wall_s": round(self.wall_s, 2),
                "cpu_s": round(self.cpu_s, 2),
                "measured": [None if m is None else round(m, 2) for m in self.measured],
                "exported_12": None if self.exported_12 is None else round(self.exported_12, 2),
                "baseline_best": round(self.baseline_best, 2), "distrust_at": self.distrust_at,
                "points": self.points}


def _tell(study: optuna.Study, trial: optuna.Trial, names: list[str], outcome: search_truth.Outcome) -> None:
    attrs: dict[str, Any] = {"launched": outcome.launched, "feasible": outcome.feasible}
    if outcome.failure_class:
        attrs["failure_class"] = outcome.failure_class
    if outcome.figures is not None:
        attrs.update({"output_throughput": outcome.figures["output_tok_s"],
                      "p95_ttft_ms": outcome.figures["ttft_p95_ms"], "p95_itl_ms": outcome.figures["itl_p95_ms"],
                      "max_concurrency": outcome.concurrency})
        margins = [*outcome.margins, 0.0, 0.0]
    else:
        margins = [1.0] * len(names)
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    for name, margin in zip(names, margins, strict=True):
        trial.set_constraint(name, margin)
    study.tell(trial, outcome.value if outcome.figures is not None else 0.0)


def _tell_duplicate(study: optuna.Study, trial: optuna.Trial, first: int) -> None:
    frozen = study.trials[first]
    for key, value in frozen.user_attrs.items():
        trial.set_user_attr(key, value)
    trial.set_user_attr("duplicate_of", first)
    for name, margin in frozen.constraints.items():
        trial.set_constraint(name, margin)
    study.tell(trial, frozen.value if frozen.value is not None else 0.0)


CONFIRM = ConfirmSpec()
"""The study's confirmation as it ships: top 2, and any within 5 % of the second, 3 repeats, spread ≤ 25 %."""
EXPORT_AFTER = 12


def exported_winner(truth: Any, points: list[int], measured: list[float | None], rng: np.random.Generator,
                    after: int = EXPORT_AFTER, baselines: frozenset[int] = frozenset(),
                    next_in_line: bool = True) -> float | None:
    """True value of the winner the study would export after ``after`` launches: its confirmation (as
    ``tuner.study.confirm`` ships: the top 2 screening values, and any within 5 % of the second, and the
    best baseline that met the SLOs with any other baseline that screened within ``INCUMBENT_BAND`` × 5 % of
    it (``baselines``: their points), each run 3 more times; a candidate is confirmed when every repeat met
    the SLOs and their spread is within 25 % of their median; the best confirmed median − MAD wins, unless
    the confirmed baseline with the best median has a median + MAD as high: then that baseline; with none
    confirmed, the best screening value) on the same node, with the node's noise. When every challenger
    confirmed is rejected, the next screening values in line are confirmed one at a time (``NEXT_IN_LINE`` at
    most) while they screened above the best confirmed recipe (``next_in_line``: False, as before it).
    Each repeat runs the launch's ladder again (the study repeats the chosen step, and steps down when a
    repeat misses an SLO there)."""
    screened = sorted(((m, p) for m, p in zip(measured[:after], points[:after], strict=True) if m),
                      reverse=True)
    if not screened:
        return None
    seen: set[int] = set()
    candidates: list[int] = []
    for m, p in screened:
        if p in seen:
            continue
        if len(candidates) >= CONFIRM.top_k and m < screened[min(CONFIRM.top_k, len(screened)) - 1][0] * (
                1.0 - CONFIRM.noise):
            break
        seen.add(p)
        candidates.append(p)
    incumbents = close_to_lead([(m, p) for m, p in screened if p in baselines], CONFIRM.noise)
    candidates += [p for p in dict.fromkeys(incumbents) if p not in seen]
    verdicts = []

    def confirm(p: int) -> None:
        runs = [truth.measure(p, rng) for _ in range(CONFIRM.repeats)]
        verdicts.append(judge(p, str(p), [o.value for o in runs], all_feasible=all(o.feasible for o in runs),
                              spec=CONFIRM, maximize=True, trial_dir="", speculative=False))

    for p in candidates:
        confirm(p)
    for _ in range(NEXT_IN_LINE if next_in_line else 0):  # as ConfirmationPhase.next_in_line chooses
        following = following_in_line(verdicts, screened, baselines, maximize=True)
        if following is None:
            break
        confirm(following)
    chosen = pick_winner(verdicts, maximize=True, incumbent=baselines)
    best_point = chosen.trial if chosen is not None else candidates[0]
    return float(truth.value[best_point])


def baseline_points(node: Node) -> list[int]:
    out = []
    for base in node.profile.baselines:
        found = node.table.index_of.get(build_config(node.profile, dict(base.values)).key())
        if found is not None:
            out.append(int(found))
    return out


def run_study(node: Node, truth: search_truth.Truth, method: Method, seed: int, launches: int,
              *, stop_when_reached: bool = True, noise: float = search_truth.NOISE_THROUGHPUT,
              latency_noise: float = search_truth.NOISE_LATENCY) -> Run:
    """Drive ``method`` as the study's local loop does, for at most ``launches`` launches."""
    started, cpu = time.perf_counter(), time.process_time()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    table = node.table
    rng = np.random.default_rng(seed * 7919 + 17)
    names = constraint_names(node.objective)
    values: list[float] = []
    failed: list[bool] = []
    chance: list[float | None] = []
    measured: list[float | None] = []
    points: list[int] = []
    controls = 0
    assert method.sampler is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(direction="maximize", sampler=method.sampler(seed))
        for base in node.profile.baselines:
            study.enqueue_trial(dict(base.values), user_attrs={"baseline": base.name}, skip_if_exists=True)
        guided = None
        if method.guided:
            guided = GuidedSearch(Guide(node.predictor, noise_sd=noise, seed=seed, learn=method.learn,
                                        explore_when_distrusted=method.explore, second_spread=method.second_spread),
                                  node.profile, spread=method.spread)
            guided.enqueue_prior(study)
        launched: dict[str, int] = {}
        start_failed: set[str] = set()
        duplicates = 0

        def point_of(config: Any) -> int:
            # A speculative trial's control keeps its twin's capture size, so it is not a point of the
            # table: its physics are those of the same levers with no draft.
            found = table.index_of.get(config.key())
            return int(found if found is not None else table.index_of[build_config(node.profile, config.params).key()])

        def launch(trial: optuna.Trial, config: Any) -> search_truth.Outcome:
            key = config.key()
            point = point_of(config)
            outcome = truth.measure(point, rng, noise=noise, latency_noise=latency_noise)
            _tell(study, trial, names, outcome)
            launched[key] = trial.number
            values.append(float(truth.value[point]))
            failed.append(outcome.figures is None)
            measured.append(outcome.value if outcome.feasible else None)
            points.append(point)
            if outcome.failure_class == "oom":
                start_failed.add(key)
            if guided is not None:
                estimate = guided.after_trial(study, trial.number)["chance_to_beat"]
                chance.append(None if estimate is None else float(estimate))
            return outcome

        def done() -> bool:
            if len(values) >= launches:
                return True
            if len(values) < EXPORT_AFTER:  # the winner exported after 12 launches is measured on every run
                return False
            reached = bool(values) and max(values) >= TARGETS[-1] * truth.optimum
            if guided is not None and method.learn:  # runs on until its own stop estimate says done (a
                # distrusted model's estimate never does: then it stops once there, as the samplers do)
                return reached and (guided.done() or guided.distrust_at() is not None) if stop_when_reached else False
            return reached and stop_when_reached

        while not done():
            if guided is not None:
                guided.before_ask(study)
            trial = study.ask()
            config = suggest(node.profile, trial)
            key = config.key()
            if key in launched:
                _tell_duplicate(study, trial, launched[key])
                duplicates += 1
                if duplicates >= MAX_DUPLICATES:
                    break
                continue
            duplicates = 0
            point = point_of(config)
            if config.is_speculative:
                control = config.control()
                ckey = control.key()
                if ckey not in launched and not table.prunable[point_of(control)]:
                    ctrial = ask_fixed(study, control.params, {"control_for": key})
                    suggest(node.profile, ctrial)  # records its parameters, as TrialStep.control_for does
                    controls += 1
                    launch(ctrial, control)
                    if done():
                        study.tell(trial, 0.0)
                        break
                if ckey in start_failed:  # the twin of a control that failed to start is not launched
                    _tell(study, trial, names, search_truth.Outcome(False, False, 0.0, "oom"))
                    launched[key] = trial.number
                    continue
            if table.prunable[point]:
                _tell(study, trial, names, search_truth.Outcome(False, False, 0.0, "infeasible"))
                launched[key] = trial.number
                continue
            launch(trial, config)
    exported = exported_winner(truth, points, measured, np.random.default_rng(seed * 104729 + 3),
                               baselines=frozenset(baseline_points(node)) if method.incumbent else frozenset())
    baseline = max((float(truth.value[p]) for p in baseline_points(node)), default=0.0)
    distrust = guided.distrust_at() if guided is not None and hasattr(guided, "distrust_at") else None
    return Run(node.name, method.name, seed, truth.optimum, values, failed, controls, chance,
               time.perf_counter() - started, time.process_time() - cpu, measured, exported, baseline, distrust, points)


def cartesian(profile: HardwareProfile) -> Iterator[dict[str, Any]]:
    """Every combination of the levers, the profile's order (topology outermost), as a sweep list is written."""
    names = ([TOPOLOGY_PARAM] if profile.topology is not None else []) + draw_order(profile)
    domains = [list(profile.lever(n).choices or []) for n in names]  # type: ignore[union-attr]
    for values in itertools.product(*domains):
        yield dict(zip(names, values, strict=True))


def run_grid(node: Node, truth: search_truth.Truth, seed: int, launches: int) -> Run:
    started, cpu = time.perf_counter(), time.process_time()
    table = node.table
    seen: set[str] = set()
    values: list[float] = []
    failed: list[bool] = []
    for params in cartesian(node.profile):
        if len(values) >= launches or (values and max(values) >= TARGETS[-1] * truth.optimum):
            break
        # A lever inactive under this topology (all2all without EP) is dropped, as the study does; the
        # sweep's list would still hold the combination, and vLLM would ignore the flag: same launch.
        config = suggest(node.profile, _Fixed(params))
        key = config.key()
        if key in seen:
            continue
        seen.add(key)
        point = table.index_of[key]
        values.append(float(truth.value[point]))
        failed.append(not truth.runs_at(point))
    # The sweep measures once per launch and keeps the best; its true best of the first 12 stands in.
    baseline = max((float(truth.value[p]) for p in baseline_points(node)), default=0.0)
    return Run(node.name, "grid", seed, truth.optimum, values, failed, 0, [], time.perf_counter() - started,
               time.process_time() - cpu, [v or None for v in values], max(values[:EXPORT_AFTER] or [0.0]), baseline)


class _Fixed:
    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = values

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return self.values[name]

    def suggest_int(self, name: str, low: int, high: int, **_: Any) -> int:
        return int(self.values[name])

    def suggest_float(self, name: str, low: float, high: float, **_: Any) -> float:
        return float(self.values[name])


# -- the table --------------------------------------------------------------------------------------------------
_NODES: dict[str, Node] = {}
_TRUTHS: dict[tuple[str, int, float, str], Any] = {}
TRUTHS = ("wave", "independent", "independent-quiet")
"""``wave``: the prior's own model with its constants drawn away (section 1 of docs/search.md);
``independent``: a node written without it (tuner.engines.emulated.independent, issue 24)."""
DEFAULT_SPREAD = {"wave": 0.3, "independent": 0.2, "independent-quiet": 0.2}


def make_truth(node: Node, seed: int, spread: float, kind: str = "wave") -> Any:
    if kind == "independent":
        return search_truth.make_independent_truth(node.table, node.model, seed, spread)
    if kind == "independent-quiet":
        return search_truth.quiet(search_truth.make_independent_truth(node.table, node.model, seed, spread))
    return search_truth.make_truth(node.table, node.model, seed, spread)


def _job(args: tuple[str, str, int, int, float, float, float, str]) -> dict[str, Any]:
    node_name, method_name, seed, launches, noise, latency_noise, spread, kind = args
    node = _NODES.get(node_name) or _NODES.setdefault(node_name, load_node(node_name))
    truth = _TRUTHS.get((node_name, seed, spread, kind))
    if truth is None:
        truth = _TRUTHS[(node_name, seed, spread, kind)] = make_truth(node, seed, spread, kind)
        if len(_TRUTHS) > 4:
            _TRUTHS.pop(next(iter(_TRUTHS)))
    method = METHODS[method_name]
    run = run_grid(node, truth, seed, launches) if method.grid else run_study(
        node, truth, method, seed, launches, noise=noise, latency_noise=latency_noise)
    out = run.to_json()
    out.update({"launches_cap": launches, "noise": noise, "latency_noise": latency_noise, "spread": spread,
                "truth": kind})
    if kind.startswith("independent"):
        out["optimum_all"] = round(truth.optimum_all, 2)
    return out


def launches_to(values: list[float], optimum: float, fraction: float) -> int | None:
    for i, v in enumerate(values, start=1):
        if v >= fraction * optimum:
            return i
    return None


def cmd_run(args: argparse.Namespace) -> int:
    cache = args.cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in cache.read_text().splitlines()] if cache.exists() else []
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    cap = {m: args.launches or METHODS[m].cap for m in methods}
    done = {(r["node"], r["method"], r["seed"]) for r in rows
            if r.get("noise") == args.noise and r.get("spread", 0.3) == args.spread and r["method"] in cap
            and r.get("truth", "wave") == args.truth and r.get("launches_cap", 0) >= cap[r["method"]]}
    for node in args.nodes.split(","):
        load_node(node)  # build the cache once, before the workers start
    jobs = [(node, m, seed, cap[m], args.noise, args.latency_noise, args.spread, args.truth)
            for node in args.nodes.split(",")
            for seed in range(args.first_seed, args.first_seed + args.seeds) for m in methods
            if (node, m, seed) not in done]
    print(f"{len(jobs)} runs to do ({len(done)} cached)", file=sys.stderr)
    started = time.time()
    with ProcessPoolExecutor(max_workers=args.workers) as pool, cache.open("a") as fh:
        for out in pool.map(_job, jobs, chunksize=1):
            fh.write(json.dumps(out) + "\n")
            fh.flush()
            reach = launches_to(out["values"], out["optimum"], 0.95)
            print(f"{out['node']} {out['method']:8s} seed {out['seed']:2d}: 95 % at {reach}, "
                  f"{len(out['values'])} launches, {out['wall_s']:.1f} s [{time.time() - started:.0f} s]",
                  file=sys.stderr, flush=True)
    return 0


def _quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile that stays ∞ when it touches a run that never got there."""
    data = sorted(xs)
    h = (len(data) - 1) * q
    lo, hi = math.floor(h), math.ceil(h)
    if math.isinf(data[lo]) or math.isinf(data[hi]):
        return math.inf
    return data[lo] + (data[hi] - data[lo]) * (h - lo)


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    return _quantile(xs, 0.25), _quantile(xs, 0.5), _quantile(xs, 0.75)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per node and method: launches to each target (∞ where not reached within the run's cap), as quartiles."""
    out: dict[str, Any] = {"targets": list(TARGETS), "nodes": {}}
    for node in sorted({r["node"] for r in rows}):
        per: dict[str, Any] = {}
        for method in METHODS:
            mine = sorted((r for r in rows if r["node"] == node and r["method"] == method), key=lambda r: r["seed"])
            if not mine:
                continue
            entry: dict[str, Any] = {"seeds": len(mine), "what": METHODS[method].what,
                                     "cap": min(r["launches_cap"] for r in mine)}
            for t in TARGETS:
                reach = [launches_to(r["values"][:r["launches_cap"]], r["optimum"], t) for r in mine]
                xs = [float(x) if x is not None else math.inf for x in reach]
                q1, med, q3 = _quartiles(xs)
                q1, med, q3 = (None if math.isinf(x) else x for x in (q1, med, q3))  # type: ignore[assignment]
                entry[f"to_{int(t * 100)}"] = {"q1": q1, "median": med, "q3": q3,
                                               "reached": sum(1 for x in reach if x is not None),
                                               "per_seed": [x if x is not None else None for x in reach]}
            entry["best_after_12"] = statistics.median(
                max(r["values"][:12] or [0.0]) / r["optimum"] for r in mine)
            exported = [r["exported_12"] / r["optimum"] if r.get("exported_12") else 0.0 for r in mine
                        if "exported_12" in r]
            if exported:
                baseline = [r["baseline_best"] / r["optimum"] for r in mine]
                entry["exported_after_12"] = {
                    "median": statistics.median(exported), "worst": min(exported),
                    "per_seed": [round(x, 4) for x in exported],
                    "at_least_95": sum(1 for x in exported if x >= 0.95),
                    "below_best_baseline": sum(1 for x, b in zip(exported, baseline, strict=True) if x < b - 1e-9),
                    "below_best_baseline_by_2pct": sum(1 for x, b in zip(exported, baseline, strict=True)
                                                       if x < 0.98 * b)}
                entry["best_baseline"] = {"median": statistics.median(baseline), "min": min(baseline),
                                          "max": max(baseline)}
                entry["best_below_baseline_after_12"] = sum(
                    1 for r, b in zip(mine, baseline, strict=True) if max(r["values"][:12] or [0.0]) / r["optimum"]
                    < b - 1e-9)
            entry["failed_in_first_12"] = statistics.mean(sum(r["failed"][:12]) for r in mine)
            entry["wall_s"] = statistics.mean(r["wall_s"] for r in mine)
            entry["cpu_s"] = statistics.mean(r.get("cpu_s", r["wall_s"]) for r in mine)
            if method == "model" and any("distrust_at" in r for r in mine):
                at = [r.get("distrust_at") for r in mine]
                entry["distrust_at"] = {"per_seed": at, "seeds": sum(1 for a in at if a is not None),
                                        "median": statistics.median(a for a in at if a is not None)
                                        if any(a is not None for a in at) else None}
            if method == "model":
                stops = []
                for r in mine:
                    stop = next((i for i, c in enumerate(r["chance"], start=1)
                                 if i >= 4 and c is not None and c < 0.05), None)
                    at = stop or len(r["values"])
                    stops.append({"seed": r["seed"], "stop_at": stop,
                                  "best_at_stop": round(max(r["values"][:at] or [0.0]) / r["optimum"], 4)})
                entry["stop"] = stops
                entry["chance_median_by_launch"] = [  # over the seeds whose guide still trusted the model
                    statistics.median(c) if (c := [r["chance"][i] for r in mine if len(r["chance"]) > i
                                                   and r["chance"][i] is not None]) else None
                    for i in range(max(len(r["chance"]) for r in mine))]
            per[method] = entry
        out["nodes"][node] = per
    return out


def measurement_noise(runs: list[dict[str, Any]], params: Any) -> dict[str, dict[str, float]]:
    """How far each launch's measured value fell from its true value (log sd, in %), launches with and without
    speculative drafts apart: the noise the node measured with, which no search is told."""
    ratios: dict[str, list[float]] = {"no_drafts": [], "drafts": []}
    for r in runs:
        for point, measured, true in zip(r.get("points", []), r["measured"], r["values"], strict=False):
            if measured is not None and true > 0:
                key = "drafts" if draft_tokens_of(params[point]) > 0 else "no_drafts"
                ratios[key].append(math.log(measured / true))
    return {k: {"launches": len(v), "sd_pct": round(100 * statistics.pstdev(v), 1) if len(v) > 1 else 0.0}
            for k, v in ratios.items()}


def cmd_summarize(args: argparse.Namespace) -> int:
    rows = [json.loads(line) for line in args.cache.read_text().splitlines()]
    rows = [r for r in rows if r.get("noise") == args.noise and r.get("latency_noise") == args.latency_noise
            and r.get("spread", 0.3) == args.spread and r.get("truth", "wave") == args.truth]
    latest: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in rows:  # the longest run of each (node, method, seed)
        key = (r["node"], r["method"], r["seed"])
        if key not in latest or r["launches_cap"] >= latest[key]["launches_cap"]:
            latest[key] = r
    summary = summarize(list(latest.values()))
    if args.keep_from is not None:  # searches not re-run keep their entries from an earlier summary
        earlier = json.loads(args.keep_from.read_text())
        renamed = dict(pair.split("=", 1) for pair in args.rename)
        for node, per in earlier["nodes"].items():
            for old, entry in per.items():
                method = renamed.get(old, old)
                if not old.startswith("_") and method not in summary["nodes"].get(node, {}):
                    summary["nodes"].setdefault(node, {})[method] = {**entry, "from_earlier_run": True,
                                                                     **({"earlier_name": old} if old != method
                                                                        else {})}
        summary["kept_from_earlier_run"] = sorted({m for per in summary["nodes"].values() for m, e in per.items()
                                                   if isinstance(e, dict) and e.get("from_earlier_run")})
        summary["earlier_run"] = {k: earlier[k] for k in ("runs", "runs_wall_s") if k in earlier}
    summary["noise"] = {"throughput_sd": args.noise, "latency_sd": args.latency_noise}
    summary["spread"] = args.spread
    summary["truth"] = args.truth
    summary["runs"] = len(latest)
    summary["runs_wall_s"] = round(sum(r["wall_s"] for r in latest.values()), 1)
    """Seconds the runs took, summed (truth tables and node caches not counted: a few seconds each)."""
    for node in summary["nodes"]:
        n = load_node(node)
        summary["nodes"][node]["_objective"] = n.model.describe()
        summary["nodes"][node]["_space"] = {"points": len(n.table), "pruned": int(n.table.prunable.sum()),
                                            "baselines": [b.name for b in n.profile.baselines]}
        for method in ("model", "model-trusting"):  # where the guide spent its launches, seed by seed:
            # launches per topology and draft tokens ("topology|draft tokens")
            if method in summary["nodes"][node] and not summary["nodes"][node][method].get("from_earlier_run"):
                mine = sorted((r for r in latest.values() if r["node"] == node and r["method"] == method),
                              key=lambda r: r["seed"])
                params = n.table.params
                summary["nodes"][node][method]["measurement_noise"] = measurement_noise(mine, params)
                summary["nodes"][node][method]["cells_launched"] = [
                    dict(Counter(f"{params[p].get('topology', params[p].get('disaggregation'))}|"
                                 f"{params[p].get('speculative.draft_tokens', 0)}"
                                 for p in r.get("points", []))) for r in mine]
        optima = sorted({(r["seed"], r["optimum"]) for r in rows if r["node"] == node})
        summary["nodes"][node]["_optimum_tok_s"] = {"median": statistics.median(o for _, o in optima),
                                                    "min": min(o for _, o in optima),
                                                    "max": max(o for _, o in optima)}
        every = sorted({(r["seed"], r["optimum"], r["optimum_all"]) for r in rows
                        if r["node"] == node and "optimum_all" in r})
        if every:  # the feasibility model's refusals that the node would run, and what they are worth
            summary["nodes"][node]["_optimum_all_over_optimum"] = {
                "max": max(a / o for _, o, a in every), "seeds_above": sum(1 for _, o, a in every if a > o * 1.0001)}
    args.out.mkdir(parents=True, exist_ok=True)
    name = "summary.json" if args.spread == DEFAULT_SPREAD[args.truth] else f"summary-spread{args.spread:g}.json"
    (args.out / name).write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out / name}", file=sys.stderr)
    return 0


def cmd_reexport(args: argparse.Namespace) -> int:
    """Recompute each cached run's exported winner (after a change to :func:`exported_winner`) in place."""
    rows = [json.loads(line) for line in args.cache.read_text().splitlines()]
    by_truth: dict[tuple[str, int, float, str], list[dict[str, Any]]] = {}
    for r in rows:
        if "points" in r and r["method"] != "grid":
            by_truth.setdefault((r["node"], r["seed"], r.get("spread", 0.3), r.get("truth", "wave")), []).append(r)
    for (node_name, seed, spread, kind), mine in sorted(by_truth.items()):
        node = _NODES.get(node_name) or _NODES.setdefault(node_name, load_node(node_name))
        truth = make_truth(node, seed, spread, kind)
        for r in mine:
            measured = r["measured"]
            method = METHODS.get(r["method"])
            incumbent = frozenset(baseline_points(node)) if method is None or method.incumbent else frozenset()
            exported = exported_winner(truth, r["points"], measured, np.random.default_rng(seed * 104729 + 3),
                                       baselines=incumbent)
            r["exported_12"] = None if exported is None else round(exported, 2)
        print(f"{node_name} seed {seed}: {len(mine)} runs re-exported", file=sys.stderr, flush=True)
    args.cache.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


# -- what the independent node is, seed by seed ---------------------------------------------------------------
def cmd_describe(args: argparse.Namespace) -> int:
    """``truth.json``: the independent model at the blog's three launches, and per node and seed its optimum,
    how many launches fail and why, what the feasibility model refuses that would run, and what the prior's
    first pick and the baselines are worth there."""

    from tuner.engines.emulated.independent import calibration_points, measure

    out: dict[str, Any] = {"calibration": {
        name: {"concurrency": c, "output_tok_s": round(measure(o, "gh200x4", c).tokens_per_s, 1)}
        for name, (o, c) in calibration_points().items()},
        "blog": {"TP4": 5856, "DP4+EP": 12802, "DP4+EP+W4A8 / DP4+EP": 1.40}, "spread": args.spread, "nodes": {}}
    for node_name in args.nodes.split(","):
        node = load_node(node_name)
        table = node.table
        bases = baseline_points(node)
        prior_top = node.predictor.ranking(top=1)[0].point
        seeds = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            truth = make_truth(node, seed, args.spread, "independent")
            launchable = ~table.prunable
            fails = launchable & ~(truth.starts & truth.survives)
            reasons = Counter(r for r, f in zip(truth.reason, fails, strict=True) if f)
            seeds.append({
                "seed": seed, "optimum": round(truth.optimum, 1), "optimum_all": round(truth.optimum_all, 1),
                "optimum_params": dict(table.params[int(np.argmax(truth.value))]),
                "launchable": int(launchable.sum()), "fail": int(fails.sum()), "fail_reasons": dict(reasons),
                "miss_slo": int((launchable & truth.starts & truth.survives & (truth.value <= 0)).sum()),
                "refused_but_runs": int((table.prunable & truth.starts & truth.survives).sum()),
                "within_95": int((truth.value >= 0.95 * truth.optimum).sum()),
                "within_98": int((truth.value >= 0.98 * truth.optimum).sum()),
                "prior_top": round(float(truth.value[prior_top]) / truth.optimum, 4),
                "baselines": [round(float(truth.value[p]) / truth.optimum, 4) for p in bases]})
            print(f"{node_name} seed {seed}", file=sys.stderr, flush=True)
        out["nodes"][node_name] = {"points": len(table), "refused": int(table.prunable.sum()),
                                   "baselines": [b.name for b in node.profile.baselines], "seeds": seeds}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "truth.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out / 'truth.json'}", file=sys.stderr)
    return 0


# -- the wave model against the emulated node's scheduler ---------------------------------------------------------
def cmd_validate(args: argparse.Namespace) -> int:
    from tuner.engines.emulated import BenchmarkShape, predict

    out: dict[str, Any] = {"samples": {}, "note": "ratio = wave model / scheduler (tuner.engines.emulated.predict)"}
    path = args.out / "agreement.json"
    if args.rewave:  # the scheduler's side is kept; the wave model's is recomputed (after a change to it)
        old = json.loads(path.read_text())
        for node_name, block in old["samples"].items():
            node = load_node(node_name)
            truth = search_truth.make_truth(node.table, node.model, block["seed"], args.spread)
            for p in block["points"]:
                sub = node.table.physics.take(np.array([p["row"]]))
                figs = wave_bench(sub, coefficient_arrays(sub, truth.coefficients), node.model.shape(p["c"]))
                p["wave"] = [float(figs.output_tok_s[0]), float(figs.ttft_p95_ms[0]), float(figs.itl_p95_ms[0])]
        path.write_text(json.dumps(old, indent=None) + "\n")
        return 0
    for node_name in args.nodes.split(","):
        node = load_node(node_name)
        table = node.table
        truth = search_truth.make_truth(table, node.model, args.seed, args.spread)
        rng = np.random.default_rng(args.seed)
        runs_rows = np.flatnonzero(truth.runs)
        # half near the truth's optimum (where a search ends), half anywhere it launches
        row_value = np.zeros(len(table.physics))
        np.maximum.at(row_value, np.maximum(table.phys_of, 0), truth.value)
        top = descending(row_value)[:300]
        picks = list(rng.choice(top, size=args.samples // 2, replace=False)) + list(
            rng.choice(runs_rows, size=args.samples - args.samples // 2, replace=False))
        samples = []
        started = time.time()
        for row in picks:
            row = int(row)
            j = int(rng.integers(truth.steps.concurrency.shape[1]))
            c = int(truth.steps.concurrency[row, j])
            shape = node.model.shape(c)
            sched = predict(table.profile, table.physics.configs[row],
                            BenchmarkShape(node.model.input_len, node.model.output_len, c, int(shape.num_prompts)),
                            checkpoint=table.checkpoint, coefficients=truth.coefficients)
            samples.append({"row": row, "c": c, "near_optimum": bool(row in set(top.tolist())),
                            "wave": [float(truth.steps.value[row, j]),
                                     float(truth.steps.figures["ttft_p95_ms"][row, j]),
                                     float(truth.steps.figures["itl_p95_ms"][row, j])],
                            "scheduler": [sched.output_tok_s, sched.ttft_p95_ms, sched.itl_p95_ms]})
            print(f"{node_name} {len(samples)}/{len(picks)} [{time.time() - started:.0f} s]", file=sys.stderr,
                  flush=True)
        out["samples"][node_name] = {"seed": args.seed, "objective": node.model.describe(), "points": samples}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "agreement.json").write_text(json.dumps(out, indent=None) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--nodes", default=",".join(NODES))
    common.add_argument("--truth", choices=TRUTHS, default="wave",
                        help="the node: the prior's model with its constants drawn away (wave), a node written "
                        "without it (independent), or that node measured without its noise (independent-quiet, a "
                        "diagnostic)")
    common.add_argument("--cache", type=Path, default=None,
                        help="the runs (default runs/bench-search/runs.jsonl; <truth>.jsonl for the others)")
    common.add_argument("--launches", type=int, default=0,
                        help="launch cap per run (default: each method's, 40 for the model-based, 100-200 for the "
                        "cheap ones)")
    common.add_argument("--noise", type=float, default=search_truth.NOISE_THROUGHPUT,
                        help="relative sd of a launch's throughput")
    common.add_argument("--latency-noise", type=float, default=search_truth.NOISE_LATENCY,
                        help="relative sd of a launch's p95 TTFT and ITL")
    common.add_argument("--spread", type=float, default=None,
                        help="how far the node's constants are drawn (±spread; default 0.3 from the model's for "
                        "wave, 0.2 from the independent model's nominal for independent)")
    run = sub.add_parser("run", parents=[common])
    run.add_argument("--methods", default=",".join(METHODS))
    run.add_argument("--seeds", type=int, default=30)
    run.add_argument("--first-seed", type=int, default=0)
    run.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    summ = sub.add_parser("summarize", parents=[common])
    summ.add_argument("--keep-from", type=Path, default=None,
                      help="an earlier summary.json: the searches these runs do not hold keep its entries")
    summ.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                      help="with --keep-from: an earlier entry's search under a new name (the code it ran is now NEW)")
    summ.add_argument("--out", type=Path, default=None,
                      help="default docs/evidence/search-emulated, search-independent for --truth independent")
    sub.add_parser("reexport", parents=[common], help="recompute the cached runs' exported winners in place")
    desc = sub.add_parser("describe", parents=[common], help="truth.json: the independent node, seed by seed")
    desc.add_argument("--seeds", type=int, default=30)
    desc.add_argument("--first-seed", type=int, default=0)
    desc.add_argument("--out", type=Path, default=None)
    val = sub.add_parser("validate", parents=[common])
    val.add_argument("--samples", type=int, default=120)
    val.add_argument("--seed", type=int, default=0)
    val.add_argument("--rewave", action="store_true",
                     help="keep agreement.json's scheduler runs, recompute its wave-model side")
    val.add_argument("--out", type=Path, default=HERE.parent / "docs" / "evidence" / "search-emulated")
    args = parser.parse_args(argv)
    if args.spread is None:
        args.spread = DEFAULT_SPREAD[args.truth]
    if args.cache is None:
        args.cache = CACHE / ("runs.jsonl" if args.truth == "wave" else f"{args.truth}.jsonl")
    if getattr(args, "out", "") is None:
        args.out = HERE.parent / "docs" / "evidence" / ("search-emulated" if args.truth == "wave"
                                                        else f"search-{args.truth}")
    if args.cmd == "describe" and args.truth != "independent":
        parser.error("describe reads the independent truth: add --truth independent")
    return {"run": cmd_run, "summarize": cmd_summarize, "validate": cmd_validate,
            "describe": cmd_describe, "reexport": cmd_reexport}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())

"""The workload envelope of a node: an objective at the profile's scale, and each launch's ladder through its knee.

One function resolves the objective a study runs (:func:`objective_for`: the objective file at the
hardware profile's ``server.workload_scale``, then ``--slo`` overrides), so ``plan``, ``run`` and the
report show one workload. A ladder named in fractions of the KV knee becomes node concurrencies per
configuration with :func:`knee_of` (the feasibility model's maximum concurrency for that launch,
refitted to the night's logged KV capacities when the study has them), and :func:`envelope` lists those
ladders for the profile's topologies and baselines: what ``plan`` shows, and what the emulated node's
units are sized for (its highest step).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tuner.errors import UsageError
from tuner.load.ladder import ladder_concurrencies
from tuner.objective import Objective, load_objective
from tuner.search.checkpoints import Checkpoint
from tuner.search.feasibility import Feasibility, KvCalibration, check
from tuner.search.profile import DRAFT_TOKENS_PARAM, TOPOLOGY_PARAM, HardwareProfile, Lever, Scalar
from tuner.search.space import FixedParams, ServeConfig, build_config, suggest

__all__ = ["DEFAULT_OBJECTIVE", "Envelope", "LadderRow", "envelope", "knee_of", "objective_for"]

DEFAULT_OBJECTIVE = "throughput"
"""What ``run`` measures when no ``--objective`` is given (and what ``plan`` shows then)."""


def objective_for(profile: HardwareProfile, objective: str | Objective | None,
                  slo_overrides: Mapping[str, float] | None = None) -> Objective:
    """The objective a study on ``profile`` runs: at the profile's workload scale, with ``--slo`` overrides."""
    loaded = load_objective(objective or DEFAULT_OBJECTIVE) if not isinstance(objective, Objective) else objective
    return loaded.at_scale(profile.server.workload_scale).with_slos(slo_overrides or {})


def knee_of(profile: HardwareProfile, config: ServeConfig, checkpoint: Checkpoint | None, objective: Objective,
            calibration: KvCalibration | None = None) -> int:
    """The KV knee of one launch: requests of the objective's longest ISL + OSL its KV caches hold at once.

    The feasibility model's maximum concurrency (capped by max-num-seqs per DP engine). A knee-relative
    ladder needs it, so it needs a catalogued checkpoint.
    """
    if checkpoint is None:
        raise UsageError(f"objective {objective.name!r} steps its ladder by the KV knee, which the feasibility "
                         "model predicts only for a catalogued checkpoint. Fix: pass --checkpoint, or use an "
                         "objective file whose ladder gives explicit steps")
    verdict: Feasibility = check(profile, config, checkpoint, objective.workload, calibration)
    return max(1, verdict.max_concurrency)


@dataclass(frozen=True)
class LadderRow:
    """One launch of the envelope: its knee and the node concurrencies its ladder steps through."""

    name: str
    fits: bool
    knee: int
    steps: tuple[int, ...]
    dp: int
    config: ServeConfig


@dataclass(frozen=True)
class Envelope:
    """An objective at a profile's scale, and the ladder each listed launch would run."""

    objective: Objective
    rows: tuple[LadderRow, ...]

    @property
    def top_concurrency(self) -> int:
        """The highest node concurrency any listed launch's ladder reaches (the workload's when there is no ladder)."""
        steps = [s for row in self.rows if row.fits for s in row.steps]
        return max(steps, default=self.objective.workload.concurrency)

    @property
    def max_dp(self) -> int:
        return max((row.dp for row in self.rows if row.fits), default=1)

    @property
    def top_row(self) -> LadderRow | None:
        """The launch whose ladder reaches highest (the one the night's units are sized for)."""
        fitting = [row for row in self.rows if row.fits and row.steps]
        return max(fitting, key=lambda row: max(row.steps)) if fitting else None


def _largest(lever: Lever | None) -> Scalar | None:
    if lever is None or lever.choices is None:
        return None if lever is None or lever.int_range is None else lever.int_range[1]
    numbers = [c for c in lever.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
    return max(numbers) if numbers else None


def _rows(profile: HardwareProfile, checkpoint: Checkpoint | None) -> list[tuple[str, ServeConfig]]:
    """The baselines, then each topology at the most KV-friendly settings (as ``plan``'s KV table)."""
    out = [(f"baseline {b.name}", build_config(profile, b.values)) for b in profile.baselines
           if b.checkpoints is None or checkpoint is None or checkpoint.name in b.checkpoints]
    base: dict[str, Scalar] = dict(profile.baselines[0].values) if profile.baselines else {}
    for name in ("gpu-memory-utilization", "max-num-seqs"):
        top = _largest(profile.levers.get(name))
        if top is not None:
            base[name] = top
    if profile.speculative is not None:
        base[DRAFT_TOKENS_PARAM] = 0
    for shape in profile.topologies():
        params = {**base, TOPOLOGY_PARAM: shape.name} if profile.topology is not None else base
        out.append((f"topology {shape.name}", suggest(profile, FixedParams(params))))
    return out


def envelope(profile: HardwareProfile, checkpoint: Checkpoint | None, objective: Objective) -> Envelope:
    """The ladders of the profile's baselines and topologies under ``objective`` (already at the profile's scale)."""
    rows: list[LadderRow] = []
    ladder = objective.ladder
    for name, config in _rows(profile, checkpoint):
        dp = int(config.args.get("data-parallel-size", 1))
        if checkpoint is None:
            knee, fits = 0, True
        else:
            verdict = check(profile, config, checkpoint, objective.workload)
            knee, fits = verdict.max_concurrency, verdict.ok
        if ladder is None:
            steps: tuple[int, ...] = (objective.workload.concurrency,)
        elif ladder.relative:
            steps = ladder.steps_for_knee(knee) if knee > 0 else ()
        else:
            steps = tuple(ladder_concurrencies(ladder))
        rows.append(LadderRow(name=name, fits=fits, knee=knee, steps=steps, dp=dp, config=config))
    return Envelope(objective=objective, rows=tuple(rows))

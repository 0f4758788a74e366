"""What the prior predicts before the first launch: the section ``dsv4-tune plan`` adds.

:func:`prior_plan` ranks a profile's whole space by predicted objective value under the objective's
SLOs, and lists the predicted optimum, the top configurations, the diverse picks ``run --prior model``
queues after the baselines, and what it predicts for each baseline. :func:`format_prior` renders it
as markdown. Pure: the CLI prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tuner.objective import Objective
from tuner.predict.guide import Predictor, Ranked
from tuner.predict.surface import PriorUnavailable
from tuner.search.checkpoints import Checkpoint
from tuner.search.profile import HardwareProfile, Scalar
from tuner.search.space import build_config

__all__ = ["PriorPlan", "format_prior", "prior_plan"]

_SHOWN = ("disaggregation", "topology", "moe-backend", "all2all-backend", "enable-eplb", "max-num-seqs",
          "max-num-batched-tokens", "gpu-memory-utilization", "compilation-config.cudagraph_mode",
          "speculative.draft_tokens")


@dataclass(frozen=True)
class PriorPlan:
    available: bool
    reason: str = ""
    objective: str = ""
    feasible_share: float = 0.0
    top: tuple[Ranked, ...] = ()
    picks: tuple[Ranked, ...] = ()
    baselines: tuple[tuple[str, Ranked | None], ...] = ()


def prior_plan(profile: HardwareProfile, checkpoint: Checkpoint | None, objective: Objective, *, top: int = 5,
               picks: int = 3) -> PriorPlan:
    """The prior's view of ``profile`` (bound to ``checkpoint``) under ``objective``; unavailable with a reason."""
    from tuner.predict import predictor_for

    if profile.hardware.accelerator == "cpu":
        return PriorPlan(False, f"{profile.name} is a CPU profile; the performance model describes GPU nodes")
    if checkpoint is None:
        return PriorPlan(False, "the performance model needs a catalogued checkpoint (--checkpoint)")
    try:
        predictor: Predictor = predictor_for(profile, checkpoint, objective)
    except PriorUnavailable as exc:
        return PriorPlan(False, str(exc))
    ranked = predictor.ranking(top=max(top, 50))
    by_point = {r.point: r for r in ranked}
    baselines: list[tuple[str, Ranked | None]] = []
    base_points: list[int] = []
    for base in profile.baselines:
        point = predictor.table.index_of.get(build_config(profile, base.values).key())
        baselines.append((base.name, None if point is None else _rank_one(predictor, point)))
        if point is not None:
            base_points.append(int(point))
    # the study's picks (tuner.study.guided): spread over topology × MoE kernel × batching, past the baselines
    found = [by_point[p] if p in by_point else _rank_one(predictor, p)
             for p in predictor.spread_top(picks, exclude=base_points)]
    chosen = tuple(r for r in found if r is not None)
    return PriorPlan(True, objective=predictor.objective.describe(), feasible_share=predictor.feasible_share(),
                     top=tuple(ranked[:top]), picks=chosen, baselines=tuple(baselines))


def _rank_one(predictor: Predictor, point: int) -> Ranked | None:
    row = int(predictor.table.phys_of[point])
    if row < 0:
        return None
    return predictor.ranked(point, predictor.prior_surface, row)


def _levers(params: Mapping[str, Scalar]) -> str:
    return ", ".join(f"{k} {params[k]}" for k in _SHOWN if k in params)


def _value(value: float) -> str:
    """A rate as the table shows it: tokens/s whole, requests/s (goodput) to two decimals."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"


def _row(r: Ranked) -> str:
    ok = "" if r.feasible else " (misses an SLO)"
    return (f"| {_value(r.value)}{ok} | {r.concurrency:,} | {r.figures['ttft_p95_ms'] / 1e3:,.1f} | "
            f"{r.figures['itl_p95_ms']:,.0f} | {_levers(r.params)} |")


def format_prior(plan: PriorPlan) -> str:
    out = ["## Prior: what the performance model predicts (before any launch)", ""]
    if not plan.available:
        return "\n".join([*out, f"Off: {plan.reason}. `run` then searches with the sampler alone.", ""])
    metric = plan.objective.split(",")[0] or "value"
    header = [f"| predicted {metric} | at concurrency | p95 TTFT s | p95 ITL ms | configuration |",
              "|---|---|---|---|---|"]
    best = plan.top[0].value if plan.top else 0.0
    out += [f"- objective: {plan.objective}",
            f"- predicted optimum: **{_value(best)} {metric}**; {plan.feasible_share:.0%} of the space is "
            "predicted to launch and meet the SLOs",
            "- the model's constants are the prior (docs/emulator.md); a real node differs, which is why "
            "`run --prior model` refits them after every launch (docs/search.md)", "",
            "Predicted top configurations:", "", *header, *(_row(r) for r in plan.top), "",
            "Queued by `run --prior model` after the baselines (the best of distinct topology, MoE kernel, "
            "all2all and speculation):", "", *header, *(_row(r) for r in plan.picks), ""]
    if plan.baselines:
        out += ["The baselines, as predicted:", "", f"| baseline | predicted {metric} | configuration |",
                "|---|---|---|"]
        for name, r in plan.baselines:
            value = "—" if r is None else (_value(r.value) + ("" if r.feasible else " (misses an SLO)"))
            out.append(f"| {name} | {value} | {'' if r is None else _levers(r.params)} |")
        out.append("")
    return "\n".join(out)

"""What a night on this node can hold: ``dsv4-tune plan``.

:func:`build_plan` sizes a hardware profile's search space, samples it with a seeded random source to
find the share the feasibility model lets through, tabulates KV capacity and concurrency per
topology, lists the baseline trials, and divides a time budget by the profile's per-trial estimate.
It shows the workload ``run`` would measure: the objective (``throughput`` unless one is named) at
the profile's workload scale, its SLOs, and each launch's ladder through its own KV knee
(:mod:`tuner.search.envelope`). :func:`format_plan` renders that as markdown. Both are pure: the CLI
prints.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from tuner.engines import Engine, default_engine
from tuner.objective import Objective, Workload
from tuner.search.checkpoints import Checkpoint, WeightSplit
from tuner.search.envelope import LadderRow, envelope, objective_for
from tuner.search.feasibility import GB, GIB, Feasibility, check
from tuner.search.profile import (
    AGGREGATED,
    DISAGG_PARAM,
    DRAFT_TOKENS_PARAM,
    SPECULATIVE_OPTION,
    TOPOLOGY_PARAM,
    BoundProfile,
    HardwareProfile,
    Lever,
    Scalar,
    bound_profile,
    parse_topology,
)
from tuner.search.space import FixedParams, RandomParams, ServeConfig, build_config, suggest
from tuner.search.unified import UnifiedFit, unified_fit

DEFAULT_SAMPLES = 400


@dataclass(frozen=True)
class TopologyRow:
    topology: str
    ok: bool
    reason: str
    weights_gib_per_rank: float
    kv_gib_per_rank: float
    kv_tokens_per_rank: int
    kv_tokens_total: int
    max_concurrency: int


@dataclass(frozen=True)
class BaselineRow:
    name: str
    note: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    ok: bool
    reason: str
    max_concurrency: int
    members: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """A prefill/decode layout's servers: (member name, its own flags); ``argv`` is then what they share."""


@dataclass(frozen=True)
class EnvelopeRow:
    """One qualified envelope of a unified-memory host: its files, its memory fit, its flags."""

    name: str
    baseline: str
    backend: str
    target: str
    draft: str
    fit: UnifiedFit
    argv: tuple[str, ...]
    not_expressed: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    profile: str
    description: str
    checkpoint: str
    checkpoint_repo: str
    draft: str
    objective: str
    """The objective's name (``throughput`` when none was given: what ``run`` measures then)."""
    scale: str | None
    """The profile's workload scale (None: the objectives' node scale)."""
    workload: Workload
    slos: dict[str, float]
    ladder: tuple[LadderRow, ...]
    """Each baseline's and topology's ladder, in node concurrency (through its own KV knee)."""
    ladder_rule: str
    workload_tokens: tuple[int, int]
    space_size: int | None
    """Distinct points (``None``: a continuous lever makes it infinite)."""
    samples: int
    feasible_share: float
    top_rejections: tuple[tuple[str, int], ...]
    topologies: tuple[TopologyRow, ...]
    baselines: tuple[BaselineRow, ...]
    per_trial_s: float
    budget_s: float | None
    trials_in_budget: int | None
    envelopes: tuple[EnvelopeRow, ...] | None = None
    """A unified-memory host's envelopes (None: a GPU node, whose KV capacity is per topology)."""
    levers: tuple[str, ...] = ()
    """Each lever and its domain, as the plan lists them for a unified-memory host."""


def space_size(profile: HardwareProfile) -> int | None:
    """Exact number of distinct points, honouring ``when`` conditions (define-by-run order)."""
    names = profile.param_names()
    conditioning = {other for lever in profile.levers.values() for other in (lever.when or {})}

    def domain(name: str) -> Lever | None:
        return profile.lever(name)

    def count(i: int, chosen: dict[str, Scalar]) -> int | None:
        if i == len(names):
            return 1
        name = names[i]
        lever = profile.levers.get(name)
        if lever is not None and lever.when and not all(
                _context(profile, chosen).get(k) in v for k, v in lever.when.items()):
            return count(i + 1, chosen)
        if name == TOPOLOGY_PARAM and chosen.get(DISAGG_PARAM, AGGREGATED) != AGGREGATED:
            return count(i + 1, chosen)  # a prefill/decode layout's pools carry their own topology
        dom = domain(name)
        assert dom is not None
        size = dom.domain_size()
        if size is None:
            return None
        if name in conditioning or name in (TOPOLOGY_PARAM, DISAGG_PARAM):
            total = 0
            for value in _values(dom):
                sub = count(i + 1, {**chosen, name: value})
                if sub is None:
                    return None
                total += sub
            return total
        rest = count(i + 1, chosen)
        return None if rest is None else size * rest

    return count(0, {})


def _values(lever: Lever) -> list[Scalar]:
    if lever.choices is not None:
        return list(lever.choices)
    assert lever.int_range is not None
    low, high = lever.int_range
    return list(range(low, high + 1, lever.step or 1))


def _context(profile: HardwareProfile, chosen: dict[str, Scalar]) -> dict[str, Scalar]:
    out = dict(chosen)
    if TOPOLOGY_PARAM in chosen:
        out.update(parse_topology(str(chosen[TOPOLOGY_PARAM])).derived())
    return out


def _largest(lever: Lever | None) -> Scalar | None:
    if lever is None:
        return None
    if lever.choices is not None:
        numbers = [c for c in lever.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
        return max(numbers) if numbers else None
    if lever.int_range is not None:
        return lever.int_range[1]
    return lever.float_range[1] if lever.float_range is not None else None


def _topology_rows(profile: HardwareProfile, ckpt: Checkpoint, workload: Workload) -> list[TopologyRow]:
    """Each shape at the most KV-friendly settings: highest utilization and seq cap, no draft."""
    base: dict[str, Scalar] = {}
    if profile.baselines:
        base.update(profile.baselines[0].values)
    for name in ("gpu-memory-utilization", "max-num-seqs", "kv-cache-memory-bytes"):
        top = _largest(profile.levers.get(name))
        if top is not None:
            base[name] = top
    if profile.speculative is not None:
        base[DRAFT_TOKENS_PARAM] = 0
    rows: list[TopologyRow] = []
    for shape in profile.topologies():
        params = {**base, TOPOLOGY_PARAM: shape.name} if profile.topology is not None else base
        config = suggest(profile, FixedParams(params))
        verdict = check(profile, config, ckpt, workload)
        rows.append(TopologyRow(
            topology=shape.name, ok=verdict.ok, reason=verdict.reason,
            weights_gib_per_rank=round(verdict.memory.weights_bytes / GIB, 1),
            kv_gib_per_rank=round(max(0, verdict.memory.kv_bytes) / GIB, 1),
            kv_tokens_per_rank=verdict.kv_tokens_per_rank, kv_tokens_total=verdict.kv_tokens_total,
            max_concurrency=verdict.max_concurrency))
    return rows


def _first_clause(reason: str) -> str:
    """The first reason, numbers masked, so like rejections count together."""
    head = reason.split(";")[0]
    head = head.split(":")[0] if head.startswith("does not fit") else head
    return re.sub(r"\d+(\.\d+)?", "N", head)


def sample_feasibility(profile: HardwareProfile, ckpt: Checkpoint, workload: Workload,
                       samples: int = DEFAULT_SAMPLES, seed: int = 0) -> tuple[float, list[tuple[str, int]]]:
    """Share of uniformly sampled points the model accepts, and the commonest rejection reasons."""
    source = RandomParams(seed)
    accepted = 0
    reasons: dict[str, int] = {}
    for _ in range(samples):
        verdict: Feasibility = check(profile, suggest(profile, source), ckpt, workload)
        if verdict.ok:
            accepted += 1
        else:
            key = _first_clause(verdict.reason)
            reasons[key] = reasons.get(key, 0) + 1
    top = sorted(reasons.items(), key=lambda kv: -kv[1])[:5]
    return accepted / samples if samples else 0.0, top


def _baseline_rows(profile: HardwareProfile, ckpt: Checkpoint, workload: Workload,
                   engine: Engine) -> list[BaselineRow]:
    rows: list[BaselineRow] = []
    for base in profile.baselines:
        config: ServeConfig = build_config(profile, base.values)
        verdict = check(profile, config, ckpt, workload)
        members = () if config.disaggregation is None else tuple(
            (m.name, tuple(engine.flags({k: v for k, v in m.args.items() if config.args.get(k) != v})))
            for m in config.disaggregation.members)
        rows.append(BaselineRow(name=base.name, note=base.note, argv=tuple(engine.flags(config.args)),
                                env=tuple(sorted(config.env.items())), ok=verdict.ok, reason=verdict.reason,
                                max_concurrency=verdict.max_concurrency, members=members))
    return rows


def _layout_rows(profile: HardwareProfile, ckpt: Checkpoint, workload: Workload) -> list[TopologyRow]:
    """Each prefill/decode layout at the most KV-friendly shared settings, its decode pool's KV and seats."""
    section = profile.disaggregation
    if section is None:
        return []
    base: dict[str, Scalar] = {}
    for name in ("gpu-memory-utilization",):
        top = _largest(profile.levers.get(name))
        if top is not None:
            base[name] = top
    if profile.speculative is not None:
        base[DRAFT_TOKENS_PARAM] = 0
    rows: list[TopologyRow] = []
    for layout in section.layouts:
        config = suggest(profile, FixedParams({**base, DISAGG_PARAM: layout}))
        verdict = check(profile, config, ckpt, workload)
        assert config.disaggregation is not None
        rows.append(TopologyRow(
            topology=config.disaggregation.describe(), ok=verdict.ok, reason=verdict.reason,
            weights_gib_per_rank=round(verdict.memory.weights_bytes / GIB, 1),
            kv_gib_per_rank=round(max(0, verdict.memory.kv_bytes) / GIB, 1),
            kv_tokens_per_rank=verdict.kv_tokens_per_rank, kv_tokens_total=verdict.kv_tokens_total,
            max_concurrency=verdict.max_concurrency))
    return rows


def _envelope_rows(profile: HardwareProfile, engine: Engine) -> tuple[EnvelopeRow, ...]:
    """Each envelope's baseline launch against the unified memory model, with its own files' sizes."""
    memory = profile.unified_memory
    assert memory is not None
    rows: list[EnvelopeRow] = []
    for key, env in memory.envelopes.items():
        base = next(b for b in profile.baselines if b.name == env.baseline)
        args = dict(build_config(profile, base.values).args)
        spec = args.get(SPECULATIVE_OPTION)
        if isinstance(spec, dict) and env.draft is not None:
            args[SPECULATIVE_OPTION] = {**spec, "draft_model": env.draft.file}
        fit = unified_fit(memory, args, target_bytes=env.target.size_gb * GB,
                          draft_bytes=env.draft.size_gb * GB if env.draft else 0.0)
        rows.append(EnvelopeRow(
            name=key, baseline=base.name, backend=env.backend, target=f"{env.target.file} ({env.target.size_gb} GB)",
            draft=f"{env.draft.file} ({env.draft.size_gb} GB)" if env.draft else "none", fit=fit,
            argv=tuple(engine.flags({"model": env.target.file, **args})), not_expressed=tuple(env.not_expressed)))
    return tuple(rows)


def _unified_share(profile: HardwareProfile, samples: int, seed: int) -> tuple[float, list[tuple[str, int]]]:
    """Share of sampled launches that fit the unified memory, with the first envelope's files."""
    memory = profile.unified_memory
    assert memory is not None
    first = next(iter(memory.envelopes.values()), None)
    target = first.target.size_gb * GB if first else 0.0
    draft = first.draft.size_gb * GB if first and first.draft else 0.0
    source = RandomParams(seed)
    fits = 0
    reasons: dict[str, int] = {}
    for _ in range(samples):
        fit = unified_fit(memory, suggest(profile, source).args, target_bytes=target, draft_bytes=draft)
        if fit.ok:
            fits += 1
        else:
            key = "does not fit the unified memory" if not fit.reason else fit.reason
            reasons[key] = reasons.get(key, 0) + 1
    return fits / samples if samples else 0.0, sorted(reasons.items(), key=lambda kv: -kv[1])[:5]


def _lever_lines(profile: HardwareProfile) -> tuple[str, ...]:
    lines = []
    for name in profile.param_names():
        lever = profile.lever(name)
        assert lever is not None
        domain = (", ".join(str(v) for v in lever.choices) if lever.choices is not None else
                  f"{lever.int_range[0]}..{lever.int_range[1]}" if lever.int_range is not None else
                  f"{lever.float_range[0]}..{lever.float_range[1]}" if lever.float_range is not None else "")
        lines.append(f"{name}: {domain}")
    return tuple(lines)


def build_plan(hw: str | BoundProfile, objective: str | None, budget_s: float | None, checkpoint: str | None = None,
               *, samples: int = DEFAULT_SAMPLES, seed: int = 0, engine: Engine | None = None) -> Plan:
    """Everything ``dsv4-tune plan`` shows, computed without launching anything (flags as ``engine`` spells them).

    ``hw``: a profile name or path (bound to ``checkpoint`` here), or one already bound (:func:`bound_profile`)."""
    bound = hw if isinstance(hw, BoundProfile) else bound_profile(hw, checkpoint)
    raw, profile = bound.raw, bound.profile
    resolved: Objective = objective_for(raw, objective)
    workload = resolved.workload
    # no catalogued checkpoint (the CPU demo, the GPU evidence profiles' generated models): the model
    # comes with --model at run time, and `run` checks no weights against memory either
    ckpt = bound.checkpoint if bound.checkpoint is not None else _cpu_checkpoint()
    if raw.unified_memory is not None:
        return _unified_plan(raw, resolved, budget_s, samples, seed, engine or default_engine())
    share, top = sample_feasibility(profile, ckpt, workload, samples, seed)
    per_trial = profile.server.expected_launch_s + profile.server.expected_measure_s
    trials = None if budget_s is None else max(0, math.floor(budget_s / per_trial))
    spec = profile.speculative
    draft = "off (checkpoint carries none, or the profile has no settings for it)" if spec is None else (
        f"{spec.method}, draft tokens {list(_values(spec.draft_tokens))}"
        if spec.draft_tokens.float_range is None else spec.method)
    return Plan(
        profile=profile.name, description=profile.description, checkpoint=ckpt.name or "(none)",
        checkpoint_repo=ckpt.repo, draft=draft, objective=resolved.name, scale=profile.server.workload_scale,
        workload=workload, slos=dict(resolved.slos),
        ladder=envelope(profile, None if ckpt.name == "demo" else ckpt, resolved).rows,
        ladder_rule=_ladder_rule(resolved),
        workload_tokens=(workload.input_len, workload.output_len), space_size=space_size(profile),
        samples=samples, feasible_share=share, top_rejections=tuple(top),
        topologies=tuple(_topology_rows(profile, ckpt, workload) + _layout_rows(profile, ckpt, workload)),
        baselines=tuple(_baseline_rows(profile, ckpt, workload, engine or default_engine())),
        per_trial_s=per_trial, budget_s=budget_s, trials_in_budget=trials)


def _unified_plan(profile: HardwareProfile, objective: Objective, budget_s: float | None, samples: int, seed: int,
                  engine: Engine) -> Plan:
    """The plan of a unified-memory host: its envelopes against the memory model, the levers, the baselines."""
    workload = objective.workload
    share, top = _unified_share(profile, samples, seed)
    per_trial = profile.server.expected_launch_s + profile.server.expected_measure_s
    spec = profile.speculative
    draft = "off" if spec is None else f"{spec.method}, draft tokens {list(_values(spec.draft_tokens))}"
    configs = [(b, build_config(profile, b.values)) for b in profile.baselines]
    baselines = tuple(BaselineRow(name=b.name, note=b.note, argv=tuple(engine.flags(c.args)),
                                  env=tuple(sorted(c.env.items())), ok=True, reason="",
                                  max_concurrency=int(c.args.get("parallel", 1))) for b, c in configs)
    return Plan(
        profile=profile.name, description=profile.description, checkpoint="(the GGUF given with --model)",
        checkpoint_repo=profile.server.model or "--model PATH.gguf", draft=draft, objective=objective.name,
        scale=profile.server.workload_scale, workload=workload, slos=dict(objective.slos), ladder=(),
        ladder_rule=_ladder_rule(objective), workload_tokens=(workload.input_len, workload.output_len),
        space_size=space_size(profile), samples=samples, feasible_share=share, top_rejections=tuple(top),
        topologies=(), baselines=baselines, per_trial_s=per_trial, budget_s=budget_s,
        trials_in_budget=None if budget_s is None else max(0, math.floor(budget_s / per_trial)),
        envelopes=_envelope_rows(profile, engine), levers=_lever_lines(profile))


def _ladder_rule(objective: Objective) -> str:
    ladder = objective.ladder
    if ladder is None:
        return f"one window at concurrency {objective.workload.concurrency}"
    if ladder.relative:
        assert ladder.knee_fractions is not None
        fractions = ", ".join(f"{f:g}" for f in ladder.knee_fractions)
        return (f"steps at {fractions} x each launch's own KV knee (the feasibility model's max concurrency), "
                f"{ladder.prompts_per_concurrency:g} x concurrency prompts per step")
    return f"steps {', '.join(str(c) for c in (ladder.steps or ()))}" if ladder.steps else \
        f"steps from {ladder.start} x{ladder.factor:g} up to {ladder.max}"


def _workload_line(plan: Plan) -> str:
    w = plan.workload
    if w.kind == "agent":
        a = w.agent_spec
        shape = (f"agent sessions: {w.concurrency} agents x {a.turns} turns, ~{a.system_len + a.context_len} "
                 f"prompt words, {w.output_len} output tokens, reasoning {a.reasoning_effort}, tools {a.tools}")
    else:
        prefix = f" after a {w.prefix_len}-token prefix (1 of {w.num_prefixes})" if w.kind == "shared_prefix" else ""
        pace = f", {w.request_rate:g} req/s" if w.request_rate else ""
        shape = f"{w.kind}: ISL {w.input_len}{prefix} + OSL {w.output_len}{pace}"
    scale = f"scale {plan.scale}" if plan.scale else "node scale"
    return f"objective **{plan.objective}** ({scale}): {shape}"


def _cpu_checkpoint() -> Checkpoint:
    """A tiny generated model (the CPU demo, the GPU evidence runs): a negligible 'checkpoint' for it."""
    return Checkpoint(name="demo", repo="demo (generated tiny model)", size_gb=0.01, routed_experts_gb=0.001,
                      weights=WeightSplit(routed_experts="bf16", attention="bf16"), kv_bytes_per_token=2048)


def _md_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def format_plan(plan: Plan) -> str:
    """The plan as markdown, for a terminal or a file."""
    isl, osl = plan.workload_tokens
    size = "infinite (continuous lever)" if plan.space_size is None else f"{plan.space_size:,}"
    slos = ", ".join(f"{k} <= {v:g}" for k, v in plan.slos.items()) or "none"
    out = [f"# Plan: {plan.profile}", "", plan.description, "",
           f"- checkpoint: **{plan.checkpoint}** (`{plan.checkpoint_repo}`)",
           f"- speculation: {plan.draft}",
           f"- workload: {_workload_line(plan)}",
           f"- SLOs: {slos}",
           f"- ladder: {plan.ladder_rule}",
           f"- space: {size} points; feasible share {plan.feasible_share:.0%} of {plan.samples} seeded samples",
           ""]
    if plan.top_rejections:
        out += ["Commonest reasons a sampled point is pruned before launch:", ""]
        out += [f"- {count}× {reason}" for reason, count in plan.top_rejections] + [""]
    if plan.envelopes is not None:
        return "\n".join(out + _unified_sections(plan)) + "\n"
    out += ["## KV capacity by topology", "",
            "At the highest gpu-memory-utilization and max-num-seqs in the space, speculation off; a "
            "prefill/decode layout by its decode pool (its pools' own seats).", "",
            _md_table(["topology", "fits", "weights GiB/rank", "KV GiB/rank", "KV tokens/rank",
                       "KV tokens total", f"max concurrency @ {isl + osl}"],
                      [[r.topology, "yes" if r.ok else f"no: {r.reason}", r.weights_gib_per_rank,
                        r.kv_gib_per_rank, f"{r.kv_tokens_per_rank:,}", f"{r.kv_tokens_total:,}",
                        r.max_concurrency] for r in plan.topologies]), ""]
    out += ["## The ladder of each launch (node concurrency)", "",
            _md_table(["launch", "fits", f"KV knee @ {isl + osl}", "steps"],
                      [[r.name, "yes" if r.fits else "no", r.knee or "-", ", ".join(str(c) for c in r.steps) or "-"]
                       for r in plan.ladder]), ""]
    out += ["## Baseline trials (enqueued first)", ""]
    if not plan.baselines:
        out += ["(none for this checkpoint)", ""]
    for b in plan.baselines:
        verdict = "feasible" if b.ok else f"pruned: {b.reason}"
        out += [f"- **{b.name}** — {b.note} ({verdict}; max concurrency {b.max_concurrency})",
                f"  `{' '.join(b.argv)}`"]
        out += [f"  - {member}: `{' '.join(flags)}`" for member, flags in b.members]
        if b.env:
            out.append("  env: " + " ".join(f"{k}={v}" for k, v in b.env))
    out += ["", "## Budget", "",
            f"- per trial: ~{plan.per_trial_s / 60:.0f} min (launch + guards + load, from the profile)"]
    if plan.budget_s is not None and plan.trials_in_budget is not None:
        out.append(f"- budget {plan.budget_s / 3600:.1f} h → about {plan.trials_in_budget} trials "
                   f"({len(plan.baselines)} baselines first; a speculative trial also runs its control)")
    else:
        out.append("- pass --budget to see how many trials fit")
    return "\n".join(out) + "\n"


def _unified_sections(plan: Plan) -> list[str]:
    """A unified-memory host's sections: each envelope's memory fit and flags, the levers, the baselines."""
    assert plan.envelopes is not None
    limit = plan.envelopes[0].fit.limit_gib if plan.envelopes else 0.0
    out: list[str] = [] if not plan.envelopes else ["## Envelopes: memory fit on the unified memory", "",
           f"weights + KV (context x bytes per token at the cache types) + compute buffers <= {limit:.2f} GiB "
           "(unified_memory: host limit less the reserve)", "",
           _md_table(["envelope", "backend", "target", "draft", "context", "weights GiB", "KV GiB", "compute GiB",
                      "total GiB", "fits"],
                     [[e.name, e.backend, e.target, e.draft, f"{e.fit.context_tokens:,}", f"{e.fit.weights_gib:.2f}",
                       f"{e.fit.kv_gib:.2f}", f"{e.fit.compute_gib:.2f}", f"{e.fit.total_gib:.2f}",
                       f"yes ({e.fit.headroom_gib:.2f} GiB left)" if e.fit.ok else f"no ({e.fit.describe()})"]
                      for e in plan.envelopes]), ""]
    for e in plan.envelopes:
        out += [f"- **{e.name}** (baseline {e.baseline}): `{' '.join(e.argv)}`"]
        if e.not_expressed:
            out.append(f"  not expressed by a lever (the recipe has it, llama-server's flags do not): "
                       f"{', '.join(e.not_expressed)}")
    out += ["", "## Levers", ""] + [f"- {line}" for line in plan.levers]
    out += ["", "## Baseline trials (enqueued first)", ""]
    for b in plan.baselines:
        out += [f"- **{b.name}** — {b.note}", f"  `{' '.join(b.argv)}`"]
    out += ["", "## Budget", "",
            f"- per trial: ~{plan.per_trial_s / 60:.0f} min (launch + guards + load, from the profile)"]
    if plan.budget_s is not None and plan.trials_in_budget is not None:
        out.append(f"- budget {plan.budget_s / 3600:.1f} h -> about {plan.trials_in_budget} trials")
    return out

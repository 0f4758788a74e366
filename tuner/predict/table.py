"""A hardware profile's whole space as a table: every point, what the pre-launch checks say, its physics.

:func:`space_table` enumerates every configuration a profile's levers span (``when`` conditions
honoured, in the profile's draw order, as :func:`tuner.search.space.suggest` draws them), runs the
feasibility model on each (what the study would prune before a launch), and turns each launchable
point into the numbers the performance model reads (:class:`Physics`: one row per distinct
launch, as arrays). Points that differ only in what the model cannot see (prefix caching under a
random workload, ``auto`` against the backend it resolves to) share a physics row.

A prefill/decode layout's point (issue 27) is one row too: the decode pool's member as the row's physics,
and beside it, in :class:`PdPhysics`, the prefill pool's member, both pools' instances and the KV bytes a
token moves between them; :mod:`tuner.predict.disagg` predicts such rows.

Pure: no I/O, no Optuna. A table of h200x8 (93,312 points) takes about half a minute to build.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tuner.objective import Workload
from tuner.perfmodel import NOMINAL, EmulatedConfig, capacity, moe_backend, node_spec
from tuner.perfmodel.architecture import DRAFT_ACTIVE_PARAMS
from tuner.perfmodel.hardware import NodeSpec
from tuner.search.checkpoints import Checkpoint
from tuner.search.feasibility import check
from tuner.search.profile import (
    AGGREGATED,
    DISAGG_PARAM,
    DRAFT_TOKENS_PARAM,
    TOPOLOGY_PARAM,
    HardwareProfile,
    Scalar,
    draw_order,
    parse_topology,
)
from tuner.search.space import build_config

__all__ = ["FULL_DECODE_MODES", "PIECEWISE_MODES", "PdPhysics", "Physics", "SpaceTable", "descending",
           "enumerate_points", "space_table"]

def descending(values: np.ndarray) -> np.ndarray:
    """Indices of ``values``, largest first; equal values keep their order in the table, which follows the
    profile's order of choices (the profiles list vLLM's default first), the same on every machine.

    The model gives rows that differ only in a lever it does not price the same value (three CUDA-graph modes
    of one DeepEP launch on h200x8, say). numpy's default sort is not stable, and which of equal rows it
    returns first depends on the CPU's SIMD sort: the same study picked a different first launch on two hosts.
    """
    return np.argsort(-np.asarray(values), kind="stable")


FULL_DECODE_MODES = frozenset({"FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"})
PIECEWISE_MODES = frozenset({"PIECEWISE", "FULL_AND_PIECEWISE"})
MAX_POINTS = 400_000
"""A space larger than this is not enumerated (the prior then stays off, with the reason)."""


class SpaceTooLarge(ValueError):
    """The profile's space is continuous or too large to rank point by point."""


def _values(profile: HardwareProfile, name: str) -> list[Scalar]:
    lever = profile.lever(name)
    if lever is None:
        raise SpaceTooLarge(f"no domain for {name!r}")
    if lever.choices is not None:
        return list(lever.choices)
    if lever.int_range is not None:
        low, high = lever.int_range
        return list(range(low, high + 1, lever.step or 1))
    raise SpaceTooLarge(f"lever {name!r} is continuous; the prior ranks finite spaces only")


def enumerate_points(profile: HardwareProfile) -> Iterator[dict[str, Scalar]]:
    """Every point of the space, each as the flat parameters ``suggest`` would draw for it."""
    order = (([DISAGG_PARAM] if profile.disaggregation is not None else [])
             + ([TOPOLOGY_PARAM] if profile.topology is not None else []) + draw_order(profile))

    def walk(i: int, chosen: dict[str, Scalar], context: dict[str, Scalar]) -> Iterator[dict[str, Scalar]]:
        if i == len(order):
            yield dict(chosen)
            return
        name = order[i]
        if name == TOPOLOGY_PARAM and chosen.get(DISAGG_PARAM, AGGREGATED) != AGGREGATED:
            yield from walk(i + 1, chosen, context)  # a layout's pools carry their own topology
            return
        lever = profile.levers.get(name)
        if lever is not None and lever.when and not all(
                {**chosen, **context}.get(k) in allowed for k, allowed in lever.when.items()):
            yield from walk(i + 1, chosen, context)
            return
        for value in _values(profile, name):
            extra = dict(parse_topology(str(value)).derived()) if name == TOPOLOGY_PARAM else {}
            yield from walk(i + 1, {**chosen, name: value}, {**context, **extra})

    yield from walk(0, {}, {})


@dataclass(frozen=True)
class Physics:
    """What the step-time model reads about each distinct launch, as arrays of one row per launch."""

    node: NodeSpec
    configs: tuple[EmulatedConfig, ...]
    tp: np.ndarray
    dp: np.ndarray
    world: np.ndarray
    ep: np.ndarray
    eplb: np.ndarray
    spec_k: np.ndarray
    """Draft tokens when speculating, else 0."""
    spec_method: tuple[str | None, ...]
    draft_params: np.ndarray
    """Active parameters of one draft pass (0 without speculation)."""
    mtp: np.ndarray
    eager: np.ndarray
    mode_full: np.ndarray
    mode_piecewise: np.ndarray
    max_capture: np.ndarray
    capture_group: np.ndarray
    capture_sizes: tuple[np.ndarray, ...]
    moe_field: tuple[str, ...]
    moe_math: tuple[str, ...]
    moe_peak_flop_s: np.ndarray
    a2a_backend: tuple[str, ...]
    a2a_sparse: np.ndarray
    """DeepEP-like all2all: sends only to the ranks a token's experts live on."""
    custom_allreduce: np.ndarray
    api_servers: np.ndarray
    routed_bytes: np.ndarray
    non_expert_bytes: np.ndarray
    draft_bytes: np.ndarray
    weights_bytes: np.ndarray
    kv_budget_bytes: np.ndarray
    kv_bytes_per_token: np.ndarray
    """Per token per rank before the truth's (or the correction's) KV factor."""
    block_size: np.ndarray
    max_model_len: np.ndarray
    max_num_seqs: np.ndarray
    max_batched_tokens: np.ndarray
    chunked_prefill: np.ndarray
    knee: np.ndarray
    """Requests of the workload's longest ISL + OSL the KV caches hold at once (the feasibility model's,
    capped by max-num-seqs): what a knee-relative ladder is sized from."""
    pd: PdPhysics | None = None
    """The prefill/decode layouts among the rows (None: every row is one server)."""

    def __len__(self) -> int:
        return len(self.configs)

    def take(self, rows: np.ndarray) -> Physics:
        """The rows ``rows`` only (a smaller table for the launched trials)."""
        rows = np.asarray(rows, dtype=np.int64)
        groups, inverse = np.unique(self.capture_group[rows], return_inverse=True)
        values: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name == "node":
                values[name] = value
            elif name == "pd":
                values[name] = None if value is None else value.take(rows)
            elif name == "capture_group":
                values[name] = inverse.astype(np.int64)
            elif name == "capture_sizes":
                values[name] = tuple(self.capture_sizes[int(g)] for g in groups)
            elif isinstance(value, np.ndarray):
                values[name] = value[rows]
            else:
                values[name] = tuple(value[int(r)] for r in rows)
        return Physics(**values)


@dataclass(frozen=True)
class PdPhysics:
    """The prefill/decode rows of a :class:`Physics`: their prefill pool's member and the pools' sizes.

    The parent row itself is the decode pool's member (``knee``: the whole decode pool's)."""

    rows: np.ndarray
    """Indices of the layouts' rows in the parent."""
    prefill: Physics
    """One row per layout: the prefill pool's member."""
    prefill_instances: np.ndarray
    decode_instances: np.ndarray
    transfer_bytes_per_token: np.ndarray
    """KV bytes one prompt token moves from the prefill member to the decode member (before the KV factor)."""
    link_bytes_s: float

    def take(self, parent_rows: np.ndarray) -> PdPhysics | None:
        """The layouts among ``parent_rows`` (rows renumbered as in the smaller parent), or None."""
        position = {int(r): i for i, r in enumerate(np.asarray(parent_rows, dtype=np.int64))}
        keep = [j for j, r in enumerate(self.rows) if int(r) in position]
        if not keep:
            return None
        index = np.asarray(keep, dtype=np.int64)
        return PdPhysics(rows=np.asarray([position[int(self.rows[j])] for j in keep], dtype=np.int64),
                         prefill=self.prefill.take(index), prefill_instances=self.prefill_instances[index],
                         decode_instances=self.decode_instances[index],
                         transfer_bytes_per_token=self.transfer_bytes_per_token[index], link_bytes_s=self.link_bytes_s)


def _physics_key(config: EmulatedConfig, generation: str) -> str:
    data = {k: v for k, v in config.__dict__.items() if k not in ("extra", "enable_prefix_caching", "moe_backend")}
    data["moe"] = moe_backend(config.moe_backend, generation).name
    return json.dumps(data, sort_keys=True, default=str)


def _physics(node: NodeSpec, profile: HardwareProfile, checkpoint: Checkpoint,
             configs: Sequence[EmulatedConfig], knees: Sequence[int]) -> Physics:
    dev = node.device
    groups: dict[tuple[int, ...], int] = {}
    rows: dict[str, list[Any]] = {k: [] for k in (
        "tp", "dp", "world", "ep", "eplb", "spec_k", "spec_method", "draft_params", "mtp", "eager", "mode_full",
        "mode_piecewise", "max_capture", "capture_group", "moe_field", "moe_math", "moe_peak_flop_s", "a2a_backend",
        "a2a_sparse",
        "custom_allreduce", "api_servers", "routed_bytes", "non_expert_bytes", "draft_bytes", "weights_bytes",
        "kv_budget_bytes", "kv_bytes_per_token", "block_size", "max_model_len", "max_num_seqs",
        "max_batched_tokens", "chunked_prefill", "knee")}

    def peak(math_dtype: str) -> float:
        if math_dtype == "fp4" and dev.fp4_flop_s > 0:
            return dev.fp4_flop_s
        if math_dtype in ("fp4", "fp8") and dev.fp8_flop_s > 0:
            return dev.fp8_flop_s
        return dev.bf16_flop_s

    for cfg, knee in zip(configs, knees, strict=True):
        rows["knee"].append(int(knee))
        cap = capacity(profile, cfg, checkpoint, NOMINAL)
        backend = moe_backend(cfg.moe_backend, node.generation)
        group = groups.setdefault(tuple(cfg.capture_sizes), len(groups))
        spec = cfg.spec_tokens if cfg.speculative else 0
        for name, value in (
                ("tp", cfg.tp), ("dp", cfg.dp), ("world", cfg.world), ("ep", cfg.ep), ("eplb", cfg.eplb),
                ("spec_k", spec), ("spec_method", cfg.spec_method if cfg.speculative else None),
                ("draft_params", DRAFT_ACTIVE_PARAMS.get(cfg.spec_method or "", 0.0) if cfg.speculative else 0.0),
                ("mtp", cfg.speculative and cfg.spec_method == "mtp"), ("eager", cfg.eager),
                ("mode_full", cfg.cudagraph_mode in FULL_DECODE_MODES),
                ("mode_piecewise", cfg.cudagraph_mode in PIECEWISE_MODES), ("max_capture", cfg.max_capture_size),
                ("capture_group", group), ("moe_field", backend.mfu_field), ("moe_math", backend.math),
                ("moe_peak_flop_s", peak(backend.math)), ("a2a_backend", cfg.all2all_backend),
                ("a2a_sparse", cfg.all2all_backend.startswith(("deepep", "pplx", "flashinfer", "mori"))),
                ("custom_allreduce", cfg.custom_allreduce), ("api_servers", cfg.api_servers),
                ("routed_bytes", float(cap.memory.routed_experts_bytes)),
                ("non_expert_bytes", float(cap.memory.non_expert_bytes)),
                ("draft_bytes", float(cap.memory.draft_bytes)), ("weights_bytes", float(cap.memory.weights_bytes)),
                ("kv_budget_bytes", float(cap.memory.kv_bytes)), ("kv_bytes_per_token", cap.kv_bytes_per_token),
                ("block_size", cfg.block_size), ("max_model_len", cfg.max_model_len),
                ("max_num_seqs", cfg.max_num_seqs), ("max_batched_tokens", cfg.max_num_batched_tokens),
                ("chunked_prefill", cfg.enable_chunked_prefill)):
            rows[name].append(value)
    sizes = [np.asarray(s if s else (0,), dtype=np.int64) for s, _ in sorted(groups.items(), key=lambda kv: kv[1])]
    out: dict[str, Any] = {"node": node, "configs": tuple(configs), "capture_sizes": tuple(sizes)}
    for name, values in rows.items():
        if name in ("spec_method", "moe_field", "moe_math", "a2a_backend"):
            out[name] = tuple(values)
        elif isinstance(values[0] if values else 0, bool) or name in ("ep", "eplb", "mtp", "eager", "mode_full",
                                                                      "mode_piecewise", "a2a_sparse",
                                                                      "custom_allreduce", "chunked_prefill"):
            out[name] = np.asarray(values, dtype=bool)
        elif name in ("routed_bytes", "non_expert_bytes", "draft_bytes", "weights_bytes", "kv_budget_bytes",
                      "kv_bytes_per_token", "moe_peak_flop_s", "draft_params"):
            out[name] = np.asarray(values, dtype=np.float64)
        else:
            out[name] = np.asarray(values, dtype=np.int64)
    return Physics(**out)


@dataclass(frozen=True)
class SpaceTable:
    """Every point of a profile's space, the pre-launch verdict on it, and its physics row."""

    profile: HardwareProfile
    checkpoint: Checkpoint
    workload: Workload
    params: tuple[Mapping[str, Scalar], ...]
    keys: tuple[str, ...]
    """``ServeConfig.key()`` of each point (what the study de-duplicates on)."""
    prunable: np.ndarray
    """The feasibility model refuses the point before launch (it costs no launch)."""
    phys_of: np.ndarray
    """Each point's row in :attr:`physics` (-1 for a pruned point)."""
    physics: Physics
    index_of: Mapping[str, int] = field(default_factory=dict)
    """Point number by configuration key."""

    def __len__(self) -> int:
        return len(self.params)

    def labels(self, name: str) -> list[str]:
        """A lever's value at every point, as text ('' where the lever is inactive)."""
        return ["" if p.get(name) is None else str(p.get(name)) for p in self.params]


def space_table(profile: HardwareProfile, checkpoint: Checkpoint, workload: Workload) -> SpaceTable:
    """Enumerate ``profile`` (bound to ``checkpoint``), judge each point, and tabulate its physics."""
    node = node_spec(profile)
    points = list(itertools.islice(enumerate_points(profile), MAX_POINTS + 1))
    if len(points) > MAX_POINTS:
        raise SpaceTooLarge(f"{profile.name}: more than {MAX_POINTS:,} points; the prior ranks smaller spaces")
    keys: list[str] = []
    prunable = np.zeros(len(points), dtype=bool)
    phys_of = np.full(len(points), -1, dtype=np.int64)
    unique: dict[str, int] = {}
    configs: list[EmulatedConfig] = []
    knees: list[int] = []
    layouts: dict[int, tuple[EmulatedConfig, int, int, int]] = {}
    for i, params in enumerate(points):
        config = build_config(profile, params)
        keys.append(config.key())
        verdict = check(profile, config, checkpoint, workload)
        if not verdict.ok:
            prunable[i] = True
            continue
        launch = config.disaggregation
        if launch is not None:
            decode, prefill = launch.pool("decode"), launch.pool("prefill")
            emulated = EmulatedConfig.from_options(decode[0].args)
            emulated_prefill = EmulatedConfig.from_options(prefill[0].args)
            pkey = "pd:" + _physics_key(emulated, node.generation) + _physics_key(emulated_prefill, node.generation) \
                + f"{len(prefill)}x{len(decode)}"
        else:
            emulated = EmulatedConfig.from_options(config.args)
            pkey = _physics_key(emulated, node.generation)
        row = unique.get(pkey)
        if row is None:
            row = unique[pkey] = len(configs)
            configs.append(emulated)
            knees.append(verdict.max_concurrency)
            if launch is not None:
                layouts[row] = (emulated_prefill, len(launch.pool("prefill")), len(launch.pool("decode")),
                                verdict.max_concurrency)
        phys_of[i] = row
    physics = _physics(node, profile, checkpoint, configs, knees)
    if layouts:
        rows = np.asarray(sorted(layouts), dtype=np.int64)
        prefill_phys = _physics(node, profile, checkpoint, [layouts[int(r)][0] for r in rows],
                                [layouts[int(r)][3] for r in rows])
        physics = dataclasses.replace(physics, pd=PdPhysics(
            rows=rows, prefill=prefill_phys,
            prefill_instances=np.asarray([layouts[int(r)][1] for r in rows], dtype=np.float64),
            decode_instances=np.asarray([layouts[int(r)][2] for r in rows], dtype=np.float64),
            transfer_bytes_per_token=physics.kv_bytes_per_token[rows].copy(), link_bytes_s=node.device.link_bytes_s))
    return SpaceTable(profile=profile, checkpoint=checkpoint, workload=workload, params=tuple(points),
                      keys=tuple(keys), prunable=prunable, phys_of=phys_of, physics=physics,
                      index_of={k: i for i, k in enumerate(keys)})


def draft_tokens_of(params: Mapping[str, Scalar]) -> int:
    return int(params.get(DRAFT_TOKENS_PARAM, 0) or 0)

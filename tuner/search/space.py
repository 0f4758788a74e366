"""A hardware profile's search space: the vLLM configurations its levers span (:mod:`tuner.search.profile`).

:func:`suggest` turns a source of parameter values (an Optuna trial, or a fixed dict) into a
:class:`ServeConfig`, honouring each lever's ``when`` condition; :func:`build_config` does the same from
known values. This module never imports Optuna.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from tuner import store
from tuner.search.pools import Disaggregated, disaggregated
from tuner.search.profile import (
    AGGREGATED,
    CAPTURE_OPTION,
    DISAGG_PARAM,
    DRAFT_TOKENS_PARAM,
    SPECULATIVE_OPTION,
    TOPOLOGY_PARAM,
    HardwareProfile,
    Lever,
    Scalar,
    draw_order,
    parse_topology,
)


class ParamSource(Protocol):
    """What :func:`suggest` needs: the three suggest methods of ``optuna.Trial``."""

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int: ...

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float: ...


@dataclass(frozen=True)
class ServeConfig:
    """One point of the space, ready for the engine to turn into argv.

    ``args`` maps vLLM option names to values; JSON options are nested dicts.
    ``params`` is the flat set of lever values that produced it (what Optuna saw).
    ``disaggregation``: a prefill/decode layout's servers (:mod:`tuner.search.pools`); ``args`` then holds
    the options the pools share, and each member's own are in it. None: one server of ``args``.
    """

    args: Mapping[str, Any]
    env: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, Scalar] = field(default_factory=dict)
    disaggregation: Disaggregated | None = None

    @property
    def draft_tokens(self) -> int:
        return int(self.params.get(DRAFT_TOKENS_PARAM, 0))

    @property
    def is_speculative(self) -> bool:
        return SPECULATIVE_OPTION in self.args

    def key(self) -> str:
        """Stable identity of what would be launched (args + env), for de-duplication."""
        identity: dict[str, Any] = {"args": self.args, "env": self.env}
        if self.disaggregation is not None:
            identity["disaggregation"] = self.disaggregation.to_json()
        blob = json.dumps(identity, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        """What a trial's ``config.json`` holds (secret-looking environment values masked)."""
        out = {"args": self.args, "env": store.safe_env(dict(self.env)), "params": self.params, "key": self.key(),
               "speculative": self.is_speculative}
        if self.disaggregation is not None:
            out["disaggregation"] = self.disaggregation.to_json()
        return out

    def control(self) -> ServeConfig:
        """The no-speculation twin: the same flags with speculation off."""
        args = {k: v for k, v in self.args.items() if k != SPECULATIVE_OPTION}
        params = dict(self.params)
        if DRAFT_TOKENS_PARAM in params:
            params[DRAFT_TOKENS_PARAM] = 0
        pools = self.disaggregation.without(SPECULATIVE_OPTION) if self.disaggregation is not None else None
        return replace(self, args=args, params=params, disaggregation=pools)


def _suggest_one(source: ParamSource, name: str, lever: Lever) -> Scalar:
    if lever.choices is not None:
        value: Scalar = source.suggest_categorical(name, list(lever.choices))
        return value
    if lever.int_range is not None:
        low, high = lever.int_range
        return source.suggest_int(name, low, high, step=lever.step or 1, log=lever.log)
    assert lever.float_range is not None
    low_f, high_f = lever.float_range
    return source.suggest_float(name, low_f, high_f, log=lever.log)


def _active(lever: Lever, chosen: Mapping[str, Scalar]) -> bool:
    if not lever.when:
        return True
    return all(chosen.get(other) in allowed for other, allowed in lever.when.items())


def _set_dotted(args: dict[str, Any], name: str, value: Any) -> None:
    head, _, rest = name.partition(".")
    if not rest:
        args[head] = value
        return
    inner = args.setdefault(head, {})
    if not isinstance(inner, dict):
        raise ValueError(f"option {head!r} is both a value and a JSON object")
    _set_dotted(inner, rest, value)


def capture_size_for(max_num_seqs: int, draft_tokens: int, limit: int) -> int:
    """min(max_num_seqs·(1+k), limit), rounded down to a multiple of 1+k (at least 1+k)."""
    query_len = 1 + max(0, draft_tokens)
    size = min(max_num_seqs * query_len, limit)
    return max(query_len, size - size % query_len)


def _apply_cudagraph_rule(profile: HardwareProfile, args: dict[str, Any], draft: int) -> None:
    rule = profile.cudagraph
    if rule is None or args.get("enforce-eager") is True:
        return
    compilation = args.get("compilation-config")
    mode = compilation.get("cudagraph_mode") if isinstance(compilation, dict) else None
    if mode == "NONE" or "max-num-seqs" not in args:
        return
    _set_dotted(args, CAPTURE_OPTION, capture_size_for(int(args["max-num-seqs"]), draft, rule.limit))


def build_config(profile: HardwareProfile, params: Mapping[str, Scalar]) -> ServeConfig:
    """Fixed flags + lever values → ServeConfig. Levers absent from ``params`` are left out."""
    args: dict[str, Any] = json.loads(json.dumps(profile.server.fixed))
    env = dict(profile.server.env)
    layout = str(params.get(DISAGG_PARAM, AGGREGATED)) if profile.disaggregation is not None else AGGREGATED
    if layout != AGGREGATED:  # the pools set their own topology, seats and budget
        params = {k: v for k, v in params.items() if k != TOPOLOGY_PARAM}
    if profile.topology is not None and TOPOLOGY_PARAM in params:
        shape = parse_topology(str(params[TOPOLOGY_PARAM]))
        args["tensor-parallel-size"] = shape.tp
        args["data-parallel-size"] = shape.dp
        if shape.ep:
            args["enable-expert-parallel"] = True
    for name, lever in profile.levers.items():
        if name not in params:
            continue
        value = params[name]
        if lever.env:
            env[lever.env] = str(value).lower() if isinstance(value, bool) else str(value)
        else:
            _set_dotted(args, name, value)
        env.update(lever.env_for.get(str(value), {}))
    spec = profile.speculative
    draft = int(params.get(DRAFT_TOKENS_PARAM, 0)) if spec else 0
    if spec is not None and draft > 0:
        args[SPECULATIVE_OPTION] = {"method": spec.method, "num_speculative_tokens": draft, **spec.config}
    if layout != AGGREGATED:
        launch = disaggregated(profile, layout, args)
        members = []
        for member in launch.members:
            member_args = dict(member.args)
            _apply_cudagraph_rule(profile, member_args, draft if SPECULATIVE_OPTION in member_args else 0)
            members.append(replace(member, args=member_args))
        return ServeConfig(args=args, env=env, params=dict(params),
                           disaggregation=replace(launch, members=tuple(members)))
    _apply_cudagraph_rule(profile, args, draft)
    return ServeConfig(args=args, env=env, params=dict(params))


def suggest(profile: HardwareProfile, source: ParamSource) -> ServeConfig:
    """Draw one configuration from the profile's space (define-by-run, conditional levers).

    The prefill/decode layout is drawn first, then the topology (only for ``aggregated``: a layout's pools
    carry their own), so ``when`` conditions may name ``disaggregation`` and ``topology.tp/dp/ep``; the
    draft count last.
    """
    chosen: dict[str, Scalar] = {}
    context: dict[str, Scalar] = {}
    if profile.disaggregation is not None:
        chosen[DISAGG_PARAM] = source.suggest_categorical(DISAGG_PARAM, profile.disaggregation.choices())
    if profile.topology is not None and chosen.get(DISAGG_PARAM, AGGREGATED) == AGGREGATED:
        chosen[TOPOLOGY_PARAM] = source.suggest_categorical(TOPOLOGY_PARAM, list(profile.topology.choices))
        context.update(parse_topology(str(chosen[TOPOLOGY_PARAM])).derived())
    for name in draw_order(profile):
        if name == DRAFT_TOKENS_PARAM:
            assert profile.speculative is not None
            chosen[name] = _suggest_one(source, name, profile.speculative.draft_tokens)
            continue
        lever = profile.levers[name]
        if _active(lever, {**chosen, **context}):
            chosen[name] = _suggest_one(source, name, lever)
    return build_config(profile, chosen)


class FixedParams:
    """A ParamSource that answers from a dict (falls back to the first choice / low end)."""

    def __init__(self, values: Mapping[str, Scalar]) -> None:
        self.values = dict(values)

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        return self.values.get(name, choices[0])

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        return int(self.values.get(name, low))

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        return float(self.values.get(name, low))


class RandomParams:
    """A seeded ParamSource drawing uniformly (for plans and tests; the study uses Optuna)."""

    def __init__(self, seed: int = 0) -> None:
        import random

        self.rng = random.Random(seed)

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        return choices[self.rng.randrange(len(choices))]

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        return low + step * self.rng.randrange((high - low) // step + 1)

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        return self.rng.uniform(low, high)



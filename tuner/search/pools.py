"""Prefill/decode disaggregation: the servers one launch of a layout runs (issue 27).

A hardware profile's ``disaggregation`` section (:class:`~tuner.search.profile.Disaggregation`) names
layouts: a prefill pool and a decode pool, each ``instances`` servers of one topology with their own
max-num-seqs and batched tokens. The ``disaggregation`` lever picks ``aggregated`` (one server on the
whole node, as before) or a layout. A layout's launch is a :class:`Disaggregated`: every member's vLLM
options (the profile's fixed flags and the shared levers, then the pool's own), its GPUs, the KV connector
and the router that fronts them. Speculation runs on the decode pool only (the prefill pool emits one
token a request).

What a member's ``--kv-transfer-config`` holds besides the connector (a side channel's port, a shared
folder) depends on the trial, so the launch adds it (:func:`kv_transfer_config`).

Pure: no I/O; :mod:`tuner.search.space` builds a :class:`Disaggregated` into a ``ServeConfig``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tuner.search.profile import POOL_ROLES, SPECULATIVE_OPTION, HardwareProfile, PdLayout

__all__ = ["CONNECTOR_MODULES", "KV_ROLES", "Disaggregated", "PoolMember", "connector_missing", "disaggregated",
           "kv_transfer_config", "layout_gpus", "router_missing"]

KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
"""``kv_role`` of each pool. vLLM 0.32 deprecates ``kv_both`` for NixlConnector ("Please set
kv_role='kv_producer' for prefill instances and kv_role='kv_consumer' for decode instances", logged by a CPU
pair started with it), and ExampleConnector needs the direction."""
TOPOLOGY_OPTIONS = ("tensor-parallel-size", "data-parallel-size", "enable-expert-parallel")
CONNECTOR_MODULES: Mapping[str, str] = {
    "NixlConnector": "nixl", "NixlPullConnector": "nixl", "NixlPushConnector": "nixl",
    "MooncakeConnector": "mooncake", "MooncakeStoreConnector": "mooncake",
    "LMCacheConnectorV1": "lmcache", "LMCacheMPConnector": "lmcache",
}
"""The Python module each connector needs beside vLLM (the others, ExampleConnector among them, need none)."""
CONNECTOR_PACKAGES: Mapping[str, str] = {"nixl": "nixl (NVIDIA's wheel: nixl-cu12 or nixl-cu13)",
                                         "mooncake": "mooncake-transfer-engine", "lmcache": "lmcache"}


def connector_missing(connector: str, python: str) -> str:
    """The error of a connector whose module ``python`` cannot import, with the fix."""
    module = CONNECTOR_MODULES.get(connector, connector)
    return (f"the KV connector {connector} needs the Python module {module!r}, which {python} cannot import. "
            f"Fix: pip install {CONNECTOR_PACKAGES.get(module, module)} into the engine's environment, or set "
            "disaggregation.connector in the hardware profile to one that is installed")


def router_missing(router: str) -> str:
    """The error of a router program that is not installed, with the fix."""
    return (f"the prefill/decode router {router!r} is not installed (not on PATH). Fix: pip install vllm-router "
            "(pip install -e .[pd]), or set disaggregation.router in the hardware profile to its path")


@dataclass(frozen=True)
class PoolMember:
    """One server of a pool: its role, its place in the pool, its vLLM options and its GPUs."""

    role: str
    index: int
    args: Mapping[str, Any]
    gpus: tuple[int, ...]

    @property
    def name(self) -> str:
        """``prefill-0``, ``decode-1``: the member's folder and its label in records."""
        return f"{self.role}-{self.index}"

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "index": self.index, "args": dict(self.args), "gpus": list(self.gpus)}


@dataclass(frozen=True)
class Disaggregated:
    """The launch of one layout: every member, the connector, the router."""

    layout: str
    connector: str
    connector_config: Mapping[str, Any]
    router: str
    members: tuple[PoolMember, ...]
    note: str = ""
    pool_topologies: Mapping[str, str] = field(default_factory=dict)

    def pool(self, role: str) -> tuple[PoolMember, ...]:
        return tuple(m for m in self.members if m.role == role)

    def gpus(self, role: str) -> int:
        return sum(len(m.gpus) for m in self.pool(role))

    def describe(self) -> str:
        """``4p4d: prefill 1 x tp4, decode 1 x dp4-ep``."""
        parts = [f"{role} {len(self.pool(role))} x {self.pool_topologies.get(role, '?')}" for role in POOL_ROLES]
        return f"{self.layout}: {', '.join(parts)}"

    def without(self, option: str) -> Disaggregated:
        """The same launch with ``option`` removed from every member (a speculative launch's control)."""
        members = tuple(replace(m, args={k: v for k, v in m.args.items() if k != option}) for m in self.members)
        return replace(self, members=members)

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.layout, "connector": self.connector, "connector_config": dict(self.connector_config),
                "router": self.router, "pools": dict(self.pool_topologies),
                "members": [m.to_json() for m in self.members]}

    def key_blob(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, default=str)


def layout_gpus(layout: PdLayout) -> dict[str, int]:
    return {role: layout.pool(role).gpus for role in POOL_ROLES}


def _member_args(shared: Mapping[str, Any], layout: PdLayout, role: str) -> dict[str, Any]:
    pool = layout.pool(role)
    shape = pool.shape()
    args = {k: v for k, v in json.loads(json.dumps(dict(shared))).items() if k not in TOPOLOGY_OPTIONS}
    if role == "prefill":
        args.pop(SPECULATIVE_OPTION, None)  # the prefill pool emits one token a request: nothing to draft
    args["tensor-parallel-size"] = shape.tp
    args["data-parallel-size"] = shape.dp
    if shape.ep:
        args["enable-expert-parallel"] = True
    if pool.max_num_seqs is not None:
        args["max-num-seqs"] = pool.max_num_seqs
    if pool.max_num_batched_tokens is not None:
        args["max-num-batched-tokens"] = pool.max_num_batched_tokens
    args.update(json.loads(json.dumps(pool.options)))
    return args


def disaggregated(profile: HardwareProfile, layout_name: str, shared: Mapping[str, Any]) -> Disaggregated:
    """The launch of ``layout_name`` on ``profile`` whose shared options (fixed flags and levers) are ``shared``.

    GPUs are numbered prefill first, then decode, each member taking the next ``world`` of them.
    """
    section = profile.disaggregation
    if section is None or layout_name not in section.layouts:
        known = ", ".join(section.layouts) if section is not None else "none"
        raise ValueError(f"no prefill/decode layout {layout_name!r} in profile {profile.name} (layouts: {known})")
    layout = section.layouts[layout_name]
    members: list[PoolMember] = []
    next_gpu = 0
    for role in POOL_ROLES:
        pool = layout.pool(role)
        world = pool.shape().world
        for index in range(pool.instances):
            members.append(PoolMember(role=role, index=index, args=_member_args(shared, layout, role),
                                      gpus=tuple(range(next_gpu, next_gpu + world))))
            next_gpu += world
    return Disaggregated(layout=layout_name, connector=section.connector,
                         connector_config=dict(section.connector_config), router=section.router,
                         members=tuple(members), note=layout.note,
                         pool_topologies={role: layout.pool(role).topology for role in POOL_ROLES})


def kv_transfer_config(launch: Disaggregated, member: PoolMember, extra: Mapping[str, Any] | None = None
                       ) -> dict[str, Any]:
    """The ``--kv-transfer-config`` of one member: the connector, its role, and the extra config."""
    config: dict[str, Any] = {"kv_connector": launch.connector, "kv_role": KV_ROLES[member.role]}
    merged = {**launch.connector_config, **(extra or {})}
    if merged:
        config["kv_connector_extra_config"] = merged
    return config

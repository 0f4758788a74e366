"""The few names the emulator takes from the rest of dsv4-tune, imported in one place.

The performance model is :mod:`tuner.perfmodel` (imported by its path, as any user does); the node is a
hardware profile; the weights are a checkpoint of the catalog. Nothing else of the tuner's search room is
imported by the emulator, so when those modules move only this file changes.
"""

from __future__ import annotations

from tuner.search.checkpoints import Checkpoint, load_catalog, load_checkpoint
from tuner.search.feasibility import GIB
from tuner.search.profile import HardwareProfile, load_profile

__all__ = [
    "GIB",
    "Checkpoint",
    "HardwareProfile",
    "load_catalog",
    "load_checkpoint",
    "load_profile",
]

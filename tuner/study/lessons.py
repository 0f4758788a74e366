"""What launch failures teach beyond their own flags: a fault of the node, or a hard constraint on one lever value.

- **Node-level fault**: two launches fail with the same message (digits ignored) while the message names
  none of their lever values: a missing checkpoint, no device, a driver error, an unreachable hub. No
  other configuration would start either, so the study stops (:class:`~tuner.errors.NodeFaultError`)
  and points at ``dsv4-tune doctor``. Only the launches of the running session count, so ``resume``
  goes on once the cause is fixed; such failures never mark a base configuration as failed.
- **Lever constraint**: a deterministic start failure (``bad_flag``, ``assertion``) whose message
  names one lever value (the lever's flag or name, and the value), or the one vLLM's CPU build gives for
  FP8 KV without AVX-512. That value is refused before launch for the rest of the study. A cheap host
  probe predicts some before any launch (:func:`probed_constraints`). Hangs and timeouts may be
  transient and teach nothing here.

Constraints are rebuilt from the study's trials (so a resumed study and every worker agree) and
written to ``constraints.json`` in the study folder for ``status`` and the report.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuner import store
from tuner.failures import FailureClass
from tuner.search.profile import HardwareProfile

__all__ = ["CONSTRAINTS_FILE", "FP8_KV_CPU_MESSAGE", "LeverConstraint", "lever_named", "load_constraints",
           "node_fault_key", "probed_constraints", "write_constraints"]

CONSTRAINTS_FILE = "constraints.json"
FP8_KV_CPU_MESSAGE = "FP8 KV cache on CPU requires x86 with AVX-512 or AMX"
"""vLLM CPU's refusal of ``--kv-cache-dtype fp8`` on a host without AVX-512 (docs/decisions.md, issue 25)."""
DETERMINISTIC = frozenset({FailureClass.BAD_FLAG.value, FailureClass.ASSERTION.value})
"""Start failures that repeat with the same flags: they can name a lever value."""
NODE_FAULT_CLASSES = frozenset({FailureClass.BAD_FLAG.value, FailureClass.ASSERTION.value,
                                FailureClass.CRASH.value, FailureClass.NCCL.value})
"""Start failures whose repeated message, naming no lever value, is the node's (not a hang or a timeout)."""


@dataclass(frozen=True)
class LeverConstraint:
    lever: str
    value: str
    failure_class: str
    evidence: str
    """The log line (or probe result) that names the value."""
    trial: int | None = None
    """The trial whose failure taught it (None: a host probe, before any launch)."""

    def describe(self) -> str:
        source = f"trial {self.trial}" if self.trial is not None else "host probe"
        return f"{self.lever}={self.value} never launched ({self.failure_class}, {source}): {self.evidence}"


def _spellings(lever: str) -> set[str]:
    name = lever.rsplit(".", 1)[-1]
    return {lever, f"--{lever}", name, name.replace("-", "_"), lever.replace("-", "_")}


def lever_named(profile: HardwareProfile, params: Mapping[str, Any], failure_class: str,
                reason: str) -> LeverConstraint | None:
    """The lever value a deterministic start failure's message names, as a constraint; None if none or many."""
    if failure_class not in DETERMINISTIC:
        return None
    if FP8_KV_CPU_MESSAGE.lower() in reason.lower() and str(params.get("kv-cache-dtype", "")).startswith("fp8"):
        return LeverConstraint("kv-cache-dtype", str(params["kv-cache-dtype"]), failure_class, reason)
    text = reason.lower()
    named = []
    for lever, value in params.items():
        if lever not in profile.levers or isinstance(value, bool):
            continue
        shown = str(value).lower()
        if any(s.lower() in text for s in _spellings(lever)) and re.search(rf"(?<![\w.]){re.escape(shown)}(?![\w.])",
                                                                           text):
            named.append(LeverConstraint(lever, str(value), failure_class, reason))
    return named[0] if len(named) == 1 else None


def node_fault_key(failure_class: str, reason: str) -> str | None:
    """The message two launches must share to be one node fault (digits, addresses ignored); None: not one."""
    if failure_class not in NODE_FAULT_CLASSES or not reason:
        return None
    return re.sub(r"0x[0-9a-f]+|\d+", "#", reason.lower()).strip()


def probed_constraints(profile: HardwareProfile, cpu_flags: frozenset[str]) -> list[LeverConstraint]:
    """What a cheap probe of this host rules out before any launch: FP8 KV on a CPU without AVX-512/AMX."""
    from tuner.search.preflight import cpu_has_avx512

    out: list[LeverConstraint] = []
    lever = profile.levers.get("kv-cache-dtype")
    if profile.hardware.accelerator == "cpu" and lever is not None and not cpu_has_avx512(cpu_flags):
        for value in lever.choices or []:
            if str(value).startswith("fp8"):
                out.append(LeverConstraint("kv-cache-dtype", str(value), FailureClass.BAD_FLAG.value,
                                           f"this CPU has neither AVX-512 nor AMX (/proc/cpuinfo flags); vLLM CPU "
                                           f"says: {FP8_KV_CPU_MESSAGE}"))
    return out


def write_constraints(folder: Path, constraints: Iterable[LeverConstraint]) -> None:
    rows = [asdict(c) for c in constraints]
    store.write_text(folder / CONSTRAINTS_FILE, json.dumps(rows, indent=1, sort_keys=True) + "\n")


def load_constraints(folder: Path) -> list[LeverConstraint]:
    path = folder / CONSTRAINTS_FILE
    if not path.is_file():
        return []
    return [LeverConstraint(**row) for row in json.loads(path.read_text())]

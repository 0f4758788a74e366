"""Equivalence gate: a trial's numerics must match a trusted reference within calibrated drift.

Recording (one per probe): the server's prompt ids, its greedy completion ids, and — teacher-forced
through ``prompt_logprobs`` over prompt + completion (vLLM), or through ``n_probs`` over the completion
(llama-server, which scores no prompt token) — the logprob of every scored token with the top-k
alternatives by token id.

The first trusted launch of a study (not speculative, its args within ``reference_requires``, every
earlier gate of the suite passed) writes its recording as the study's reference, under
``<study>/reference/``. ``reference_requires`` is the hardware profile's reference numerics
(:func:`tuner.search.profile.reference_requires`: its fixed KV dtype, MoE backend and the like), put
into the spec by :func:`tuner.guards.load_suite`; the study queues the profile's recipe baselines
first, so the first of them that passes every other gate records it. Every trial, whatever its
numerics, is then compared with it: a KV dtype, MoE backend or quantization input other than the
reference's must stay within the drift thresholds. Every non-speculative trial also files its own
recording by config key, so a speculative trial is checked against its no-speculation control too.

A trial passes against a baseline recording when
- teacher-forced drift over the baseline's text (mean and largest |Δ logprob|) is within thresholds:
  exact text equality is not required, because vLLM is not batch-invariant;
- its greedy completion equals the baseline's, or leaves it only at a near-tie: where the baseline's
  logprobs of its own token and of the trial's token were within ``max_tie_gap_nats``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from tuner.guards.api import GuardKind, GuardResult, GuardTarget, ProbeFailure, SpecGuard
from tuner.guards.http import GuardClient
from tuner.guards.specs import StrictModel

__all__ = ["KIND", "Comparison", "EquivalenceGuard", "EquivalenceProbe", "EquivalenceSpec", "EquivalenceThresholds",
           "ProbeRecording", "compare", "reference_dir"]

log = logging.getLogger(__name__)

REFERENCE_DIR = "reference"


class EquivalenceProbe(StrictModel):
    name: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    max_tokens: int = Field(default=16, ge=1)


class EquivalenceThresholds(StrictModel):
    """Drift, in nats, of teacher-forced logprobs against the reference (calibrated: docs/guards.md)."""

    max_mean_drift_nats: float = Field(ge=0)
    """Mean |Δ logprob| per scored token, over all probes."""
    max_token_drift_nats: float = Field(ge=0)
    """Largest |Δ logprob| of any single token."""
    max_tie_gap_nats: float = Field(ge=0)
    """Greedy output may leave the reference only where the reference's top two were this close."""


class EquivalenceSpec(StrictModel):
    kind: Literal["equivalence"]
    description: str = ""
    timeout_s: float = Field(default=120.0, gt=0)
    probes: list[EquivalenceProbe] = Field(min_length=1)
    thresholds: EquivalenceThresholds
    top_logprobs: int = Field(default=5, ge=2, le=20)
    reference_requires: dict[str, list[Any]] | None = None
    """Only a trial whose args take one of these values may record the reference (absent arg = null;
    a dotted name reads inside a JSON option). Unset in the shipped file: the hardware profile's reference
    numerics fill it (:func:`tuner.guards.load_suite`); set here, it wins over the profile's."""
    reference_source: str = ""
    """Where ``reference_requires`` came from (set by :func:`tuner.guards.load_suite`), for messages."""


@dataclass(frozen=True)
class ProbeRecording:
    name: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    """Teacher-forced logprob of token i+1 of prompt + completion (the first token has none)."""
    top: list[dict[str, float]]
    """Top-k alternatives (token id as a string → logprob) at the same positions."""
    scored_from: int = 0
    """The first scored index of ``logprobs``: 0 where the server scores prompt tokens (vLLM's
    ``prompt_logprobs``), the prompt's last index where it scores only what it generates (llama-server)."""

    @property
    def sequence(self) -> list[int]:
        return [*self.prompt_ids, *self.completion_ids]


@dataclass(frozen=True)
class Comparison:
    """Drift of one recording against a baseline; the sign of the house: ≤ threshold passes."""

    mean_drift_nats: float
    max_drift_nats: float
    scored_tokens: int
    greedy_diverged: list[dict[str, Any]]
    worst_tie_gap_nats: float
    outside_top_k: int = 0
    """Divergences to a token the baseline did not even rank in its top-k (never a near-tie)."""

    def problems(self, spec: EquivalenceSpec) -> list[str]:
        t = spec.thresholds
        out = []
        if self.mean_drift_nats > t.max_mean_drift_nats:
            out.append(f"mean drift {self.mean_drift_nats:.4f} nats/token > {t.max_mean_drift_nats}")
        if self.max_drift_nats > t.max_token_drift_nats:
            out.append(f"largest token drift {self.max_drift_nats:.4f} nats > {t.max_token_drift_nats}")
        if self.worst_tie_gap_nats > t.max_tie_gap_nats:
            out.append(f"greedy output left the baseline where its top choice led by "
                       f"{self.worst_tie_gap_nats:.4f} nats > {t.max_tie_gap_nats}")
        if self.outside_top_k:
            out.append(f"greedy output left the baseline for a token outside its top-{spec.top_logprobs} "
                       f"in {self.outside_top_k} probe(s)")
        return out


def reference_dir(study_dir: Path) -> Path:
    return study_dir / REFERENCE_DIR


class EquivalenceGuard(SpecGuard[EquivalenceSpec]):
    kind = "equivalence"
    runs_last = True
    """It may record the study's reference, which only a trial that passed every other gate may do."""

    def __init__(self, name: str, spec: EquivalenceSpec) -> None:
        super().__init__(name, spec)
        blob = json.dumps([p.model_dump() for p in spec.probes] + [spec.top_logprobs], sort_keys=True)
        self.probes_hash = hashlib.sha256(blob.encode()).hexdigest()[:12]

    def reference_path(self, study_dir: Path) -> Path:
        return reference_dir(study_dir) / f"{self.name}-{self.probes_hash}.json"

    def config_path(self, study_dir: Path, config_key: str) -> Path:
        return reference_dir(study_dir) / "configs" / f"{self.name}-{self.probes_hash}-{config_key}.json"

    def run(self, target: GuardTarget, *, may_record: bool | None = None) -> GuardResult:
        """``may_record`` (default: ``target.earlier_gates_passed``) lets this trial record the reference."""
        if may_record is None:
            may_record = target.earlier_gates_passed
        evidence: dict[str, Any] = {}
        try:
            with GuardClient(target, self.spec.timeout_s) as client:
                own = [record_probe(client, p, self.spec.top_logprobs) for p in self.spec.probes]
                key = _config_key(target)
                evidence["config_key"] = key
                if not target.is_speculative:
                    _write(self.config_path(target.study_dir, key), _recording_doc(own, target, key))
                baselines = self._baselines(target, own, may_record, evidence)
                if isinstance(baselines, GuardResult):
                    return baselines
                failures: list[str] = []
                for label, baseline in baselines:
                    comparison = self._compare_live(client, own, baseline)
                    evidence[f"vs_{label}"] = asdict(comparison)
                    failures += [f"vs {label}: {p}" for p in comparison.problems(self.spec)]
        except ProbeFailure as exc:
            return GuardResult(self.name, self.kind, False, str(exc), evidence)
        if failures:
            return GuardResult(self.name, self.kind, False, "; ".join(failures), evidence)
        summary = ", ".join(f"{label} mean {evidence[f'vs_{label}']['mean_drift_nats']:.4f} "
                            f"max {evidence[f'vs_{label}']['max_drift_nats']:.4f} nats" for label, _ in baselines)
        return GuardResult(self.name, self.kind, True, f"within drift thresholds ({summary})", evidence)

    def _baselines(self, target: GuardTarget, own: list[ProbeRecording], may_record: bool,
                   evidence: dict[str, Any]) -> list[tuple[str, list[ProbeRecording]]] | GuardResult:
        ref_path = self.reference_path(target.study_dir)
        reference = _load(ref_path)
        if reference is None:
            why_not = self._untrusted_reason(target, may_record)
            if why_not is None and _write(ref_path, _recording_doc(own, target, _config_key(target)),
                                          exclusive=True):
                evidence["recorded_reference"] = str(ref_path)
                return GuardResult(self.name, self.kind, True, f"recorded the study's reference at {ref_path}",
                                   evidence)
            reference = _load(ref_path)  # another worker may have won the race
            if reference is None:
                return GuardResult(self.name, self.kind, False, self._no_reference(why_not), evidence)
        evidence["reference"] = str(ref_path)
        baselines: list[tuple[str, list[ProbeRecording]]] = [("reference", reference)]
        if target.is_speculative and target.control_key:
            control_path = self.config_path(target.study_dir, target.control_key)
            control = _load(control_path)
            evidence["control"] = str(control_path) if control is not None else None
            if control is not None:
                baselines.append(("control", control))
        return baselines

    def _untrusted_reason(self, target: GuardTarget, may_record: bool) -> str | None:
        if target.is_speculative:
            return "a speculative trial is never a reference"
        if not may_record:
            return "an earlier gate of this trial failed"
        for arg, allowed in (self.spec.reference_requires or {}).items():
            value = _arg(target.args, arg)
            if value not in allowed:
                return f"--{arg}={value!r} is not the reference numerics' {_spell(allowed)}"
        return None

    def _no_reference(self, why_not: str | None) -> str:
        requires = self.spec.reference_requires or {}
        numerics = ", ".join(f"{arg} {_spell(allowed)}" for arg, allowed in requires.items())
        source = f" ({self.spec.reference_source})" if self.spec.reference_source else ""
        return (f"no reference to compare with yet, and this trial may not record it: {why_not}. The reference is "
                f"recorded by the first launch that passes every other gate with no speculation"
                + (f" under the reference numerics{source}: {numerics}" if numerics else "")
                + ". Fix: the study queues the hardware profile's recipe baselines first, and one of them records "
                "it; if none did, read why in their trials/<n>/outcome.json (a gate or the launch failed), or set "
                "guards.reference in the hardware profile to numerics a passing launch uses")

    def _compare_live(self, client: GuardClient, own: list[ProbeRecording],
                      baseline: list[ProbeRecording]) -> Comparison:
        by_name = {r.name: r for r in own}
        teacher: list[list[float]] = []
        for base in baseline:
            mine = by_name.get(base.name)
            if mine is None:
                raise ProbeFailure(f"probe {base.name} of the baseline was not recorded by this trial")
            if mine.sequence == base.sequence:
                teacher.append(mine.logprobs)
            else:
                teacher.append(client.teacher_forced(base.sequence, self.spec.top_logprobs, base.scored_from)[0])
        return compare(own, baseline, teacher)


KIND = GuardKind("equivalence", EquivalenceSpec, EquivalenceGuard)


def compare(own: Sequence[ProbeRecording], baseline: Sequence[ProbeRecording],
            teacher: Sequence[Sequence[float]]) -> Comparison:
    """Drift of ``teacher`` (this trial's logprobs over each baseline sequence) and greedy divergence."""
    diffs: list[float] = []
    diverged: list[dict[str, Any]] = []
    worst_gap = 0.0
    by_name = {r.name: r for r in own}
    for base, lps in zip(baseline, teacher, strict=True):
        if len(lps) != len(base.logprobs):
            raise ProbeFailure(f"probe {base.name}: {len(lps)} teacher-forced logprobs, baseline has "
                               f"{len(base.logprobs)}")
        start = max(base.scored_from, by_name[base.name].scored_from)
        diffs += [abs(a - b) for a, b in zip(lps[start:], base.logprobs[start:], strict=True)]
        mine = by_name[base.name]
        if mine.prompt_ids != base.prompt_ids:
            raise ProbeFailure(f"probe {base.name}: the server tokenized the prompt differently from the baseline")
        gap = _divergence_gap(mine, base)
        if gap is not None:
            diverged.append({"probe": base.name, **gap})
            worst_gap = max(worst_gap, float(gap["tie_gap_nats"]))
    mean = sum(diffs) / len(diffs) if diffs else 0.0
    outside = sum(1 for d in diverged if d["gap_is_lower_bound"])
    return Comparison(round(mean, 6), round(max(diffs, default=0.0), 6), len(diffs), diverged, round(worst_gap, 6),
                      outside)


def _divergence_gap(mine: ProbeRecording, base: ProbeRecording) -> dict[str, Any] | None:
    """Where this greedy completion first leaves the baseline's, and how close the baseline's choice was."""
    for j, (a, b) in enumerate(zip(mine.completion_ids, base.completion_ids, strict=False)):
        if a == b:
            continue
        pos = len(base.prompt_ids) + j - 1  # index into logprobs/top (they start at token 1)
        own_lp = base.logprobs[pos]
        alternatives = base.top[pos]
        if str(a) in alternatives:
            gap, exact = own_lp - alternatives[str(a)], True
        else:  # not in the baseline's top-k: at least this far behind
            gap, exact = own_lp - min(alternatives.values(), default=own_lp), False
        return {"position": j, "baseline_token": b, "trial_token": a, "tie_gap_nats": max(gap, 0.0),
                "gap_is_lower_bound": not exact}
    if len(mine.completion_ids) != len(base.completion_ids):
        return {"position": min(len(mine.completion_ids), len(base.completion_ids)), "baseline_token": None,
                "trial_token": None, "tie_gap_nats": 0.0, "gap_is_lower_bound": False, "note": "lengths differ"}
    return None


# ---------------------------------------------------------------- talking to the server


def record_probe(client: GuardClient, probe: EquivalenceProbe, top_k: int) -> ProbeRecording:
    """The server's prompt ids, its greedy completion (its own decoding path, drafting included), and the
    teacher-forced logprobs over them (:meth:`GuardClient.teacher_forced`, in the server's dialect)."""
    prompt_ids = client.tokenize_text(probe.prompt)
    if not prompt_ids:
        raise ProbeFailure(f"probe {probe.name}: the server tokenized the prompt to nothing")
    completion_ids = client.greedy_ids(prompt_ids, probe.max_tokens)
    if not completion_ids:
        raise ProbeFailure(f"probe {probe.name}: the server generated no tokens")
    scored_from = len(prompt_ids) - 1 if client.llamacpp else 0
    logprobs, top = client.teacher_forced([*prompt_ids, *completion_ids], top_k, scored_from)
    return ProbeRecording(probe.name, prompt_ids, completion_ids, logprobs, top, scored_from)


# ---------------------------------------------------------------- files


def _arg(args: Mapping[str, Any], name: str) -> Any:
    """The value of option ``name`` in ``args`` (a dotted name reads inside a JSON option); None when unset."""
    if name in args:
        return args[name]
    head, _, rest = name.partition(".")
    inner = args.get(head)
    return _arg(inner, rest) if rest and isinstance(inner, Mapping) else None


def _spell(allowed: Sequence[Any]) -> str:
    shown = [v for v in allowed if v is not None]
    unset = " (or unset)" if None in allowed else ""
    return (f"{shown[0]!r}" if len(shown) == 1 else f"one of {shown!r}") + unset if shown else "unset"


def _config_key(target: GuardTarget) -> str:
    """``ServeConfig.key()`` of this trial, as trial.py wrote it to config.json (else a hash of the args)."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        key = json.loads((target.trial_dir / "config.json").read_text(encoding="utf-8")).get("key")
        if isinstance(key, str) and key:
            return key
    blob = json.dumps({"args": dict(target.args)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _recording_doc(recordings: Sequence[ProbeRecording], target: GuardTarget, key: str) -> dict[str, Any]:
    return {"config_key": key, "trial_dir": str(target.trial_dir), "args": dict(target.args),
            "speculative": target.is_speculative, "probes": [asdict(r) for r in recordings]}


def _load(path: Path) -> list[ProbeRecording] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return [ProbeRecording(**p) for p in doc["probes"]]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ProbeFailure(f"reference {path} is unreadable ({exc}). Fix: delete it to record a new one") from exc


def _write(path: Path, doc: Mapping[str, Any], *, exclusive: bool = False) -> bool:
    """Write atomically; with ``exclusive``, only if no file is there yet (first writer wins)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
        else:
            os.replace(tmp, path)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)

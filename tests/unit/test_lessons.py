"""What a failed launch teaches (issue 25): a node fault ends the session, a named lever value becomes a constraint.

Synthetic launches (``tuner.study.step.run_trial`` replaced: the failures a real server cannot be made
to show on demand here, named as such) on the real study machinery: the cpu profile, constrained TPE,
real SQLite storage. The host probe (``tuner.search.preflight.ACTIVE_PROBE``) is injected.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tuner.search.preflight as preflight
import tuner.study.step as step_mod
from tests.conftest import synthetic_record
from tuner.errors import NodeFaultError
from tuner.objective import constraint_names
from tuner.search.space import ServeConfig
from tuner.study import Study
from tuner.study.lessons import CONSTRAINTS_FILE, FP8_KV_CPU_MESSAGE, load_constraints
from tuner.trial import TrialContext, TrialOutcome

AVX512 = frozenset({"sse4_2", "avx2", "avx512f", "avx512bw"})
NO_AVX512 = frozenset({"sse4_2", "avx2"})
Node = Callable[[ServeConfig], tuple[str | None, str]]
"""config → (failure class or None, reason)."""


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Callable[[Node, frozenset[str]], list[ServeConfig]]:
    def install(behaviour: Node, flags: frozenset[str]) -> list[ServeConfig]:
        seen: list[ServeConfig] = []
        monkeypatch.setattr(preflight, "ACTIVE_PROBE", preflight.HostProbe(cpu_flags=lambda: flags))

        def fake_run_trial(ctx: TrialContext, config: ServeConfig, tdir: Path, **_: Any) -> TrialOutcome:
            seen.append(config)
            failure, reason = behaviour(config)
            tdir.mkdir(parents=True, exist_ok=True)
            ok = failure is None
            value = float(config.args.get("max-num-seqs", 1)) if ok else 0.0
            return TrialOutcome(ok=ok, value=value, constraints=tuple(-1.0 if ok else 1.0
                                                                      for _ in constraint_names(ctx.objective)),
                                failure_class=failure, reason=reason, summary={"output_throughput": value},
                                server_metrics={}, ready_s=1.0 if ok else None, duration_s=5.0,
                                trial_dir=str(tdir), config_key=config.key())

        monkeypatch.setattr(step_mod, "run_trial", fake_run_trial)
        return seen

    return install


def _study(tmp_path: Path, trials: int, name: str = "night") -> Study:
    return Study.create(synthetic_record(tmp_path, name=name, trials=trials, seed=3), tmp_path / "runs")


def _fp8(config: ServeConfig) -> bool:
    return str(config.params.get("kv-cache-dtype")) == "fp8"


def test_without_avx512_the_cpu_study_never_launches_fp8_kv(tmp_path: Path, node: Any) -> None:
    seen = node(lambda c: (None, "ok"), NO_AVX512)
    study = _study(tmp_path, trials=8)
    study.run()
    assert len(seen) >= 6
    assert not any(_fp8(c) for c in seen)
    learned = load_constraints(study.path)
    assert [(c.lever, c.value, c.trial) for c in learned] == [("kv-cache-dtype", "fp8", None)]
    assert "AVX-512" in learned[0].evidence


def test_with_avx512_one_rejection_teaches_the_constraint(tmp_path: Path, node: Any) -> None:
    def engine(config: ServeConfig) -> tuple[str | None, str]:  # an engine that rejects FP8 KV on this host
        if _fp8(config):
            return "bad_flag", f"engine rejected a flag: ValueError: {FP8_KV_CPU_MESSAGE}"
        return None, "ok"

    seen = node(engine, AVX512)
    study = _study(tmp_path, trials=12)
    study.run()
    assert sum(_fp8(c) for c in seen) == 1, [c.params for c in seen]
    learned = load_constraints(study.path)
    assert [(c.lever, c.value) for c in learned] == [("kv-cache-dtype", "fp8")]
    assert learned[0].trial is not None and FP8_KV_CPU_MESSAGE in learned[0].evidence
    report = (study.path / "report.md")
    from tuner.report import write_report

    write_report(study)
    assert "kv-cache-dtype=fp8" in report.read_text() and FP8_KV_CPU_MESSAGE in report.read_text()


def test_a_named_lever_value_becomes_a_constraint(tmp_path: Path, node: Any) -> None:
    def engine(config: ServeConfig) -> tuple[str | None, str]:
        if config.params.get("block-size") == 32:
            return "bad_flag", "engine rejected a flag: --block-size 32 is not supported by this attention backend"
        return None, "ok"

    seen = node(engine, AVX512)
    study = _study(tmp_path, trials=10)
    study.run()
    assert sum(c.params.get("block-size") == 32 for c in seen) == 1
    assert [(c.lever, c.value) for c in load_constraints(study.path)] == [("block-size", "32")]


def test_a_node_fault_stops_after_two_launches_and_resume_goes_on(tmp_path: Path, node: Any) -> None:
    broken = [True]
    message = "exit code 1; last log line: OSError: /models/dsv4/config.json: Permission denied"

    def host(config: ServeConfig) -> tuple[str | None, str]:
        return ("crash", message) if broken[0] else (None, "ok")

    seen = node(host, AVX512)
    study = _study(tmp_path, trials=6)
    with pytest.raises(NodeFaultError, match="Permission denied") as stop:
        study.run()
    assert "dsv4-tune doctor" in str(stop.value)
    assert len(seen) == 2 and seen[0].key() != seen[1].key(), [c.params for c in seen]
    assert json.loads((study.path / CONSTRAINTS_FILE).read_text()) == []  # the node's fault, not a lever's
    broken[0] = False  # the fix
    resumed = Study.open("night", tmp_path / "runs")
    resumed.run()
    assert len(seen) >= 6  # the two failed configurations are not refused as failed bases

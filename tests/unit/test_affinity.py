"""tuner/load/affinity.py: the core split between server and client, and that it reaches real processes."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
from pathlib import Path

import pytest

from tuner.engines.process import LaunchSpec, ServerProcess, free_port
from tuner.engines.vllm import OMP_BIND_ENV, local_ranks, omp_bind_env
from tuner.load.affinity import CpuSplit, available_cpus, format_cpu_list, pinned, plan_cpu_split
from tuner.search.profile import load_profile

two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to split")


def test_the_last_cores_go_to_the_client() -> None:
    split = plan_cpu_split(1, bind_omp=True, available=[3, 0, 2, 1])
    assert split == CpuSplit(server=(0, 1, 2), client=(3,), bind_omp=True)
    assert plan_cpu_split(2, bind_omp=False, available=[0, 1, 2, 3]) == CpuSplit(server=(0, 1), client=(2, 3))


def test_no_split_without_a_core_left_for_the_server_or_when_not_asked(caplog: pytest.LogCaptureFixture) -> None:
    assert plan_cpu_split(1, bind_omp=True, available=[0]) is None
    assert "share" in caplog.text
    assert plan_cpu_split(0, bind_omp=True, available=[0, 1]) is None


def test_no_split_where_the_os_cannot_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_setaffinity")
    assert plan_cpu_split(1, bind_omp=True, available=[0, 1]) is None


def test_omp_binding_has_one_core_list_per_rank() -> None:
    split = CpuSplit(server=(0, 1, 2, 3, 4), client=(5,), bind_omp=True)
    assert omp_bind_env(split) == {OMP_BIND_ENV: "0-4"}
    assert omp_bind_env(split, ranks=2) == {OMP_BIND_ENV: "0-1|2-3"}
    assert omp_bind_env(split, ranks=6) == {}  # more ranks than cores: vLLM's auto binding decides
    assert omp_bind_env(dataclasses.replace(split, bind_omp=False)) == {}


def test_cpu_lists_use_the_taskset_syntax() -> None:
    assert format_cpu_list([5, 0, 1, 2]) == "0-2,5"
    assert format_cpu_list([3]) == "3"
    assert format_cpu_list([1, 3, 5]) == "1,3,5"


def test_local_ranks_multiplies_the_parallel_sizes() -> None:
    assert local_ranks({}) == 1
    assert local_ranks({"tensor-parallel-size": 2, "data-parallel-size": 2}) == 4
    assert local_ranks({"tensor-parallel-size": "2"}) == 1  # not an int: not a rank count


@two_cores
def test_pinned_narrows_this_thread_only_and_restores() -> None:
    before = os.sched_getaffinity(0)
    seen: dict[str, set[int]] = {}
    target = available_cpus()[-1]
    with pinned([target]):
        seen["inside"] = os.sched_getaffinity(0)
        other = threading.Thread(target=lambda: seen.__setitem__("started_inside", os.sched_getaffinity(0)))
        other.start()
        other.join()
    assert seen["inside"] == {target} and seen["started_inside"] == {target}
    assert os.sched_getaffinity(0) == before
    with pinned(None):
        assert os.sched_getaffinity(0) == before


@two_cores
def test_a_server_started_with_cpus_keeps_them_and_the_caller_does_not(tmp_path: Path) -> None:
    """A real child process: its affinity (and its children's) is the spec's, the tuner's is unchanged."""
    before = os.sched_getaffinity(0)
    server_core = available_cpus()[0]
    out = tmp_path / "affinity.json"
    code = ("import json, os, subprocess, sys, time\n"
            "kid = subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'],"
            " capture_output=True, text=True).stdout.strip()\n"
            f"open({str(out)!r}, 'w').write(json.dumps({{'own': sorted(os.sched_getaffinity(0)), 'kid': kid}}))\n"
            "time.sleep(600)\n")
    port = free_port("127.0.0.1")
    spec = LaunchSpec(argv=[sys.executable, "-c", code], env={}, host="127.0.0.1", port=port,
                      workdir=tmp_path / "trial", ready_timeout_s=5, cpus=(server_core,))
    with ServerProcess(spec):
        assert os.sched_getaffinity(0) == before
        for _ in range(200):
            if out.exists() and out.read_text():
                break
            threading.Event().wait(0.05)
        seen = json.loads(out.read_text())
    assert seen == {"own": [server_core], "kid": str([server_core])}


def test_the_cpu_profile_keeps_a_core_for_the_client() -> None:
    assert load_profile("cpu").server.client_cpus == 1
    assert load_profile("h200x8").server.client_cpus == 0

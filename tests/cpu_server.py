"""The one vLLM CPU server that the load tests share, and how to launch it.

Several integration tests only need *a* real vLLM server serving the demo model with prefix caching on:
the prompt-freshness windows, the load generator's cross-check against ``vllm bench serve``, the ladder,
the shipped throughput objective and ``ClientPool``. Each used to launch its own (a launch costs 30-90 s
on the 2-core machine). ``tests/integration/conftest.py`` launches this one once for all of them, runs
them back to back and stops it after the last; ``benchmarks/bench_loadgen_crosscheck.py`` launches the
same server for the committed cross-check data, so the test's bound and its data describe one setup.

Every test on it draws its prompts from its own seed (:meth:`SharedServer.seed`), so no test re-sends
another's prompt and each window can be checked for prefix-cache hits.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.engines import default_engine
from tuner.engines.process import LaunchSpec, ServerProcess, free_port
from tuner.load.affinity import CpuSplit, plan_cpu_split

SERVED = "demo"
# Prefix caching on (vLLM's default, stated) with 32-token blocks: a re-sent 128-token prompt hits 3 of
# its 4 blocks, so a window that re-sends prompts shows in vllm:prefix_cache_hits.
ARGS: dict[str, Any] = {"max-model-len": 1024, "enforce-eager": True, "dtype": "bfloat16", "max-num-seqs": 32,
                        "block-size": 32, "enable-prefix-caching": True}
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "120"}
READY_TIMEOUT_S = 600.0   # a generous deadline: a start takes 30-90 s here, more on a loaded machine
# Seeds below this are the tests' own fixed ones (test_freshness uses 0); shared-server users draw above.
_FIRST_SEED = 10_000


def cpu_split() -> CpuSplit | None:
    """The server on every core but the last, the clients on the last (``server.client_cpus: 1``)."""
    return plan_cpu_split(1, bind_omp=True)


def launch_spec(cli: str, model: Path, workdir: Path, *, port: int | None = None) -> LaunchSpec:
    engine = default_engine()
    split = cpu_split()
    port = port or free_port()
    return LaunchSpec(argv=[cli, "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
                            "--served-model-name", SERVED, *engine.flags(ARGS)],
                      env={**ENV, **engine.server_env(split, ARGS)},
                      host="127.0.0.1", port=port, workdir=workdir, ready_timeout_s=READY_TIMEOUT_S,
                      cpus=split.server if split else None)


def vocab_size(model: Path) -> int:
    return int(json.loads((model / "config.json").read_text())["vocab_size"])


@dataclass
class SharedServer:
    """A running server, the model it serves, and a source of seeds no other user of it draws."""

    proc: ServerProcess
    model: Path
    split: CpuSplit | None
    _next_seed: int = _FIRST_SEED
    _lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: bool = False

    @property
    def base_url(self) -> str:
        return self.proc.base_url

    @property
    def vocab_size(self) -> int:
        return vocab_size(self.model)

    def seed(self) -> int:
        """A prompt seed no earlier user of this server was given (its prompts are new to the cache)."""
        with self._lock:
            seed = self._next_seed
            self._next_seed += 1
            return seed

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.proc.stop()


def start(cli: str, model: Path, workdir: Path) -> SharedServer:
    proc = ServerProcess(launch_spec(cli, model, workdir))
    proc.start()
    try:
        proc.wait_ready()
    except BaseException:
        proc.stop()
        raise
    return SharedServer(proc=proc, model=model, split=cpu_split())

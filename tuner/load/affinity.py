"""Keep the load generator off the server's cores.

On a small host the vLLM CPU build's OpenMP threads spin on every core, and a client that shares
those cores is descheduled for up to 2 s at a time: its event loop stalls, the window stretches,
and the measured throughput halves with no change on the server (docs/loadgen.md, "Client
isolation"). A hardware profile's ``server.client_cpus`` reserves that many cores for the client and
the guards; the server is started on the rest (its threads bound there where the engine can bind
them: ``Engine.server_env``, vLLM-CPU's OpenMP binding).

Linux affinity is per thread and inherited by threads and processes created afterwards, so
:func:`pinned` narrows only the calling thread for the duration of a block: a server started (or a
client process spawned) inside the block keeps the narrowed set for its whole life.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CpuSplit:
    """Which cores the server gets and which the client gets; the two never overlap."""

    server: tuple[int, ...]
    client: tuple[int, ...]
    bind_omp: bool = False
    """Also bind the server's own threads to ``server`` (the engine's ``server_env``; OpenMP on vLLM-CPU)."""

    def to_json(self) -> dict[str, Any]:
        return {"server": list(self.server), "client": list(self.client), "bind_omp": self.bind_omp}


def available_cpus() -> tuple[int, ...]:
    """The cores this thread may run on, in order."""
    return tuple(sorted(os.sched_getaffinity(0)))


def plan_cpu_split(client_cpus: int, *, bind_omp: bool,
                   available: Sequence[int] | None = None) -> CpuSplit | None:
    """Reserve the last ``client_cpus`` cores for the client; ``None`` when there is nothing to split.

    A host with no core left for the server after the reservation gets no split (and a warning):
    measuring on a shared core is noisy, but refusing to run would be worse.
    """
    if client_cpus <= 0:
        return None
    if not hasattr(os, "sched_setaffinity"):  # not Linux: no per-thread affinity to set
        log.warning("cpu split: this OS cannot pin threads to cores; client and server will share")
        return None
    cores = tuple(sorted(available)) if available is not None else available_cpus()
    if len(cores) <= client_cpus:
        log.warning("cpu split: %d core(s) available, %d asked for the client; client and server will share",
                    len(cores), client_cpus)
        return None
    return CpuSplit(server=cores[:-client_cpus], client=cores[-client_cpus:], bind_omp=bind_omp)


def format_cpu_list(cores: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0-2,5"`` (the syntax of taskset and VLLM_CPU_OMP_THREADS_BIND)."""
    parts: list[str] = []
    ordered = sorted(cores)
    start = prev = ordered[0]
    for core in [*ordered[1:], None]:
        if core is not None and core == prev + 1:
            prev = core
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if core is not None:
            start = prev = core
    return ",".join(parts)


@contextlib.contextmanager
def pinned(cores: Sequence[int] | None) -> Iterator[None]:
    """Run the block (and whatever it starts) on ``cores`` only; ``None`` changes nothing."""
    if not cores:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cores))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)

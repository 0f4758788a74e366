"""Several load-generator processes acting as one client.

One Python process parses a bounded number of streamed chunks per second (``docs/loadgen.md``);
a node serving thousands of streams needs more. A :class:`ClientPool` starts ``processes`` workers
once (``spawn``: no state inherited from the tuner's threads) and, for each window, splits the
concurrency between them. Job numbers come from one counter shared by all of them, so the window
sends exactly the planned jobs in order, whichever worker is free first; with a request rate each
worker paces its share (a sum of independent Poisson streams is Poisson). All workers start at one
``time.perf_counter`` instant (``CLOCK_MONOTONIC``, the same in every process on Linux), so their
records share one time axis. Records come back as they complete, so the ladder's early stop works
the same as in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable
from typing import Any

from tuner.errors import LoadError
from tuner.load.generator import (
    Backend,
    LoadResult,
    RequestRecord,
    WindowPlan,
    available_backend,
    combine_client_stats,
    run_window,
)
from tuner.objective import Workload

__all__ = ["ClientPool", "auto_processes"]

logger = logging.getLogger(__name__)

_START_DELAY_S = 0.3
_READY_TIMEOUT_S = 60.0
_POLL_S = 0.05


def auto_processes(concurrency: int, streams_per_process: int) -> int:
    """Workers for ``concurrency`` streams: one per ``streams_per_process``, at most one per spare core."""
    spare = max(1, (os.cpu_count() or 2) - 1)
    return max(1, min(spare, math.ceil(concurrency / streams_per_process)))


def _worker_main(worker: int, settings: dict[str, Any], commands: Any, results: Any,
                 counter: Any, stop: Any) -> None:
    """One worker: run each window it is told to, stream its records back, report when done."""
    logging.basicConfig(level=settings.get("log_level", logging.WARNING))
    workload = Workload.model_validate(settings["workload"])
    results.put(("ready", worker, None))
    while True:
        command = commands.get()
        if command is None:
            return
        plan, end, t0, rate_scale = command

        def take(end: int = end) -> int | None:
            with counter.get_lock():
                index = int(counter.value)
                if index >= end:
                    return None
                counter.value = index + 1
                return index

        raws: list[dict[str, Any]] = []
        try:
            if plan.concurrency > 0:
                result = asyncio.run(run_window(
                    settings["base_url"], settings["model"], workload, plan, vocab_size=settings["vocab_size"],
                    api_key=settings["api_key"], request_timeout_s=settings["request_timeout_s"],
                    should_stop=stop.is_set, on_record=lambda r: results.put(("record", worker, r)),
                    backend=settings["backend"], take=take, rate_scale=rate_scale, t0=t0, watch_raw=raws))
                results.put(("done", worker, {"duration_s": result.duration_s, "stopped": result.stopped,
                                              "watch": raws[0] if raws else None}))
            else:
                results.put(("done", worker, {"duration_s": 0.0, "stopped": False, "watch": None}))
        except Exception as exc:  # report, never hang the parent
            results.put(("error", worker, f"{type(exc).__name__}: {exc}"))


class ClientPool:
    """``processes`` load-generator workers; use as a context manager or ``start()``/``close()``."""

    def __init__(self, processes: int, *, base_url: str, model: str, workload: Workload, vocab_size: int,
                 api_key: str | None = None, request_timeout_s: float = 600.0, backend: Backend = "auto") -> None:
        if processes < 1:
            raise LoadError(f"a client pool needs at least one process, got {processes}")
        self.processes = processes
        self.backend = available_backend(backend)
        self._ctx = mp.get_context("spawn")
        self._settings = {"base_url": base_url, "model": model, "workload": workload.model_dump(),
                          "vocab_size": vocab_size, "api_key": api_key, "request_timeout_s": request_timeout_s,
                          "backend": self.backend, "log_level": logging.getLogger().level or logging.WARNING}
        self._workload = workload
        self._results: Any = self._ctx.Queue()
        self._commands: list[Any] = [self._ctx.Queue() for _ in range(processes)]
        self._counter: Any = self._ctx.Value("q", 0)
        self._stop: Any = self._ctx.Event()
        self._procs: list[Any] = []

    def start(self) -> None:
        for i in range(self.processes):
            proc = self._ctx.Process(target=_worker_main, name=f"loadgen-{i}", daemon=True,
                                     args=(i, self._settings, self._commands[i], self._results,
                                           self._counter, self._stop))
            proc.start()
            self._procs.append(proc)
        ready = 0
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while ready < self.processes:
            try:
                kind, _, _ = self._results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty as exc:
                self.close()
                raise LoadError(f"load-generator workers not ready after {_READY_TIMEOUT_S:.0f} s") from exc
            if kind == "ready":
                ready += 1
        logger.info("client pool: %d load-generator processes (%s)", self.processes, self.backend)

    def run_window(self, plan: WindowPlan, *, should_stop: Callable[[], bool] | None = None,
                   on_record: Callable[[RequestRecord], None] | None = None) -> LoadResult:
        """Send one window's jobs from every worker; records come back in job order."""
        with self._counter.get_lock():
            self._counter.value = plan.first_job
        self._stop.clear()
        shares = [plan.concurrency // self.processes + (1 if i < plan.concurrency % self.processes else 0)
                  for i in range(self.processes)]
        active = sum(1 for s in shares if s > 0)
        t0 = time.perf_counter() + _START_DELAY_S
        for i, share in enumerate(shares):
            worker_plan = WindowPlan(plan.first_job, plan.jobs, share, plan.request_rate, plan.warmup)
            self._commands[i].put((worker_plan, plan.first_job + plan.jobs, t0, 1.0 / active))
        records: list[RequestRecord] = []
        done: dict[int, dict[str, Any]] = {}
        errors: list[str] = []
        stopped = False
        while len(done) + len(errors) < self.processes:
            if not stopped and should_stop is not None and should_stop():
                stopped = True
                self._stop.set()
            try:
                kind, worker, payload = self._results.get(timeout=_POLL_S)
            except queue.Empty:
                if any(not p.is_alive() for p in self._procs):
                    raise LoadError("a load-generator worker died during a window") from None
                continue
            if kind == "record":
                records.append(payload)
                if on_record is not None:
                    on_record(payload)
            elif kind == "done":
                done[worker] = payload
            elif kind == "error":
                errors.append(payload)
        # Records put just before "done" may still be in the queue.
        while True:
            try:
                kind, _, payload = self._results.get_nowait()
            except queue.Empty:
                break
            if kind == "record":
                records.append(payload)
                if on_record is not None:
                    on_record(payload)
        if errors:
            raise LoadError(f"load-generator worker failed: {errors[0]}")
        raws = [d["watch"] for d in done.values() if d.get("watch") is not None]
        records.sort(key=lambda r: (r.job, r.turn))
        return LoadResult(records=tuple(records), duration_s=max((d["duration_s"] for d in done.values()), default=0.0),
                          concurrency=plan.concurrency, request_rate=plan.request_rate,
                          stopped=stopped or any(d["stopped"] for d in done.values()),
                          client=combine_client_stats(raws, self.backend) if raws else None)

    def close(self) -> None:
        for commands in self._commands:
            with contextlib.suppress(OSError, ValueError):
                commands.put(None)
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        self._procs = []

    def __enter__(self) -> ClientPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

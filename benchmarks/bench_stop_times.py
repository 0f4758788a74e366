"""How long the tool takes to stop what it must stop: the figures the tests no longer bound by the clock.

The tests check *that* each of these happens (the group is gone, the requests were cut, the cache was
used, the wait ended at its cap), never how fast: a wall-clock bound fails on a loaded 2-core machine.
How fast is measured here, with the same stand-ins the tests use, ``--repeats`` times each, and
written to ``docs/evidence/stop-times/stop_times.json`` (``tables.py`` there builds the table that
docs/failure-classes.md embeds). Each row also keeps the bound the test used to assert.

    .venv/bin/python benchmarks/bench_stop_times.py --repeats 5

Needs no vLLM server (the demo model is built once for the cached-call figure).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tuner.engines.process import LaunchSpec, ServerProcess, free_port, group_alive, kill_group  # noqa: E402
from tuner.errors import LaunchError  # noqa: E402
from tuner.objective import Objective  # noqa: E402
from tuner.search.space import ServeConfig  # noqa: E402
from tuner.trial import TrialContext, run_trial  # noqa: E402

STANDINS = REPO / "tests" / "standins"
OUT = REPO / "docs" / "evidence" / "stop-times" / "stop_times.json"


def _group(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"armed"
    return proc


def sigterm_ignoring_group() -> float:
    proc = _group("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('armed', flush=True)\n"
                  "time.sleep(600)\n")
    t0 = time.monotonic()
    kill_group(proc.pid, grace_s=1)
    took = time.monotonic() - t0
    proc.wait(timeout=30)
    assert not group_alive(proc.pid)
    return took


def dead_group() -> float:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait(timeout=30)
    t0 = time.monotonic()
    kill_group(proc.pid, grace_s=5)
    return time.monotonic() - t0


def never_ready(workdir: Path) -> float:
    port = free_port()
    spec = LaunchSpec(argv=[sys.executable, "-c", "import time; time.sleep(600)"], env={}, host="127.0.0.1",
                      port=port, workdir=workdir, ready_timeout_s=1.5)
    t0 = time.monotonic()
    with ServerProcess(spec) as server, contextlib.suppress(LaunchError):
        server.wait_ready()
    return time.monotonic() - t0


def _ctx(program: list[str], objective: Objective | None = None, **kw: Any) -> TrialContext:
    return TrialContext(server_cmd=program, model="standin-model", objective=objective or Objective(name="t"), **kw)


def hang_before_ready(workdir: Path) -> float:
    ctx = _ctx([sys.executable, str(STANDINS / "hang_before_ready.py")], ready_timeout_s=3)
    t0 = time.monotonic()
    outcome = run_trial(ctx, ServeConfig(args={}, env={}, params={}), workdir / "t")
    assert outcome.failure_class == "timeout", outcome.reason
    return time.monotonic() - t0


def unhealthy_midrun(workdir: Path) -> float:
    objective = Objective.model_validate({"name": "t", "workload": {
        "input_len": 8, "output_len": 400, "num_prompts": 8, "concurrency": 2, "warmup_prompts": 0}})
    ctx = _ctx([sys.executable, str(STANDINS / "unhealthy_midrun.py")], objective, ready_timeout_s=30,
               health_poll_s=0.5)
    t0 = time.monotonic()
    outcome = run_trial(ctx, ServeConfig(args={}, env={"HEALTH_500_AFTER_S": "2"}, params={}), workdir / "t")
    assert outcome.failure_class == "unhealthy", outcome.reason
    return time.monotonic() - t0


def gpu_never_freed(workdir: Path) -> float:
    state = {"stopped": False}
    spec = LaunchSpec(argv=["sleep", "300"], env={}, host="127.0.0.1", port=free_port(), workdir=workdir,
                      ready_timeout_s=5, gpu_release_timeout_s=1.5)
    server = ServerProcess(spec, gpu_probe=lambda: [50000] if state["stopped"] else [1000])
    server.start()
    state["stopped"] = True
    t0 = time.monotonic()
    server.stop()
    return time.monotonic() - t0


def demo_model_cached(model: Path) -> float:
    from tuner.demo_model import build_demo_model

    t0 = time.monotonic()
    build_demo_model(model)
    return time.monotonic() - t0


def load_stopped() -> float:
    """The test's own run: a stand-in transport streaming 4 tokens 50 ms apart; stop asked after 0.12 s."""
    import httpx

    from tests.unit.test_loadgen import BASE, VOCAB, _normal_parts, _streaming
    from tuner.load.generator import run_load
    from tuner.objective import Workload

    finished = {"n": 0}

    async def main() -> float:
        async def watcher() -> None:
            await asyncio.sleep(0.12)
            finished["n"] = 1

        task = asyncio.create_task(watcher())
        t0 = time.monotonic()
        result = await run_load(BASE, "tiny", Workload(num_prompts=50, concurrency=2, output_len=4, warmup_prompts=0),
                                vocab_size=VOCAB, should_stop=lambda: finished["n"] >= 1,
                                transport=httpx.MockTransport(_streaming(_normal_parts, gap_s=0.05)))
        took = time.monotonic() - t0
        await task
        assert result.stopped
        return took

    return asyncio.run(main())


def measure(name: str, what: str, test: str, former_bound_s: float, fn: Callable[[], float],
            repeats: int) -> dict[str, Any]:
    runs = [round(fn(), 4) for _ in range(repeats)]
    print(f"{name}: {runs}", file=sys.stderr)
    return {"name": name, "what": what, "test": test, "former_bound_s": former_bound_s, "runs_s": runs,
            "median_s": round(statistics.median(runs), 4), "max_s": max(runs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    n = args.repeats
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-stop-") as tmp:
        root = Path(tmp)
        counter = iter(range(10_000))

        def fresh() -> Path:
            path = root / f"w{next(counter)}"
            path.mkdir()
            return path

        from tuner.demo_model import build_demo_model

        model = build_demo_model(root / "demo")
        rows.append(measure("kill_group, SIGTERM ignored", "SIGTERM, 1 s grace, then SIGKILL of the whole group",
                            "tests/unit/test_launcher.py::test_sigterm_ignoring_group_is_sigkilled_after_grace", 6.0,
                            sigterm_ignoring_group, n))
        rows.append(measure("kill_group, group already gone", "returns without waiting its 5 s grace",
                            "tests/unit/test_launcher.py::test_kill_group_of_dead_group_returns_without_waiting",
                            1.0, dead_group, n))
        rows.append(measure("never ready (launcher)", "1.5 s ready timeout, then the group stopped",
                            "tests/unit/test_launcher.py::test_never_ready_is_timeout_and_group_killed", 15.0,
                            lambda: never_ready(fresh()), n))
        rows.append(measure("hang before ready (trial)",
                            "3 s ready timeout; a child ignores SIGTERM (15 s grace, then SIGKILL)",
                            "tests/faults/test_process_faults.py::test_hang_before_ready_times_out_and_kills_the_"
                            "whole_group", 28.0, lambda: hang_before_ready(fresh()), n))
        rows.append(measure("/health 500 mid-load (trial)", "requests of 100 s each in flight; /health 500 after 2 s",
                            "tests/faults/test_process_faults.py::test_health_500_mid_run_stops_the_trial_in_bounded_"
                            "time", 40.0, lambda: unhealthy_midrun(fresh()), n))
        rows.append(measure("GPU memory never freed (stop)", "stop waits for GPU memory, capped at 1.5 s",
                            "tests/faults/test_process_faults.py::test_stop_waits_for_gpu_memory_and_writes_the_report",
                            10.0, lambda: gpu_never_freed(fresh()), n))
        rows.append(measure("demo model, cached call", "build_demo_model on a folder already built",
                            "tests/unit/test_demo_model.py::test_second_call_is_cached", 0.5,
                            lambda: demo_model_cached(model), n))
        rows.append(measure("load stopped by should_stop", "50 prompts, stop asked after 0.12 s",
                            "tests/unit/test_loadgen.py::test_should_stop_ends_the_run_quickly_and_keeps_what_was_sent",
                            3.0, load_stopped, n))
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(),
               "processor": platform.processor() or platform.machine()}
    doc = {"measured": time.strftime("%Y-%m-%d"), "machine": machine, "repeats": n, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

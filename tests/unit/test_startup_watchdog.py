"""The start-up watchdog (finding 6 of issue 14): a start whose log makes no progress ends as ``hang``.

Replayed on a real log: the only GPU start this project has, a TP2 launch with torch.compile that hung on
2x H200 (docs/evidence/h200x2-tiny-gpu, vLLM 0.26). Its last progress was ``torch.compile took 16.19 s in
total``; after that vLLM only said "No available shared memory broadcast block found in 60 seconds",
which is a heartbeat of a silent worker, not progress. The clock is a fake one that each line advances
to the minute:second its record states.
"""

from __future__ import annotations

import re
from pathlib import Path

from tuner.engines import LaunchSpec
from tuner.engines.process import StartupWatch
from tuner.engines.vllm import VllmEngine
from tuner.engines.vllm.logs import describe_stall, is_log_record, is_progress

REPO = Path(__file__).resolve().parents[2]
HUNG_GPU_LOG = REPO / "docs/evidence/h200x2-tiny-gpu/trial-0000-server.log"
STAMP = re.compile(r"\d\d-\d\d (\d\d):(\d\d):(\d\d)")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _replay(log: Path, out: Path, stall_s: float) -> tuple[StartupWatch, float | None]:
    """Feed ``log`` line by line into ``out`` with a clock at each record's time; when did the watch trip?"""
    clock = Clock()
    spec = LaunchSpec(argv=["vllm"], env={}, host="127.0.0.1", port=1, workdir=out.parent, ready_timeout_s=3600,
                      engine=VllmEngine(), startup_stall_s=stall_s)
    watch = StartupWatch(out, stall_s=stall_s, is_progress=spec.is_progress, clock=clock)
    start: float | None = None
    with out.open("w", encoding="utf-8") as fh:
        for line in log.read_text(encoding="utf-8").splitlines(keepends=True):
            stamp = STAMP.search(line)
            if stamp:
                seconds = int(stamp[1]) * 3600 + int(stamp[2]) * 60 + int(stamp[3])
                start = seconds if start is None else start
                if "Parent process exited" in line:  # what the launcher's stop made it print: not replayed
                    break
                # time passes up to this record: the watch polls once a second meanwhile
                while clock.now < seconds - start:
                    clock.now += 1.0
                    watch.poll()
                    if watch.stalled():
                        return watch, clock.now
            fh.write(line)
            fh.flush()
            watch.poll()
    for _ in range(int(3 * stall_s)):  # nothing more comes
        clock.now += 1.0
        watch.poll()
        if watch.stalled():
            return watch, clock.now
    return watch, None


def test_the_hung_gpu_start_trips_the_watchdog_with_its_last_progress(tmp_path: Path) -> None:
    watch, tripped_at = _replay(HUNG_GPU_LOG, tmp_path / "server.log", stall_s=60.0)
    assert tripped_at is not None
    assert "torch.compile took 16.19 s in total" in watch.last_progress
    assert describe_stall(watch.last_progress) == "torch.compile took 16.19 s in total"
    # the broadcast warning 45 s after the compile did not restart the clock: it tripped 60 s after the compile
    first = STAMP.search(HUNG_GPU_LOG.read_text(encoding="utf-8"))
    assert first is not None
    compile_done = (51 * 60 + 38) - (int(first[2]) * 60 + int(first[3]))
    assert tripped_at == compile_done + 61


def test_the_hung_gpu_start_is_normal_up_to_its_hang(tmp_path: Path) -> None:
    """Its longest silent step before the hang is 25 s (process start, engine start): a 30 s watchdog lets every
    step of it pass and trips only in the hang."""
    watch, tripped_at = _replay(HUNG_GPU_LOG, tmp_path / "server.log", stall_s=30.0)
    assert tripped_at is not None and "torch.compile took 16.19 s in total" in watch.last_progress
    watch, tripped_at = _replay(HUNG_GPU_LOG, tmp_path / "again.log", stall_s=24.0)  # shorter: a normal step trips
    assert tripped_at is not None and "torch.compile" not in watch.last_progress


def test_a_heartbeat_is_not_progress_and_a_progress_bar_is() -> None:
    heartbeat = ("(EngineCore_DP0 pid=7) INFO 12-01 22:37:28 [shm_broadcast.py:705] No available shared memory "
                 "broadcast block found in 60 seconds. This typically happens when some processes are hanging")
    bar = "(Worker_DP0_EP0 pid=9) Capturing CUDA graphs (mixed prefill-decode, FULL):  33%|███       | 2/6"
    assert not is_progress(heartbeat) and not is_progress("(Worker pid=1) ") and not is_progress("   ")
    assert is_progress(bar)
    assert describe_stall(bar + "\n" + heartbeat + "\n") == "Capturing CUDA graphs (mixed prefill-decode, FULL):  " \
                                                            "33%|███       | 2/6"


def test_a_line_is_judged_once_it_is_whole(tmp_path: Path) -> None:
    """A half-written line (the reader caught a write in the middle) is not read until its end arrives."""
    clock = Clock()
    log = tmp_path / "server.log"
    log.write_text("")
    watch = StartupWatch(log, stall_s=10.0, is_progress=is_progress, clock=clock)
    with log.open("a", encoding="utf-8") as fh:
        fh.write("(EngineCore pid=1) INFO 12-01 [shm_broadcast.py:705] No available shared mem")
        fh.flush()
        clock.now = 5.0
        watch.poll()
        assert watch.last_progress_at == 0.0
        fh.write("ory broadcast block found in 60 seconds.\n")
        fh.flush()
        clock.now = 11.0
        watch.poll()
    assert watch.stalled() and watch.last_progress == ""


def test_the_process_start_is_allowed_until_the_servers_first_log_record_only(tmp_path: Path) -> None:
    """An engine whose process needs time before its clock starts (the emulator imports vLLM's parser) gets that
    grace once: what the import prints does not end it, the server's first own log record does."""
    clock = Clock()
    log = tmp_path / "server.log"
    log.write_text("")
    watch = StartupWatch(log, stall_s=10.0, is_progress=is_progress, clock=clock, process_start_grace_s=45.0,
                         ends_process_start=is_log_record)
    with log.open("a", encoding="utf-8") as fh:
        fh.write("Triton is installed, but doesn't include CPU backend. Disabling Triton.\n")  # during the import
        fh.flush()
        clock.now = 50.0
        watch.poll()
        assert not watch.stalled() and watch.limit_s == 55.0  # still importing: within 10 + 45 s
        fh.write("(APIServer pid=7) INFO 12-02 04:45:36 [api_utils.py:286] non-default args: {}\n")
    watch.poll()
    assert watch.limit_s == 10.0
    clock.now = 60.5
    assert watch.stalled()  # 10.5 s without progress after the first record: a hang, not 55 s later

"""Time every line of a normal vLLM CPU start (the demo model), as the start-up watchdog sees them.

Starts the real server through the process helper (``ServerProcess``), polls its log every 0.2 s, and
records when each complete line appeared, from the launch on, until the server is ready. Writes
``cpu_starts.json``: per start, seconds to the first line, the longest silence between two lines and
the line that ended it, and the time to ready. Run under the vLLM lock:

    flock /tmp/dsv4-vllm.lock .venv/bin/python docs/evidence/startup-stall/measure_cpu.py
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tuner.demo_model import build_demo_model  # noqa: E402
from tuner.engines import LaunchSpec, ServerProcess, free_port  # noqa: E402
from tuner.engines.vllm import VllmEngine  # noqa: E402
from tuner.engines.vllm.logs import is_progress  # noqa: E402

STARTS = 3


def one_start(model: Path, where: Path) -> dict[str, object]:
    engine = VllmEngine()
    port = free_port()
    cli = str(Path(sys.executable).parent / "vllm")
    options = engine.serve_options(str(model), {"max-model-len": 1024, "enforce-eager": True, "dtype": "bfloat16"},
                                   host="127.0.0.1", port=port, served_model_name="demo")
    spec = LaunchSpec(argv=engine.build_argv([cli], options, api_key=None), host="127.0.0.1", port=port,
                      env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}, workdir=where,
                      ready_timeout_s=600, engine=engine)
    seen: list[tuple[float, str]] = []
    done = threading.Event()

    def watch(log: Path, started: float) -> None:
        offset, partial = 0, b""
        while not done.wait(0.2):
            if not log.exists():
                continue
            with log.open("rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
            offset += len(chunk)
            *lines, partial = (partial + chunk).replace(b"\r", b"\n").split(b"\n")
            now = time.monotonic() - started
            seen.extend((now, ln.decode(errors="replace")) for ln in lines if is_progress(ln.decode(errors="replace")))

    server = ServerProcess(spec)
    with server:
        started = time.monotonic()
        thread = threading.Thread(target=watch, args=(server.log_path, started), daemon=True)
        thread.start()
        ready_s = server.wait_ready()
        done.set()
        thread.join()
    times = [0.0] + [t for t, _ in seen]
    gaps = [(b - a, line) for a, (b, line) in zip(times, seen, strict=False)]
    longest = max(gaps, default=(0.0, ""))
    return {"first_line_s": round(seen[0][0], 1) if seen else None, "longest_silence_s": round(longest[0], 1),
            "line_after_longest_silence": longest[1][:160], "ready_s": round(ready_s, 1), "lines": len(seen)}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = build_demo_model(Path(tmp) / "demo")
        rows = []
        for i in range(STARTS):
            where = Path(tmp) / f"s{i}"
            rows.append(one_start(model, where))
            print(rows[-1], flush=True)
            shutil.rmtree(where, ignore_errors=True)
    (HERE / "cpu_starts.json").write_text(json.dumps(
        {"what": "vllm-cpu 0.32.0 serving the demo model on this 2-core machine, enforce-eager, as the tests run it; "
                 "seconds from the launch (the watchdog's clock starts there)", "starts": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""tuner/engines/process.py with real processes (no vLLM): readiness, group kill, failure classes, orphans, ports."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tuner.engines.process as process_mod
from tuner.engines.process import (
    PID_FILE,
    LaunchSpec,
    ServerProcess,
    choose_port,
    describe_port_holder,
    free_port,
    group_alive,
    kill_group,
    port_is_free,
    stop_orphans,
    tail,
)
from tuner.engines.vllm import VllmEngine
from tuner.errors import LaunchError, PortInUseError

HOST = "127.0.0.1"

# A stand-in for a vLLM server, for readiness only: it answers /health and /v1/models with 200,
# spawns one child (as vLLM spawns its engine core), and writes its pid, the child's pid and its argv.
STUB_SERVER = textwrap.dedent("""\
    import http.server, json, os, subprocess, sys

    port, info_path = int(sys.argv[1]), sys.argv[2]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            code = 200 if self.path in ("/health", "/v1/models") else 404
            body = b'{"data": []}'
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    tmp = info_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"pid": os.getpid(), "child": child.pid, "argv": sys.argv}, fh)
    os.replace(tmp, info_path)
    server.serve_forever()
""")

SLEEPER = "import time; time.sleep(600)"


def _alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def started() -> Iterator[list[int]]:
    """Pids (group leaders) a test started; whatever is still alive at the end is killed by pgid."""
    pgids: list[int] = []
    yield pgids
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def stub(tmp_path: Path) -> Path:
    path = tmp_path / "stub_server.py"
    path.write_text(STUB_SERVER, encoding="utf-8")
    return path


def _spec(tmp_path: Path, argv: list[str], port: int, ready_timeout_s: float = 20.0) -> LaunchSpec:
    return LaunchSpec(argv=argv, env={"STUB_MARK": "1"}, host=HOST, port=port, workdir=tmp_path / "trial",
                      ready_timeout_s=ready_timeout_s, engine=VllmEngine())


def _spawn_group(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)


def test_ready_then_whole_group_stopped_and_port_freed(tmp_path: Path, stub: Path, started: list[int]) -> None:
    port = free_port(HOST)
    info_path = tmp_path / "info.json"
    nasty = '"; rm -rf /"'
    spec = _spec(tmp_path, [sys.executable, str(stub), str(port), str(info_path), nasty], port)
    with ServerProcess(spec) as server:
        assert server.proc is not None
        pgid = server.proc.pid
        started.append(pgid)
        record = json.loads((spec.workdir / PID_FILE).read_text())
        assert record["pgid"] == pgid and record["port"] == port and record["program"] == sys.executable
        took_s = server.wait_ready()
        assert took_s >= 0
        assert server.healthy()
        info = json.loads(info_path.read_text())
        assert info["pid"] == pgid
        assert info["argv"][3] == nasty  # one argv element, no shell in between
        assert os.getpgid(info["child"]) == pgid
        assert _alive(info["child"])
        assert group_alive(pgid)
        assert not port_is_free(HOST, port)
    assert not group_alive(pgid)
    assert not _alive(info["child"])
    assert not _alive(pgid)
    assert port_is_free(HOST, port)
    assert not (spec.workdir / PID_FILE).exists()
    assert server.proc is None


def test_start_refuses_a_taken_port(tmp_path: Path, stub: Path) -> None:
    with socket.socket() as holder:
        holder.bind((HOST, 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = ServerProcess(_spec(tmp_path, [sys.executable, str(stub), str(port), "x"], port))
        with pytest.raises(PortInUseError, match=str(port)):
            server.start()
        assert server.proc is None


def test_sigterm_ignoring_group_is_sigkilled_after_grace(started: list[int]) -> None:
    proc = _spawn_group("import signal, sys, time\n"
                        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                        "print('armed', flush=True)\n"
                        "time.sleep(600)\n")
    started.append(proc.pid)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"armed"
    t0 = time.monotonic()
    kill_group(proc.pid, grace_s=1)
    assert time.monotonic() - t0 >= 1.0  # the grace was given (how long the kill takes: benchmarks/bench_stop_times.py)
    assert proc.wait(timeout=5) == -signal.SIGKILL
    assert not group_alive(proc.pid)


def test_a_stopped_member_gets_its_sigterm_not_a_sigkill_after_the_grace(started: list[int]) -> None:
    """A SIGSTOPped process (an engine wedged on purpose, a debugger) receives SIGTERM only when continued:
    without the SIGCONT it would sit out the whole grace and die by SIGKILL."""
    proc = _spawn_group("print('armed', flush=True)\n"
                        "import time; time.sleep(600)\n")
    started.append(proc.pid)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"armed"
    os.kill(proc.pid, signal.SIGSTOP)
    kill_group(proc.pid, grace_s=120)
    assert proc.wait(timeout=5) == -signal.SIGTERM
    assert not group_alive(proc.pid)


def test_kill_group_of_dead_group_returns_without_waiting(started: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    proc = _spawn_group("pass")
    proc.wait(timeout=10)
    waits: list[float] = []
    monkeypatch.setattr(process_mod.time, "sleep", waits.append)
    kill_group(proc.pid, grace_s=5)
    assert waits == []  # nothing to signal: no grace waited, no SIGKILL sent


def test_immediate_bad_flag_exit_is_launch_error(tmp_path: Path, started: list[int]) -> None:
    code = ("import sys\n"
            "sys.stderr.write('usage: vllm serve [model_tag] [options]\\n')\n"
            "sys.stderr.write(\"vllm serve: error: argument --kv-cache-dtype: invalid choice: 'fp9' \"\n"
            "                 \"(choose from 'auto', 'fp8')\\n\")\n"
            "sys.exit(2)\n")
    port = free_port(HOST)
    with ServerProcess(_spec(tmp_path, [sys.executable, "-c", code], port)) as server:
        assert server.proc is not None
        started.append(server.proc.pid)
        with pytest.raises(LaunchError) as info:
            server.wait_ready()
    err = info.value
    assert err.failure_class == "bad_flag"
    assert err.log_path == tmp_path / "trial" / "server.log"
    assert "invalid choice" in err.log_tail
    assert "--kv-cache-dtype" in str(err)


def test_never_ready_is_timeout_and_group_killed(tmp_path: Path, started: list[int]) -> None:
    port = free_port(HOST)
    t0 = time.monotonic()
    with ServerProcess(_spec(tmp_path, [sys.executable, "-c", SLEEPER], port, ready_timeout_s=1.5)) as server:
        assert server.proc is not None
        pgid = server.proc.pid
        started.append(pgid)
        with pytest.raises(LaunchError) as info:
            server.wait_ready()
        assert group_alive(pgid)  # still running until the context exits
    assert info.value.failure_class == "timeout"
    assert time.monotonic() - t0 >= 1.5  # the ready timeout was given in full
    assert not group_alive(pgid)


def test_should_stop_interrupts_waiting(tmp_path: Path, started: list[int]) -> None:
    port = free_port(HOST)
    with ServerProcess(_spec(tmp_path, [sys.executable, "-c", SLEEPER], port)) as server:
        assert server.proc is not None
        started.append(server.proc.pid)
        with pytest.raises(LaunchError) as info:
            server.wait_ready(should_stop=lambda: True)
    assert info.value.failure_class == "interrupted"


def _record(folder: Path, pid: int, program: str) -> Path:
    folder.mkdir(parents=True)
    path = folder / PID_FILE
    path.write_text(json.dumps({"pid": pid, "pgid": pid, "host": HOST, "port": 1, "program": program}))
    return path


def test_stop_orphans_kills_recorded_group(tmp_path: Path, started: list[int]) -> None:
    proc = _spawn_group(SLEEPER)
    started.append(proc.pid)
    pid_file = _record(tmp_path / "runs" / "s1" / "trials" / "0003", proc.pid, sys.executable)
    stopped = stop_orphans(tmp_path / "runs")
    assert [r["pgid"] for r in stopped] == [proc.pid]
    assert proc.wait(timeout=5) == -signal.SIGTERM
    assert not group_alive(proc.pid)
    assert not pid_file.exists()


def test_stop_orphans_ignores_stale_record(tmp_path: Path) -> None:
    proc = _spawn_group("pass")
    proc.wait(timeout=10)
    pid_file = _record(tmp_path / "runs" / "s1" / "trials" / "0001", proc.pid, sys.executable)
    assert stop_orphans(tmp_path / "runs") == []
    assert not pid_file.exists()


def test_stop_orphans_spares_a_group_running_another_program(tmp_path: Path, started: list[int]) -> None:
    proc = _spawn_group(SLEEPER)
    started.append(proc.pid)
    _record(tmp_path / "runs" / "s1", proc.pid, "/opt/elsewhere/some-other-server")
    assert stop_orphans(tmp_path / "runs") == []
    assert proc.poll() is None and group_alive(proc.pid)


def test_stop_orphans_drops_garbage_record(tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "s1"
    folder.mkdir(parents=True)
    (folder / PID_FILE).write_text("{not json")
    assert stop_orphans(tmp_path / "runs") == []
    assert not (folder / PID_FILE).exists()


def test_choose_port_avoids_a_held_port() -> None:
    with socket.socket() as holder:
        holder.bind((HOST, 0))
        holder.listen()
        held = holder.getsockname()[1]
        assert not port_is_free(HOST, held)
        chosen = choose_port(HOST, held)
        assert chosen != held
        assert port_is_free(HOST, chosen)


def test_choose_port_keeps_a_free_requested_port() -> None:
    port = free_port(HOST)
    assert choose_port(HOST, port) == port
    assert 0 < choose_port(HOST, None) < 65536


def test_describe_port_holder_names_this_process() -> None:
    with socket.socket() as holder:
        holder.bind((HOST, 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert f"held by pid {os.getpid()}:" in describe_port_holder(port)


def test_describe_port_holder_for_free_port() -> None:
    assert describe_port_holder(free_port(HOST)) == "holder unknown"


def test_a_log_tail_reads_line_ends_as_a_text_reader_does(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"x" * 50 + b"INFO starting\r\nloading 10%\rloading 100%\r\nERROR invalid choice\r\n")
    text = tail(log, max_bytes=60)
    assert "\r" not in text
    assert text.endswith("loading 100%\nERROR invalid choice\n")
    assert text.strip() in log.read_text()
    assert tail(tmp_path / "missing.log") == ""

"""The process helper: start one server, wait until it is ready, stop it and everything it spawned.

Only this module starts servers, whatever the engine. A server runs in its own session (process
group) so SIGTERM, then SIGKILL, reaches every child; its pid/pgid is written beside its log so that
a later run can find and stop it if this tuner is killed outright.

What "ready" means and why a start failed are the engine's (:class:`~tuner.engines.Engine`:
``ready_paths``, ``health_path``, ``diagnose_startup``, ``describe_stall``, ``is_startup_progress``),
passed in the :class:`LaunchSpec`. Without an engine, readiness is the OpenAI-compatible ``/health``
and ``/v1/models``, a failed start is a crash with its exit code, and every log line is progress.

The start-up watchdog (:class:`StartupWatch`): a start whose log shows no progress for
``LaunchSpec.startup_stall_s`` ends as ``hang``, with its last progress line, long before the ready
timeout. Progress is a new log line the engine counts as such: vLLM's "No available shared memory
broadcast block found in 60 seconds", which a hung worker repeats, is not.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType

import httpx

from tuner.engines.base import Engine
from tuner.errors import LaunchError, PortInUseError
from tuner.failures import Diagnosis, FailureClass, clip, generic_startup_failure
from tuner.load.affinity import pinned

log = logging.getLogger(__name__)

PID_FILE = "server.pid.json"
LOG_FILE = "server.log"
GPU_RELEASE_FILE = "gpu_release.json"
HEALTH_PATH = "/health"
READY_PATHS = (HEALTH_PATH, "/v1/models")
"""Readiness of an OpenAI-compatible server, when the spec names no engine."""
GENERIC_LOG_BYTES = 6000


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def choose_port(host: str, requested: int | None) -> int:
    """The requested port if free, else a free one; never a port someone else holds."""
    if requested is None:
        return free_port(host)
    if port_is_free(host, requested):
        return requested
    fallback = free_port(host)
    log.warning("port %d on %s is taken (%s); using %d instead", requested, host,
                describe_port_holder(requested), fallback)
    return fallback


def describe_port_holder(port: int) -> str:
    """Best effort: which process listens on ``port`` (Linux /proc), for error messages."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(parts[9])
    if not inodes:
        return "holder unknown"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    return f"held by pid {proc.name}: {cmd.strip()[:120]}"
    return "held by a process this user cannot see"


def wait_port_free(host: str, port: int, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_is_free(host, port):
            return True
        time.sleep(0.2)
    return port_is_free(host, port)


def kill_group(pgid: int, *, grace_s: float = 15.0) -> None:
    """SIGTERM the whole process group, then SIGKILL whatever is left after ``grace_s``.

    SIGCONT follows the SIGTERM, as the shell's ``kill`` does for a stopped job: a stopped member (SIGSTOP,
    a debugger) gets its SIGTERM only once continued, and would otherwise hold the group for the whole grace.
    """
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGCONT)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.1)


def _signal_reaches(send: Callable[[], None]) -> bool | None:
    """Signal 0 as a probe: False when nothing is there, True when it exists but is not ours, None when sent."""
    try:
        send()
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return None


def group_alive(pgid: int) -> bool:
    reached = _signal_reaches(lambda: os.killpg(pgid, 0))
    if reached is not None:
        return reached
    # A group whose members are all zombies still "exists"; look for a live member.
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (proc / "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def tail(path: Path, max_bytes: int = 6000) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    # line ends as a text reader sees them: a server's log can carry CRLF and progress bars' lone CR
    return text.replace("\r\n", "\n").replace("\r", "\n")


# -- GPU memory after a stop -----------------------------------------------------------------------
GpuProbe = Callable[[], Sequence[int] | None]
"""Returns MiB used on each visible GPU, or None when it cannot tell."""

GPU_TOLERANCE_MIB = 1024
"""Memory above the pre-start level that still counts as freed (driver and context noise)."""


def nvidia_smi_probe() -> list[int] | None:
    """MiB used per GPU from ``nvidia-smi`` (NVML's command line), or None when it is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=15, check=True).stdout
        return [int(float(line.strip())) for line in out.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def gpu_holders() -> str:
    """Best effort: the compute processes still holding GPU memory, for the report."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "unknown"
    try:
        out = subprocess.run([exe, "--query-compute-apps=pid,process_name,used_memory",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=15,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    rows = [line.strip() for line in out.splitlines() if line.strip()]
    return "; ".join(rows) if rows else "no compute process listed (memory held by a zombie or the driver)"


def default_gpu_probe() -> GpuProbe | None:
    """``nvidia_smi_probe`` where NVML's tool is installed and answers, else None (CPU hosts)."""
    return nvidia_smi_probe if nvidia_smi_probe() is not None else None


@dataclass(frozen=True)
class GpuRelease:
    """What :func:`wait_gpu_memory_released` saw."""

    status: str
    """``freed``, ``not_freed`` or ``unknown`` (the probe stopped answering)."""
    waited_s: float
    baseline_mib: tuple[int, ...]
    last_mib: tuple[int, ...]
    tolerance_mib: int
    holders: str = ""

    @property
    def freed(self) -> bool:
        return self.status != "not_freed"

    def message(self) -> str:
        if self.status == "freed":
            return f"GPU memory freed after {self.waited_s:.1f} s"
        if self.status == "unknown":
            return "GPU memory could not be read after the stop (the probe failed)"
        over = [f"GPU {i}: {last} MiB used, {base} MiB before start"
                for i, (base, last) in enumerate(zip(self.baseline_mib, self.last_mib, strict=False))
                if last > base + self.tolerance_mib]
        return (f"GPU memory not freed {self.waited_s:.0f} s after the server stopped ({'; '.join(over)}); "
                f"holders: {self.holders or 'unknown'}. The next launch may run out of memory. Fix: stop "
                "the holders (nvidia-smi), or wait and `dsv4-tune resume`")


def wait_gpu_memory_released(probe: GpuProbe, baseline_mib: Sequence[int], *, timeout_s: float,
                             tolerance_mib: int = GPU_TOLERANCE_MIB, poll_s: float = 1.0,
                             clock: Callable[[], float] = time.monotonic,
                             sleep: Callable[[float], None] = time.sleep) -> GpuRelease:
    """Wait, at most ``timeout_s``, until every GPU is back within ``tolerance_mib`` of ``baseline_mib``."""
    started = clock()
    base = tuple(int(x) for x in baseline_mib)
    last: tuple[int, ...] = base
    while True:
        reading = probe()
        if reading is None:
            return GpuRelease("unknown", clock() - started, base, last, tolerance_mib)
        last = tuple(int(x) for x in reading)
        if all(used <= b + tolerance_mib for used, b in zip(last, base, strict=False)):
            return GpuRelease("freed", clock() - started, base, last, tolerance_mib)
        if clock() - started >= timeout_s:
            return GpuRelease("not_freed", clock() - started, base, last, tolerance_mib)
        sleep(poll_s)


@dataclass(frozen=True)
class LaunchSpec:
    argv: list[str]
    env: Mapping[str, str]
    host: str
    port: int
    workdir: Path
    ready_timeout_s: float
    api_key: str | None = None
    model_name: str | None = None
    stop_grace_s: float = 15.0
    """SIGTERM → SIGKILL delay when the server is stopped."""
    gpu_release_timeout_s: float = 120.0
    """How long :meth:`ServerProcess.stop` waits for GPU memory to return to its level before start."""
    cpus: tuple[int, ...] | None = None
    """Cores the server and everything it spawns may use (``None``: this process's own)."""
    engine: Engine | None = None
    """Whose readiness paths and log diagnosis apply (``None``: an OpenAI-compatible server, generic diagnosis)."""
    startup_stall_s: float | None = None
    """The start-up watchdog: no progress in the log for this long ends the launch as ``hang`` (None: off)."""

    @property
    def process_start_grace_s(self) -> float:
        """Real seconds the watchdog adds until the engine's first own log record: its process's start (its
        units' ``process_start_s``: the emulator imports vLLM's parser before its node clock starts)."""
        return self.engine.units.process_start_s if self.engine is not None else 0.0

    @property
    def ready_paths(self) -> tuple[str, ...]:
        return self.engine.ready_paths if self.engine is not None else READY_PATHS

    @property
    def health_path(self) -> str:
        return self.engine.health_path if self.engine is not None else HEALTH_PATH

    def diagnose(self, log_path: Path, returncode: int | None) -> Diagnosis:
        """Why the server ended before it was ready: the engine's reading of its log end."""
        if self.engine is None:
            return generic_startup_failure(tail(log_path, GENERIC_LOG_BYTES), returncode)
        return self.engine.diagnose_startup(tail(log_path, self.engine.startup_log_bytes), returncode)

    def describe_stall(self, log_tail: str) -> str:
        return self.engine.describe_stall(log_tail) if self.engine is not None else ""

    def ends_process_start(self, line: str) -> bool:
        """Whether a start-up line is the engine's first own log record (its process has started)."""
        return self.engine.is_log_record(line) if self.engine is not None else bool(line.strip())

    def is_progress(self, line: str) -> bool:
        """Whether a start-up log line is progress (the engine's rule; without one, any non-blank line)."""
        return self.engine.is_startup_progress(line) if self.engine is not None else bool(line.strip())


class StartupWatch:
    """The start-up watchdog: reads the log as it grows, and knows when progress last came and what it said.

    Only whole lines (ended by a newline or a carriage return, as progress bars end theirs) are read, so
    a line caught half-written is judged once it is complete. The clock starts at the launch: a server
    that never prints a line stalls too.
    """

    def __init__(self, log_path: Path, *, stall_s: float | None, is_progress: Callable[[str], bool],
                 clock: Callable[[], float] = time.monotonic, process_start_grace_s: float = 0.0,
                 ends_process_start: Callable[[str], bool] | None = None) -> None:
        self.log_path = log_path
        self.stall_s = stall_s
        self.process_start_grace_s = process_start_grace_s
        """Added to ``stall_s`` until the process has started (the engine's first own log record)."""
        self.ends_process_start = ends_process_start or is_progress
        self.process_started = False
        self.is_progress = is_progress
        self.clock = clock
        self.last_progress_at = clock()
        self.last_progress = ""
        """The last line that counted as progress, as written (empty until one did)."""
        self._offset = 0
        self._partial = b""

    def poll(self) -> None:
        """Read what the log gained since the last poll; a progress line restarts the clock."""
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except OSError:
            return
        self._offset += len(chunk)
        *complete, self._partial = re.split(rb"[\r\n]", self._partial + chunk)
        for raw in complete:
            line = raw.decode(errors="replace")
            if not self.process_started and self.ends_process_start(line):
                self.process_started = True
            if self.is_progress(line):
                self.last_progress = line.strip()
                self.last_progress_at = self.clock()

    def silent_s(self) -> float:
        return self.clock() - self.last_progress_at

    @property
    def limit_s(self) -> float | None:
        """The silence that counts as a stall now: longer until the server's first own log record."""
        if self.stall_s is None:
            return None
        return self.stall_s + (0.0 if self.process_started else self.process_start_grace_s)

    def stalled(self) -> bool:
        limit = self.limit_s
        return limit is not None and self.silent_s() > limit


class ServerProcess:
    """A running server. Use as a context manager: the server is always stopped on exit."""

    def __init__(self, spec: LaunchSpec, *, gpu_probe: GpuProbe | str | None = "auto") -> None:
        self.spec = spec
        self.log_path = spec.workdir / LOG_FILE
        self.pid_path = spec.workdir / PID_FILE
        self.proc: subprocess.Popen[bytes] | None = None
        self._gpu_probe: GpuProbe | str | None = gpu_probe
        self._gpu_baseline: tuple[int, ...] | None = None
        self.gpu_release: GpuRelease | None = None
        """Set by :meth:`stop` on a GPU host: did the memory come back (``gpu_release.json`` if not)."""

    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.spec.api_key}"} if self.spec.api_key else {}

    def start(self) -> None:
        if not port_is_free(self.spec.host, self.spec.port):
            raise PortInUseError(f"port {self.spec.port} on {self.spec.host} is taken "
                                 f"({describe_port_holder(self.spec.port)})")
        self.spec.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.spec.env}
        if self._gpu_probe == "auto":
            self._gpu_probe = default_gpu_probe()
        if callable(self._gpu_probe):
            reading = self._gpu_probe()
            self._gpu_baseline = tuple(reading) if reading is not None else None
        log.info("starting server on %s:%d", self.spec.host, self.spec.port)
        with self.log_path.open("ab") as log_fh, pinned(self.spec.cpus):
            self.proc = subprocess.Popen(
                self.spec.argv, stdout=log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=self.spec.workdir, start_new_session=True)
        record = {"pid": self.proc.pid, "pgid": self.proc.pid, "host": self.spec.host,
                  "port": self.spec.port, "started_at": time.time(), "program": self.spec.argv[0],
                  "node": socket.gethostname(), "tuner_pid": os.getpid()}
        self.pid_path.write_text(json.dumps(record))

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait_ready(self, *, should_stop: Callable[[], bool] | None = None) -> float:
        """Block until every readiness path (``/health``, ``/v1/models`` for vLLM) answers 200; return seconds taken."""
        started = time.monotonic()
        deadline = started + self.spec.ready_timeout_s
        watch = StartupWatch(self.log_path, stall_s=self.spec.startup_stall_s, is_progress=self.spec.is_progress,
                             process_start_grace_s=self.spec.process_start_grace_s,
                             ends_process_start=self.spec.ends_process_start)
        with httpx.Client(timeout=httpx.Timeout(5.0), headers=self.headers) as client:
            while True:
                code = self.exited()
                if code is not None:
                    log_tail = tail(self.log_path)
                    diag = self.spec.diagnose(self.log_path, code)
                    raise LaunchError(f"server exited during startup ({diag.failure_class.value}): "
                                      f"{diag.reason}", failure_class=diag.failure_class.value,
                                      log_path=self.log_path, log_tail=log_tail)
                if self._answers(client):
                    return time.monotonic() - started
                watch.poll()
                if watch.stalled() and self.exited() is None:
                    raise self._hang(watch, time.monotonic() - started)
                if time.monotonic() > deadline:
                    log_tail = tail(self.log_path)
                    stall = self.spec.describe_stall(log_tail)
                    raise LaunchError(f"server not ready after {self.spec.ready_timeout_s:.0f} s"
                                      + (f"; last progress: {stall}" if stall else ""),
                                      failure_class=FailureClass.TIMEOUT.value, log_path=self.log_path,
                                      log_tail=log_tail)
                if should_stop is not None and should_stop():
                    raise LaunchError("stopped while waiting for the server",
                                      failure_class=FailureClass.INTERRUPTED.value, log_path=self.log_path)
                time.sleep(1.0)

    def _hang(self, watch: StartupWatch, waited_s: float) -> LaunchError:
        """The watchdog's verdict: no start-up progress for ``startup_stall_s``; the reason names the last."""
        said = self.spec.describe_stall(watch.last_progress) or clip(watch.last_progress, 300)
        last = f"last progress {watch.silent_s():.0f} s earlier: {said}" if said else "no progress line at all"
        return LaunchError(
            f"server hung during startup: no progress in its log for {watch.limit_s or 0:.0f} s "
            f"(the start-up watchdog; {waited_s:.0f} s after launch); {last}",
            failure_class=FailureClass.HANG.value, log_path=self.log_path, log_tail=tail(self.log_path))

    def _answers(self, client: httpx.Client) -> bool:
        try:
            for path in self.spec.ready_paths:
                if client.get(self.base_url + path).status_code != 200:
                    return False
        except httpx.HTTPError:
            return False
        return True

    def healthy(self, timeout_s: float = 5.0) -> bool:
        try:
            return httpx.get(self.base_url + self.spec.health_path, timeout=timeout_s,
                             headers=self.headers).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc is None:
            return
        kill_group(self.proc.pid, grace_s=self.spec.stop_grace_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        if not wait_port_free(self.spec.host, self.spec.port):
            log.warning("port %d still busy after the server stopped", self.spec.port)
        with contextlib.suppress(FileNotFoundError):
            self.pid_path.unlink()
        self.proc = None
        self._check_gpu_release()

    def _check_gpu_release(self) -> None:
        probe = self._gpu_probe
        if not callable(probe) or self._gpu_baseline is None:
            return
        report = wait_gpu_memory_released(probe, self._gpu_baseline, timeout_s=self.spec.gpu_release_timeout_s)
        if not report.freed:
            report = GpuRelease(report.status, report.waited_s, report.baseline_mib, report.last_mib,
                                report.tolerance_mib, holders=gpu_holders())
            log.warning("%s", report.message())
            with contextlib.suppress(OSError):
                (self.spec.workdir / GPU_RELEASE_FILE).write_text(
                    json.dumps({**asdict(report), "message": report.message()}, indent=2))
        self.gpu_release = report

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def stop_orphans(root: Path, *, markers: Sequence[str] = ()) -> list[dict[str, object]]:
    """Stop servers a killed tuner left behind: every ``server.pid.json`` under ``root``.

    A recorded group is stopped only if one of its processes still runs the recorded program (or a
    command line holding one of ``markers``, the engine's name: a wrapper script's child), so a
    recycled pid is never killed.
    """
    stopped: list[dict[str, object]] = []
    for pid_file in sorted(root.glob(f"**/{PID_FILE}")):
        try:
            record = json.loads(pid_file.read_text())
            pgid = int(record["pgid"])
        except (OSError, ValueError, KeyError, TypeError):
            pid_file.unlink(missing_ok=True)
            continue
        if record.get("node", socket.gethostname()) != socket.gethostname():
            continue  # another node's server, in a shared runs dir: not ours to judge
        owner = record.get("tuner_pid")
        if isinstance(owner, int) and owner != os.getpid() and _pid_alive(owner):
            continue  # its tuner is alive (another worker on this node): not an orphan
        if group_alive(pgid) and _group_runs(pgid, str(record.get("program", "")), markers):
            log.warning("stopping orphaned server pgid %d from %s", pgid, pid_file.parent)
            kill_group(pgid)
            stopped.append(record)
        pid_file.unlink(missing_ok=True)
    return stopped


def _pid_alive(pid: int) -> bool:
    reached = _signal_reaches(lambda: os.kill(pid, 0))
    if reached is not None:
        return reached
    with contextlib.suppress(OSError, IndexError):  # a killed tuner not yet reaped is a zombie: dead
        if (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _group_runs(pgid: int, program: str, markers: Sequence[str]) -> bool:
    name = Path(program).name
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not name or name in cmd or any(marker in cmd for marker in markers):
                return True
    return False

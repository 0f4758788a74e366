"""The pre-flight check: does this host serve this profile? (``dsv4-tune doctor``, and before a run's first launch).

Every check reads the host through :class:`HostProbe`, whose methods a test replaces to fake a host
(no GPU, a GPU node, a CPU without AVX-512). Each mismatch is one :class:`Mismatch`: what is wrong and
the fix. Nothing here launches a server or reaches the network.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tuner.search.checkpoints import Checkpoint
from tuner.search.pools import CONNECTOR_MODULES, connector_missing, router_missing
from tuner.search.profile import HardwareProfile

__all__ = ["Device", "HostProbe", "Mismatch", "check_host", "cpu_has_avx512", "host_probe", "version_at_least"]

MIN_FREE_DISK_GB = 20.0
"""Logs, the compile caches (torch.compile, CUDA graphs) and the study's files of one night on a GPU node."""
MIN_FREE_DISK_GB_CPU = 1.0
"""The CPU demo writes logs and a tiny model."""


@dataclass(frozen=True)
class Device:
    name: str
    memory_gb: float


@dataclass(frozen=True)
class Mismatch:
    check: str
    problem: str
    fix: str

    def line(self) -> str:
        return f"{self.check}: {self.problem}. Fix: {self.fix}"


def _nvidia_devices() -> list[Device] | None:
    """The NVIDIA GPUs nvidia-smi lists (None: no nvidia-smi, or it failed: no driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    devices = []
    for row in out.splitlines():
        name, _, mib = row.rpartition(",")
        try:
            devices.append(Device(name.strip(), float(mib) * 1.048576 / 1000))  # MiB → decimal GB
        except ValueError:
            continue
    return devices


def _amd_devices() -> list[Device] | None:
    exe = shutil.which("rocm-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--showproductname"], capture_output=True, text=True, timeout=30,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [Device(line.split(":")[-1].strip(), 0.0) for line in out.splitlines() if "Card series" in line]


def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def _engine_version(engine: str) -> str | None:
    try:
        return importlib.metadata.version(engine)
    except importlib.metadata.PackageNotFoundError:
        return None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _hf_snapshot(repo: str, revision: str | None) -> Path | None:
    """The local Hugging Face cache's snapshot folder of ``repo`` at ``revision`` (no network)."""
    cache = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" /
                                                                       "huggingface")) / "hub")
    folder = cache / ("models--" + repo.replace("/", "--"))
    ref = revision or "main"
    ref_file = folder / "refs" / ref
    commit = ref_file.read_text().strip() if ref_file.is_file() else ref
    snapshot = folder / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


@dataclass
class HostProbe:
    """How the host is read. Each field is a function a test may replace (a faked host)."""

    nvidia_devices: Callable[[], list[Device] | None] = _nvidia_devices
    amd_devices: Callable[[], list[Device] | None] = _amd_devices
    cpu_flags: Callable[[], frozenset[str]] = _cpu_flags
    engine_version: Callable[[str], str | None] = _engine_version
    hf_snapshot: Callable[[str, str | None], Path | None] = _hf_snapshot
    free_disk_gb: Callable[[Path], float] = field(
        default=lambda path: shutil.disk_usage(_existing(path)).free / 1e9)
    port_free: Callable[[int], bool] = _port_free
    which: Callable[[str], str | None] = field(default=lambda program: _which(program))
    module_found: Callable[[str], bool] = field(default=lambda name: importlib.util.find_spec(name) is not None)


def _which(program: str) -> str | None:
    """On PATH, or beside this Python (a venv's console scripts, the venv not activated)."""
    found = shutil.which(program)
    if found is not None or "/" in program:
        return found
    beside = Path(sys.executable).parent / program
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


ACTIVE_PROBE: HostProbe | None = None
"""The probe ``doctor``, ``plan`` and a study use (None: the real host). A test sets a faked one."""


def host_probe() -> HostProbe:
    return ACTIVE_PROBE or HostProbe()


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def cpu_has_avx512(flags: frozenset[str]) -> bool:
    """What vLLM's CPU build needs for an FP8 KV cache: x86 with AVX-512 (or AMX)."""
    return "avx512f" in flags or any(flag.startswith("amx") for flag in flags)


def version_at_least(found: str, wanted: str) -> bool:
    """``0.32.0+cpu`` ≥ ``0.26``: the numeric release parts compared, a local suffix ignored."""
    def parts(text: str) -> tuple[int, ...]:
        out = []
        for piece in text.split("+")[0].split("."):
            digits = "".join(ch for ch in piece if ch.isdigit())
            if not digits:
                break
            out.append(int(digits))
        return tuple(out)

    return parts(found) >= parts(wanted)


def check_host(profile: HardwareProfile, checkpoint: Checkpoint | None, model: str | None, *,
               engine: str, runs_dir: Path, port: int | None, probe: HostProbe | None = None) -> list[Mismatch]:
    """Every way this host cannot serve ``profile`` (empty: it can). ``model`` is the resolved model (a
    local path, a hub id, or None for the checkpoint's repo)."""
    probe = probe or host_probe()
    found = _check_devices(profile, probe)
    found += _check_engine(profile, engine, probe)
    found += _check_checkpoint(checkpoint, model, probe)
    need = MIN_FREE_DISK_GB_CPU if profile.hardware.accelerator == "cpu" else MIN_FREE_DISK_GB
    free = probe.free_disk_gb(runs_dir)
    if free < need:
        found.append(Mismatch("disk", f"{free:.1f} GB free under {runs_dir}, the night needs {need:.0f} GB for "
                              "logs and compile caches", "free space there, or give --runs-dir on a larger disk"))
    found += _check_disaggregation(profile, engine, probe)
    if port is not None and not probe.port_free(port):
        found.append(Mismatch("port", f"port {port} on 127.0.0.1 is in use",
                              "stop what holds it, or drop --port to take a free one"))
    return found


def _check_disaggregation(profile: HardwareProfile, engine: str, probe: HostProbe) -> list[Mismatch]:
    """A profile with prefill/decode layouts needs the router, and the connector's module in vLLM's Python (this
    one: the launch checks the engine command's own Python again, before a layout's first start)."""
    section = profile.disaggregation
    if section is None:
        return []
    out: list[Mismatch] = []
    program = shlex.split(section.router)[0] if section.router.strip() else section.router
    if probe.which(program) is None and not Path(program).is_file():
        problem, _, fix = router_missing(section.router).partition(" Fix: ")
        out.append(Mismatch("router", problem, fix))
    module = CONNECTOR_MODULES.get(section.connector)
    if engine == "vllm" and module is not None and not probe.module_found(module):
        problem, _, fix = connector_missing(section.connector, sys.executable).partition(" Fix: ")
        out.append(Mismatch("connector", problem, fix))
    return out


def _check_devices(profile: HardwareProfile, probe: HostProbe) -> list[Mismatch]:
    hw = profile.hardware
    if hw.accelerator == "cpu":
        return []
    devices = probe.nvidia_devices() if hw.accelerator == "nvidia" else probe.amd_devices()
    tool = "nvidia-smi" if hw.accelerator == "nvidia" else "rocm-smi"
    want = f"{hw.device_count}x {hw.device_name}"
    if not devices:
        return [Mismatch("accelerator", f"no {hw.accelerator.upper()} GPU found ({tool} "
                         f"{'lists none' if devices is not None else 'is missing or failed'}); the profile "
                         f"{profile.name} needs {want}",
                         f"run on the node the profile describes (check the driver with `{tool}`), or pick this "
                         "host's profile with --hw (see `dsv4-tune list`)")]
    out = []
    if len(devices) != hw.device_count:
        out.append(Mismatch("accelerator", f"{len(devices)} GPU(s) found, the profile {profile.name} needs "
                            f"{hw.device_count}", "pick the profile of this host with --hw, or free the GPUs "
                            "(CUDA_VISIBLE_DEVICES)"))
    names = {d.name for d in devices}
    key = hw.device_name.split()[-1].lower()
    if not any(key in name.lower() for name in names):
        out.append(Mismatch("accelerator", f"GPU model {', '.join(sorted(names))}, the profile expects "
                            f"{hw.device_name}", "pick the profile of this host with --hw"))
    small = [d for d in devices if 0 < d.memory_gb < hw.memory_per_device_gb * 0.9]
    if small:
        out.append(Mismatch("accelerator", f"{small[0].memory_gb:.0f} GB per GPU, the profile expects "
                            f"{hw.memory_per_device_gb:g} GB", "pick the profile of this host with --hw"))
    return out


def _check_engine(profile: HardwareProfile, engine: str, probe: HostProbe) -> list[Mismatch]:
    if engine != "vllm":
        return []
    version = probe.engine_version("vllm")
    wanted = profile.server.engine_version
    if version is None:
        return [Mismatch("engine", "vLLM is not installed in this environment",
                         f"install vLLM{f' {wanted} or later' if wanted else ''} (scripts/setup.sh), or point "
                         "--engine-cmd at one")]
    if wanted and not version_at_least(version, wanted):
        return [Mismatch("engine", f"vLLM {version} is installed; the profile's flags are written for "
                         f"{wanted} or later", f"upgrade vLLM to {wanted} or later")]
    return []


def _check_checkpoint(checkpoint: Checkpoint | None, model: str | None, probe: HostProbe) -> list[Mismatch]:
    if model and Path(model).is_dir():
        folder: Path | None = Path(model)
    elif checkpoint is not None or model:
        repo = model or (checkpoint.repo if checkpoint else "")
        revision = checkpoint.revision if checkpoint is not None and repo == checkpoint.repo else None
        folder = probe.hf_snapshot(repo, revision)
        if folder is None:
            return [Mismatch("checkpoint", f"{repo}{'@' + revision if revision else ''} is not available offline "
                             "(no local folder, not in the local Hugging Face cache)",
                             f"download it first (`huggingface-cli download {repo}"
                             f"{' --revision ' + revision if revision else ''}`), or give --model PATH")]
    else:
        return []
    assert folder is not None
    out = []
    if not (folder / "config.json").is_file():
        out.append(Mismatch("checkpoint", f"{folder} holds no config.json", "download the checkpoint again"))
    has_weights = (folder / "model.safetensors.index.json").is_file() or any(folder.glob("*.safetensors"))
    if not has_weights:
        out.append(Mismatch("checkpoint", f"{folder} holds no weight index (model.safetensors.index.json)",
                            "download the checkpoint again"))
    if checkpoint is not None and has_weights and not checkpoint.size_is_estimate:
        size_gb = sum(p.stat().st_size for p in folder.rglob("*.safetensors") if p.exists()) / 1e9
        if size_gb < checkpoint.size_gb * 0.95:
            out.append(Mismatch("checkpoint", f"{folder} holds {size_gb:.1f} GB of weights, the catalog's "
                                f"{checkpoint.name} is {checkpoint.size_gb:g} GB", "finish the download"))
    return out

"""GPU power during a measured window, and what the window's tokens cost in energy and money.

A :class:`PowerReader` reads every GPU of the node: NVML first (``pynvml``, from the
``nvidia-ml-py`` package; it reads the driver and never creates a CUDA context), else
``nvidia-smi --query-gpu=power.draw``. :func:`detect_power_reader` picks one once per process; on a
host with neither (a CPU build, this machine) it returns None and logs why, and the figures below
are simply absent from the window's summary.

:class:`PowerSampler` runs beside one measured window (as the gauge sampler does) and reduces it to
:class:`WindowEnergy`. Energy comes from the driver's cumulative energy counter where the GPU has one
(NVML ``nvmlDeviceGetTotalEnergyConsumption``, Volta and later): the counter's growth over the
window, summed over GPUs. Otherwise it is the trapezoid integral of the sampled power. Either way the
idle GPUs of the node count: the node draws that power whether or not a launch uses it.

Two objective metrics come from it (:func:`energy_figures`):

- ``tokens_per_joule`` = output tokens of the window / joules of the window (maximize);
- ``usd_per_mtok`` = GPU-hour price × GPUs × window hours / million output tokens (minimize), when
  the user gives a price (``--gpu-hour-usd``; ``gpu_hour_usd`` in the objective). The GPUs are the
  ones the reader sees: the node's, which is what a reservation pays for.
"""

from __future__ import annotations

import itertools
import logging
import math
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from tuner.load.poller import Poller

__all__ = ["ENERGY_KEYS", "NvmlPower", "PowerReader", "PowerSampler", "SmiPower", "WindowEnergy",
           "detect_power_reader", "energy_figures", "power_unavailable_reason"]

log = logging.getLogger(__name__)

ENERGY_KEYS = ("gpu_energy_j", "gpu_power_mean_w", "gpu_power_max_w", "tokens_per_joule", "usd_per_mtok")
"""What a window's summary gains when power is read (``usd_per_mtok`` only with a price)."""
SMI_TIMEOUT_S = 10.0


class PowerReader(Protocol):
    """Reads the power of every GPU of the node."""

    name: str

    def devices(self) -> int:
        """How many GPUs it reads."""

    def read_w(self) -> tuple[float, ...] | None:
        """Power per GPU in watts, now; None when this read failed."""

    def energy_j(self) -> tuple[float, ...] | None:
        """The driver's cumulative energy counter per GPU, in joules; None when there is none."""


class NvmlPower:
    """NVML through ``pynvml`` (package ``nvidia-ml-py``): power in mW, energy in mJ since driver load."""

    name = "nvml"

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        if not self._handles:
            raise RuntimeError("NVML sees no GPU")
        self._lock = threading.Lock()

    def devices(self) -> int:
        return len(self._handles)

    def read_w(self) -> tuple[float, ...] | None:
        try:
            with self._lock:
                return tuple(self._nvml.nvmlDeviceGetPowerUsage(h) / 1000.0 for h in self._handles)
        except self._nvml.NVMLError as exc:
            log.debug("NVML power read failed: %s", exc)
            return None

    def energy_j(self) -> tuple[float, ...] | None:
        try:
            with self._lock:
                return tuple(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0 for h in self._handles)
        except self._nvml.NVMLError as exc:  # not supported before Volta, or on some virtual GPUs
            log.debug("NVML energy counter unavailable: %s", exc)
            return None


class SmiPower:
    """``nvidia-smi --query-gpu=power.draw``: one subprocess per sample, no energy counter."""

    name = "nvidia-smi"

    def __init__(self, exe: str) -> None:
        self.exe = exe
        first = self.read_w()
        if not first:
            raise RuntimeError("nvidia-smi reports no power.draw")
        self._devices = len(first)

    def devices(self) -> int:
        return self._devices

    def read_w(self) -> tuple[float, ...] | None:
        try:
            out = subprocess.run([self.exe, "--query-gpu=power.draw", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=True).stdout
            return tuple(float(line.strip()) for line in out.splitlines() if line.strip())
        except (OSError, subprocess.SubprocessError, ValueError) as exc:  # "[N/A]" on GPUs without a sensor
            log.debug("nvidia-smi power read failed: %s", exc)
            return None

    def energy_j(self) -> tuple[float, ...] | None:
        return None


_DETECTED: list[PowerReader | None] = []
_WHY_NOT: list[str] = []
_DETECT_LOCK = threading.Lock()


def detect_power_reader() -> PowerReader | None:
    """NVML, else nvidia-smi, else None (the reason is logged once and kept for the record)."""
    with _DETECT_LOCK:
        if _DETECTED:
            return _DETECTED[0]
        reasons: list[str] = []
        reader: PowerReader | None = None
        try:
            reader = NvmlPower()
        except Exception as exc:  # ImportError (no nvidia-ml-py), NVMLError (no driver), no GPU
            reasons.append(f"NVML: {type(exc).__name__}: {exc}")
        if reader is None:
            exe = shutil.which("nvidia-smi")
            if exe is None:
                reasons.append("nvidia-smi: not on PATH")
            else:
                try:
                    reader = SmiPower(exe)
                except RuntimeError as exc:
                    reasons.append(f"nvidia-smi: {exc}")
        if reader is None:
            _WHY_NOT[:] = ["; ".join(reasons)]
            log.info("GPU power is not measured on this host, so tokens_per_joule and usd_per_mtok are absent "
                     "(%s)", _WHY_NOT[0])
        else:
            log.info("GPU power: read with %s over %d GPU(s)", reader.name, reader.devices())
        _DETECTED.append(reader)
        return reader


def power_unavailable_reason() -> str:
    """Why :func:`detect_power_reader` found no reader ("" when it found one or has not run)."""
    return _WHY_NOT[0] if _WHY_NOT else ""


@dataclass(frozen=True)
class WindowEnergy:
    """The power of one measured window, all GPUs of the node together."""

    source: str
    gpus: int
    seconds: float
    samples: int
    energy_j: float
    energy_from: str
    """``counter`` (the driver's energy counter) or ``samples`` (integral of the sampled power)."""
    mean_w: float
    max_w: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class PowerSampler(Poller):
    """Samples a :class:`PowerReader` every ``interval_s`` while a window runs (a ``with`` block)."""

    def __init__(self, reader: PowerReader, interval_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__("power-sampler", interval_s, join_timeout_s=30)
        self.reader = reader
        self.clock = clock
        self.samples: list[tuple[float, float]] = []
        self._start: tuple[float, tuple[float, ...] | None] | None = None
        self._end: tuple[float, tuple[float, ...] | None] | None = None

    def _sample(self) -> None:
        watts = self.reader.read_w()
        if watts:
            self.samples.append((self.clock(), float(sum(watts))))

    def poll(self) -> bool:
        self._sample()
        return True

    def __enter__(self) -> PowerSampler:
        self._start = (self.clock(), self.reader.energy_j())
        self._sample()
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._sample()
        self._end = (self.clock(), self.reader.energy_j())

    def result(self) -> WindowEnergy | None:
        """The window's energy; None when nothing could be read."""
        if self._start is None or self._end is None:
            return None
        (t0, e0), (t1, e1) = self._start, self._end
        seconds = max(0.0, t1 - t0)
        energy, source = math.nan, "samples"
        if e0 is not None and e1 is not None and len(e0) == len(e1):
            grown = sum(b - a for a, b in zip(e0, e1, strict=True))
            if grown > 0:
                energy, source = grown, "counter"
        if math.isnan(energy):
            energy = _integral(self.samples)
        if math.isnan(energy) or seconds <= 0:
            return None
        watts = [w for _, w in self.samples]
        return WindowEnergy(source=self.reader.name, gpus=self.reader.devices(), seconds=seconds,
                            samples=len(self.samples), energy_j=energy, energy_from=source,
                            mean_w=energy / seconds, max_w=max(watts) if watts else math.nan)


def _integral(samples: Sequence[tuple[float, float]]) -> float:
    """Trapezoid integral of (time, watts) samples, in joules; NaN with fewer than two samples."""
    if len(samples) < 2:
        return math.nan
    return sum((t1 - t0) * (w0 + w1) / 2.0 for (t0, w0), (t1, w1) in itertools.pairwise(samples))


def energy_figures(window: WindowEnergy | None, summary: Mapping[str, Any],
                   gpu_hour_usd: float | None) -> dict[str, float]:
    """The summary keys a window's power gives (:data:`ENERGY_KEYS`); empty without a reading.

    ``summary`` is the window's load summary (``total_output_tokens``, ``duration``). The energy is the
    sampler's mean power over the load's own duration: the sampler's window also holds what surrounds the
    load (the client pool's start, the last scrape), which on a busy host was 10 % of it and would count
    joules no token was served in (``tests/integration/test_study_e2e.py``).
    """
    if window is None:
        return {}
    tokens = float(summary.get("total_output_tokens") or 0.0)
    duration_s = float(summary.get("duration") or 0.0)
    energy_j = window.mean_w * duration_s if duration_s > 0 and math.isfinite(window.mean_w) else window.energy_j
    out = {"gpu_energy_j": energy_j, "gpu_power_mean_w": window.mean_w, "gpu_power_max_w": window.max_w}
    if tokens > 0 and energy_j > 0:
        out["tokens_per_joule"] = tokens / energy_j
    if gpu_hour_usd is not None and tokens > 0 and duration_s > 0:
        out["usd_per_mtok"] = gpu_hour_usd * window.gpus * duration_s / 3600.0 / (tokens / 1e6)
    return out

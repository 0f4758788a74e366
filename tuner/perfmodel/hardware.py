"""The node a hardware profile names, in the units a roofline needs.

A profile (``search_spaces/<hw>.yaml``) states the GPU's name, count and memory. The rates the
performance model needs (HBM bandwidth, *sustained* dense FLOP/s per precision, interconnect
bandwidth and latency) are not in the profile schema; they live in :data:`DEVICES`, one row per
GPU kind, each figure with its source. Sustained means what a long kernel holds, not the datasheet:
the blog measured a GH200 "top out at 583 TF/s" of bf16 under its power cap against 990 on paper.
Where no measurement exists the sustained figure is the datasheet's dense number times
:data:`SUSTAINED_FRACTION` (an assumption, stated in ``docs/emulator.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tuner.perfmodel._deps import GIB, HardwareProfile

__all__ = ["DEVICES", "SUSTAINED_FRACTION", "DeviceSpec", "NodeSpec", "UnknownDeviceError", "node_spec"]

TB = 1e12
TF = 1e12
GBPS = 1e9

SUSTAINED_FRACTION = 0.72
"""Datasheet dense FLOP/s → sustained, where nothing was measured (assumption: the GH200's
583/990 = 0.59 is a power-capped low; 0.7–0.75 is typical of a long GEMM at full power)."""


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU kind. Rates are per GPU; ``fp4_flop_s`` is 0 where there are no FP4 tensor cores."""

    name: str
    hbm_bytes_s: float
    bf16_flop_s: float
    fp8_flop_s: float
    fp4_flop_s: float
    link_bytes_s: float
    """What one GPU can push to its peers at once (sum over its links, one direction)."""
    link_latency_s: float
    """Fixed cost of one collective step over the links."""
    source: str
    mesh: bool = False
    """Point-to-point links, one per peer (no switch): a group of g GPUs uses g - 1 of them."""


DEVICES: tuple[tuple[str, DeviceSpec], ...] = (
    # Matched against hardware.device_name, lower case, first hit wins (gh200 before h200).
    ("gh200", DeviceSpec(
        "GH200 (H100-class, power-capped)", hbm_bytes_s=4.0 * TB, bf16_flop_s=583 * TF, fp8_flop_s=1166 * TF,
        fp4_flop_s=0.0, link_bytes_s=3 * 150 * GBPS, link_latency_s=8e-6,
        source="blog: 990 TF/s bf16 datasheet vs 4 TB/s HBM; sustained bf16 583 TF/s (power cap); "
               "fp8 doubles the FLOPs; NVLink 4 P2P, 150 GB/s per peer, 3 peers, no switch", mesh=True)),
    ("h200", DeviceSpec(
        "H200-SXM5", hbm_bytes_s=4.8 * TB, bf16_flop_s=989 * TF * SUSTAINED_FRACTION,
        fp8_flop_s=1979 * TF * SUSTAINED_FRACTION, fp4_flop_s=0.0, link_bytes_s=450 * GBPS,
        link_latency_s=8e-6, source="NVIDIA datasheet: 4.8 TB/s HBM3e, 989/1979 TF/s dense bf16/fp8, "
                                    "NVLink 4 900 GB/s bidirectional via NVSwitch")),
    ("h100", DeviceSpec(
        "H100-SXM5", hbm_bytes_s=3.35 * TB, bf16_flop_s=989 * TF * SUSTAINED_FRACTION,
        fp8_flop_s=1979 * TF * SUSTAINED_FRACTION, fp4_flop_s=0.0, link_bytes_s=450 * GBPS,
        link_latency_s=8e-6, source="NVIDIA datasheet: 3.35 TB/s HBM3, 989/1979 TF/s dense, NVLink 4 + NVSwitch")),
    ("b200", DeviceSpec(
        "B200", hbm_bytes_s=8.0 * TB, bf16_flop_s=2250 * TF * SUSTAINED_FRACTION,
        fp8_flop_s=4500 * TF * SUSTAINED_FRACTION, fp4_flop_s=9000 * TF * SUSTAINED_FRACTION,
        link_bytes_s=900 * GBPS, link_latency_s=6e-6,
        source="NVIDIA datasheet: 8 TB/s HBM3e, 2.25/4.5/9 PF dense bf16/fp8/fp4, NVLink 5 1.8 TB/s bidirectional")),
    ("gb300", DeviceSpec(
        "GB300 (Blackwell Ultra)", hbm_bytes_s=8.0 * TB, bf16_flop_s=2500 * TF * SUSTAINED_FRACTION,
        fp8_flop_s=5000 * TF * SUSTAINED_FRACTION, fp4_flop_s=15000 * TF * SUSTAINED_FRACTION,
        link_bytes_s=900 * GBPS, link_latency_s=6e-6,
        source="NVIDIA GB300 NVL72 page: 8 TB/s HBM3e, 15 PF dense fp4; NVLink 5 (bf16/fp8 assumed as B200 scaled)")),
    ("rtx pro 6000", DeviceSpec(
        "RTX PRO 6000 Blackwell", hbm_bytes_s=1.79 * TB, bf16_flop_s=500 * TF * SUSTAINED_FRACTION,
        fp8_flop_s=1000 * TF * SUSTAINED_FRACTION, fp4_flop_s=2000 * TF * SUSTAINED_FRACTION,
        link_bytes_s=50 * GBPS, link_latency_s=25e-6,
        source="NVIDIA RTX PRO 6000 Blackwell: 1.79 TB/s GDDR7, ~0.5/1/2 PF dense bf16/fp8/fp4; "
               "PCIe 5 x16 (~50 GB/s usable), no NVLink (model card: --disable-custom-all-reduce)")),
    ("mi325x", DeviceSpec(
        "Instinct MI325X", hbm_bytes_s=6.0 * TB, bf16_flop_s=1307 * TF * SUSTAINED_FRACTION,
        fp8_flop_s=2615 * TF * SUSTAINED_FRACTION, fp4_flop_s=0.0, link_bytes_s=400 * GBPS,
        link_latency_s=10e-6, source="AMD specification: 6 TB/s HBM3E, 1.3/2.6 PF dense bf16/fp8 (single GPU here)")),
)
"""GPU kinds the performance model knows, keyed by a fragment of the profile's ``hardware.device_name``."""


class UnknownDeviceError(ValueError):
    """The profile's GPU is not in :data:`DEVICES`."""


@dataclass(frozen=True)
class NodeSpec:
    """One node: ``device_count`` GPUs of one kind, with the profile's memory per GPU."""

    profile_name: str
    device: DeviceSpec
    device_count: int
    memory_per_device_bytes: float
    generation: str

    @property
    def memory_per_device_gib(self) -> float:
        return self.memory_per_device_bytes / GIB

    def scaled(self, *, hbm: float = 1.0, flops: float = 1.0, link: float = 1.0) -> NodeSpec:
        """The same node with its rates multiplied (a "true" node for the truth/prior split)."""
        dev = replace(self.device, hbm_bytes_s=self.device.hbm_bytes_s * hbm,
                      bf16_flop_s=self.device.bf16_flop_s * flops, fp8_flop_s=self.device.fp8_flop_s * flops,
                      fp4_flop_s=self.device.fp4_flop_s * flops, link_bytes_s=self.device.link_bytes_s * link)
        return replace(self, device=dev)


def device_for(device_name: str) -> DeviceSpec:
    lowered = device_name.lower()
    for fragment, spec in DEVICES:
        if fragment in lowered:
            return spec
    known = ", ".join(fragment for fragment, _ in DEVICES)
    raise UnknownDeviceError(f"no device rates for {device_name!r}; the emulator knows: {known}")


def node_spec(profile: HardwareProfile) -> NodeSpec:
    """The node of a hardware profile (device memory from the profile, rates from :data:`DEVICES`)."""
    hw = profile.hardware
    if hw.accelerator == "cpu":
        raise UnknownDeviceError(f"profile {profile.name!r} is a CPU profile; the emulator models GPU nodes")
    return NodeSpec(profile_name=profile.name, device=device_for(hw.device_name), device_count=hw.device_count,
                    memory_per_device_bytes=hw.memory_per_device_gb * GIB, generation=hw.generation)

"""The nodes the independent truth knows, from public datasheets and the 4xGH200 blog (no tuner constant).

Each figure is a vendor or blog figure, not a fit: HBM per GPU and its bandwidth, the bf16 dense rate the
GPU sustains (the blog measured 583 TF/s on a GH200 under its software power cap; the H200 figure is the
datasheet's 989 TF/s scaled by the same cap ratio), FP8 at twice bf16 (Hopper), and the GPU-to-GPU link:
NVLink 4 point to point without a switch on the GH200 node (150 GB/s per peer on paper, the blog), one
NVSwitch at 450 GB/s a direction per GPU on the H200 node.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NODES", "Node", "node_named"]

_GIB = 1024 ** 3


@dataclass(frozen=True)
class Node:
    """One node: its GPUs, their memory and rates, and how they are linked."""

    name: str
    gpus: int
    hbm_bytes: float
    hbm_bytes_s: float
    bf16_flop_s: float
    link_bytes_s: float
    """Per GPU, to its peers: the sum over peers on a switchless mesh, the switch port otherwise."""
    switch: bool

    @property
    def fp8_flop_s(self) -> float:
        return 2.0 * self.bf16_flop_s

    def link_for(self, group: int) -> float:
        """Bytes/s one GPU can send into a group of ``group`` GPUs (a mesh uses only the peers in the group)."""
        if group <= 1:
            return self.link_bytes_s
        if self.switch:
            return self.link_bytes_s
        return self.link_bytes_s * (group - 1) / max(self.gpus - 1, 1)


NODES: dict[str, Node] = {
    "gh200x4": Node("gh200x4", gpus=4, hbm_bytes=96 * _GIB, hbm_bytes_s=4.0e12, bf16_flop_s=583e12,
                    link_bytes_s=3 * 150e9, switch=False),
    "h200x8": Node("h200x8", gpus=8, hbm_bytes=141e9, hbm_bytes_s=4.8e12, bf16_flop_s=989e12 * 583 / 990,
                   link_bytes_s=450e9, switch=True),
}


def node_named(name: str) -> Node:
    try:
        return NODES[name]
    except KeyError:
        raise KeyError(f"the independent truth knows the nodes {', '.join(NODES)}, not {name!r}") from None

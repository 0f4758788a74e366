"""A TP x DP x EP shape has one name, :attr:`tuner.search.profile.Topology.name`: the emulated node's
serve config names it through it, and ``parse_topology`` reads it back."""

from __future__ import annotations

import itertools

from tuner.perfmodel.serve_config import EmulatedConfig
from tuner.search.profile import Topology, parse_topology


def test_the_emulated_serve_config_names_a_shape_as_the_profile_does() -> None:
    for tp, dp, ep in itertools.product((1, 2, 4, 8), (1, 2, 4), (False, True)):
        topology = Topology(tp=tp, dp=dp, ep=ep)
        assert EmulatedConfig(model="m", tp=tp, dp=dp, ep=ep).topology_name == topology.name
        assert parse_topology(topology.name) == topology
    assert [Topology(4, 1, False).name, Topology(1, 4, True).name, Topology(2, 2, True).name] == [
        "tp4", "dp4-ep", "tp2-dp2-ep"]

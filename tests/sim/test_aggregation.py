"""Per-stage aggregation time: hivemind's butterfly all-reduce over the replicas' links."""

from __future__ import annotations

import pytest

from gwtfp2p.flow.geo import GIB
from gwtfp2p.sim.allreduce import butterfly_allreduce_s
from gwtfp2p.sim.network import MBIT, Network, NetworkSpec

pytestmark = pytest.mark.timeout(30)
SIZE = 150e6


def network(kind: str, places: dict[str, str]) -> Network:
    net = Network(NetworkSpec(kind))
    for node, place in places.items():
        net.add_node(node, place, (20 * MBIT, 100 * MBIT))
    return net


def test_one_replica_needs_no_reduction():
    assert butterfly_allreduce_s(network("geo10", {"a": "Tokyo"}), ["a"], SIZE) == 0.0


def test_two_phases_of_parts_over_the_slowest_link():
    net = network("geo10", {"a": "Oregon", "b": "Virginia", "c": "Ohio"})
    part = SIZE / 3
    slowest = max(0.067 + part / (0.395 * GIB), 0.049 + part / (0.55 * GIB), 0.011 + part / (0.56 * GIB))
    assert butterfly_allreduce_s(net, ["a", "b", "c"], SIZE) == pytest.approx(2 * slowest)


def test_home_uploads_share_the_uplink():
    places = {"a": "London", "b": "London", "c": "London"}
    home, geo = network("home", places), network("geo10", places)
    part = SIZE / 3
    assert butterfly_allreduce_s(home, list(places), SIZE) == pytest.approx(2 * (0.001 + 2 * part / (20 * MBIT)))
    assert butterfly_allreduce_s(geo, list(places), SIZE) < butterfly_allreduce_s(home, list(places), SIZE)

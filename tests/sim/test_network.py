"""Network model: geo10 links, per-direction serialization, control messages, variants."""

from __future__ import annotations

import pytest

from gwtfp2p.config import ConfigError
from gwtfp2p.flow.geo import GIB
from gwtfp2p.sim.network import CONTROL_BYTES, MBIT, Network, NetworkSpec

pytestmark = pytest.mark.timeout(30)
SIZE = 8 * 2**20


def geo_network(kind: str = "geo10") -> Network:
    net = Network(NetworkSpec(kind))
    net.add_node("a", "Oregon", (20 * MBIT, 100 * MBIT))
    net.add_node("b", "Virginia", (40 * MBIT, 300 * MBIT))
    net.add_node("c", "Virginia", (100 * MBIT, 1000 * MBIT))
    return net


def test_geo10_link_comes_from_the_table():
    net = geo_network()
    assert net.link("a", "b") == pytest.approx((0.067, 0.395 * GIB))
    assert net.link("b", "c") == pytest.approx((0.001, 2.0 * GIB))  # same region: the local link


def test_transfers_queue_per_direction_only():
    net = geo_network()
    serialize = SIZE / (0.395 * GIB)
    start1, depart1, arrive1 = net.transfer("a", "b", SIZE, 10.0)
    assert (start1, depart1, arrive1) == pytest.approx((10.0, 10.0 + serialize, 10.0 + serialize + 0.067))
    start2, depart2, _ = net.transfer("a", "b", SIZE, 10.0)  # same direction: waits for the first
    assert start2 == pytest.approx(depart1) and depart2 == pytest.approx(depart1 + serialize)
    start3, _, _ = net.transfer("b", "a", SIZE, 10.0)  # the other direction is free
    start4, _, _ = net.transfer("a", "c", SIZE, 10.0)  # another destination is free too
    assert start3 == 10.0 and start4 == 10.0


def test_control_messages_are_not_queued_behind_bulk_data():
    net = geo_network()
    net.transfer("a", "b", 100 * SIZE, 0.0)
    assert net.control_delay("a", "b") == pytest.approx(0.067 + CONTROL_BYTES / (0.395 * GIB))


def test_home_broadband_uses_access_links_and_a_shared_uplink():
    net = geo_network("home")
    assert net.link("a", "b")[1] == pytest.approx(20 * MBIT)  # a's uplink
    assert net.link("b", "a")[1] == pytest.approx(40 * MBIT)  # b's uplink (a's downlink is larger)
    _, depart1, _ = net.transfer("a", "b", SIZE, 0.0)
    start2, _, _ = net.transfer("a", "c", SIZE, 0.0)  # another destination, the same uplink
    assert start2 == pytest.approx(depart1)


def test_uniform_and_ideal_variants():
    uniform = Network(NetworkSpec("uniform"))
    uniform.add_node("x", "")
    uniform.add_node("y", "")
    assert uniform.link("x", "y") == (0.05, 1000 * MBIT)
    ideal = Network(NetworkSpec("ideal"))
    ideal.add_node("x", "")
    ideal.add_node("y", "")
    _, _, arrive = ideal.transfer("x", "y", SIZE, 3.0)
    assert arrive == pytest.approx(3.0)


def test_bad_network_settings_name_the_flag():
    with pytest.raises(ConfigError, match="--network"):
        NetworkSpec("dialup")
    with pytest.raises(ConfigError, match="--network"):
        Network(NetworkSpec()).add_node("x", "Atlantis")

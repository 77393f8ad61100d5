"""FlowNode protocol behaviour on small, hand-checked swarms driven by the in-memory bus."""

import random

from gwtfp2p.flow.bus import MessageBus, NetworkModel
from gwtfp2p.flow.core import InUnit, OutUnit
from gwtfp2p.flow.generate import FamilyShape, generate
from gwtfp2p.flow.instance import FlowInstance, NodeSpec, edge_key
from gwtfp2p.flow.messages import Advert, BackwardEntry, ForwardEntry, Refresh, Request
from gwtfp2p.flow.node import FlowNode


def two_stage_line(capacity_1: int = 2, capacity_2: int = 5, supply: int = 3) -> FlowInstance:
    nodes = (NodeSpec("dh", 0, supply=supply), NodeSpec("r1", 1, capacity=capacity_1),
             NodeSpec("r2", 2, capacity=capacity_2))
    edges = {edge_key("dh", "r1"): 1.0, edge_key("r1", "r2"): 2.0, edge_key("r2", "dh"): 3.0}
    return FlowInstance(2, nodes, edges)


def test_flow_is_capped_by_the_smallest_capacity_and_never_exceeds_it():
    bus = MessageBus(two_stage_line(capacity_1=2), seed=1, check_every_tick=True)
    result = bus.run(max_ticks=300, quiet_ticks=40)
    assert result.quality.flow_value == 2
    assert result.quality.total_cost == 2 * 6.0
    assert bus.violations == []
    assert len(bus.nodes["r1"].core.ins) <= 2


def test_unroutable_demand_does_not_spin():
    bus = MessageBus(two_stage_line(capacity_1=2), seed=1)
    bus.run(max_ticks=300, quiet_ticks=40)
    before = bus.messages
    for _ in range(60):
        bus.step()
    # only soft-state refreshes and keep-alives: a few messages per node and tick at most
    assert (bus.messages - before) / 60 < 3 * len(bus.nodes)


def test_losing_a_neighbour_breaks_its_units_at_once():
    bus = MessageBus(two_stage_line(capacity_1=3), seed=2, check_every_tick=True)
    bus.run(max_ticks=300, quiet_ticks=40)
    assert len(bus.routing()) == 3
    bus.remove_node("r2")
    assert bus.routing() == []
    r1 = bus.nodes["r1"].core
    assert all(o.next != "r2" for o in r1.outs.values())
    for _ in range(40):
        bus.step()
    assert bus.violations == []
    assert not bus.nodes["r1"].core.ins  # upstream units were cancelled or pushed back
    assert bus.nodes["dh"].core.demand() == 3


def test_lower_capacity_pushes_units_back():
    bus = MessageBus(two_stage_line(capacity_1=3), seed=3)
    bus.run(max_ticks=300, quiet_ticks=40)
    bus.nodes["r1"].set_capacity(1, bus.now)
    bus.specs["r1"] = NodeSpec("r1", 1, capacity=1)
    bus.run(max_ticks=300, quiet_ticks=40)
    assert len(bus.routing()) == 1
    assert bus.check().violations == []


def test_messages_from_strangers_are_ignored():
    node = FlowNode("r1", 1, 2, capacity=2, rng=random.Random(0))
    assert node.on_message(Request("intruder", "dh", ("x#1",), (1.0,), 0.0), 1) == []
    assert node.on_message(Advert("intruder", (("dh", 0.0),), 5), 1) == []
    assert not node.core.ins


def test_a_newcomer_attracts_flow():
    inst = generate("b", 5, FamilyShape(n_stages=3, relays_per_stage=2, data_holders=1, supply=40))
    bus = MessageBus(inst, seed=5)
    bus.run(max_ticks=600)
    before = len(bus.routing())
    stage = min(range(1, 4), key=lambda k: sum(n.capacity for n in inst.stage_nodes(k)))
    neighbours = {n.node_id: 1.0 for n in bus.specs.values() if abs(n.stage - stage) == 1
                  or (stage == 3 and n.stage == 0) or (stage == 1 and n.stage == 0)}
    bus.add_node(NodeSpec("newcomer", stage, capacity=20), neighbours)
    bus.run(max_ticks=600)
    assert len(bus.routing()) > before
    assert any("newcomer" in path for path in bus.routing())


def test_same_seed_same_result_and_different_seed_may_differ():
    inst = generate("b", 11)
    runs = [MessageBus(inst, seed=4, network=NetworkModel(jitter_ticks=2, loss=0.05)).run(max_ticks=400)
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_unit_states_name_each_unit_its_neighbours_and_flags():
    bus = MessageBus(two_stage_line(capacity_1=2), seed=1)
    bus.run(max_ticks=300, quiet_ticks=40)
    r1 = bus.nodes["r1"].unit_states()
    assert len(r1) == 4 and all(line.startswith("in dh#") and " from dh e0 -> r1#" in line for line in r1[:2])
    assert all(line.startswith("out r1#") and line.endswith(" to r2 e0 CK") for line in r1[2:]), r1
    assert bus.nodes["dh"].unit_states()[-1].endswith(" to r1 e0 CK")


def test_a_refresh_from_a_units_new_holder_moves_the_routing_version():
    """A take-over downstream: the taker's Refresh reaches us before the giver's Moved, and the routing
    table (and what caches it by routing_version, such as the daemon's published summary) follows it."""
    node = FlowNode("r1", 1, 2, capacity=4)
    for peer, stage, cost in (("dh", 0, 1.0), ("dh2", 0, 1.5), ("a", 2, 5.0), ("b", 2, 2.0)):
        node.add_neighbour(peer, stage, cost, now=0)
    c = node.core
    c.ins["x#1"] = InUnit("x#1", "dh", "dh", 1.0, 0, 0, 0)
    c.outs["r1#1"] = OutUnit("r1#1", "a", "dh", 0, 0, None, confirmed=True, complete=True, down_cost=6.0)
    c.match("x#1", "r1#1")
    version = node.routing_version
    node.on_message(Refresh("b", backward=(BackwardEntry("r1#1", 1.0, True, 1),)), now=1)
    assert node.routing_version > version
    assert [(r.next, r.complete) for r in node.routing_table()] == [("b", True)]
    version = node.routing_version
    node.on_message(Refresh("dh2", forward=(ForwardEntry("x#1", "dh", 1.5, 1),)), now=2)
    assert node.routing_version > version
    assert [r.prev for r in node.routing_table()] == ["dh2"]

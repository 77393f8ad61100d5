"""The global checker itself must catch broken states (a checker that cannot fail proves nothing)."""

from gwtfp2p.flow.bus import MessageBus
from gwtfp2p.flow.core import InUnit, OutUnit
from gwtfp2p.flow.instance import FlowInstance, NodeSpec, edge_key


def converged_bus() -> MessageBus:
    nodes = (NodeSpec("dh0", 0, supply=2), NodeSpec("dh1", 0, supply=2), NodeSpec("r1", 1, capacity=4))
    edges = {edge_key("dh0", "r1"): 1.0, edge_key("dh1", "r1"): 1.0}
    bus = MessageBus(FlowInstance(1, nodes, edges), seed=0)
    bus.run(max_ticks=200, quiet_ticks=30)
    assert len(bus.routing()) == 4 and bus.check().violations == []
    return bus


def test_detects_over_capacity():
    bus = converged_bus()
    bus.nodes["r1"].core.capacity = 3
    assert any("capacity" in v for v in bus.check().violations)


def test_detects_a_unit_ending_at_another_holder():
    bus = converged_bus()
    r1 = bus.nodes["r1"].core
    unit = next(u for u in r1.ins.values() if u.sink == "dh0")
    out = r1.outs[unit.out_id]
    sink_unit = bus.nodes["dh0"].core.ins.pop(out.edge_id)
    sink_unit.sink = "dh1"
    bus.nodes["dh1"].core.ins[out.edge_id] = sink_unit
    out.next = "dh1"
    assert any("not its own data holder" in v for v in bus.check().violations)


def test_detects_double_ownership_and_lost_node_references():
    bus = converged_bus()
    r1 = bus.nodes["r1"].core
    some_out = next(iter(r1.outs.values()))
    bus.nodes["dh1"].core.outs[some_out.edge_id] = OutUnit(some_out.edge_id, "r1", "dh1", 0, 0, None)
    bus.nodes["dh1"].core.ins["ghost"] = InUnit("ghost", "gone", "dh1", 0.0, 0, 0, 0)
    bus.lost_signalled["dh1"].add("gone")
    violations = bus.check().violations
    assert any("owned by 2" in v for v in violations)
    assert any("through gone" in v for v in violations)

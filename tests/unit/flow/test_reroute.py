"""Augmenting steps at a relay (reroute.py ``start_for_flow``): a unit that a step moved off a next hop is not
moved back there by a later step, which would undo the first and free nothing new (measured: such steps
alternated a unit between two next hops every walk, forever, on a ``tight`` swarm; docs/flow-tight.md)."""

from __future__ import annotations

from gwtfp2p.config import FlowParams
from gwtfp2p.flow.bus import MessageBus
from gwtfp2p.flow.instance import NodeSpec
from tests.unit.flow.swarms import swarm

STILL = FlowParams(augment=False, reroute_margin=0.0, improve_probability=0.0)  # moves only when the test asks


def fork() -> MessageBus:
    """g routes one unit g -> x -> a -> g; x could send it to b or c instead (dearer links)."""
    nodes = (NodeSpec("g", 0, supply=1), NodeSpec("x", 1, capacity=1), NodeSpec("a", 2, capacity=1),
             NodeSpec("b", 2, capacity=1), NodeSpec("c", 2, capacity=1))
    costs = {("g", "x"): 1.0, ("x", "a"): 1.0, ("x", "b"): 2.0, ("x", "c"): 3.0, ("a", "g"): 1.0, ("b", "g"): 1.0,
             ("c", "g"): 1.0}
    bus = swarm(nodes, costs, STILL)
    assert bus.run(max_ticks=300, quiet_ticks=30).converged
    assert bus.routing() == [("g", "x", "a", "g")]
    return bus


def step_to(bus: MessageBus, relay: str, hop: str) -> bool:
    """Have ``relay`` start an augmenting step that moves its one unit onto ``hop``; run until it is done."""
    node = bus.nodes[relay]
    (out,) = node.core.outs.values()
    started = node.rerouter.start_for_flow(out, node.core.neighbours[hop])
    for _ in range(40):
        bus.step()
    assert bus.violations == [] and node.rerouter.current is None
    return started


def test_a_step_does_not_move_a_unit_back_to_the_hop_a_step_took_it_from() -> None:
    bus = fork()
    assert step_to(bus, "x", "b")
    assert bus.routing() == [("g", "x", "b", "g")]
    assert not step_to(bus, "x", "a")  # undoing the first step
    assert bus.routing() == [("g", "x", "b", "g")]
    assert step_to(bus, "x", "c")  # a hop it never left is still open
    assert bus.routing() == [("g", "x", "c", "g")]

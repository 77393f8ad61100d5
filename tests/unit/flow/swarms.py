"""Small hand-built swarms for the flow unit tests: a bus over given links, and the two-lane swarm."""

from __future__ import annotations

from gwtfp2p.config import FlowParams
from gwtfp2p.flow.bus import MessageBus
from gwtfp2p.flow.instance import FlowInstance, NodeSpec, edge_key

LANE_NODES = (NodeSpec("g", 0, supply=2), NodeSpec("x", 1, capacity=1), NodeSpec("y", 1, capacity=1),
              NodeSpec("z", 2, capacity=1), NodeSpec("w", 2, capacity=1))
LANE_COSTS = {("g", "x"): 1.0, ("g", "y"): 1.0, ("x", "z"): 1.0, ("y", "w"): 1.0, ("x", "w"): 5.0, ("y", "z"): 5.0,
              ("z", "g"): 1.0, ("w", "g"): 1.0}
STRAIGHT = [("g", "x", "z", "g"), ("g", "y", "w", "g")]
CROSSED = [("g", "x", "w", "g"), ("g", "y", "z", "g")]


def swarm(nodes: tuple[NodeSpec, ...], costs: dict[tuple[str, str], float], params: FlowParams) -> MessageBus:
    """A two-stage bus over ``nodes`` with the links ``costs`` names, invariants checked every tick."""
    return MessageBus(FlowInstance(2, nodes, {edge_key(a, b): c for (a, b), c in costs.items()}), seed=0,
                      params=params, check_every_tick=True)


def lanes(params: FlowParams) -> MessageBus:
    """g routes two units, g -> x -> z -> g and g -> y -> w -> g (``STRAIGHT``; the crossed links cost more);
    every relay carries one unit, so the only cost moves swap or exchange x's and y's next hops (``CROSSED``)."""
    return swarm(LANE_NODES, LANE_COSTS, params)

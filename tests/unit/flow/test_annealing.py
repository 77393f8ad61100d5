"""The annealer under a blocked holder's flag (annealing.py): swaps and exchanges, which keep every node's
load, go on; a takeover, which fills the taker's spare capacity, waits (``FlowParams.swaps_under_flags``)."""

from __future__ import annotations

from gwtfp2p.config import FlowParams
from gwtfp2p.flow.bus import MessageBus
from gwtfp2p.flow.instance import NodeSpec
from tests.unit.flow.swarms import CROSSED, STRAIGHT, lanes, swarm

QUIET = FlowParams(augment=False, reroute_margin=0.0)  # no augmenting steps, no re-routes


def flagged(bus: MessageBus) -> None:
    """Every node holds its cost-driven moves from now on, as if a blocked holder's flag reached it (a fake:
    the flag is set again after each residual tick, which would clear it)."""
    for node in bus.nodes.values():
        residual_tick = node.residual.tick

        def tick(core=node.core, residual_tick=residual_tick) -> None:
            residual_tick()
            core.flow_first = True

        node.residual.tick = tick


def settle(bus: MessageBus) -> list[tuple[str, ...]]:
    result = bus.run(max_ticks=400, quiet_ticks=40)
    assert result.converged and bus.violations == []
    return sorted(bus.routing())


def run(bus: MessageBus, ticks: int = 200) -> list[tuple[str, ...]]:
    """The routing after ``ticks`` ticks (a flagged bus never counts as settled: a flag is work under way)."""
    for _ in range(ticks):
        bus.step()
    assert bus.violations == []
    return sorted(bus.routing())


def test_a_swap_goes_on_under_a_flag_and_waits_without_swaps_under_flags() -> None:
    for swaps in (True, False):
        bus = lanes(FlowParams(augment=False, reroute_margin=0.0, swaps_under_flags=swaps))
        assert settle(bus) == STRAIGHT
        flagged(bus)
        for node, peer, cost_s in (("x", "z", 9.0), ("z", "x", 9.0), ("y", "w", 9.0), ("w", "y", 9.0),
                                   ("x", "w", 1.0), ("w", "x", 1.0), ("y", "z", 1.0), ("z", "y", 1.0)):
            bus.measured(node, peer, cost_s)
        assert run(bus) == (CROSSED if swaps else STRAIGHT)


def spare_relay() -> MessageBus:
    """g routes one unit through y (g -> y -> w -> g); x, beside y, has room and links to g and w. With one
    unit and one relay after them there is nothing to swap or exchange: the only move is x taking y's unit
    over once y's links grow dear."""
    nodes = (NodeSpec("g", 0, supply=1), NodeSpec("x", 1, capacity=2), NodeSpec("y", 1, capacity=1),
             NodeSpec("w", 2, capacity=1))
    costs = {("g", "x"): 5.0, ("g", "y"): 1.0, ("x", "w"): 5.0, ("y", "w"): 1.0, ("w", "g"): 1.0}
    return swarm(nodes, costs, QUIET)


def test_a_takeover_waits_under_a_flag() -> None:
    for flags in (True, False):
        bus = spare_relay()
        assert settle(bus) == [("g", "y", "w", "g")]
        if flags:
            flagged(bus)
        for node, peer, cost_s in (("y", "g", 20.0), ("g", "y", 20.0), ("y", "w", 20.0), ("w", "y", 20.0)):
            bus.measured(node, peer, cost_s)
        assert run(bus) == ([("g", "y", "w", "g")] if flags else [("g", "x", "w", "g")])

"""The move protocol between same-stage peers (moves.py): a receiver re-checks a proposed swap with its own
costs and the proposer's, and takes it when it gains what the proposer expected."""

from __future__ import annotations

import pytest

from gwtfp2p.config import FlowParams
from gwtfp2p.flow.bus import MessageBus
from tests.unit.flow.swarms import CROSSED, STRAIGHT, lanes

# No move unless the test starts it: no annealing draw, no augmenting step, no re-route.
STILL = FlowParams(augment=False, reroute_margin=0.0, improve_probability=0.0)


def dear_lanes() -> MessageBus:
    """The two lanes, settled straight; then the straight links grow dear and the crossed ones cheap, x -> w (1)
    cheaper than y -> z (4), so the two relays' costs to the other's next hop differ."""
    bus = lanes(STILL)
    result = bus.run(max_ticks=400, quiet_ticks=40)
    assert result.converged and sorted(bus.routing()) == STRAIGHT
    for a, b, cost_s in (("x", "z", 9.0), ("y", "w", 9.0), ("x", "w", 1.0), ("y", "z", 4.0)):
        bus.measured(a, b, cost_s)
        bus.measured(b, a, cost_s)
    for _ in range(30):  # tables and the units' path costs catch up
        bus.step()
    return bus


@pytest.mark.parametrize("proposer", ["x", "y"])
def test_a_swap_that_gains_is_taken_whichever_relay_proposes_it(proposer: str) -> None:
    bus = dear_lanes()
    annealer = bus.nodes[proposer].annealer
    peer, table = annealer._fresh_tables()[0]
    swap = annealer._swaps(peer, table)
    assert swap is not None and swap.gain > 0
    annealer._execute(swap)
    for _ in range(20):
        bus.step()
    assert bus.violations == []
    assert sorted(bus.routing()) == CROSSED

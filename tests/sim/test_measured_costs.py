"""Measured costs and a settled routing: two equal replicas must not trade units on measurement noise.

The live status page showed a 4-node swarm (a data holder, two equal stage-1 relays, one stage-2
relay) re-route 49 times in 120 s with nothing changing: each probe re-measured costs with ±25 % of
noise, the flow took every change past 20 % and moved units to whichever replica looked cheaper.
Here the same swarm runs on the in-memory bus, its nodes' costs re-measured every 4 ticks with
that noise (a uniform draw of ±80 % per ping, averaged as the daemon's link table does, α = 0.3),
and fed to each flow through ``SettledCosts``: with the daemon's settling the routing stays put
after it formed; with the old rule (every change past 20 % at once) it keeps moving.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gwtfp2p.config import CostSettling, FlowParams
from gwtfp2p.flow.bus import MessageBus
from gwtfp2p.flow.costs import SettledCosts
from gwtfp2p.flow.instance import FlowInstance, NodeSpec, edge_key

TRUE_COST_S = 0.010
PING_NOISE = 0.8
LINK_ALPHA = 0.3  # the daemon's RTT average (links.LinkTable)
PROBE_EVERY_TICKS = 4  # Timings.probe_s = 4 ticks
FORMED_BY_TICK = 300
TICKS = 1200
OLD_RULE = CostSettling(smoothing=1.0, rel_tolerance=0.2, confirmations=1)  # before: links.cost_changed


def hops(bus: MessageBus) -> tuple:
    """The routing as the status page draws it: units per (node, next hop)."""
    return tuple(sorted(Counter((p[i], p[i + 1]) for p in bus.routing() for i in range(len(p) - 1)).items()))


def run(seed: int, settling: CostSettling) -> tuple[int, int]:
    """(routing changes after ``FORMED_BY_TICK``, units routed at the end)."""
    nodes = (NodeSpec("dh", 0, supply=4), NodeSpec("r1a", 1, capacity=16), NodeSpec("r1b", 1, capacity=16),
             NodeSpec("r2", 2, capacity=16))
    edges = {edge_key(a, b): TRUE_COST_S for a, b in
             (("dh", "r1a"), ("dh", "r1b"), ("r1a", "r2"), ("r1b", "r2"), ("r2", "dh"))}
    bus = MessageBus(FlowInstance(2, nodes, edges), seed=seed, params=FlowParams())
    rng = random.Random(f"pings:{seed}")
    averages: dict[tuple[str, str], float] = {}
    settled = {node_id: SettledCosts(settling) for node_id in bus.nodes}
    last, changes = None, 0
    for tick in range(TICKS):
        if tick % PROBE_EVERY_TICKS == 0:
            for node_id, node in sorted(bus.nodes.items()):
                for peer in sorted(node.core.neighbours):
                    if edge_key(node_id, peer) not in edges:
                        continue
                    sample = TRUE_COST_S * (1 + rng.uniform(-PING_NOISE, PING_NOISE))
                    old = averages.get((node_id, peer), sample)
                    averages[(node_id, peer)] = average = (1 - LINK_ALPHA) * old + LINK_ALPHA * sample
                    cost = settled[node_id].offer(peer, average)
                    if cost is not None:
                        bus.measured(node_id, peer, cost)
        bus.step()
        current = hops(bus)
        if current != last:
            changes += tick > FORMED_BY_TICK
            last = current
    return changes, sum(units for (a, _), units in last if a == "dh")


@pytest.mark.parametrize("seed", range(4))
def test_noisy_costs_leave_a_formed_routing_almost_alone(seed: int) -> None:
    settled_changes, settled_units = run(seed, CostSettling())
    old_changes, _ = run(seed, OLD_RULE)
    print(f"seed {seed}: routing changes after tick {FORMED_BY_TICK}: settled {settled_changes}, "
          f"old rule {old_changes}")
    assert settled_units == 4
    # the defect: the routing never settles (108-162 changes on seeds 0-3 with the annealer's and the
    # re-routes' hysteresis, 153-177 before it: a noisy cost still moves units past any margin)
    assert old_changes >= 80
    assert settled_changes <= 30 and settled_changes * 5 <= old_changes

"""A node's routing table, read through its ``routing_version``, follows every change of a unit's prev or next.

The daemon caches ``FlowNode.routing_table()`` by ``routing_version`` (``FlowDriver.routes()``) and publishes
its summary in the node's DHT record, from which ``gwtf status`` computes the routing's cost. A take-over
downstream hands a unit to another replica; when the taker's Refresh reached the upstream node before the
giver's ``Moved``, the next hop changed with no version change, and the record kept the old next hop for good
(``test_daemon_location`` failed in CI with London publishing a unit to Tokyo that Tokyo no longer held).

The swarm is that test's: a data holder in Frankfurt, stage 1 in London and Sydney, stage 2 in Ireland and Tokyo,
costs first small and nearly equal (before the link emulation knows where peers are), then the geo10 ones at
``--link-scale 0.5`` on both ends of every edge, after which stage 2 moves units from Tokyo to Ireland.
"""

from __future__ import annotations

import random

import pytest

from gwtfp2p.flow.bus import MessageBus
from gwtfp2p.flow.geo import geo10
from gwtfp2p.flow.instance import FlowInstance, NodeSpec, edge_key
from gwtfp2p.flow.node import Route

PLACE = {"dh0": (0, "Frankfurt"), "london": (1, "London"), "sydney": (1, "Sydney"),
         "ireland": (2, "Ireland"), "tokyo": (2, "Tokyo")}
EDGES = [("dh0", "london"), ("dh0", "sydney"), ("london", "ireland"), ("london", "tokyo"), ("sydney", "ireland"),
         ("sydney", "tokyo"), ("ireland", "dh0"), ("tokyo", "dh0")]
LOCATED_AT_TICK = 60
TICKS = 300


def geo_cost_s(a: str, b: str) -> float:
    return 0.01 + 0.5 * geo10().link(PLACE[a][1], PLACE[b][1])[0]


def shape(routes: list[Route]) -> list[tuple]:
    """What a version-cached table must keep right: the complete units (what a record publishes), each with its
    ends (costs move on their own, and units under construction count once complete)."""
    return [(r.sink, r.in_edge, r.prev, r.out_edge, r.next) for r in routes if r.complete]


@pytest.mark.parametrize("seed", [4, 10, 15, 22, 28, 33])
def test_the_table_cached_by_routing_version_is_the_current_one_at_every_tick(seed: int) -> None:
    rng = random.Random(seed)
    nodes = (NodeSpec("dh0", 0, supply=4),
             *(NodeSpec(name, stage, capacity=4) for name, (stage, _) in PLACE.items() if stage))
    bus = MessageBus(FlowInstance(2, nodes, {edge_key(a, b): 0.003 + 0.002 * rng.random() for a, b in EDGES}),
                     seed=seed)
    cached = {name: (-1, []) for name in PLACE}
    for tick in range(1, TICKS + 1):
        if tick == LOCATED_AT_TICK:
            for a, b in EDGES:
                bus.edge_costs[edge_key(a, b)] = geo_cost_s(a, b)
                bus.measured(a, b, geo_cost_s(a, b))
                bus.measured(b, a, geo_cost_s(a, b))
        bus.step()
        for name, node in bus.nodes.items():
            if cached[name][0] != node.routing_version:
                cached[name] = (node.routing_version, shape(node.routing_table()))
            assert cached[name][1] == shape(node.routing_table()), (tick, name)
    assert bus.check().violations == []

"""Churn on the in-memory bus: remove or add a fraction of the relays, seeded.

Used by the tests, ``gwtf flow solve --churn`` and the flow benchmark. Newcomers get edge costs
drawn like the instance's own: geo10 costs from their location, otherwise U[1,100].
"""

from __future__ import annotations

import random

from gwtfp2p.flow.bus import MessageBus
from gwtfp2p.flow.costs import edge_cost_s
from gwtfp2p.flow.generate import MIB
from gwtfp2p.flow.geo import geo10
from gwtfp2p.flow.instance import FlowInstance, NodeSpec, adjacent_stages


def _count(instance: FlowInstance, fraction: float) -> int:
    relays = sum(1 for n in instance.nodes if n.stage > 0)
    return max(1, round(fraction * relays))


def remove_relays(bus: MessageBus, instance: FlowInstance, fraction: float, seed: int) -> list[str]:
    """Crash ``fraction`` of the live relays at random; returns their ids."""
    rng = random.Random(f"remove:{seed}")
    relays = sorted(n for n, spec in bus.specs.items() if spec.stage > 0)
    gone = rng.sample(relays, min(len(relays), _count(instance, fraction)))
    for node_id in gone:
        bus.remove_node(node_id)
    return gone


def add_relays(bus: MessageBus, instance: FlowInstance, fraction: float, seed: int) -> list[str]:
    """Start ``fraction`` new relays on random stages; returns their ids."""
    rng = random.Random(f"add:{seed}")
    geo = geo10()
    is_geo = any(n.location for n in instance.nodes)
    added = []
    for i in range(_count(instance, fraction)):
        stage = rng.randint(1, instance.n_stages)
        location = rng.choice(geo.locations) if is_geo else ""
        compute_s = 0.05 * geo.compute_factor[location] if is_geo else 0.0
        spec = NodeSpec(f"new{seed}-{i}", stage, capacity=rng.randint(1, 20), compute_s=compute_s, location=location)
        costs = {}
        for other in bus.specs.values():
            if not adjacent_stages(other.stage, stage, instance.n_stages):
                continue
            if is_geo:
                latency_s, bandwidth = geo.link(location, other.location)
                costs[other.node_id] = edge_cost_s(compute_s, other.compute_s, latency_s, latency_s,
                                                   bandwidth, bandwidth, 16 * MIB)
            else:
                costs[other.node_id] = float(rng.randint(1, 100))
        bus.add_node(spec, costs)
        added.append(spec.node_id)
    return added

"""Seeded generators of flow instances: the judged families (a), (b) and geo10 (c).

(a) 8 stages × 12 relays, capacities U[1,20], edge costs U[1,100], one data holder wanting 60;
(b) 6 stages × 6 relays, same distributions, two data holders wanting 30 each;
(c) geo10: 40 relays over the ten locations, compute scaled by the location factor, costs from
d(i,j) with a 16 MiB activation, two data holders. Pure: randomness comes from ``random.Random``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gwtfp2p.flow.costs import edge_cost_s
from gwtfp2p.flow.geo import geo10
from gwtfp2p.flow.instance import FlowInstance, NodeSpec, adjacent_stages, edge_key

MIB = 2**20
FAMILIES = ("a", "b", "geo10")


@dataclass(frozen=True)
class FamilyShape:
    """Sizes of a generated instance (overridable from the CLI)."""

    n_stages: int
    relays_per_stage: int
    data_holders: int
    supply: int
    capacity_max: int = 20


DEFAULT_SHAPES = {
    "a": FamilyShape(n_stages=8, relays_per_stage=12, data_holders=1, supply=60),
    "b": FamilyShape(n_stages=6, relays_per_stage=6, data_holders=2, supply=30),
    "geo10": FamilyShape(n_stages=4, relays_per_stage=10, data_holders=2, supply=40),
}


def generate(family: str, seed: int, shape: FamilyShape | None = None) -> FlowInstance:
    """One instance of ``family`` for ``seed`` (same seed, same instance)."""
    if family not in DEFAULT_SHAPES:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    shape = shape or DEFAULT_SHAPES[family]
    rng = random.Random(f"{family}:{seed}")
    if family == "geo10":
        return _geo10_instance(rng, shape)
    return _uniform_instance(rng, shape)


def _layout(rng: random.Random, shape: FamilyShape) -> list[NodeSpec]:
    nodes = [NodeSpec(f"dh{d}", 0, supply=shape.supply) for d in range(shape.data_holders)]
    for stage in range(1, shape.n_stages + 1):
        for r in range(shape.relays_per_stage):
            nodes.append(NodeSpec(f"s{stage}r{r}", stage, capacity=rng.randint(1, shape.capacity_max)))
    return nodes


def _all_edges(nodes: list[NodeSpec], n_stages: int):
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            if adjacent_stages(a.stage, b.stage, n_stages):
                yield a, b


def _uniform_instance(rng: random.Random, shape: FamilyShape) -> FlowInstance:
    nodes = _layout(rng, shape)
    costs = {edge_key(a.node_id, b.node_id): float(rng.randint(1, 100))
             for a, b in _all_edges(nodes, shape.n_stages)}
    return FlowInstance(shape.n_stages, tuple(nodes), costs)


def _geo10_instance(rng: random.Random, shape: FamilyShape, base_compute_s: float = 0.05,
                    activation_bytes: int = 16 * MIB) -> FlowInstance:
    geo = geo10()
    placed = []
    for node in _layout(rng, shape):
        location = rng.choice(geo.locations)
        compute_s = 0.0 if node.is_data_holder else base_compute_s * geo.compute_factor[location]
        placed.append(NodeSpec(node.node_id, node.stage, node.capacity, node.supply, compute_s, location))
    costs = {}
    for a, b in _all_edges(placed, shape.n_stages):
        latency_s, bandwidth = geo.link(a.location, b.location)
        costs[edge_key(a.node_id, b.node_id)] = edge_cost_s(
            a.compute_s, b.compute_s, latency_s, latency_s, bandwidth, bandwidth, activation_bytes)
    return FlowInstance(shape.n_stages, tuple(placed), costs)

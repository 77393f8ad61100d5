"""Seeded generators of flow instances: the judged families (a), (b), geo10 (c) and tight.

(a) 8 stages × 12 relays, capacities U[1,20], edge costs U[1,100], one data holder wanting 60;
(b) 6 stages × 6 relays, same distributions, two data holders wanting 30 each;
(c) geo10: 40 relays over the ten locations, compute scaled by the location factor, costs from
d(i,j) with a 16 MiB activation, two data holders; (tight) oversubscribed sparse swarms, see
``_tight_instance``. Pure: randomness comes from ``random.Random``.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from gwtfp2p.flow.costs import edge_cost_s
from gwtfp2p.flow.geo import geo10
from gwtfp2p.flow.instance import FlowInstance, NodeSpec, adjacent_stages, edge_key

MIB = 2**20
FAMILIES = ("a", "b", "geo10", "tight")


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
    # tight draws its sizes per seed (0 = drawn); a non-zero field fixes that size instead
    "tight": FamilyShape(n_stages=0, relays_per_stage=0, data_holders=0, supply=0, capacity_max=4),
}
TIGHT_LINK_PROBABILITY = 0.45  # chance that two relays of consecutive stages are linked
TIGHT_HOLDER_LINK_PROBABILITY = 0.6  # chance that a data holder is linked to a stage-1 / stage-S relay


def generate(family: str, seed: int, shape: FamilyShape | None = None) -> FlowInstance:
    """One instance of ``family`` for ``seed`` (same seed, same instance)."""
    if family not in DEFAULT_SHAPES:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    shape = shape or DEFAULT_SHAPES[family]
    rng = random.Random(f"{family}:{seed}")
    if family == "geo10":
        return _geo10_instance(rng, shape)
    if family == "tight":
        return _tight_instance(rng, shape)
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


def _tight_instance(rng: random.Random, shape: FamilyShape) -> FlowInstance:
    """An oversubscribed sparse swarm: the stages carry far less than the data holders want.

    5–8 stages of 4–7 relays with capacities U[1, capacity_max=4]; consecutive relay stages are
    linked pair by pair with probability 0.45 and data holders to stage-1 / stage-S relays with
    0.6 (every node keeps at least one link on each side); 2–3 data holders, each wanting 2–4×
    the capacity of the bottleneck stage. Edge costs U[1,100].
    """
    n_stages = shape.n_stages or rng.randint(5, 8)
    per_stage = shape.relays_per_stage or rng.randint(4, 7)
    holders = shape.data_holders or rng.randint(2, 3)
    relays = [[NodeSpec(f"s{stage}r{r}", stage, capacity=rng.randint(1, shape.capacity_max))
               for r in range(per_stage)] for stage in range(1, n_stages + 1)]
    bottleneck = min(sum(n.capacity for n in layer) for layer in relays)
    dhs = [NodeSpec(f"dh{d}", 0, supply=shape.supply or round(rng.uniform(2.0, 4.0) * bottleneck))
           for d in range(holders)]
    layers = [dhs, *relays, dhs]
    costs: dict[tuple[str, str], float] = {}
    for k, (left, right) in enumerate(itertools.pairwise(layers)):
        p = TIGHT_HOLDER_LINK_PROBABILITY if k in (0, n_stages) else TIGHT_LINK_PROBABILITY
        linked = {(a.node_id, b.node_id) for a in left for b in right if rng.random() < p}
        for a in left:  # at least one link to the right of every node...
            if not any(x == a.node_id for x, _ in linked):
                linked.add((a.node_id, rng.choice(right).node_id))
        for b in right:  # ...and one to the left
            if not any(y == b.node_id for _, y in linked):
                linked.add((rng.choice(left).node_id, b.node_id))
        for a, b in sorted(linked):
            costs[edge_key(a, b)] = float(rng.randint(1, 100))
    return FlowInstance(n_stages, (*dhs, *(r for layer in relays for r in layer)), costs)

"""Evaluate any routing of a flow instance: flow value, total cost, maximum path cost.

A routing is a list of paths (dh, r1, …, rS, dh). The evaluator checks every path against the
instance (stages in order, edges exist, the same data holder at both ends, capacities and
supplies respected) and reports the objective the protocol optimizes: edge costs plus, at each
node with a shared uplink, the wait behind the other units it carries (load.py). It is a global
view, used only by tests, the oracle, the bus and the simulator, never by a FlowNode.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gwtfp2p.flow.instance import FlowInstance
from gwtfp2p.flow.load import congestion_cost_s

Path = tuple[str, ...]


class RoutingError(ValueError):
    """A routing violates the instance (bad path, capacity or supply exceeded)."""


@dataclass(frozen=True)
class RoutingQuality:
    """Objective of a routing: maximize flow, then minimize max path cost, then total cost."""

    flow_value: int
    total_cost: float
    max_path_cost: float

    def as_dict(self) -> dict[str, float]:
        return {"flow_value": self.flow_value, "total_cost": self.total_cost,
                "max_path_cost": self.max_path_cost}


def path_cost(instance: FlowInstance, path: Path) -> float:
    """Sum of edge costs along ``path`` (no uplink waits); raises RoutingError if an edge is missing."""
    total = 0.0
    for a, b in itertools.pairwise(path):
        cost = instance.cost(a, b)
        if cost is None:
            raise RoutingError(f"path {path} uses a missing edge ({a}, {b})")
        total += cost
    return total


def check_path(instance: FlowInstance, path: Path) -> None:
    """A complete unit: dh → stage 1 → … → stage S → the same dh."""
    if len(path) != instance.n_stages + 2:
        raise RoutingError(f"path {path} has {len(path)} nodes, expected {instance.n_stages + 2}")
    if path[0] != path[-1]:
        raise RoutingError(f"path {path} does not return to its data holder")
    for position, node_id in enumerate(path[:-1]):
        try:
            stage = instance.node(node_id).stage
        except KeyError as exc:
            raise RoutingError(f"path {path} names unknown node {node_id}") from exc
        if stage != position:
            raise RoutingError(f"path {path}: {node_id} is stage {stage}, expected {position}")


def check_routing(instance: FlowInstance, paths: Sequence[Path]) -> None:
    """Every path complete, no relay above capacity, no data holder above its supply."""
    load: Counter[str] = Counter()
    for path in paths:
        check_path(instance, path)
        path_cost(instance, path)
        load.update(path[:-1])
    for node_id, units in load.items():
        node = instance.node(node_id)
        limit = node.supply if node.is_data_holder else node.capacity
        if units > limit:
            raise RoutingError(f"{node_id} carries {units} units, limit {limit}")


def loads(paths: Sequence[Path]) -> Counter[str]:
    """Units each node carries (a data holder counts the units it sends)."""
    load: Counter[str] = Counter()
    for path in paths:
        load.update(path[:-1])
    return load


def congestion_cost(instance: FlowInstance, paths: Sequence[Path]) -> float:
    """Total uplink wait of a routing: each node's ``congestion_cost_s`` at its load."""
    return sum(congestion_cost_s(instance.node(n).uplink_s_per_unit, k) for n, k in loads(paths).items())


def evaluate(instance: FlowInstance, paths: Sequence[Path], *, check: bool = True) -> RoutingQuality:
    """Flow value, total cost and maximum path cost of ``paths``.

    A path's cost is its edges plus, at each node on it, its share of the uplink wait there:
    ``uplink_s_per_unit × (load − 1) / 2``, so the path costs sum to edges + congestion.
    """
    if check:
        check_routing(instance, paths)
    load = loads(paths)
    wait = {n: instance.node(n).uplink_s_per_unit * (k - 1) / 2 for n, k in load.items()}
    costs = [path_cost(instance, p) + sum(wait[n] for n in p[:-1]) for p in paths]
    return RoutingQuality(len(paths), float(sum(costs)), float(max(costs, default=0.0)))

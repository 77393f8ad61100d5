"""A flow instance: the layered graph the decentralized protocol and the oracle both solve.

Stage 0 holds the data holders (sources and sinks of their own units), stages 1..S the relays.
Edges join consecutive stages and stage S back to stage 0; every edge has one symmetric cost in
seconds; a node's shared uplink adds ``uplink_s_per_unit`` per unit it already carries (load.py).
This module owns the data shape, its validation and its JSON form; not the solving.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field


class InstanceError(ValueError):
    """An instance is malformed (unknown node, bad stage, negative capacity...)."""


@dataclass(frozen=True)
class NodeSpec:
    """One node: a data holder (stage 0, ``supply`` units wanted) or a relay (``capacity`` units).

    ``capacity`` and ``supply`` are already bounded by the node's time budget (see
    ``NodeResources.capacity``); ``uplink_s_per_unit`` prices the wait on its shared uplink.
    """

    node_id: str
    stage: int
    capacity: int = 0
    supply: int = 0
    compute_s: float = 0.0
    location: str = ""
    uplink_s_per_unit: float = 0.0

    @property
    def is_data_holder(self) -> bool:
        return self.stage == 0


def edge_key(a: str, b: str) -> tuple[str, str]:
    """Edges are undirected for costing: one key per unordered pair."""
    return (a, b) if a <= b else (b, a)


@dataclass(frozen=True)
class FlowInstance:
    """Nodes and edge costs of one layered graph with ``n_stages`` relay stages."""

    n_stages: int
    nodes: tuple[NodeSpec, ...]
    edge_costs: Mapping[tuple[str, str], float] = field(default_factory=dict)
    _index: dict[str, NodeSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.n_stages < 1:
            raise InstanceError(f"n_stages must be >= 1, got {self.n_stages}")
        ids = [n.node_id for n in self.nodes]
        if len(set(ids)) != len(ids):
            raise InstanceError("node ids must be unique")
        by_id = {n.node_id: n for n in self.nodes}
        object.__setattr__(self, "_index", by_id)
        for n in self.nodes:
            if not 0 <= n.stage <= self.n_stages:
                raise InstanceError(f"{n.node_id}: stage {n.stage} outside 0..{self.n_stages}")
            if n.capacity < 0 or n.supply < 0:
                raise InstanceError(f"{n.node_id}: capacity and supply must be >= 0")
            if not (math.isfinite(n.uplink_s_per_unit) and n.uplink_s_per_unit >= 0):
                raise InstanceError(f"{n.node_id}: uplink_s_per_unit must be a finite number >= 0")
        for (a, b), cost in self.edge_costs.items():
            if a not in by_id or b not in by_id:
                raise InstanceError(f"edge ({a}, {b}) names an unknown node")
            if not adjacent_stages(by_id[a].stage, by_id[b].stage, self.n_stages):
                raise InstanceError(f"edge ({a}, {b}) does not join consecutive stages")
            if not (math.isfinite(cost) and cost >= 0):
                raise InstanceError(f"edge ({a}, {b}) has invalid cost {cost!r}")

    def node(self, node_id: str) -> NodeSpec:
        return self._index[node_id]

    def stage_nodes(self, stage: int) -> list[NodeSpec]:
        return [n for n in self.nodes if n.stage == stage]

    @property
    def data_holders(self) -> list[NodeSpec]:
        return self.stage_nodes(0)

    def cost(self, a: str, b: str) -> float | None:
        """The edge cost between ``a`` and ``b``, or None when they are not linked."""
        return self.edge_costs.get(edge_key(a, b))

    def next_hops(self, node_id: str) -> Iterator[tuple[str, float]]:
        """(neighbour, cost) pairs of the next stage (stage S wraps to the data holders)."""
        stage = self.node(node_id).stage
        nxt = 0 if stage == self.n_stages else stage + 1
        for other in self.stage_nodes(nxt):
            cost = self.cost(node_id, other.node_id)
            if cost is not None:
                yield other.node_id, cost

    def with_changes(self, *, nodes: tuple[NodeSpec, ...] | None = None,
                     edge_costs: Mapping[tuple[str, str], float] | None = None) -> FlowInstance:
        """A copy with other nodes/costs; edges to removed nodes are dropped."""
        new_nodes = self.nodes if nodes is None else nodes
        ids = {n.node_id for n in new_nodes}
        costs = dict(self.edge_costs if edge_costs is None else edge_costs)
        costs = {k: v for k, v in costs.items() if k[0] in ids and k[1] in ids}
        return FlowInstance(self.n_stages, tuple(new_nodes), costs)

    def to_json(self) -> str:
        return json.dumps({
            "n_stages": self.n_stages,
            "nodes": [dict(n.__dict__) for n in self.nodes],
            "edges": [{"a": a, "b": b, "cost": c} for (a, b), c in sorted(self.edge_costs.items())],
        }, indent=1)

    @staticmethod
    def from_json(text: str) -> FlowInstance:
        """Parse an instance file; every field is checked, errors say which one."""
        try:
            raw = json.loads(text)
            nodes = tuple(NodeSpec(node_id=str(n["node_id"]), stage=int(n["stage"]),
                                   capacity=int(n.get("capacity", 0)), supply=int(n.get("supply", 0)),
                                   compute_s=float(n.get("compute_s", 0.0)),
                                   location=str(n.get("location", "")),
                                   uplink_s_per_unit=float(n.get("uplink_s_per_unit", 0.0)))
                          for n in raw["nodes"])
            edges = {edge_key(str(e["a"]), str(e["b"])): float(e["cost"]) for e in raw["edges"]}
            return FlowInstance(int(raw["n_stages"]), nodes, edges)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, InstanceError):
                raise
            raise InstanceError(f"malformed instance JSON: {exc!r}") from exc


def adjacent_stages(stage_a: int, stage_b: int, n_stages: int) -> bool:
    """True when the stages are consecutive in the ring 0 → 1 → … → S → 0."""
    lo, hi = min(stage_a, stage_b), max(stage_a, stage_b)
    return hi - lo == 1 or (lo == 0 and hi == n_stages and n_stages > 1) or (n_stages == 1 and hi - lo == 1)

"""The centralized oracle: the best routing with full knowledge of the instance.

Its objective, in order: the maximum flow; then max-min fairness between data holders (no
holder can get more without one that has no more than it getting less, so when the swarm
cannot carry every holder's supply the holders share it evenly, each capped by its supply and
its reach); then the least total cost, uplink waits included. With one data holder this is
networkx's min-cost max-flow on the split-node layered graph; with several, each unit must
return to its own holder (multi-commodity), solved exactly as integer programs (milp.py).
``solve_relaxed`` gives the single-commodity relaxation: a bound, not a plan.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import networkx as nx
import numpy as np

from gwtfp2p.flow import milp
from gwtfp2p.flow.evaluate import Path, RoutingQuality, evaluate
from gwtfp2p.flow.instance import FlowInstance

COST_SCALE = 1_000_000  # networkx's simplex wants integer costs: micro-units
SOURCE, TARGET = "__source__", "__target__"


@dataclass(frozen=True)
class OracleResult:
    paths: tuple[Path, ...]
    quality: RoutingQuality
    exact: bool

    def holder_flows(self) -> dict[str, int]:
        """Units routed per data holder."""
        flows: dict[str, int] = defaultdict(int)
        for path in self.paths:
            flows[path[0]] += 1
        return dict(flows)


def solve(instance: FlowInstance) -> OracleResult:
    """Exact: maximum flow, then fair between holders, then cheapest (see the module docstring)."""
    if not instance.data_holders:
        return OracleResult((), RoutingQuality(0, 0.0, 0.0), exact=True)
    paths = _networkx_paths(instance) if len(instance.data_holders) <= 1 else _milp_paths(instance)
    return OracleResult(tuple(paths), evaluate(instance, paths), exact=True)


def solve_relaxed(instance: FlowInstance) -> RoutingQuality:
    """Single-commodity relaxation: an upper bound on flow and a lower bound on cost."""
    graph = _layered_graph(instance)
    flow = nx.max_flow_min_cost(graph, SOURCE, TARGET)
    value = sum(flow[SOURCE].values())
    cost = nx.cost_of_flow(graph, flow) / COST_SCALE
    return RoutingQuality(int(value), float(cost), float("nan"))


def max_flow_value(instance: FlowInstance) -> int:
    """The largest number of units the instance can carry (exact)."""
    return solve(instance).quality.flow_value


def _in(node_id: str) -> str:
    return f"in:{node_id}"


def _out(node_id: str) -> str:
    return f"out:{node_id}"


def _add_limited(g: nx.DiGraph, a: str, b: str, units: int, uplink_s_per_unit: float) -> None:
    """a → b carrying at most ``units``; with an uplink, the k-th unit costs k × uplink_s_per_unit."""
    if uplink_s_per_unit <= 0:
        g.add_edge(a, b, capacity=units, weight=0)
        return
    for k in range(units):
        slot = f"slot{k}:{b}"
        g.add_edge(a, slot, capacity=1, weight=round(k * uplink_s_per_unit * COST_SCALE))
        g.add_edge(slot, b, capacity=1, weight=0)


def _layered_graph(instance: FlowInstance) -> nx.DiGraph:
    """Split-node graph: relay capacity on in→out, holder supply on source edges."""
    g = nx.DiGraph()
    g.add_nodes_from((SOURCE, TARGET))
    for node in instance.nodes:
        if node.is_data_holder:
            _add_limited(g, SOURCE, _out(node.node_id), node.supply, node.uplink_s_per_unit)
            g.add_edge(_in(node.node_id), TARGET, capacity=node.supply, weight=0)
        else:
            _add_limited(g, _in(node.node_id), _out(node.node_id), node.capacity, node.uplink_s_per_unit)
    for node in instance.nodes:
        for nxt, cost in instance.next_hops(node.node_id):
            g.add_edge(_out(node.node_id), _in(nxt), weight=round(cost * COST_SCALE))
    return g


def _networkx_paths(instance: FlowInstance) -> list[Path]:
    graph = _layered_graph(instance)
    flow = nx.max_flow_min_cost(graph, SOURCE, TARGET)
    edge_flow = {(a, b): f for a, nbrs in flow.items() if a.startswith("out:")
                 for b, f in nbrs.items() if f > 0}
    sent: dict[str, int] = defaultdict(int)  # units per holder, through its uplink slots if any
    for b, f in flow[SOURCE].items():
        sent[b.split(":", 1)[1] if b.startswith("slot") else b] += f
    paths = []
    for holder in instance.data_holders:
        for _ in range(sent.get(_out(holder.node_id), 0)):
            paths.append(_walk(instance, holder.node_id, edge_flow))
    return paths


def _walk(instance: FlowInstance, holder: str, edge_flow: dict) -> Path:
    """Peel one unit off ``edge_flow`` starting at ``holder`` (a DAG walk, so it terminates)."""
    path = [holder]
    current = _out(holder)
    for _ in range(instance.n_stages + 1):
        nxt = next(b for (a, b), f in edge_flow.items() if a == current and f > 0)
        edge_flow[(current, nxt)] -= 1
        node_id = nxt[len("in:"):]
        path.append(node_id)
        if instance.node(node_id).is_data_holder:
            break
        current = _out(node_id)
    return tuple(path)


def _milp_paths(instance: FlowInstance) -> list[Path]:
    edges, x = milp.solve_edges(instance)
    return _decompose(instance, edges, x)


def _decompose(instance: FlowInstance, edges, x: np.ndarray) -> list[Path]:
    remaining: dict[tuple[str, str, str], int] = defaultdict(int)
    for (h, a, b, _), units in zip(edges, x, strict=False):
        if units > 0:
            remaining[(h, a, b)] += int(units)
    paths = []
    for holder in instance.data_holders:
        h = holder.node_id
        while any(units > 0 for (hh, a, _), units in remaining.items() if hh == h and a == h):
            path, current = [h], h
            for _ in range(instance.n_stages + 1):
                nxt = next(b for (hh, a, b), units in remaining.items() if hh == h and a == current and units > 0)
                remaining[(h, current, nxt)] -= 1
                path.append(nxt)
                current = nxt
            paths.append(tuple(path))
    return paths

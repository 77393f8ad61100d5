"""The centralized oracle: min-cost maximum flow with full knowledge of the instance.

With one data holder the problem is a single-commodity min-cost max-flow over the split-node
layered graph, solved exactly by networkx. With several, each unit must return to the data
holder it came from: a multi-commodity flow. We solve it exactly as an integer program (scipy's
HiGHS): maximize the flow value, then minimize total cost at that value. ``solve_relaxed`` gives
the networkx single-commodity relaxation (units may end at another holder): a bound, not a plan.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import networkx as nx
import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from gwtfp2p.flow.evaluate import Path, RoutingQuality, evaluate
from gwtfp2p.flow.instance import FlowInstance

COST_SCALE = 1_000_000  # networkx's simplex wants integer costs: micro-units
SOURCE, TARGET = "__source__", "__target__"


@dataclass(frozen=True)
class OracleResult:
    paths: tuple[Path, ...]
    quality: RoutingQuality
    exact: bool


def solve(instance: FlowInstance) -> OracleResult:
    """Exact min-cost max-flow (networkx for one holder, an integer program for several)."""
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


def _layered_graph(instance: FlowInstance) -> nx.DiGraph:
    """Split-node graph: relay capacity on in→out, holder supply on source edges."""
    g = nx.DiGraph()
    g.add_nodes_from((SOURCE, TARGET))
    for node in instance.nodes:
        if node.is_data_holder:
            g.add_edge(SOURCE, _out(node.node_id), capacity=node.supply, weight=0)
            g.add_edge(_in(node.node_id), TARGET, capacity=node.supply, weight=0)
        else:
            g.add_edge(_in(node.node_id), _out(node.node_id), capacity=node.capacity, weight=0)
    for node in instance.nodes:
        for nxt, cost in instance.next_hops(node.node_id):
            g.add_edge(_out(node.node_id), _in(nxt), weight=round(cost * COST_SCALE))
    return g


def _networkx_paths(instance: FlowInstance) -> list[Path]:
    graph = _layered_graph(instance)
    flow = nx.max_flow_min_cost(graph, SOURCE, TARGET)
    edge_flow = {(a, b): f for a, nbrs in flow.items() for b, f in nbrs.items() if f > 0}
    paths = []
    for holder in instance.data_holders:
        for _ in range(flow[SOURCE].get(_out(holder.node_id), 0)):
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
        edge_flow[(nxt, _out(node_id))] = edge_flow.get((nxt, _out(node_id)), 0) - 1
        current = _out(node_id)
    return tuple(path)


def _commodity_edges(instance: FlowInstance) -> list[tuple[str, str, str, float]]:
    """(holder, a, b, cost) for every edge each holder's units may use."""
    edges = []
    for holder in instance.data_holders:
        for node in instance.nodes:
            if node.is_data_holder and node.node_id != holder.node_id:
                continue
            for nxt, cost in instance.next_hops(node.node_id):
                if instance.node(nxt).is_data_holder and nxt != holder.node_id:
                    continue
                edges.append((holder.node_id, node.node_id, nxt, cost))
    return edges


def _milp_paths(instance: FlowInstance) -> list[Path]:
    edges = _commodity_edges(instance)
    n = len(edges)
    rows, lo, hi = _milp_constraints(instance, edges)
    a_matrix = np.array(rows, dtype=float) if rows else np.zeros((0, n))
    constraints = [LinearConstraint(a_matrix, lo, hi)]
    is_source = np.array([1.0 if a == h else 0.0 for h, a, _, _ in edges])
    integrality = np.ones(n)
    bounds = Bounds(0, np.inf)
    first = milp(-is_source, constraints=constraints, integrality=integrality, bounds=bounds)
    if not first.success:
        raise RuntimeError(f"oracle MILP (max flow) failed: {first.message}")
    best = round(-first.fun)
    fixed = LinearConstraint(is_source.reshape(1, -1), best, best)
    costs = np.array([c for _, _, _, c in edges])
    second = milp(costs, constraints=[*constraints, fixed], integrality=integrality, bounds=bounds)
    if not second.success:
        raise RuntimeError(f"oracle MILP (min cost) failed: {second.message}")
    return _decompose(instance, edges, np.round(second.x).astype(int))


def _milp_constraints(instance: FlowInstance, edges: list[tuple[str, str, str, float]]):
    """Conservation per holder per relay, relay capacity, holder supply."""
    n = len(edges)
    rows, lo, hi = [], [], []
    by_holder_node: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    capacity_rows: dict[str, list[int]] = defaultdict(list)
    for k, (h, a, b, _) in enumerate(edges):
        by_holder_node[(h, a)].append((k, -1.0))
        by_holder_node[(h, b)].append((k, 1.0))
        if not instance.node(b).is_data_holder:
            capacity_rows[b].append(k)
    for (h, node_id), terms in by_holder_node.items():
        row = np.zeros(n)
        for k, sign in terms:
            row[k] += sign
        rows.append(row)
        lo.append(0.0)
        hi.append(0.0)
        if node_id == h:  # the holder: what leaves must come back (in - out = 0) and out <= supply
            supply_row = np.zeros(n)
            for k, sign in terms:
                if sign < 0:
                    supply_row[k] = 1.0
            rows.append(supply_row)
            lo.append(0.0)
            hi.append(float(instance.node(h).supply))
    for node_id, ks in capacity_rows.items():
        row = np.zeros(n)
        row[ks] = 1.0
        rows.append(row)
        lo.append(0.0)
        hi.append(float(instance.node(node_id).capacity))
    return rows, lo, hi


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

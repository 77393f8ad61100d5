"""The exact multi-holder oracle as integer programs (scipy's HiGHS): flow, fairness, then cost.

Each unit must return to the data holder it came from, so with several holders routing is a
multi-commodity flow: one integer variable per (holder, edge). Uplink waits are convex in a
node's load; they are priced by one slot variable per unit a node may carry (slot k costs
k × uplink_s_per_unit), which the minimization fills cheapest first. Solved in three steps:
the maximum flow; then max-min fairness between holders at that flow (leximin: the smallest
holder flow as large as possible, then the sum of the two smallest, and so on, each sum of the k
smallest written linearly as max over t of k·t − Σ max(0, t − f_h)); then the least cost.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from gwtfp2p.flow.instance import FlowInstance

Edge = tuple[str, str, str, float]  # (holder, from, to, cost)


def commodity_edges(instance: FlowInstance) -> list[Edge]:
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


@dataclass
class Model:
    """Variables [edge flows | uplink slots | t_k | s_kh], its constraints and objective rows.

    t_k and s_kh (k = 1..H holders) express the sum of the k smallest holder flows (fairness).
    """

    instance: FlowInstance
    edges: list[Edge]
    slots: list[tuple[str, float]] = field(default_factory=list)  # (node, cost of this slot)
    holders: list[str] = field(default_factory=list)  # holders that want units
    rows: list[np.ndarray] = field(default_factory=list)
    lo: list[float] = field(default_factory=list)
    hi: list[float] = field(default_factory=list)

    @property
    def n_flow(self) -> int:
        return len(self.edges) + len(self.slots)

    @property
    def size(self) -> int:
        return self.n_flow + len(self.holders) * (1 + len(self.holders))

    def t(self, k: int) -> int:
        """Index of t_k (k = 1..H)."""
        return self.n_flow + k - 1

    def s(self, k: int, h: int) -> int:
        """Index of s_kh, the shortfall of holder h below t_k."""
        return self.n_flow + len(self.holders) + (k - 1) * len(self.holders) + h

    def row(self) -> np.ndarray:
        return np.zeros(self.size)

    def add(self, row: np.ndarray, lo: float, hi: float) -> None:
        self.rows.append(row)
        self.lo.append(lo)
        self.hi.append(hi)

    def flow_row(self, holder: str | None = None) -> np.ndarray:
        """Coefficients of a holder's flow value (all holders' when ``holder`` is None)."""
        row = self.row()
        for k, (h, a, _, _) in enumerate(self.edges):
            if a == h and (holder is None or h == holder):
                row[k] = 1.0
        return row

    def smallest_row(self, k: int) -> np.ndarray:
        """k·t_k − Σ_h s_kh: at its maximum, the sum of the k smallest holder flows."""
        row = self.row()
        row[self.t(k)] = float(k)
        for h in range(len(self.holders)):
            row[self.s(k, h)] = -1.0
        return row

    def cost_row(self) -> np.ndarray:
        row = self.row()
        row[:len(self.edges)] = [c for *_, c in self.edges]
        row[len(self.edges):self.n_flow] = [c for _, c in self.slots]
        return row

    def solve(self, objective: np.ndarray, extra: list[tuple[np.ndarray, float, float]] = ()) -> np.ndarray:
        """Minimize ``objective`` under the model's and the ``extra`` constraints."""
        rows = self.rows + [r for r, _, _ in extra]
        lo = self.lo + [lo for _, lo, _ in extra]
        hi = self.hi + [hi for _, _, hi in extra]
        integrality = np.zeros(self.size)
        integrality[:len(self.edges)] = 1
        upper = np.full(self.size, np.inf)
        upper[len(self.edges):self.n_flow] = 1.0
        constraints = [LinearConstraint(np.array(rows), lo, hi)]
        result = milp(objective, constraints=constraints, integrality=integrality, bounds=Bounds(0, upper))
        if not result.success:  # HiGHS's presolve has wrongly called feasible programs infeasible
            result = milp(objective, constraints=constraints, integrality=integrality, bounds=Bounds(0, upper),
                          options={"presolve": False})
        if not result.success:
            raise RuntimeError(f"oracle MILP failed: {result.message}")
        return result.x


def build(instance: FlowInstance) -> Model:
    """Conservation per holder per node, relay capacity, holder supply, uplink slots."""
    model = Model(instance, commodity_edges(instance), holders=[h.node_id for h in instance.data_holders
                                                                 if h.supply > 0])
    for node in instance.nodes:
        units = node.supply if node.is_data_holder else node.capacity
        if node.uplink_s_per_unit > 0:
            model.slots += [(node.node_id, k * node.uplink_s_per_unit) for k in range(units)]
    n_edges = len(model.edges)
    by_holder_node: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    load_terms: dict[str, list[int]] = defaultdict(list)
    for k, (h, a, b, _) in enumerate(model.edges):
        by_holder_node[(h, a)].append((k, -1.0))
        by_holder_node[(h, b)].append((k, 1.0))
        if a == h:
            load_terms[h].append(k)  # a holder's load is what it sends
        if not instance.node(b).is_data_holder:
            load_terms[b].append(k)
    for (_, _), terms in by_holder_node.items():
        row = model.row()
        for k, sign in terms:
            row[k] += sign
        model.add(row, 0.0, 0.0)
    slot_index: dict[str, list[int]] = defaultdict(list)
    for j, (node_id, _) in enumerate(model.slots):
        slot_index[node_id].append(n_edges + j)
    for node in instance.nodes:
        row = model.row()
        row[load_terms[node.node_id]] = 1.0
        model.add(row, 0.0, float(node.supply if node.is_data_holder else node.capacity))
        if slot_index[node.node_id]:
            row = row.copy()
            row[slot_index[node.node_id]] = -1.0
            model.add(row, 0.0, 0.0)
    return model


def _add_shortfalls(model: Model) -> None:
    """s_kh >= t_k − f_h for every k and holder h (s_kh >= 0 by the bounds)."""
    for k in range(1, len(model.holders) + 1):
        for h, holder in enumerate(model.holders):
            row = model.flow_row(holder)
            row[model.s(k, h)] = 1.0
            row[model.t(k)] = -1.0
            model.add(row, 0.0, np.inf)


def fairness_bounds(model: Model, total: int) -> list[tuple[np.ndarray, float, float]]:
    """Constraints that keep the holders' flows leximin-optimal at flow ``total``."""
    bounds = [(model.flow_row(), float(total), float(total))]
    for k in range(1, len(model.holders)):
        row = model.smallest_row(k)
        best = round(row @ model.solve(-row, bounds))
        bounds.append((row, best - 0.5, np.inf))  # sums of integer flows: >= best - 0.5 means >= best
    return bounds


def solve_edges(instance: FlowInstance) -> tuple[list[Edge], np.ndarray]:
    """Edge flows of the maximum, max-min fair, then cheapest routing."""
    model = build(instance)
    if not model.edges:
        return [], np.zeros(0, dtype=int)
    total = round(model.flow_row() @ model.solve(-model.flow_row()))
    supplies = sum(h.supply for h in instance.data_holders)
    if total < supplies and len(model.holders) > 1:
        _add_shortfalls(model)
        extra = fairness_bounds(model, total)
    else:
        extra = [(model.flow_row(), float(total), float(total))]
    x = model.solve(model.cost_row(), extra)
    return model.edges, np.round(x[:len(model.edges)]).astype(int)

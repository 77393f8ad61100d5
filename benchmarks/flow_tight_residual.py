"""How far is the flow protocol's stop on ``tight`` from the maximum, in units that must move?

For each seed, runs the MessageBus until it reports convergence (or ``--ticks``), takes its
routing, and solves two integer programs over the oracle's multi-commodity model (milp.py) with
one more variable per (holder, edge): r_e >= x0_e - x_e, the edge units of the protocol's
routing that a new routing removes. It reports the fewest edge units that must be removed
(each one a backward edge of an augmenting path, or a unit moved to another relay) to route

- one more unit than the protocol does, and
- the oracle's maximum,
- one unit more when a holder may move only its own units (every other holder's routing kept),
- and, ``LABEL_TICKS`` later, whether the protocol's residual labels (residual.py) see such a unit
  exactly when the integer program does,

and how many of the protocol's complete chains the second routing keeps whole. This is the
measure that decides what an augmenting step of the protocol must be able to do (issue 15,
change 1 of docs/flow-tight.md). Measures, asserts nothing. One process.

    python benchmarks/flow_tight_residual.py --seeds 50 --json out/residual.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from contextlib import suppress
from itertools import pairwise

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from gwtfp2p.config import FlowParams
from gwtfp2p.flow import milp as oracle_milp
from gwtfp2p.flow.bus import MessageBus
from gwtfp2p.flow.generate import generate
from gwtfp2p.flow.oracle import max_flow_value

LABEL_TICKS = 300  # ticks after the declared convergence before the residual labels are read


class Infeasible(Exception):
    """No routing meets the constraints."""


def solve_milp(objective: np.ndarray, constraints: list, integrality: np.ndarray, bounds: Bounds):
    """``scipy.optimize.milp``, asked once more without HiGHS's presolve when it fails (its presolve has
    wrongly called feasible programs infeasible; gwtfp2p/flow/milp.py does the same)."""
    result = milp(objective, constraints=constraints, integrality=integrality, bounds=bounds)
    if not result.success:
        result = milp(objective, constraints=constraints, integrality=integrality, bounds=bounds,
                      options={"presolve": False})
    return result


def current_edges(paths) -> Counter:
    """(holder, a, b) -> units of the protocol's routing on that edge."""
    units: Counter = Counter()
    for path in paths:
        for a, b in pairwise(path):
            units[(path[0], a, b)] += 1
    return units


def fewest_removals(model, paths, extra: list[tuple[np.ndarray, float, float]], kept_holder: str | None = None):
    """Minimize the edge units of ``paths`` removed (r_k >= x0_k - x_k, one r per edge of ``model``) under the
    model's constraints and ``extra`` rows over [model variables | r]; with ``kept_holder`` only that
    holder's edge units may be removed. The solver's result (x is its first ``len(model.edges)`` values)."""
    x0 = current_edges(paths)
    n, m = model.size, len(model.edges)
    rows = [np.hstack([np.array(model.rows), np.zeros((len(model.rows), m))])] + [r[None] for r, _, _ in extra]
    lo, hi = list(model.lo) + [v for _, v, _ in extra], list(model.hi) + [v for _, _, v in extra]
    for k, (h, a, b, _) in enumerate(model.edges):  # r_k + x_k >= x0_k
        row = np.zeros(n + m)
        row[k], row[n + k] = 1.0, 1.0
        rows.append(row[None])
        lo.append(float(x0.get((h, a, b), 0)))
        hi.append(np.inf)
    integrality = np.zeros(n + m)
    integrality[:m] = 1
    upper = np.full(n + m, np.inf)
    upper[m:model.n_flow] = 1.0
    if kept_holder:
        for k, (h, _, _, _) in enumerate(model.edges):
            if h != kept_holder:
                upper[n + k] = 0.0
    constraints = LinearConstraint(np.vstack(rows), lo, hi)
    return solve_milp(np.concatenate([np.zeros(n), np.ones(m)]), [constraints], integrality, Bounds(0, upper))


def fewest_removed(instance, paths, target: int, only: str | None = None) -> tuple[int, np.ndarray, list]:
    """Fewest edge units of ``paths`` a routing of ``target`` units must remove (and that routing).

    With ``only``, holder ``only`` must gain the unit and only its own edge units may be removed
    (every other holder keeps its routing); raises ``Infeasible`` when that cannot be done.
    """
    model = oracle_milp.build(instance)
    m = len(model.edges)
    gain = target - len(paths) + sum(1 for p in paths if p[0] == only) if only else target
    flow = (np.concatenate([model.flow_row(only), np.zeros(m)]), float(gain), np.inf)
    result = fewest_removals(model, paths, [flow], kept_holder=only)
    if result.status == 2:
        raise Infeasible(only or "")
    if not result.success:
        raise RuntimeError(result.message)
    return round(result.fun), np.round(result.x[:m]).astype(int), model.edges


def edge_units(x: np.ndarray, edges) -> Counter:
    """(holder, a, b) -> units of an integer program's routing on that edge."""
    return Counter({(h, a, b): int(v) for (h, a, b, _), v in zip(edges, x, strict=True) if v > 0})


def kept_chains(paths, x: np.ndarray, edges) -> int:
    """How many of the protocol's chains the new routing can keep whole (greedy over its edge units)."""
    left = edge_units(x, edges)
    kept = 0
    for path in paths:
        need = current_edges([path])
        if all(left[e] >= c for e, c in need.items()):
            left -= need
            kept += 1
    return kept


def decompose(x: np.ndarray, edges) -> list[tuple[str, ...]]:
    """Complete chains of an edge-flow routing (a layered graph: follow units from each holder)."""
    left = edge_units(x, edges)
    nexts: dict[tuple[str, str], list[str]] = {}
    for h, a, b in sorted(left):
        nexts.setdefault((h, a), []).append(b)
    paths = []
    for holder in sorted({h for h, _, _ in left}):
        while True:
            path, node = [holder], holder
            while True:
                hop = next((b for b in nexts.get((holder, node), ()) if left[(holder, node, b)] > 0), None)
                if hop is None:
                    break
                left[(holder, node, hop)] -= 1
                path.append(hop)
                node = hop
                if node == holder:
                    break
            if len(path) == 1:
                break
            paths.append(tuple(path))
    return paths


def one_at_a_time(instance, paths, best: int) -> list[int]:
    """From the protocol's routing, add one unit at a time by the fewest removals: removals per step."""
    steps = []
    while len(paths) < best:
        removed, x, edges = fewest_removed(instance, paths, len(paths) + 1)
        steps.append(removed)
        paths = decompose(x, edges)
    return steps


def own_units_only(instance, paths) -> int | None:
    """Fewest removals for one unit more when a holder may move only its own units (None: never)."""
    found = []
    for holder in instance.data_holders:
        with suppress(Infeasible):
            found.append(fewest_removed(instance, paths, len(paths) + 1, holder.node_id)[0])
    return min(found, default=None)


def one_seed(seed: int, ticks: int) -> dict:
    instance = generate("tight", seed)
    best = max_flow_value(instance)
    bus = MessageBus(instance, seed=seed, params=FlowParams(augment=False))  # growth's own stops
    bus.run(max_ticks=ticks)
    paths = bus.routing()
    row = {"seed": seed, "holders": len(instance.data_holders), "stages": instance.n_stages,
           "flow": len(paths), "max": best}
    if len(paths) < best:
        row["removed_for_one_more"], _, _ = fewest_removed(instance, paths, len(paths) + 1)
        row["own_units_for_one_more"] = own_units_only(instance, paths)
        row["removed_for_max"], x, edges = fewest_removed(instance, paths, best)
        row["chains_kept_at_max"] = kept_chains(paths, x, edges)
        row["removed_per_step"] = one_at_a_time(instance, paths, best)
    row.update(labels_check(bus, instance, best))
    return row


def labels_check(bus: MessageBus, instance, best: int) -> dict:
    """The protocol's own view (residual.py): after ``LABEL_TICKS`` more ticks, does some holder with
    demand see an augmenting path, and does the integer program agree on the routing of that moment?"""
    for _ in range(LABEL_TICKS):
        bus.step()
    paths = bus.routing()
    sees = any(node.residual.augmentable(cross=False) for node in bus.nodes.values())
    own = own_units_only(instance, paths) if len(paths) < best else None
    return {"label_flow": len(paths), "labels_see_a_path": sees, "milp_sees_a_path": own is not None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--ticks", type=int, default=1000)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows = []
    for seed in range(args.seeds):
        rows.append(one_seed(seed, args.ticks))
        print(json.dumps(rows[-1]), flush=True)
    below = [r for r in rows if r["flow"] < r["max"]]
    print(f"\n{len(below)} of {len(rows)} seeds below the maximum")
    for key in ("removed_for_one_more", "removed_for_max"):
        print(f"{key}: " + ", ".join(f"{k}: {v}" for k, v in sorted(Counter(r[key] for r in below).items())))
    agree = sum(r["labels_see_a_path"] == r["milp_sees_a_path"] for r in rows)
    print(f"residual labels agree with the integer program on {agree} of {len(rows)} seeds "
          f"({sum(r['labels_see_a_path'] for r in rows)} see a path)")
    own = Counter(r["own_units_for_one_more"] for r in below)
    print("own units only, for one unit more: " + ", ".join(f"{k}: {v}" for k, v in sorted(own.items(), key=str)))
    worst = Counter(max(r["removed_per_step"]) for r in below)
    print("most removed in one step, one unit at a time: " + ", ".join(f"{k}: {v}" for k, v in sorted(worst.items())))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

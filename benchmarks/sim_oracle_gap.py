"""Where gwtf loses time against the oracle on a simulator cell without churn: costs, routing or data plane?

Issue 15 asks gwtf for at least 0.95 of the oracle's throughput in every simulator cell; the cells below
it are geo10-hom ones, furthest ``geo10-hom-c0-gpt1.3b``. For each seed this runs the cell to
``--settle-s`` (the flow has long converged) and measures the mean iteration time over the next
``--window-s`` seconds for

* ``gwtf``: the router as it runs;
* ``oracle``: the oracle router (min-cost max-flow on the true costs, re-solved on every change);
* ``oracle_on_gwtf_paths``: the oracle's data plane held to gwtf's routing at the settle time (the same
  paths, dispatched as the oracle dispatches): the time the routing itself costs;
* ``gwtf_exact_costs``: gwtf whose nodes hold the simulator's true edge costs instead of measured ones;
* ``oracle_noisy_costs``: the oracle solving costs each off by a normal draw of the relative error gwtf's
  nodes hold at the settle time (its standard deviation): what that much measurement error costs an
  exact solver;

and, at the settle time, gwtf's routing against the least-cost routing of the same flow (true costs): the
cost ratio, the distinct paths and relays each uses, and the fewest edge units a cheaper routing must
change (an integer program; ``--gain-s``: by at least this many seconds of total cost). Measures, asserts
nothing; one process.

    python benchmarks/sim_oracle_gap.py --seeds 3 --json out/sim_oracle_gap.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from itertools import pairwise
from pathlib import Path

import numpy as np
from flow_tight_residual import current_edges, fewest_removals  # benchmarks/, beside this

from gwtfp2p.flow import milp as oracle_milp
from gwtfp2p.flow.check import follow_chains
from gwtfp2p.flow.instance import FlowInstance
from gwtfp2p.flow.oracle import solve
from gwtfp2p.sim.routers.gwtf import GwtfRouter
from gwtfp2p.sim.routers.oracle import OracleRouter
from gwtfp2p.sim.scenarios import get_scenario
from gwtfp2p.sim.simulation import Simulation

Route = tuple[str, ...]


class FixedPathsRouter(OracleRouter):
    """The oracle's data plane on a given routing: every solve returns ``fixed`` (no churn: it stays valid)."""

    def __init__(self, sim, fixed: list[Route]) -> None:
        super().__init__(sim)
        self.fixed = fixed

    def _solve(self) -> None:
        self.install(self.fixed)


class ExactCostRouter(GwtfRouter):
    """gwtf whose nodes' flows receive the simulator's true edge costs (through the same settling rule)."""

    def _measure(self, observer: str, peer: str) -> float | None:
        self.sensing.ping(observer, peer, self.sim.network.round_trip_s(observer, peer))
        return self.sensing.flow_update(observer, peer, self.sim.edge_cost(observer, peer))


def _with_router(sim: Simulation, router) -> Simulation:
    sim.router = sim.training.router = router
    return sim


def _noisy_instances(sim: Simulation, sd: float, seed: int) -> None:
    """Make ``sim.flow_instance`` (the oracle's view) hold each edge's cost off by a fixed normal draw."""
    exact, rng, factors = sim.flow_instance, random.Random(f"noise:{seed}"), {}

    def noisy(idle_holders: frozenset[str] = frozenset()) -> FlowInstance:
        inst = exact(idle_holders)
        costs = {}
        for key, cost in sorted(inst.edge_costs.items()):
            factor = factors.setdefault(key, max(0.05, 1.0 + rng.gauss(0.0, sd)))
            costs[key] = cost * factor
        return FlowInstance(inst.n_stages, inst.nodes, costs)

    sim.flow_instance = noisy


def mean_iteration_s(sim: Simulation, from_s: float, to_s: float) -> float | None:
    spans = [end - start for _, start, end in sim.metrics.iterations if start >= from_s and end <= to_s]
    return statistics.fmean(spans) if spans else None


def held_cost_error(sim: Simulation) -> list[float]:
    """Relative error of every edge cost gwtf's nodes hold, against the true cost."""
    errors = []
    for node_id, flow in sorted(sim.router.flows.items()):
        for peer in sorted(flow.core.neighbours):
            held = flow.core.cost_to(peer)
            if held is not None and peer in sim.cluster.nodes and sim.cluster.nodes[peer].alive:
                errors.append(held / sim.edge_cost(node_id, peer) - 1.0)
    return errors


def fewest_changed_for_gain(instance: FlowInstance, paths: list[Route], gain_s: float) -> int | None:
    """Fewest edge units of ``paths`` that a routing of the same units per holder, cheaper by at least
    ``gain_s`` (true costs), must remove; None when no such routing exists."""
    model = oracle_milp.build(instance)
    if model.slots:
        raise SystemExit("--scenario: uplink-aware cells (home) are not supported: their cost is not per edge")
    m = len(model.edges)
    extra = [(np.concatenate([model.flow_row(holder), np.zeros(m)]), units, units)
             for holder in model.holders for units in [sum(1 for p in paths if p[0] == holder)]]
    now = sum(current_edges(paths).get((h, a, b), 0) * c for h, a, b, c in model.edges)
    extra.append((np.concatenate([model.cost_row(), np.zeros(m)]), -np.inf, now - gain_s))
    result = fewest_removals(model, paths, extra)
    if not result.success:
        return None
    return round(result.fun)


def shape(paths: list[Route], n_stages: int) -> dict:
    return {"distinct_paths": len(set(paths)),
            "relays_per_stage": [len({p[s] for p in paths}) for s in range(1, n_stages + 1)]}


def one_seed(scenario_name: str, seed: int, settle_s: float, window_s: float, gain_s: float) -> dict:
    scenario = get_scenario(scenario_name)
    end_s = settle_s + window_s
    gwtf = Simulation(scenario, seed, "gwtf")
    gwtf.start()
    gwtf.engine.run(settle_s)
    paths = follow_chains(gwtf.router.flows, scenario.n_stages).paths
    instance = gwtf.flow_instance()
    best = solve(instance).paths
    errors = held_cost_error(gwtf)
    gwtf.engine.run(end_s)

    def true_cost(routing: list[Route]) -> float:
        return sum(gwtf.edge_cost(a, b) for p in routing for a, b in pairwise(p))

    runs = {"gwtf": gwtf}
    runs["oracle"] = Simulation(scenario, seed, "oracle")
    fixed = Simulation(scenario, seed, "oracle")
    runs["oracle_on_gwtf_paths"] = _with_router(fixed, FixedPathsRouter(fixed, paths))
    exact = Simulation(scenario, seed, "gwtf")
    runs["gwtf_exact_costs"] = _with_router(exact, ExactCostRouter(exact))
    noisy = Simulation(scenario, seed, "oracle")
    _noisy_instances(noisy, statistics.pstdev(errors), seed)
    runs["oracle_noisy_costs"] = noisy
    iteration_s = {}
    for name, sim in runs.items():
        if name != "gwtf":
            sim.start()
            sim.engine.run(end_s)
        iteration_s[name] = mean_iteration_s(sim, settle_s, end_s)
    return {"scenario": scenario_name, "seed": seed, "settle_s": settle_s, "window_s": window_s,
            "iteration_s": iteration_s,
            "over_oracle": {k: (v / iteration_s["oracle"] if v and iteration_s["oracle"] else None)
                            for k, v in iteration_s.items()},
            "units": len(paths), "oracle_units": len(best),
            "cost_ratio": true_cost(paths) / true_cost(best) if len(paths) == len(best) else None,
            "gwtf_shape": shape(paths, scenario.n_stages), "oracle_shape": shape(best, scenario.n_stages),
            "held_cost_error": {"mean": statistics.fmean(errors), "sd": statistics.pstdev(errors)},
            "fewest_changed_for_gain": fewest_changed_for_gain(instance, paths, gain_s), "gain_s": gain_s}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="geo10-hom-c0-gpt1.3b", help="a simulator cell without churn")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--settle-s", type=float, default=300.0)
    parser.add_argument("--window-s", type=float, default=900.0)
    parser.add_argument("--gain-s", type=float, default=0.1)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    if get_scenario(args.scenario).churn_pct_per_hour:
        parser.error(f"--scenario: {args.scenario} has churn; fixed paths would break at its first crash")
    rows = []
    for seed in range(args.seeds):
        row = one_seed(args.scenario, seed, args.settle_s, args.window_s, args.gain_s)
        rows.append(row)
        ratios = ", ".join(f"{k} {v:.3f}" for k, v in row["over_oracle"].items() if v is not None)
        cost = "—" if row["cost_ratio"] is None else f"{row['cost_ratio']:.4f}"
        print(f"{args.scenario} seed {seed}: iteration time / oracle's: {ratios}; units {row['units']} of "
              f"{row['oracle_units']}; cost ratio {cost}; paths {row['gwtf_shape']['distinct_paths']} vs "
              f"{row['oracle_shape']['distinct_paths']}; held cost error sd {row['held_cost_error']['sd']:.3f}; "
              f"{row['fewest_changed_for_gain']} edge units for {args.gain_s} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The judged sanity checks: agreement without latency (SWARM's recompute apart), no waste without
churn, the oracle as a bound, determinism. Plus the grid's scenarios and the CLI on a short run."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace

import pytest

from gwtfp2p.sim.report import summary_dict
from gwtfp2p.sim.scenarios import CHURN_LEVELS, all_scenarios, get_scenario, grid
from gwtfp2p.sim.simulation import Simulation
from tests.sim.conftest import ideal, small

pytestmark = pytest.mark.timeout(120)
ROUTERS = ("gwtf", "swarm", "oracle")


def test_with_zero_latency_and_homogeneous_nodes_the_routers_agree_but_for_the_recompute():
    scenario = ideal(target_microbatches=12_000)
    sims = {r: Simulation(scenario, 0, r) for r in (*ROUTERS, "swarm-barrier")}
    runs = {r: sim.run().summary for r, sim in sims.items()}
    iteration = {r: runs[r].median_iteration_s for r in ("gwtf", "oracle")}
    assert max(iteration.values()) <= 1.05 * min(iteration.values())
    assert runs["gwtf"].microbatches_per_s >= 0.95 * runs["oracle"].microbatches_per_s  # start-up included
    # SWARM's stateless servers run the forward again in every backward: 4/3 of the GPU work
    busy = {r: sum(n.busy_s for n in sim.cluster.nodes.values() if not n.is_data_holder) / runs[r].completed
            for r, sim in sims.items()}
    for router in ("swarm", "swarm-barrier"):
        assert busy[router] == pytest.approx(4 / 3 * busy["gwtf"], rel=0.01)
    # one microbatch per relay: without a barrier, the critical path is longer by at most that factor;
    # at the barrier, at least by it (the trainers' independent heaps also collide on a relay)
    slower = {r: runs[r].time_to_n_s / runs["gwtf"].time_to_n_s for r in ("swarm", "swarm-barrier")}
    assert 1.0 <= slower["swarm"] <= 4 / 3 + 0.02
    assert slower["swarm-barrier"] >= 4 / 3 - 0.02


@pytest.mark.parametrize("scenario", [small(), replace(get_scenario("geo10-het-c0-gpt1.3b"),
                                                        target_microbatches=1500)], ids=["small", "geo10"])
def test_without_churn_nothing_is_wasted(scenario):
    for router in ROUTERS:
        summary = Simulation(scenario, 1, router).run().summary
        assert summary.crashes == 0 and summary.recoveries == 0
        assert summary.wasted_gpu_s == 0.0
        assert summary.completed == scenario.target_microbatches


def test_no_router_held_to_the_barrier_beats_the_oracle_beyond_noise():
    scenario = replace(get_scenario("geo10-het-c33-llama500m"), target_microbatches=3000)
    rate = {r: statistics.median(Simulation(scenario, seed, r).run().summary.microbatches_per_s
                                 for seed in range(3)) for r in ("gwtf", "swarm-barrier", "oracle")}
    assert rate["gwtf"] <= 1.05 * rate["oracle"]
    assert rate["swarm-barrier"] <= 1.05 * rate["oracle"]


@pytest.mark.parametrize("router", [*ROUTERS, "swarm-barrier"])
def test_same_seed_same_trace_same_run(router):
    scenario = small(churn_pct_per_hour=150.0, target_microbatches=900)
    first, second = Simulation(scenario, 7, router), Simulation(scenario, 7, router)
    assert first.trace == second.trace
    a, b = first.run(), second.run()
    assert a.summary == b.summary and a.throughput == b.throughput and a.crash_times == b.crash_times


def test_the_grid_is_complete_and_named():
    names = {s.name for s in grid()}
    assert len(names) == 16
    for model in ("llama500m", "gpt1.3b"):
        for compute in ("hom", "het"):
            for churn in CHURN_LEVELS:
                assert f"geo10-{compute}-c{churn}-{model}" in names
    assert {"uniform-het-c16-llama500m", "home-het-c16-llama500m", "scale100-het-c33-llama500m"} <= set(
        all_scenarios())
    scale = get_scenario("scale100-het-c33-llama500m")
    assert scale.n_stages * scale.relays_per_stage + scale.data_holders == 100 and scale.horizon_s == 7200


def test_summary_json_has_what_scripts_compare():
    scenario = small(target_microbatches=300)
    results = [Simulation(scenario, seed, r).run() for r in ROUTERS for seed in (0, 1)]
    summary = json.loads(json.dumps(summary_dict(results)))
    assert set(summary) == set(ROUTERS)
    for router in ROUTERS:
        for key in ("time_to_n_s", "microbatches_per_s", "wasted_gpu_s", "crashes"):
            assert summary[router][key] is not None
        assert summary[router]["seeds"] == 2

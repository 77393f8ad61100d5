"""Recovery (docs/design.md §3): crashes injected mid-forward, mid-backward, mid-aggregation.

Each test runs a small seeded swarm, waits for a node to be in the wanted phase, crashes it there
and checks what the paper claims: every microbatch still completes, only the lost hop is
recomputed, and failures are noticed as fast as the router's detection allows. SWARM's retries
are tested in test_swarm.py; heavy churn here covers every router.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gwtfp2p.sim.churn import Crash
from gwtfp2p.sim.cluster import BACKWARD, FORWARD
from gwtfp2p.sim.params import DataPlaneParams
from gwtfp2p.sim.simulation import Simulation
from tests.sim.conftest import small

pytestmark = pytest.mark.timeout(60)
STEP_S = 0.005


def start(router: str, **overrides) -> Simulation:
    sim = Simulation(small(target_microbatches=10_000, horizon_s=3600.0, **overrides), 0, router)
    sim.start()
    sim.engine.run(120.0)  # past the flow's convergence
    return sim


def crash_first(sim: Simulation, wanted) -> tuple[str, list]:
    """Advance until some relay satisfies ``wanted``; crash it; return it and its microbatches."""
    for _ in range(200_000):
        for node in sim.cluster.nodes.values():
            if node.alive and node.stage > 0 and wanted(sim, node):
                affected = list(node.mbs.values())
                sim.recovery.on_crash(node, Crash(sim.engine.now, node.node_id, 0.5))
                return node.node_id, affected
        sim.engine.run(sim.engine.now + STEP_S)
    raise AssertionError("no node reached the wanted phase")


def running(kind):
    return lambda sim, node: node.running is not None and node.running[0] == kind and len(node.mbs) >= 2


def finish_iteration(sim: Simulation, iteration: int, limit_s: float = 600.0) -> float:
    """Run until ``iteration`` is closed; returns how long it took."""
    deadline = sim.engine.now + limit_s
    while sim.engine.now < deadline:
        done = [e - s for i, s, e in sim.metrics.iterations if i == iteration]
        if done:
            return done[0]
        sim.engine.run(sim.engine.now + 1.0)
    raise AssertionError(f"iteration {iteration} did not finish")


@pytest.mark.parametrize("router", ["gwtf", "oracle"])
@pytest.mark.parametrize("kind", [FORWARD, BACKWARD])
def test_a_crash_mid_compute_redoes_one_hop_per_lost_microbatch(router, kind):
    sim = start(router)
    dead, affected = crash_first(sim, running(kind))
    finish_iteration(sim, sim.iterations.iteration)
    assert affected and all(m.done for m in affected)
    redone = [m for m in affected if m.recomputed]
    assert redone and all(m.recomputed <= 1 for m in affected)  # only the lost hop, once
    assert sim.metrics.recoveries == len(redone)
    assert all(dead not in m.holder for m in redone)
    assert sim.metrics.wasted_gpu_s() > 0


@pytest.mark.parametrize("mode", ["silent", "refused"])
def test_gwtf_notices_a_crash_within_its_detection_and_redoes_the_hop(mode):
    sim = start("gwtf", dataplane=DataPlaneParams(crash_mode=mode))
    sensing = sim.scenario.sensing
    crash_first(sim, running(FORWARD))
    took = finish_iteration(sim, sim.iterations.iteration)
    # silent: record expiry (<= 2 heartbeats) + a DHT read (<= 1) + the ping timeout; refused: the
    # chaos runs' delays (p95 2.5 s); then one recomputed hop and the rest of the iteration
    bound = 3 * sensing.heartbeat_s + sensing.ping_timeout_s if mode == "silent" else 6.0
    assert took < bound + 8.0


def test_a_crash_mid_aggregation_restarts_the_reduction_without_the_node():
    sim = start("gwtf")
    dead, _ = crash_first(sim, lambda s, node: s.iterations.aggregating_with(node) and node.stage == 2)
    iteration = sim.iterations.iteration
    finish_iteration(sim, iteration)
    assert sim.metrics.allreduce_restarts == 1
    assert dead not in sim.iterations.reductions.members[2]
    assert sim.metrics.crashes[-1][2] == "aggregation"


@pytest.mark.parametrize("router", ["gwtf", "swarm", "swarm-barrier", "oracle"])
def test_a_heavy_churn_run_trains_every_microbatch(router):
    # SWARM at a barrier stalls everyone on each 30 s / 75 s timeout: it needs a longer horizon
    horizon_s = 12 * 3600.0 if router == "swarm-barrier" else 4 * 3600.0
    scenario = small(churn_pct_per_hour=600.0, target_microbatches=1500, horizon_s=horizon_s)
    summary = Simulation(scenario, 3, router).run().summary
    assert summary.time_to_n_s is not None and summary.completed == 1500
    assert summary.crashes > 3 and summary.joins > 3


def test_joiners_download_then_serve():
    scenario = replace(small(churn_pct_per_hour=0.0, join_pct_per_hour=300.0, target_microbatches=1500))
    sim = Simulation(scenario, 1, "gwtf")
    sim.run()
    joined = [n for n in sim.cluster.nodes.values() if n.node_id.startswith("j")]
    assert joined and all(n.active for n in joined if n.born_s < sim.engine.now - 120)
    assert sum(n.busy_s for n in joined) > 0

"""What gwtf's nodes measure: probed, smoothed edge costs and per-node crash detection."""

from __future__ import annotations

import statistics

import pytest

from gwtfp2p.sim.churn import Crash
from gwtfp2p.sim.params import DataPlaneParams, SensingParams
from gwtfp2p.sim.routers.sensing import Sensing, lognormal_for
from gwtfp2p.sim.simulation import Simulation
from tests.sim.conftest import small

pytestmark = pytest.mark.timeout(60)


def test_refused_detection_has_the_chaos_runs_mean_and_p95():
    _, sigma = lognormal_for(1.2, 2.5)
    sensing = Sensing(SensingParams(), "refused", seed=1)
    draws = sorted(sensing.detect_delay_s(f"n{i}", "dead", 0.5) for i in range(20_000))
    assert statistics.fmean(draws) == pytest.approx(1.2, rel=0.03)
    assert draws[int(0.95 * len(draws))] == pytest.approx(2.5, rel=0.05)
    assert sigma > 0 and draws[0] > 0


def test_silent_detection_is_record_expiry_then_a_read_then_the_ping_timeout():
    params = SensingParams()
    sensing = Sensing(params, "silent", seed=1)
    for u in (0.0, 0.3, 0.99):
        draws = [sensing.detect_delay_s(f"n{i}", "dead", u) for i in range(500)]
        low = params.heartbeat_s * (2 - u) + params.ping_timeout_s
        assert all(low <= d <= low + params.heartbeat_s for d in draws)
        assert max(draws) - min(draws) > 0.8 * params.heartbeat_s  # each node reads the DHT at its own phase
    assert sensing.detect_delay_s("a", "dead", 0.5) == sensing.detect_delay_s("a", "dead", 0.5)


def test_costs_are_measured_with_noise_and_updated_past_a_tolerance():
    sensing = Sensing(SensingParams(), "silent", seed=3)
    assert sensing.cost("a", "b", 0.1, 0.1, 8e6) is None  # nothing measured yet
    for _ in range(50):
        sensing.ping("a", "b", 0.100)
    sensing.transfer_acked("a", "b", 8e6, 0.100 + 8e6 / 2e8)
    cost = sensing.cost("a", "b", 0.1, 0.1, 8e6)
    exact = 0.1 + 0.05 + 8e6 / 2e8
    assert cost != exact and 0.9 * exact < cost < 1.15 * exact  # noisy pings, bandwidth seen net of the RTT
    assert sensing.flow_update("a", "b", cost) == cost  # the first estimate reaches the flow as it is
    assert sensing.flow_update("a", "b", 1.3 * cost) is None  # within the noise the daemon tolerates
    doubled = [sensing.flow_update("a", "b", 3 * cost) for _ in range(30)]  # a lasting change gets through
    moved = [c for c in doubled if c is not None]
    assert len(moved) >= 1 and all(c > 1.4 * cost for c in moved)


def test_each_gwtf_neighbour_learns_of_a_refused_crash_at_its_own_time():
    sim = Simulation(small(target_microbatches=10_000, dataplane=DataPlaneParams(crash_mode="refused")), 0, "gwtf")
    sim.start()
    sim.engine.run(60.0)
    router = sim.router
    victim = sim.cluster.nodes["s2r1"]
    learnt = {}
    original = router._learn

    def learn(observer, dead):
        learnt[observer] = sim.engine.now
        original(observer, dead)
    router._learn = learn
    sim.membership.crashes.on_crash(victim, Crash(sim.engine.now, victim.node_id, 0.5))
    crash_s = sim.engine.now
    sim.engine.run(crash_s + 30.0)
    neighbours = [n for n in sim.cluster.active_by_stage[1] + sim.cluster.active_by_stage[2]
                  + sim.cluster.active_by_stage[3]]
    assert set(learnt) == set(neighbours)
    delays = [t - crash_s for t in learnt.values()]
    assert len(set(delays)) == len(delays) and min(delays) > 0 and max(delays) < 15
    assert all(not router.flows[n].has_neighbour(victim.node_id) for n in neighbours)


def test_gwtf_edge_costs_follow_the_measurements_not_the_truth():
    sim = Simulation(small(target_microbatches=10_000), 0, "gwtf")
    sim.start()
    sim.engine.run(120.0)
    router = sim.router
    ratios = []
    for a in sim.cluster.active_by_stage[1]:
        for b in sim.cluster.active_by_stage[2]:
            ratios.append(router.seen_cost(a, b) / sim.edge_cost(a, b))
    assert len(set(ratios)) == len(ratios)  # every estimate has its own noise
    assert 0.9 < statistics.median(ratios) < 1.3

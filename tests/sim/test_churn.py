"""Churn traces: seeded, identical for every router, rates as configured, guard and joiner stage."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from gwtfp2p.sim.churn import Join, make_trace
from gwtfp2p.sim.simulation import Simulation
from tests.sim.conftest import small

pytestmark = pytest.mark.timeout(60)


def slots(plan) -> int:
    return 4


def test_same_seed_same_trace_and_other_seeds_differ():
    scenario = small(churn_pct_per_hour=33.0)
    assert make_trace(scenario, 3, slots) == make_trace(scenario, 3, slots)
    assert make_trace(scenario, 3, slots) != make_trace(scenario, 4, slots)


def test_every_router_sees_the_same_trace():
    scenario = small(churn_pct_per_hour=100.0, horizon_s=1800.0)
    traces = {router: Simulation(scenario, 1, router).trace for router in ("gwtf", "swarm", "oracle")}
    assert traces["gwtf"] == traces["swarm"] == traces["oracle"]


def test_crash_and_join_rates_match_the_churn():
    scenario = small(churn_pct_per_hour=33.0, relays_per_stage=10, horizon_s=200 * 3600.0)
    trace = make_trace(scenario, 0, slots)
    hours = scenario.horizon_s / 3600.0
    expected = 0.33 * 30 * hours  # ~30 relays stay alive on average: joins replace the crashed ones
    assert 0.85 * expected < len(trace.crashes) < 1.15 * expected
    assert 0.85 * expected < len(trace.joins) < 1.15 * expected
    assert make_trace(small(), 0, slots).events == ()  # no churn, no events


def test_longer_horizon_only_extends_the_trace():
    short = make_trace(small(churn_pct_per_hour=50.0, horizon_s=3600.0), 2, slots)
    long = make_trace(small(churn_pct_per_hour=50.0, horizon_s=7200.0), 2, slots)
    assert long.events[: len(short.events)] == short.events


def test_guard_keeps_established_replicas_and_holders_never_crash():
    scenario = small(churn_pct_per_hour=400.0, horizon_s=20 * 3600.0, min_replicas_after_crash=2)
    trace = make_trace(scenario, 5, slots)
    stage_of = {p.node_id: p.stage for p in trace.initial}
    alive = Counter(p.stage for p in trace.initial if not p.is_data_holder)
    for event in trace.events:
        if isinstance(event, Join):
            stage_of[event.node.node_id] = event.node.stage
            alive[event.node.stage] += 1
            continue
        assert stage_of[event.node_id] > 0 and 0.0 <= event.phase_u < 1.0
        alive[stage_of[event.node_id]] -= 1
        assert alive[stage_of[event.node_id]] >= 2


def test_joiners_take_the_bottleneck_stage():
    scenario = small(churn_pct_per_hour=0.0, join_pct_per_hour=100.0, horizon_s=3600.0)
    trace = make_trace(scenario, 0, lambda plan: 1 if plan.stage == 2 else 10)
    joins = [e for e in trace.events if isinstance(e, Join)]
    assert joins and all(j.node.stage == 2 for j in joins[:5])


def test_homogeneous_swarms_use_one_gpu_class():
    trace = make_trace(replace(small(), compute="homogeneous"), 0, slots)
    assert {p.gpu for p in trace.initial} == {"rtx3090"}

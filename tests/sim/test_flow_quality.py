"""Seeded scenarios: the decentralized protocol against the oracle, before and after churn.

The full 50-seed measurement is benchmarks/bench_flow.py (results in docs/flow.md); these few
seeds keep CI honest in well under a minute. Each run is deterministic for its seed.
"""

import statistics

import pytest

from gwtfp2p.flow.bus import MessageBus
from gwtfp2p.flow.churn import add_relays, remove_relays
from gwtfp2p.flow.generate import generate
from gwtfp2p.flow.oracle import solve

CASES = [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2), ("geo10", 0), ("geo10", 1), ("geo10", 2)]


@pytest.mark.timeout(300)
def test_converges_to_the_oracles_flow_at_near_oracle_cost():
    ratios = []
    for family, seed in CASES:
        instance = generate(family, seed)
        oracle = solve(instance).quality
        result = MessageBus(instance, seed=seed).run(max_ticks=1500)
        assert result.converged, (family, seed)
        assert result.quality.flow_value == oracle.flow_value, (family, seed)
        ratios.append(result.quality.total_cost / oracle.total_cost)
    assert statistics.median(ratios) <= 1.10, ratios
    assert max(ratios) <= 1.25, ratios


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("family", "seed", "change"), [
    ("b", 3, "remove"), ("b", 3, "add"), ("geo10", 3, "remove"), ("geo10", 3, "add")])
def test_reconverges_after_a_fifth_of_the_relays_change(family, seed, change):
    instance = generate(family, seed)
    bus = MessageBus(instance, seed=seed)
    bus.run(max_ticks=1500)
    (remove_relays if change == "remove" else add_relays)(bus, instance, fraction=0.2, seed=seed)
    result = bus.run(max_ticks=1500)
    oracle = solve(bus.instance()).quality
    assert result.converged
    assert result.quality.flow_value == oracle.flow_value
    assert result.quality.total_cost <= 1.10 * oracle.total_cost

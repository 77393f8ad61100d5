"""The oracle: exact min-cost max-flow, checked on instances whose answer is known."""

import pytest

from gwtfp2p.flow.evaluate import RoutingError, check_routing, evaluate
from gwtfp2p.flow.generate import FamilyShape, generate
from gwtfp2p.flow.instance import FlowInstance, NodeSpec, edge_key
from gwtfp2p.flow.oracle import _milp_paths, solve, solve_relaxed


def line(costs_second_relay: float) -> FlowInstance:
    """One holder wanting 3 units; stage 1 = {a (cap 2), b (cap 5)}."""
    nodes = (NodeSpec("d", 0, supply=3), NodeSpec("a", 1, capacity=2), NodeSpec("b", 1, capacity=5))
    edges = {edge_key("d", "a"): 1.0, edge_key("a", "d"): 1.0, edge_key("d", "b"): costs_second_relay}
    return FlowInstance(1, nodes, edges)


def test_cheap_relay_is_filled_first():
    result = solve(line(5.0))
    # both a-units cost 1+1 each way... a path is d -> a -> d: 2 edges of the same pair
    assert result.quality.flow_value == 3
    assert sorted(result.paths).count(("d", "a", "d")) == 2
    assert result.quality.total_cost == pytest.approx(2 * 2.0 + 2 * 5.0)
    assert result.quality.max_path_cost == pytest.approx(10.0)


def test_flow_is_limited_by_the_bottleneck_stage():
    inst = generate("b", 3, FamilyShape(n_stages=3, relays_per_stage=2, data_holders=1, supply=100))
    caps = [sum(n.capacity for n in inst.stage_nodes(k)) for k in (1, 2, 3)]
    assert solve(inst).quality.flow_value == min(caps)


@pytest.mark.parametrize("seed", range(4))
def test_milp_agrees_with_networkx_on_one_holder(seed):
    inst = generate("b", seed, FamilyShape(n_stages=4, relays_per_stage=4, data_holders=1, supply=25))
    exact = solve(inst).quality
    milp = evaluate(inst, _milp_paths(inst))
    assert milp.flow_value == exact.flow_value
    assert milp.total_cost == pytest.approx(exact.total_cost)


@pytest.mark.parametrize("family", ["b", "geo10"])
def test_multi_holder_oracle_returns_units_to_their_holder(family):
    inst = generate(family, 1)
    result = solve(inst)
    check_routing(inst, list(result.paths))
    relaxed = solve_relaxed(inst)
    assert relaxed.flow_value >= result.quality.flow_value
    assert relaxed.total_cost <= result.quality.total_cost + 1e-6


def test_evaluator_rejects_broken_routings():
    inst = line(5.0)
    with pytest.raises(RoutingError, match=r"capacity|limit"):
        check_routing(inst, [("d", "a", "d")] * 3)
    with pytest.raises(RoutingError, match="return"):
        check_routing(FlowInstance(1, (*inst.nodes, NodeSpec("e", 0, supply=1)),
                                   {**inst.edge_costs, edge_key("a", "e"): 1.0}), [("d", "a", "e")])


def test_no_data_holder_means_no_flow():
    inst = FlowInstance(1, (NodeSpec("a", 1, capacity=3),), {})
    assert solve(inst).quality.flow_value == 0

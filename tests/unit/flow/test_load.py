"""The load model: time-bounded capacity, and the uplink wait one more unit adds."""

import math

import pytest

from gwtfp2p.config import FlowParams
from gwtfp2p.flow.bus import MessageBus
from gwtfp2p.flow.evaluate import evaluate
from gwtfp2p.flow.instance import FlowInstance, NodeSpec, edge_key
from gwtfp2p.flow.load import NodeResources, congestion_cost_s, marginal_cost_s
from gwtfp2p.flow.node import FlowNode
from gwtfp2p.flow.oracle import solve


def test_memory_alone_bounds_without_a_budget():
    slow = NodeResources(compute_s_per_unit=10.0, uplink_s_per_unit=10.0)
    assert slow.capacity(7, budget_s=0.0) == 7


def test_gpu_and_uplink_time_bound_the_units_per_iteration():
    r = NodeResources(compute_s_per_unit=2.0, uplink_s_per_unit=3.0)
    assert r.capacity(100, budget_s=12.0) == 4  # the uplink: 12 / 3
    assert NodeResources(compute_s_per_unit=4.0).capacity(100, budget_s=12.0) == 3  # exact division
    assert r.capacity(2, budget_s=12.0) == 2  # memory still bounds


def test_uplink_seconds_per_unit_from_bytes_and_bandwidth():
    r = NodeResources.from_uplink(uplink_bytes_per_s=2.5e6, upload_bytes_per_unit=5e6)
    assert r.uplink_s_per_unit == pytest.approx(2.0)
    assert NodeResources.from_uplink(uplink_bytes_per_s=math.inf, upload_bytes_per_unit=5e6).uplink_s_per_unit == 0
    with pytest.raises(ValueError):
        NodeResources.from_uplink(uplink_bytes_per_s=0.0, upload_bytes_per_unit=1.0)
    with pytest.raises(ValueError):
        NodeResources(uplink_s_per_unit=-1.0)


def test_the_kth_unit_waits_for_the_k_minus_1_before_it():
    assert [marginal_cost_s(2.0, k) for k in range(4)] == [0.0, 2.0, 4.0, 6.0]
    assert congestion_cost_s(2.0, 4) == pytest.approx(sum(marginal_cost_s(2.0, k) for k in range(4)))


def test_a_flow_node_applies_the_budget_to_capacity_and_supply():
    params = FlowParams(iteration_budget_s=10.0)
    relay = FlowNode("r", 1, 2, capacity=8, params=params, resources=NodeResources(uplink_s_per_unit=4.0))
    holder = FlowNode("d", 0, 2, supply=9, params=params, resources=NodeResources(compute_s_per_unit=2.0))
    assert relay.core.capacity == 2 and holder.core.supply == 5
    relay.set_resources(NodeResources(uplink_s_per_unit=1.0), now=1)
    assert relay.core.capacity == 8


def fan(uplink_a: float, uplink_b: float) -> FlowInstance:
    """One holder, two equal stage-1 relays with their own uplinks, one stage-2 relay."""
    nodes = (NodeSpec("dh", 0, supply=10), NodeSpec("a", 1, capacity=10, uplink_s_per_unit=uplink_a),
             NodeSpec("b", 1, capacity=10, uplink_s_per_unit=uplink_b), NodeSpec("c", 2, capacity=20))
    edges = {edge_key(x, y): 5.0 for x, y in (("dh", "a"), ("dh", "b"), ("a", "c"), ("b", "c"), ("c", "dh"))}
    return FlowInstance(2, nodes, edges)


def test_evaluation_counts_each_nodes_uplink_wait():
    inst = fan(2.0, 1.0)
    paths = [("dh", "a", "c", "dh")] * 3 + [("dh", "b", "c", "dh")] * 2
    q = evaluate(inst, paths)
    assert q.total_cost == pytest.approx(5 * 15.0 + 2.0 * 3 + 1.0 * 1)  # edges + a: 0+2+4 + b: 0+1


def test_oracle_and_protocol_spread_units_over_shared_uplinks():
    inst = fan(2.0, 1.0)
    best = solve(inst)
    loads = sorted(sum(1 for p in best.paths if p[1] == r) for r in "ab")
    assert loads == [4, 6]  # marginal waits 2k vs k: a takes 4, b 6
    result = MessageBus(inst, seed=1).run(max_ticks=600)
    assert result.quality.flow_value == 10
    assert result.quality.total_cost == pytest.approx(best.quality.total_cost)

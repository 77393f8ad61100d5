"""Edge costs, instances and their JSON form."""

import json

import pytest

from gwtfp2p.flow.costs import edge_cost_s, path_cost_s
from gwtfp2p.flow.generate import DEFAULT_SHAPES, generate
from gwtfp2p.flow.geo import geo10
from gwtfp2p.flow.instance import FlowInstance, InstanceError, NodeSpec, edge_key


def test_edge_cost_is_the_papers_formula():
    # (c_i + c_j)/2 + (λij + λji)/2 + 2·size/(βij + βji)
    cost = edge_cost_s(0.2, 0.4, 0.01, 0.03, 100.0, 300.0, 1000.0)
    assert cost == pytest.approx(0.3 + 0.02 + 2 * 1000.0 / 400.0)


def test_edge_cost_is_symmetric():
    a = edge_cost_s(0.1, 0.5, 0.02, 0.04, 10.0, 30.0, 64.0)
    b = edge_cost_s(0.5, 0.1, 0.04, 0.02, 30.0, 10.0, 64.0)
    assert a == pytest.approx(b)


@pytest.mark.parametrize("bad", [dict(bandwidth=0.0), dict(latency=-1.0), dict(size=float("nan"))])
def test_edge_cost_rejects_nonsense(bad):
    args = dict(latency=0.0, bandwidth=1.0, size=1.0) | bad
    with pytest.raises(ValueError):
        edge_cost_s(0, 0, args["latency"], 0, args["bandwidth"], 0, args["size"])


def test_path_cost_sums():
    assert path_cost_s([1.0, 2.5, 3.5]) == 7.0


def test_generated_families_have_the_judged_shapes():
    a = generate("a", 0)
    assert a.n_stages == 8 and len(a.stage_nodes(1)) == 12 and [d.supply for d in a.data_holders] == [60]
    assert all(1 <= n.capacity <= 20 for n in a.nodes if n.stage)
    assert all(1 <= c <= 100 for c in a.edge_costs.values())
    b = generate("b", 0)
    assert b.n_stages == 6 and len(b.stage_nodes(3)) == 6 and len(b.data_holders) == 2
    geo = generate("geo10", 0)
    assert sum(1 for n in geo.nodes if n.stage) == 40 and len(geo.data_holders) == 2
    assert {n.location for n in geo.nodes} <= set(geo10().locations)
    assert all(n.compute_s == pytest.approx(0.05 * geo10().compute_factor[n.location]) for n in geo.nodes if n.stage)
    assert DEFAULT_SHAPES["geo10"].n_stages * DEFAULT_SHAPES["geo10"].relays_per_stage == 40


def test_same_seed_same_instance_and_json_round_trip():
    one, two = generate("geo10", 7), generate("geo10", 7)
    assert one == two
    assert FlowInstance.from_json(one.to_json()) == one
    assert generate("geo10", 8) != one


def test_instance_validation_names_the_problem():
    nodes = (NodeSpec("dh", 0, supply=1), NodeSpec("r", 1, capacity=1), NodeSpec("q", 2, capacity=1))
    with pytest.raises(InstanceError, match="consecutive"):
        FlowInstance(3, nodes, {edge_key("dh", "q"): 1.0})
    with pytest.raises(InstanceError, match="unknown"):
        FlowInstance(2, nodes, {edge_key("dh", "zz"): 1.0})
    with pytest.raises(InstanceError, match="malformed"):
        FlowInstance.from_json(json.dumps({"n_stages": 2, "nodes": [{"stage": 0}], "edges": []}))


def test_fast_gains_equal_the_generic_potential():
    from gwtfp2p.flow.objective import gain, gain1, gain2

    for w in (0.0, 0.5, 1.0):
        assert gain1(10.0, 7.0, w) == pytest.approx(gain([10.0], [7.0], w))
        assert gain2(10.0, 3.0, 7.0, 8.0, w) == pytest.approx(gain([10.0, 3.0], [7.0, 8.0], w))
    assert gain([10.0], [7.0], 0.0) == 3.0
    assert gain([10.0, 10.0], [16.0, 4.0], 0.5) < 0  # same sum, a longer worst path: worse

"""The oracle: exact, fair min-cost max-flow, checked on instances whose answer is known and
against brute force over every routing of tiny instances (an independent solver)."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtfp2p.flow.evaluate import RoutingError, check_routing, evaluate
from gwtfp2p.flow.generate import FamilyShape, generate
from gwtfp2p.flow.instance import FlowInstance, NodeSpec, adjacent_stages, edge_key
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


# -- an independent check: brute force over every routing of tiny instances -----------------------

@st.composite
def tiny_instances(draw):
    n_stages = draw(st.integers(1, 2))
    holders = draw(st.integers(1, 3 if n_stages == 1 else 2))
    uplink = st.sampled_from([0.0, 0.0, 0.5, 2.0])
    nodes = [NodeSpec(f"d{h}", 0, supply=draw(st.integers(0, 4)), uplink_s_per_unit=draw(uplink))
             for h in range(holders)]
    for stage in range(1, n_stages + 1):
        nodes += [NodeSpec(f"s{stage}r{r}", stage, capacity=draw(st.integers(0, 2)), uplink_s_per_unit=draw(uplink))
                  for r in range(draw(st.integers(1, 2)))]
    edges = {edge_key(a.node_id, b.node_id): float(draw(st.integers(1, 9)))
             for i, a in enumerate(nodes) for b in nodes[i + 1:]
             if adjacent_stages(a.stage, b.stage, n_stages) and draw(st.integers(0, 3)) > 0}
    return FlowInstance(n_stages, tuple(nodes), edges)


def all_paths(inst: FlowInstance) -> list[tuple[str, ...]]:
    paths = []
    for holder in inst.data_holders:
        partial = [(holder.node_id,)]
        for _ in range(inst.n_stages):
            partial = [(*p, n) for p in partial for n, _ in inst.next_hops(p[-1])]
        paths += [(*p, holder.node_id) for p in partial if inst.cost(p[-1], holder.node_id) is not None]
    return paths


def brute_force(inst: FlowInstance) -> tuple[int, tuple[int, ...], float]:
    """(max flow, the holders' flows sorted (max-min: lexicographically largest), least cost)."""
    paths = all_paths(inst)
    limit = {n.node_id: n.supply if n.is_data_holder else n.capacity for n in inst.nodes}
    best = None

    def visit(i: int, chosen: list, load: Counter) -> None:
        nonlocal best
        if i == len(paths):
            flows = Counter(p[0] for p in chosen)
            key = (len(chosen), tuple(sorted(flows[h.node_id] for h in inst.data_holders)),
                   -evaluate(inst, chosen, check=False).total_cost)
            best = key if best is None or key > best else best
            return
        path, count = paths[i], 0
        while True:
            visit(i + 1, chosen + [path] * count, load)
            if any(load[n] + 1 > limit[n] for n in path[:-1]):
                break
            load.update(path[:-1])
            count += 1
        load.subtract({n: count for n in path[:-1]})

    visit(0, [], Counter())
    return best[0], best[1], -best[2]


@settings(max_examples=150, deadline=None)
@given(tiny_instances())
def test_oracle_matches_brute_force_flow_fairness_and_cost(inst):
    flow, fair, cost = brute_force(inst)
    result = solve(inst)
    check_routing(inst, list(result.paths))
    flows = result.holder_flows()
    assert result.quality.flow_value == flow
    assert tuple(sorted(flows.get(h.node_id, 0) for h in inst.data_holders)) == fair
    assert result.quality.total_cost == pytest.approx(cost)


def test_fairness_shares_a_bottleneck_evenly_between_holders():
    """Two holders wanting 5 each through one relay of capacity 4: 2 and 2, not 4 and 0."""
    nodes = (NodeSpec("d0", 0, supply=5), NodeSpec("d1", 0, supply=5), NodeSpec("r", 1, capacity=4))
    edges = {edge_key("d0", "r"): 1.0, edge_key("d1", "r"): 50.0}
    result = solve(FlowInstance(1, nodes, edges))
    assert result.holder_flows() == {"d0": 2, "d1": 2}

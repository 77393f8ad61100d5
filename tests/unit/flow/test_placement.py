"""--stage auto placement and the no-flap rebalancing predicate."""

from gwtfp2p.flow.instance import FlowInstance, NodeSpec, adjacent_stages, edge_key
from gwtfp2p.flow.placement import choose_stage, should_rebalance


def swarm(capacities: dict[int, list[int]], n_stages: int = 3, supply: int = 20, cost: float = 1.0) -> FlowInstance:
    nodes = [NodeSpec("dh", 0, supply=supply)]
    for stage, caps in capacities.items():
        nodes += [NodeSpec(f"s{stage}r{i}", stage, capacity=c) for i, c in enumerate(caps)]
    edges = {edge_key(a.node_id, b.node_id): cost for a in nodes for b in nodes
             if a.node_id < b.node_id and adjacent_stages(a.stage, b.stage, n_stages)}
    return FlowInstance(n_stages, tuple(nodes), edges)


def uniform_costs(instance: FlowInstance, cost: float = 1.0):
    def costs(stage: int):
        return {n.node_id: cost for n in instance.nodes if adjacent_stages(n.stage, stage, instance.n_stages)}
    return costs


def test_unserved_stage_is_filled_first():
    inst = swarm({1: [5], 2: [], 3: [5]})
    placement = choose_stage(inst, "new", 4, uniform_costs(inst))
    assert placement.stage == 2
    assert "no replica" in placement.reason


def test_several_unserved_stages_fill_in_order():
    inst = swarm({1: [], 2: [], 3: []})
    chosen = []
    for i in range(3):
        stage = choose_stage(inst, f"n{i}", 3, uniform_costs(inst)).stage
        chosen.append(stage)
        node = NodeSpec(f"n{i}", stage, capacity=3)
        edges = dict(inst.edge_costs) | {edge_key(node.node_id, o): 1.0 for o in uniform_costs(inst)(stage)}
        inst = inst.with_changes(nodes=(*inst.nodes, node), edge_costs=edges)
    assert sorted(chosen) == [1, 2, 3]


def test_bottleneck_stage_is_chosen():
    inst = swarm({1: [8], 2: [2], 3: [8]})
    placement = choose_stage(inst, "new", 5, uniform_costs(inst))
    assert placement.stage == 2
    assert "2 -> 7" in placement.reason


def test_ties_go_to_the_cheaper_stage():
    inst = swarm({1: [10], 2: [10], 3: [10]}, supply=5, cost=10.0)

    def costs(stage):
        return {k: (1.0 if stage == 3 else 50.0) for k in uniform_costs(inst)(stage)}

    assert choose_stage(inst, "new", 5, costs).stage == 3


def test_rebalance_does_not_flap_on_near_equal_options():
    inst = swarm({1: [5, 5], 2: [5, 4], 3: [5, 5]}, supply=50)
    me = "s1r1"
    decision = should_rebalance(inst, me, uniform_costs(inst))
    assert not decision.move  # moving to stage 2 gains 1 unit of 9: below the 10 % margin


def test_rebalance_moves_for_a_clear_gain():
    inst = swarm({1: [10, 10], 2: [1], 3: [10]}, supply=50)
    decision = should_rebalance(inst, "s1r1", uniform_costs(inst))
    assert decision.move and decision.to_stage == 2


def test_near_equal_costs_go_to_the_stage_with_least_capacity():
    inst = swarm({1: [10], 2: [4], 3: [10]}, supply=3, cost=10.0)

    def costs(stage):  # stage 1 is 1 % cheaper: noise, not a reason to skip the bottleneck
        return {k: (9.9 if stage == 1 else 10.0) for k in uniform_costs(inst)(stage)}

    assert choose_stage(inst, "new", 5, costs).stage == 2

"""Stage placement for ``--stage auto`` and the rebalancing predicate (pure).

A newcomer reads the swarm from the DHT (an instance) and tries every stage: it goes where it
raises the swarm's maximum flow the most; ties go to the lower total cost (within 2 % counts as
equal: measured costs are noisy), then to the stage with the least capacity (the bottleneck: an
unserved stage first), then the lower index. A node already serving moves only when moving
raises the flow by a clear margin (no flapping).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gwtfp2p.flow.instance import FlowInstance, NodeSpec, adjacent_stages, edge_key
from gwtfp2p.flow.oracle import solve

EdgeCostsFor = Callable[[int], Mapping[str, float]]


@dataclass(frozen=True)
class StageOption:
    stage: int
    flow_value: int
    total_cost: float
    stage_capacity_before: int


@dataclass(frozen=True)
class Placement:
    stage: int
    reason: str
    options: tuple[StageOption, ...]


def _with_node(instance: FlowInstance, node: NodeSpec, costs: Mapping[str, float]) -> FlowInstance:
    """``instance`` plus ``node``, linked to the nodes of its adjacent stages that ``costs`` names."""
    edges = dict(instance.edge_costs)
    present = {n.node_id: n for n in instance.nodes if n.node_id != node.node_id}
    for other, cost in costs.items():
        if other in present and adjacent_stages(present[other].stage, node.stage, instance.n_stages):
            edges[edge_key(node.node_id, other)] = float(cost)
    return instance.with_changes(nodes=(*instance.nodes, node), edge_costs=edges)


def evaluate_stage(instance: FlowInstance, node: NodeSpec, costs: Mapping[str, float]) -> StageOption:
    """The swarm's min-cost max-flow with ``node`` added (``costs``: its edges to neighbours)."""
    quality = solve(_with_node(instance, node, costs)).quality
    before = sum(n.capacity for n in instance.stage_nodes(node.stage))
    return StageOption(node.stage, quality.flow_value, quality.total_cost, before)


COST_TIE = 0.02  # total costs within 2 % are a tie (measurement noise): the bottleneck stage wins


def _rank(options: list[StageOption]) -> StageOption:
    """Most flow; then lowest cost, near-equal costs counting as equal; then least capacity."""
    top_flow = max(o.flow_value for o in options)
    best = [o for o in options if o.flow_value == top_flow]
    cheapest = min(o.total_cost for o in best)
    near = [o for o in best if o.total_cost <= cheapest * (1 + COST_TIE) + 1e-12]
    return min(near, key=lambda o: (o.stage_capacity_before, o.total_cost, o.stage))


def choose_stage(instance: FlowInstance, node_id: str, capacity: int, edge_costs_for: EdgeCostsFor,
                 compute_s: float = 0.0) -> Placement:
    """Pick the stage where a newcomer of ``capacity`` raises the flow the most.

    ``edge_costs_for(stage)`` gives the newcomer's estimated edge costs to the nodes of the
    stages adjacent to ``stage`` (its prev and next), keyed by node id.
    """
    if capacity < 1:
        raise ValueError("a relay needs capacity >= 1 to carry any flow")
    base = solve(instance).quality.flow_value if instance.data_holders else 0
    options = []
    for stage in range(1, instance.n_stages + 1):
        node = NodeSpec(node_id, stage, capacity=capacity, compute_s=compute_s)
        options.append(evaluate_stage(instance, node, edge_costs_for(stage)))
    best = _rank(options)
    if best.stage_capacity_before == 0:
        reason = f"stage {best.stage} has no replica"
    elif best.flow_value > base:
        reason = f"stage {best.stage} limits the flow: {base} -> {best.flow_value} units"
    else:
        reason = f"no stage raises the flow ({base} units); stage {best.stage} is the cheapest"
    return Placement(best.stage, reason, tuple(options))


@dataclass(frozen=True)
class Rebalance:
    move: bool
    to_stage: int
    reason: str


def should_rebalance(instance: FlowInstance, node_id: str, edge_costs_for: EdgeCostsFor,
                     min_gain_fraction: float = 0.1) -> Rebalance:
    """Should a serving relay move to another stage? Only for a flow gain above the margin.

    The gain must be at least one unit and at least ``min_gain_fraction`` of the current flow,
    so that two near-equal options never make a node flap between stages.
    """
    me = instance.node(node_id)
    current = solve(instance).quality.flow_value
    without = instance.with_changes(nodes=tuple(n for n in instance.nodes if n.node_id != node_id))
    placement = choose_stage(without, node_id, me.capacity, edge_costs_for, me.compute_s)
    target = next(o for o in placement.options if o.stage == placement.stage)
    needed = max(1.0, min_gain_fraction * current)
    if placement.stage != me.stage and target.flow_value - current >= needed:
        return Rebalance(True, placement.stage,
                         f"moving {me.stage} -> {placement.stage} raises the flow {current} -> {target.flow_value}")
    return Rebalance(False, me.stage, f"staying at stage {me.stage}: best gain below {needed:.1f} units")

"""Property tests: with message loss, duplication, reordering and churn, the protocol's invariants hold at
every tick — no capacity exceeded, every routed unit a complete DH → 1 → … → S → same DH path,
single ownership of every edge unit, no unit through a node after its loss was signalled."""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtfp2p.flow.bus import MessageBus, NetworkModel
from gwtfp2p.flow.instance import FlowInstance, NodeSpec, adjacent_stages, edge_key
from gwtfp2p.flow.oracle import solve


@st.composite
def swarms(draw):
    n_stages = draw(st.integers(1, 4))
    holders = draw(st.integers(1, 2))
    nodes = [NodeSpec(f"dh{d}", 0, supply=draw(st.integers(1, 8))) for d in range(holders)]
    for stage in range(1, n_stages + 1):
        for r in range(draw(st.integers(1, 4))):
            nodes.append(NodeSpec(f"s{stage}r{r}", stage, capacity=draw(st.integers(1, 6))))
    edges = {}
    for a in nodes:
        for b in nodes:
            if a.node_id < b.node_id and adjacent_stages(a.stage, b.stage, n_stages):
                edges[edge_key(a.node_id, b.node_id)] = float(draw(st.integers(1, 20)))
    return FlowInstance(n_stages, tuple(nodes), edges)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(swarms(), st.integers(0, 2**16), st.floats(0.0, 0.1), st.floats(0.0, 0.2), st.integers(0, 2))
def test_invariants_hold_at_every_tick(instance, seed, loss, duplicate, jitter):
    network = NetworkModel(delay_ticks=1, jitter_ticks=jitter, loss=loss, duplicate=duplicate)
    bus = MessageBus(instance, seed=seed, network=network, check_every_tick=True)
    rng = random.Random(seed)
    for tick in range(160):
        if tick in (60, 100) and len(bus.specs) > 2:
            relays = sorted(n for n, s in bus.specs.items() if s.stage > 0)
            if relays:
                bus.remove_node(rng.choice(relays))
        if tick == 80:
            stage = rng.randint(1, instance.n_stages)
            neighbours = {o.node_id: float(rng.randint(1, 20)) for o in bus.specs.values()
                          if adjacent_stages(o.stage, stage, instance.n_stages)}
            bus.add_node(NodeSpec("late", stage, capacity=rng.randint(1, 6)), neighbours)
        bus.step()
    assert bus.violations == []


@settings(max_examples=20, deadline=None)
@given(swarms(), st.integers(0, 2**16))
def test_without_loss_the_protocol_reaches_the_maximum_flow(instance, seed):
    result = MessageBus(instance, seed=seed).run(max_ticks=800, quiet_ticks=60)
    assert result.quality.flow_value == solve(instance).quality.flow_value


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(swarms(), st.integers(0, 2**16), st.floats(0.05, 0.5), st.integers(1, 3))
def test_duplicated_and_reordered_messages_still_reach_the_maximum_flow(instance, seed, duplicate, jitter):
    network = NetworkModel(delay_ticks=1, jitter_ticks=jitter, duplicate=duplicate)
    bus = MessageBus(instance, seed=seed, network=network, check_every_tick=True)
    result = bus.run(max_ticks=1500, quiet_ticks=80)
    assert bus.violations == []
    assert result.quality.flow_value == solve(instance).quality.flow_value

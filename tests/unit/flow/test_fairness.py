"""Fairness between data holders (fairness.py): a holder that routes two units more than one that wants
more gives one up and holds back; it grows again when the poorer holder could not use the capacity;
on swarms whose holders share every relay the routing ends max-min fair (the oracle's shares)."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtfp2p.config import FlowParams
from gwtfp2p.flow.bus import MessageBus
from gwtfp2p.flow.instance import FlowInstance, NodeSpec
from gwtfp2p.flow.messages import Residual
from gwtfp2p.flow.oracle import solve


def one_relay(params: FlowParams | None = None) -> MessageBus:
    """g and h share one relay x that carries two units; g asks first and takes both."""
    nodes = (NodeSpec("g", 0, supply=2), NodeSpec("h", 0, supply=2), NodeSpec("x", 1, capacity=2))
    return MessageBus(FlowInstance(1, nodes, {("g", "x"): 1.0, ("h", "x"): 1.0}), seed=0, params=params,
                      check_every_tick=True)


def shares(bus: MessageBus) -> dict[str, int]:
    counted = Counter(path[0] for path in bus.routing())
    return {n: counted.get(n, 0) for n in sorted(bus.nodes) if bus.nodes[n].stage == 0}


def test_a_holder_with_two_units_more_gives_one_up_to_the_poorer_holder() -> None:
    bus = one_relay()
    result = bus.run(max_ticks=600)
    assert shares(bus) == {"g": 1, "h": 1}
    assert bus.nodes["g"].fairness.units_given_up == 1 and result.converged and bus.violations == []


def test_without_fair_share_the_first_holder_keeps_both_units() -> None:
    bus = one_relay(FlowParams(fair_share=False))
    bus.run(max_ticks=600)
    assert shares(bus) == {"g": 2, "h": 0}


def test_capacity_the_poorer_holder_cannot_use_is_taken_back_after_the_patience() -> None:
    """h reaches the first stage but no relay of the second stage reaches h: h wants more and can route
    nothing. g gives one unit up for it, waits ``fair_patience_ticks`` and routes it again."""
    nodes = (NodeSpec("g", 0, supply=2), NodeSpec("h", 0, supply=2), NodeSpec("x", 1, capacity=2),
             NodeSpec("w", 2, capacity=2))
    bus = MessageBus(FlowInstance(2, nodes, {("g", "x"): 1.0, ("h", "x"): 1.0, ("w", "x"): 1.0, ("g", "w"): 1.0}),
                     seed=0, params=FlowParams(fair_patience_ticks=30), check_every_tick=True)
    result = bus.run(max_ticks=800)
    assert shares(bus) == {"g": 2, "h": 0}
    assert bus.nodes["g"].fairness.units_given_up == 1 and result.converged and bus.violations == []


def test_wants_out_of_range_are_refused() -> None:
    bus = one_relay()
    x = bus.nodes["x"].core.neighbours["h"]
    for wants in ((("h", 5, 10**6, 1),), (("h", -1, 1, 1),), (("h", 5, 1, -3),), (("h", 5, 1, 10**9),)):
        bus.nodes["x"].on_message(Residual("h", (), (), wants=wants), now=1)
        assert x.res_wants == ()


@st.composite
def shared_swarms(draw) -> FlowInstance:
    """2-3 holders linked to every relay of a 1-2 stage swarm (each stage fully linked to the next):
    every holder competes for every unit of capacity, so max-min gives each its equal part."""
    n_stages = draw(st.integers(1, 2))
    holders = [NodeSpec(f"d{i}", 0, supply=draw(st.integers(1, 6))) for i in range(draw(st.integers(2, 3)))]
    relays = [[NodeSpec(f"r{s}{j}", s, capacity=draw(st.integers(1, 4))) for j in range(draw(st.integers(1, 3)))]
              for s in range(1, n_stages + 1)]
    edges = {}
    for a, b in pairwise(relays):
        edges |= {(x.node_id, y.node_id): float(draw(st.integers(1, 20))) for x in a for y in b}
    for h in holders:
        edges |= {(h.node_id, r.node_id): float(draw(st.integers(1, 20))) for r in relays[0]}
        edges |= {(r.node_id, h.node_id): float(draw(st.integers(1, 20))) for r in relays[-1]}
    return FlowInstance(n_stages, tuple(holders) + tuple(r for stage in relays for r in stage), edges)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=shared_swarms(), seed=st.integers(0, 1000))
def test_holders_sharing_every_relay_end_within_one_unit_of_the_max_min_share(instance: FlowInstance,
                                                                               seed: int) -> None:
    bus = MessageBus(instance, seed=seed, check_every_tick=True)
    result = bus.run(max_ticks=2000)
    oracle = solve(instance)
    fair, mine = oracle.holder_flows(), shares(bus)
    assert result.converged and bus.violations == []
    assert len(bus.routing()) == oracle.quality.flow_value
    assert all(abs(mine[h] - fair.get(h, 0)) <= 1 for h in mine), (mine, fair)

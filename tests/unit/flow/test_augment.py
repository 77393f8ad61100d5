"""Augmenting steps (augment.py): a holder that cannot grow has a unit moved, its own or another holder's,
by make-before-break; walks that are malformed or from strangers are ignored."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtfp2p.config import FlowParams
from gwtfp2p.flow.augment import augment_period_ticks
from gwtfp2p.flow.bus import MessageBus
from gwtfp2p.flow.generate import generate
from gwtfp2p.flow.instance import FlowInstance, NodeSpec
from gwtfp2p.flow.messages import Augment
from gwtfp2p.flow.ways import takeover_offer


def shared_relay(params: FlowParams | None = None) -> MessageBus:
    """g reaches x (cheap) and y (dear); h reaches only x; one stage, each relay carries one unit.
    g's unit takes x first, so h can route only if g's unit moves to y."""
    nodes = (NodeSpec("g", 0, supply=1), NodeSpec("h", 0, supply=1), NodeSpec("x", 1, capacity=1),
             NodeSpec("y", 1, capacity=1))
    return MessageBus(FlowInstance(1, nodes, {("g", "x"): 1.0, ("g", "y"): 10.0, ("h", "x"): 1.0}), seed=0,
                      params=params, check_every_tick=True)


def first_routing(bus: MessageBus, ticks: int = 40) -> list:
    for _ in range(ticks):
        bus.step()
        if bus.routing():
            return sorted(bus.routing())
    return []


@pytest.mark.parametrize(("takeovers", "stepper"), [(False, "g"), (True, "y")])
def test_another_holders_unit_moves_so_a_blocked_holder_can_route(takeovers: bool, stepper: str) -> None:
    """g re-routes its unit to y by a step (``takeover_steps`` off), or y takes it over (on, the default);
    either way once: the takeover is not undone by g's cost re-route back to x (reroute.py ``_moved_off``)."""
    bus = shared_relay(FlowParams(takeover_steps=takeovers))
    assert first_routing(bus) == [("g", "x", "g")]
    result = bus.run(max_ticks=600)
    assert sorted(bus.routing()) == [("g", "y", "g"), ("h", "x", "h")]
    steps = {node_id: node.augmenter.steps_started for node_id, node in bus.nodes.items()}
    assert steps == {"g": 0, "h": 0, "x": 0, "y": 0} | {stepper: 1}
    assert result.converged and bus.violations == []


def test_without_steps_the_blocked_holder_stays_blocked() -> None:
    bus = shared_relay(FlowParams(augment=False))
    assert first_routing(bus) == [("g", "x", "g")]
    bus.run(max_ticks=600)
    assert sorted(bus.routing()) == [("g", "x", "g")]
    assert bus.nodes["h"].residual.augmentable()  # it could: the labels see the step no one takes


def first_walk(bus: MessageBus, holder: str, ticks: int = 600) -> tuple[int, int]:
    """(the tick ``holder`` first walked, the tick since which its walk label then had its value)."""
    node = bus.nodes[holder]
    for _ in range(ticks):
        bus.step()
        if node.augmenter.next_walk:
            return node.augmenter.next_walk - augment_period_ticks(node.core), node.residual._own_label_since
    raise AssertionError(f"{holder} never walked")


@pytest.mark.parametrize("settle", [0, 30])
def test_a_holder_walks_only_once_its_label_has_settled(settle: int) -> None:
    bus = shared_relay(FlowParams(walk_settle_ticks=settle))
    walked, since = first_walk(bus, "h")
    assert walked - since >= settle
    if settle == 0:
        assert walked - since <= 2  # at once (labels are recomputed every residual period)
    bus.run(max_ticks=600)
    assert sorted(bus.routing()) == [("g", "y", "g"), ("h", "x", "h")] and bus.violations == []


@pytest.mark.parametrize("settle", [0, 30])
def test_a_holder_flags_itself_only_once_its_label_has_settled(settle: int) -> None:
    """h's flag goes up at once by default; held for 30 ticks it never does here: h's walk (not held) has
    its step taken sooner, and h routes."""
    bus = shared_relay(FlowParams(flag_settle_ticks=settle))
    residual = bus.nodes["h"].residual
    flagged = []
    for _ in range(600):
        bus.step()
        if "h" in residual.blocked and residual._seen["h"][1] == bus.now:  # raised by h on this tick
            flagged.append(bus.now - residual._own_label_since)
    assert all(age >= settle for age in flagged)
    assert (flagged and flagged[0] <= 2) if settle == 0 else not flagged
    assert sorted(bus.routing()) == [("g", "y", "g"), ("h", "x", "h")] and bus.violations == []


def three_holders(params: FlowParams) -> MessageBus:
    """One stage of three one-unit relays. g's unit takes x (g's dear y is k's), k's takes y (k's dear z is
    free), h reaches only x: h routes only if k's unit moves to z and then g's to y, a chain of two."""
    nodes = (NodeSpec("g", 0, supply=1), NodeSpec("h", 0, supply=1), NodeSpec("k", 0, supply=1),
             NodeSpec("x", 1, capacity=1), NodeSpec("y", 1, capacity=1), NodeSpec("z", 1, capacity=1))
    costs = {("g", "x"): 1.0, ("g", "y"): 10.0, ("h", "x"): 1.0, ("k", "y"): 1.0, ("k", "z"): 10.0}
    return MessageBus(FlowInstance(1, nodes, costs), seed=0, params=params, check_every_tick=True)


def test_a_takeover_a_walk_asked_for_is_not_taken_back_by_a_cost_reroute() -> None:
    """Takeovers on (the default): z takes k's unit over from y for h's walk; k's cost re-route would move it
    straight back to y (edge cost 1 against 10) before the slot is used, every walk, for ever (reroute.py
    ``_moved_off``). With the guard g's unit then moves to y and h routes."""
    bus = three_holders(FlowParams())
    result = bus.run(max_ticks=800)
    assert sorted(bus.routing()) == [("g", "y", "g"), ("h", "x", "h"), ("k", "z", "k")]
    assert result.converged and bus.violations == []


def test_a_chain_of_displacements_frees_a_slot_that_one_level_cannot() -> None:
    """deep_cross: g may be asked to move its unit when g itself can only by displacing k's; without it h
    stays blocked and its walk labels see no step (no takeovers here: z could take k's unit over)."""
    before, after = [("g", "x", "g"), ("k", "y", "k")], [("g", "y", "g"), ("h", "x", "h"), ("k", "z", "k")]
    for deep in (False, True):
        bus = three_holders(FlowParams(deep_cross=deep, takeover_steps=False))
        for _ in range(200):
            bus.step()
            if len(bus.routing()) == len(before):
                break
        assert sorted(bus.routing()) == before
        result = bus.run(max_ticks=800)
        assert sorted(bus.routing()) == (after if deep else before)
        assert result.converged and bus.violations == []
        assert not bus.nodes["h"].residual.augmentable()  # routed (deep), or no step seen at all


def bypass(params: FlowParams) -> MessageBus:
    """Two stages. g's unit runs g -> x -> z -> g; h reaches x, then only w. y (idle, dear) links g and z:
    it can take g's unit over and free x for h. g cannot re-route that unit to its sink (z is its only
    second-stage relay, and full), so no displacement label sees this step, only a takeover."""
    nodes = (NodeSpec("g", 0, supply=1), NodeSpec("h", 0, supply=1), NodeSpec("x", 1, capacity=1),
             NodeSpec("y", 1, capacity=1), NodeSpec("z", 2, capacity=1), NodeSpec("w", 2, capacity=1))
    costs = {("g", "x"): 1.0, ("g", "y"): 10.0, ("x", "z"): 1.0, ("y", "z"): 10.0, ("g", "z"): 1.0,
             ("h", "x"): 1.0, ("w", "x"): 1.0, ("h", "w"): 1.0}
    return MessageBus(FlowInstance(2, nodes, costs), seed=0, params=params, check_every_tick=True)


def test_a_takeover_step_frees_a_slot_no_displacement_sees() -> None:
    """takeover_steps: y takes g's unit over, x is freed for h; without them h stays blocked."""
    before, after = [("g", "x", "z", "g")], [("g", "y", "z", "g"), ("h", "x", "w", "h")]
    for take in (False, True):
        bus = bypass(FlowParams(takeover_steps=take))
        for _ in range(200):
            bus.step()
            if bus.routing():
                break
        assert sorted(bus.routing()) == before
        result = bus.run(max_ticks=800)
        assert sorted(bus.routing()) == (after if take else before)
        assert result.converged and bus.violations == []
        assert not bus.nodes["h"].residual.augmentable()  # routed, or no step seen at all


def test_a_takeover_needs_a_fresh_table_with_spare_and_both_links() -> None:
    bus = bypass(FlowParams(augment=False, takeover_steps=True))  # the routing stays g -> x -> z -> g
    bus.run(max_ticks=300)
    x = bus.nodes["x"].core
    y = x.neighbours["y"]
    unit, peer = takeover_offer(x)
    assert (unit.sink, peer.node_id) == ("g", "y")
    fresh = y.table
    y.table = replace(fresh, costs=tuple(c for c in fresh.costs if c[0] != "z"))  # y lost its link to z
    assert takeover_offer(x) is None
    y.table = replace(fresh, spare=0)
    assert takeover_offer(x) is None
    y.table, y.table_tick = fresh, x.now - 7 * x.params.table_period_ticks  # too old to rely on
    assert takeover_offer(x) is None


@pytest.mark.parametrize("walk", [
    Augment("y", "h", 3, ""),  # a same-stage peer is neither the previous nor the next stage
    Augment("h", "h", 0, ""),  # no budget left
    Augment("h", "h", 10**6, ""),  # a budget beyond the hop limit
    Augment("stranger", "h", 3, ""),
    Augment("g", "g", 3, "g#404"),  # asks to move a unit this node does not hold
])
def test_walks_that_are_malformed_or_from_strangers_are_ignored(walk: Augment) -> None:
    bus = shared_relay()
    first_routing(bus)
    x = bus.nodes["x"]
    before = (dict(x.core.ins), dict(x.core.outs))
    assert x.on_message(walk, now=bus.now) == []
    assert (dict(x.core.ins), dict(x.core.outs)) == before


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000))
def test_on_tight_swarms_steps_settle_with_no_surplus_left_at_relays(seed: int) -> None:
    """After convergence every relay's in-unit is on a complete chain (surplus stays at its holder),
    no holder is still waiting for a step it could take, and the invariants held at every tick."""
    bus = MessageBus(generate("tight", seed), seed=seed, check_every_tick=True)
    result = bus.run(max_ticks=2000)
    held = sum(len(node.core.ins) for node in bus.nodes.values() if node.stage > 0)
    assert result.converged and bus.violations == []
    assert held == len(bus.routing()) * bus.n_stages
    assert not any(node.residual.augmentable() for node in bus.nodes.values())

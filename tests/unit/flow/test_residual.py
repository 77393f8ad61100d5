"""Residual distances (residual.py): the distributed labels equal shortest paths in each holder's residual
graph, computed here independently (a 0-1 BFS over split nodes), and a blocked holder that could gain a unit
by moving its own units sees it."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtfp2p.config import ConfigError, FlowParams
from gwtfp2p.flow.bus import MessageBus
from gwtfp2p.flow.generate import generate
from gwtfp2p.flow.instance import FlowInstance, NodeSpec
from gwtfp2p.flow.messages import Residual
from gwtfp2p.flow.residual import ResidualDistances, flag_ttl_ticks, keep_newest
from gwtfp2p.flow.ways import KINDS, best, hop_limit


def residual_graph(bus: MessageBus, sink: str) -> dict[tuple[str, str], list[tuple[tuple[str, str], int]]]:
    """Reversed edges (to -> [(from, weight)]) of ``sink``'s residual graph over split nodes."""
    rev: dict[tuple[str, str], list[tuple[tuple[str, str], int]]] = {}

    def edge(a: tuple[str, str], b: tuple[str, str], w: int) -> None:
        rev.setdefault(b, []).append((a, w))

    for node_id, node in bus.nodes.items():
        core = node.core
        if core.is_data_holder:
            continue
        if core.spare() > 0:
            edge((node_id, "in"), (node_id, "out"), 0)
        if any(u.sink == sink for u in core.ins.values()):
            edge((node_id, "out"), (node_id, "in"), 0)
        for unit in core.ins.values():
            if unit.sink == sink and unit.prev in core.neighbours:
                edge((node_id, "in"), (unit.prev, "out"), 1)
        for other in core.next_neighbours():
            if other.stage != 0:
                edge((node_id, "out"), (other.node_id, "in"), 1)
            elif other.node_id == sink:
                edge((node_id, "out"), (sink, "in"), 1)
    holder = bus.nodes[sink].core
    for other in holder.next_neighbours():
        edge((sink, "out"), (other.node_id, "in"), 1)
    return rev


def shortest_to_sink(bus: MessageBus, sink: str) -> dict[tuple[str, str], int]:
    """0-1 BFS from the sink's arrival over the reversed residual graph."""
    rev = residual_graph(bus, sink)
    dist = {(sink, "in"): 0}
    queue = deque([(sink, "in")])
    while queue:
        v = queue.popleft()
        for u, w in rev.get(v, ()):
            if dist[v] + w < dist.get(u, 10**9):
                dist[u] = dist[v] + w
                (queue.appendleft if w == 0 else queue.append)(u)
    return dist


def settle(bus: MessageBus, quiet_ticks: int = 300, max_ticks: int = 4000) -> None:
    """Step until no edge unit has changed for ``quiet_ticks`` ticks (labels then had time to settle)."""
    last, since = None, 0
    while since < quiet_ticks and bus.now < max_ticks:
        bus.step()
        units = frozenset((n, e, u.prev, u.sink) for n, node in bus.nodes.items() for e, u in node.core.ins.items())
        since = since + 1 if units == last else 0
        last = units


def assert_labels_are_shortest_paths(bus: MessageBus) -> None:
    limit = hop_limit(bus.n_stages)
    for sink in (n for n, node in bus.nodes.items() if node.stage == 0):
        dist = shortest_to_sink(bus, sink)
        for node_id, node in bus.nodes.items():
            want_in = dist.get((node_id, "in"))
            want_out = dist.get((node_id, "out"))
            if node.stage == 0 and node_id != sink:
                continue
            got_in, got_out = node.residual.ins.get(sink), node.residual.outs.get(sink)
            assert got_out == (want_out if want_out is not None and want_out <= limit else None), (node_id, sink)
            if node.stage != 0:
                assert got_in == (want_in if want_in is not None and want_in <= limit else None), (node_id, sink)


def blocked_square() -> FlowInstance:
    """One holder, two stages; a1 -> b1 is the only first unit routed and a2 can only reach b1:
    the second unit needs a1's unit moved to b2 (one backward edge)."""
    nodes = (NodeSpec("h", 0, supply=2), NodeSpec("a1", 1, capacity=1), NodeSpec("a2", 1, capacity=1),
             NodeSpec("b1", 2, capacity=1), NodeSpec("b2", 2, capacity=1))
    costs = {("a1", "h"): 1.0, ("a2", "h"): 5.0, ("a1", "b1"): 1.0, ("a1", "b2"): 5.0, ("a2", "b1"): 1.0,
             ("b1", "h"): 1.0, ("b2", "h"): 1.0}
    return FlowInstance(2, nodes, costs)


def test_a_blocked_holder_sees_its_augmenting_path() -> None:
    bus = MessageBus(blocked_square(), seed=0, params=FlowParams(augment=False))
    bus.run(max_ticks=400)
    settle(bus)
    assert bus.routing() == [("h", "a1", "b1", "h")]
    holder = bus.nodes["h"].residual
    assert holder.augmentable()
    assert holder.outs["h"] == 5  # h -> a2 -> b1, back to a1, a1 -> b2 -> h
    assert bus.nodes["b1"].residual.ins["h"] == 3 and bus.nodes["a1"].residual.outs["h"] == 2
    assert_labels_are_shortest_paths(bus)


@pytest.mark.parametrize(("takeovers", "stepper"), [(False, "a1"), (True, "b2")])
def test_the_blocked_holder_routes_its_second_unit_by_an_augmenting_step(takeovers: bool, stepper: str) -> None:
    """a1 moves its unit to b2 (``takeover_steps`` off), or b2 takes a1's unit over from b1 (on)."""
    bus = MessageBus(blocked_square(), seed=0, check_every_tick=True, params=FlowParams(takeover_steps=takeovers))
    result = bus.run(max_ticks=600)
    assert sorted(bus.routing()) == [("h", "a1", "b2", "h"), ("h", "a2", "b1", "h")]
    steps = {node_id: n.augmenter.steps_started for node_id, n in bus.nodes.items() if n.augmenter.steps_started}
    assert steps == {stepper: 1} and result.converged and bus.violations == []
    assert not bus.nodes["h"].residual.augmentable()


def test_a_holder_at_its_maximum_sees_no_path() -> None:
    nodes = (NodeSpec("h", 0, supply=3), NodeSpec("a", 1, capacity=1), NodeSpec("b", 2, capacity=1))
    bus = MessageBus(FlowInstance(2, nodes, {("a", "h"): 1.0, ("a", "b"): 1.0, ("b", "h"): 1.0}), seed=0)
    bus.run(max_ticks=400)
    settle(bus)
    assert len(bus.routing()) == 1 and bus.nodes["h"].core.demand() == 2
    assert not bus.nodes["h"].residual.augmentable()
    assert_labels_are_shortest_paths(bus)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), loop_free=st.booleans())
def test_labels_equal_shortest_residual_paths_on_tight_swarms(seed: int, loop_free: bool) -> None:
    bus = MessageBus(generate("tight", seed), seed=seed, params=FlowParams(loop_free_labels=loop_free))
    bus.run(max_ticks=1000)
    settle(bus)
    assert_labels_are_shortest_paths(bus)


@pytest.mark.parametrize("ins, outs", [((("h", -1),), ()), ((), (("h", 10**6),))])
def test_out_of_range_labels_are_refused(ins, outs) -> None:
    bus = MessageBus(blocked_square(), seed=0)
    node = bus.nodes["a1"]
    node.on_message(Residual("b1", (("h", 1),), ()), now=1)
    node.on_message(Residual("b1", ins, outs), now=2)
    assert node.core.neighbours["b1"].res_in == {"h": 1}


@pytest.mark.parametrize("paths", [(("sideways", "h", ()),), (("in", "h", ("<x",) * 1000),)])
def test_labels_with_malformed_paths_are_refused(paths) -> None:
    bus = MessageBus(blocked_square(), seed=0)
    node = bus.nodes["a1"]
    node.on_message(Residual("b1", (("h", 1),), ()), now=1)
    node.on_message(Residual("b1", (("h", 2),), (), paths=paths), now=2)
    assert node.core.neighbours["b1"].res_in == {"h": 1}


def fan_in(relays: int) -> FlowInstance:
    """``relays`` one-unit relays a0.. feed b1 (full with their units); a9 reaches only b1, and b2 only from
    the a relays: h's one augmenting path is h -> a9 -> b1, back to an a relay, -> b2 -> h."""
    nodes = [NodeSpec("h", 0, supply=relays + 1), NodeSpec("a9", 1, capacity=1), NodeSpec("b1", 2, capacity=relays),
             NodeSpec("b2", 2, capacity=1)]
    costs = {("a9", "h"): 5.0, ("a9", "b1"): 1.0, ("b1", "h"): 1.0, ("b2", "h"): 1.0}
    for i in range(relays):
        nodes.append(NodeSpec(f"a{i}", 1, capacity=1))
        costs.update({(f"a{i}", "h"): 1.0, (f"a{i}", "b1"): 1.0, (f"a{i}", "b2"): 5.0})
    return FlowInstance(2, tuple(nodes), costs)


def test_a_vanished_path_is_forgotten_without_counting_up() -> None:
    """When the only augmenting path goes (b2 leaves), loop-free labels go at once: the ways between h and
    the full a relays loop back through h and are not taken. The default labels count up along those loops,
    5 -> 9 -> 11, until the hop limit (12 here), the holder's flag up meanwhile. (No takeovers: an offer of
    one would shorten the walk labels at the full relays.)"""
    highest = {}
    for loop_free in (False, True):
        bus = MessageBus(fan_in(4), seed=0, params=FlowParams(augment=False, loop_free_labels=loop_free,
                                                              takeover_steps=False))
        bus.run(max_ticks=400)
        settle(bus)
        holder = bus.nodes["h"].residual
        assert holder.outs == {"h": 5} and holder.xouts == {"h": 5}
        bus.remove_node("b2")
        seen = []
        for _ in range(100):
            bus.step()
            seen += [holder.outs.get("h"), holder.xouts.get("h")]
        assert "h" not in holder.outs and "h" not in holder.xouts
        highest[loop_free] = max(hops for hops in seen if hops is not None)
    assert highest == {False: 11, True: 5}


def test_a_neighbour_is_offered_no_way_through_its_own_vertex_inside_a_displacement() -> None:
    """Loop-free labels: our shortest way to holder g that passes the neighbour b's vertex only inside a
    chained displacement (tagged ``g|>b``) is not offered to b; b gets our next-best way instead (the quick
    check once tested the untagged vertex only, so b got the common labels and refused them on receipt)."""
    through_b = ("<me", "g|>b", ">x")
    around_b = ("<me", ">y", ">z")
    ways = {kind: {} for kind in KINDS}
    ways["in"] = {"g": {"x": (2, through_b), "y": (3, around_b)}}
    bests = {kind: best(ways[kind]) for kind in KINDS}
    assert bests["in"] == {"g": (2, through_b)}
    assert ResidualDistances._offered(ways, bests, "b")["in"] == {"g": (3, around_b)}
    assert ResidualDistances._offered(ways, bests, "c") is bests


def test_an_ended_notice_is_not_brought_back_by_a_neighbour_passing_on_its_stamp() -> None:
    seen: dict = {}
    assert keep_newest(seen, [("h", (10, 1))], now=0, ttl=8, forget_ticks=50) == {"h": (10, 1)}
    assert keep_newest(seen, [("h", (10, 2))], now=8, ttl=8, forget_ticks=50) == {"h": (10, 1)}
    assert keep_newest(seen, [("h", (10, 2))], now=9, ttl=8, forget_ticks=50) == {}  # ended: the stamp stopped
    assert keep_newest(seen, [("h", (10, 3))], now=30, ttl=8, forget_ticks=50) == {}  # a stale copy stays out
    assert keep_newest(seen, [("h", (11, 3))], now=31, ttl=8, forget_ticks=50) == {"h": (11, 3)}  # a newer one
    keep_newest(seen, [], now=31 + 8 + 51, ttl=8, forget_ticks=50)
    assert seen == {}  # forgotten: a holder that restarted its ticks is heard again


def test_blocked_flags_end_soon_after_their_holder_stops_raising_them() -> None:
    """On a two-holder swarm the holders flag themselves while they trade units for fairness; once a
    holder stops, its flag must be gone everywhere soon: within its TTL plus the few ticks a notice takes to
    reach every node (12 ticks at most here; stale copies bouncing between relays once kept flags 81 ticks
    after their holder's last, holding every cost move)."""
    bus = MessageBus(generate("b", 0), seed=0)
    bound = 3 * flag_ttl_ticks(next(iter(bus.nodes.values())).core)
    holders = [k for k, n in bus.nodes.items() if n.core.is_data_holder]
    last_raised: dict[str, int] = {}
    lingered = []
    for _ in range(400):
        bus.step()
        for h in holders:
            own = bus.nodes[h].residual._seen.get(h)
            if own is not None and own[0][0] == bus.now:
                last_raised[h] = bus.now
        lingered += [(bus.now, node_id, h) for node_id, n in bus.nodes.items() for h in n.residual.blocked
                     if bus.now - last_raised[h] > bound]
    assert last_raised and lingered == []


@pytest.mark.parametrize("period", [0, -2, 1.5])
def test_residual_period_is_a_positive_whole_number_of_ticks(period) -> None:
    with pytest.raises(ConfigError, match="--flow-residual-period-ticks"):
        FlowParams(residual_period_ticks=period)

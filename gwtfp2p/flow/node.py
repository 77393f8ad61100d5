"""FlowNode: one node's side of the decentralized flow protocol, as a sans-IO state machine.

Inputs are neighbour events (added, lost, cost changed), received messages and ticks carrying
the current time; randomness comes from an injected ``random.Random``. Outputs are the messages
to send (returned by every call) and the routing table the data plane reads. The daemon carries
the messages over RPC, the bus and the simulator over simulated networks: the same code.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import NamedTuple

from gwtfp2p.config import FlowParams
from gwtfp2p.flow.annealing import Annealer
from gwtfp2p.flow.augment import Augmenter
from gwtfp2p.flow.core import Neighbour, NodeCore
from gwtfp2p.flow.fairness import FairShare
from gwtfp2p.flow.growth import Adverts, Growth, PendingRequest
from gwtfp2p.flow.load import NodeResources
from gwtfp2p.flow.messages import (
    Accept,
    Advert,
    Augment,
    Cancel,
    Envelope,
    FlowTable,
    Message,
    MoveAnswer,
    Moved,
    ProposeExchange,
    ProposeSwap,
    ProposeTakeover,
    PushBack,
    Refresh,
    Reject,
    Request,
    Residual,
    SwapCommit,
)
from gwtfp2p.flow.moves import MoveExecutor, PendingMove
from gwtfp2p.flow.reroute import Rerouter
from gwtfp2p.flow.residual import ResidualDistances
from gwtfp2p.flow.softstate import SoftState
from gwtfp2p.ids import short_peer_id


@dataclass(frozen=True)
class Route:
    """One routed unit as the data plane sees it at this node."""

    sink: str
    in_edge: str | None  # None for a data holder's own units
    prev: str | None
    out_edge: str | None  # None at the sink
    next: str | None
    complete: bool
    path_cost: float


class Hop(NamedTuple):
    """One of this node's out-units as the data plane sees it: where a unit goes next."""

    edge_id: str
    next: str
    sink: str
    confirmed: bool
    complete: bool
    down_cost: float


class FlowNode:
    """The decentralized flow protocol for one data holder (stage 0) or relay (stage 1..S).

    ``capacity`` is what fits in a relay's memory, ``supply`` the units a holder wants per
    iteration; ``resources`` (GPU and uplink seconds per unit) bound both further when
    ``params.iteration_budget_s`` is set, and price the wait on the node's shared uplink.
    """

    def __init__(self, node_id: str, stage: int, n_stages: int, *, capacity: int = 0, supply: int = 0,
                 params: FlowParams | None = None, rng: random.Random | None = None,
                 resources: NodeResources | None = None) -> None:
        if not 0 <= stage <= n_stages:
            raise ValueError(f"stage {stage} outside 0..{n_stages}")
        self.core = NodeCore(node_id, stage, n_stages, capacity=capacity, supply=supply,
                             params=params or FlowParams(), rng=rng or random.Random(node_id),
                             resources=resources)
        self.adverts = Adverts(self.core)
        self.growth = Growth(self.core)
        self.moves = MoveExecutor(self.core)
        self.annealer = Annealer(self.core, self.growth, self.moves)
        self.softstate = SoftState(self.core)
        self.rerouter = Rerouter(self.core, self.growth, self.moves)
        self.residual = ResidualDistances(self.core)
        self.augmenter = Augmenter(self.core, self.growth, self.rerouter, self.residual, self.annealer)
        self.fairness = FairShare(self.core, self.residual)
        self._handlers = {
            Advert: self.adverts.on_advert, Request: self.growth.on_request, Accept: self.growth.on_accept,
            Reject: self.growth.on_reject, Refresh: self.softstate.on_refresh, Cancel: self.softstate.on_cancel,
            PushBack: self.softstate.on_push_back, Moved: self.softstate.on_moved, FlowTable: self.annealer.on_table,
            ProposeTakeover: self.moves.on_takeover, ProposeSwap: self.moves.on_swap,
            ProposeExchange: self.moves.on_exchange,
            MoveAnswer: self.moves.on_answer, SwapCommit: self.moves.on_commit,
            Residual: self.residual.on_residual, Augment: self.augmenter.on_augment,
        }

    # -- identity ----------------------------------------------------------------------------
    @property
    def node_id(self) -> str:
        return self.core.node_id

    @property
    def stage(self) -> int:
        return self.core.stage

    @property
    def routing_version(self) -> int:
        return self.core.routing_version

    @property
    def messages_sent(self) -> int:
        return self.core.messages_sent

    def has_neighbour(self, node_id: str) -> bool:
        return node_id in self.core.neighbours

    # -- neighbourhood events -------------------------------------------------------------------
    def add_neighbour(self, node_id: str, stage: int, cost: float | None = None,
                      now: int | None = None) -> list[Envelope]:
        """A node of the previous, same or next stage became known (cost: our edge to it)."""
        c = self._at(now)
        if node_id == c.node_id:
            return []
        known = c.neighbours.get(node_id)
        if known is None:
            c.neighbours[node_id] = Neighbour(node_id, stage, cost)
            c.neighbours_changed()
            self._reheat()
        elif cost is not None and cost != known.cost:
            self.set_edge_cost(node_id, cost)
        return c.take_outbox()

    def set_edge_cost(self, node_id: str, cost: float, now: int | None = None) -> list[Envelope]:
        """Our measured edge cost to a neighbour changed: re-cost the units on that edge."""
        c = self._at(now)
        neighbour = c.neighbours.get(node_id)
        if neighbour is None or neighbour.cost == cost:
            return c.take_outbox()
        delta = cost - (neighbour.cost or 0.0)
        neighbour.cost = cost
        c.neighbours_changed()
        for unit in c.ins.values():
            if unit.prev == node_id:
                unit.up_cost += delta
                if unit.out_id:
                    c.mark_forward(unit.out_id)
        for out in c.outs.values():
            if out.next == node_id:
                out.down_cost += delta
                if out.in_id:
                    c.mark_backward(out.in_id)
        self._reheat()
        return c.take_outbox()

    def lose_neighbour(self, node_id: str, now: int | None = None) -> list[Envelope]:
        """A neighbour is gone (failed RPC, expired record): break every unit through it at once."""
        c = self._at(now)
        if c.neighbours.pop(node_id, None) is None:
            return c.take_outbox()
        c.neighbours_changed()
        for in_id in sorted(i for i, u in c.ins.items() if u.prev == node_id):
            c.drop_in(in_id, push_back=False)
        for out_id in sorted(o for o, u in c.outs.items() if u.next == node_id):
            c.drop_out(out_id, cancel=False)
        for edge_id in [e for e, t in c.tombstones.items() if t.holder == node_id]:
            del c.tombstones[edge_id]
        pending = c.pending
        if isinstance(pending, PendingMove) and pending.to == node_id:
            self.moves.end_pending(pending, rejected=False)
        elif isinstance(pending, PendingRequest) and pending.to == node_id:
            c.pending = None
        self._reheat()
        return c.take_outbox()

    def set_capacity(self, capacity: int, now: int | None = None) -> list[Envelope]:
        """Memory capacity changed; if the load is above it, the costliest units are pushed back."""
        c = self._at(now)
        c.set_bounds(capacity, c.wanted)
        self._shed()
        return c.take_outbox()

    def set_resources(self, resources: NodeResources, now: int | None = None) -> list[Envelope]:
        """GPU or uplink time per unit changed (re-measured): capacity and uplink cost follow."""
        c = self._at(now)
        c.set_resources(resources)
        self._shed()
        return c.take_outbox()

    def _shed(self) -> None:
        """Drop the costliest units above the (new) capacity or supply."""
        c = self.core
        while not c.is_data_holder and len(c.ins) > c.capacity:
            worst = max(c.ins.values(), key=lambda u: (u.up_cost + c.remaining_of(u)[0], u.edge_id))
            c.drop_in(worst.edge_id, push_back=True)
        while c.is_data_holder and len(c.outs) > c.supply:
            worst = max(c.outs.values(), key=lambda o: (o.down_cost, o.edge_id))
            c.drop_out(worst.edge_id, cancel=True)
        self._reheat()

    def _reheat(self) -> None:
        c = self.core
        base = c.params.temperature_relay
        c.temperature = min(base, c.temperature * c.params.reheat_factor)
        self.annealer.forget()

    def _at(self, now: int | None) -> NodeCore:
        if now is not None:
            self.core.now = now
        return self.core

    # -- driving ---------------------------------------------------------------------------------
    def on_message(self, message: Message, now: int) -> list[Envelope]:
        """Handle one received message; unknown senders' protocol messages are ignored."""
        c = self._at(now)
        handler = self._handlers.get(type(message))
        if handler is not None and getattr(message, "sender", None) in c.neighbours:
            handler(message)
        return c.take_outbox()

    def on_tick(self, now: int) -> list[Envelope]:
        """Periodic work: adverts, soft state, move timeouts, growth, improvement."""
        c = self._at(now)
        self.adverts.tick()
        self.residual.tick()
        self.fairness.tick()
        self.softstate.tick()
        self.moves.tick()
        self.rerouter.tick()
        self.growth.tick()
        self.augmenter.tick()
        self.annealer.tick()
        return c.take_outbox()

    # -- outputs ---------------------------------------------------------------------------------
    def routing_table(self) -> list[Route]:
        """Per unit: where it comes from and where it goes next (what the data plane reads)."""
        c = self.core
        routes = []
        if c.is_data_holder:
            for out in sorted((o for o in c.outs.values() if not o.building), key=lambda o: o.edge_id):
                routes.append(Route(out.sink, None, None, out.edge_id, out.next, out.complete and out.confirmed,
                                    out.down_cost))
            for unit in sorted(c.ins.values(), key=lambda u: u.edge_id):
                routes.append(Route(unit.sink, unit.edge_id, unit.prev, None, None, True, unit.up_cost))
            return routes
        for unit in sorted(c.ins.values(), key=lambda u: u.edge_id):
            out = c.outs.get(unit.out_id) if unit.out_id else None
            remaining, complete = c.remaining_of(unit)
            routes.append(Route(unit.sink, unit.edge_id, unit.prev, out.edge_id if out else None,
                                out.next if out else None, complete, unit.up_cost + remaining))
        return routes

    def out_hops(self, sink: str | None = None, complete_only: bool = False) -> list[Hop]:
        """Out-units that carry a unit (re-routes under construction excluded), in edge-id order;
        optionally only those towards ``sink`` and only confirmed, complete ones."""
        outs = self.core.outs
        return [Hop(o.edge_id, o.next, o.sink, o.confirmed, o.complete, o.down_cost)
                for o in (outs[k] for k in sorted(outs))
                if not o.building and (sink is None or o.sink == sink)
                and (not complete_only or (o.confirmed and o.complete))]

    def next_hop(self, in_edge: str) -> Hop | None:
        """Where the unit that arrived on ``in_edge`` goes next (None: unknown or not routed yet)."""
        unit = self.core.ins.get(in_edge)
        out = self.core.outs.get(unit.out_id) if unit is not None and unit.out_id else None
        if out is None:
            return None
        return Hop(out.edge_id, out.next, out.sink, out.confirmed, out.complete, out.down_cost)

    def routed_units(self) -> int:
        """Units this data holder believes complete (its own view; the bus checks globally)."""
        c = self.core
        if not c.is_data_holder:
            return 0
        return len(c.routed_outs())

    def unit_states(self) -> list[str]:
        """This node's units, one short line each (what a log shows of its flow): ``in EDGE from PREV eEPOCH ->
        OUT``, ``out EDGE to NEXT eEPOCH FLAGS`` (C confirmed, K complete, B building a re-route, its in-unit
        after ``for``) and ``moved EDGE to HOLDER eEPOCH`` (a tombstone); peers as ``short_peer_id`` shows them."""
        c = self.core
        lines = [f"in {_edge_or_peer(u.edge_id)} from {_edge_or_peer(u.prev)} e{u.epoch} -> {_edge_or_peer(u.out_id)}"
                 for u in sorted(c.ins.values(), key=lambda u: u.edge_id)]
        for o in sorted(c.outs.values(), key=lambda o: o.edge_id):
            flags = "".join(f for f, on in (("C", o.confirmed), ("K", o.complete), ("B", o.building)) if on)
            lines.append(f"out {_edge_or_peer(o.edge_id)} to {_edge_or_peer(o.next)} e{o.epoch} {flags or '-'}"
                         + (f" for {_edge_or_peer(o.shadow_of)}" if o.shadow_of else ""))
        lines += [f"moved {_edge_or_peer(e)} to {_edge_or_peer(t.holder)} e{t.epoch}"
                  for e, t in sorted(c.tombstones.items())]
        return lines


def _edge_or_peer(name: str | None) -> str:
    """A peer as ``short_peer_id`` shows it; an edge id (``PEER#n``) as ``SHORT#n``; None as ``-``."""
    if name is None:
        return "-"
    peer, sep, n = name.partition("#")
    return f"{short_peer_id(peer)}{sep}{n}"

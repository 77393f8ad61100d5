"""The state one FlowNode holds, and the unit operations every protocol part shares.

A node knows itself, its neighbours (what they told it) and its edge units: in-units (edges
prev → me) and out-units (edges me → next), matched one to one at a relay. Dropping a unit
cascades the right notice (Cancel downstream, re-growth upstream). No global view lives here.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass, field

from gwtfp2p.config import FlowParams
from gwtfp2p.flow.load import NodeResources, marginal_cost_s
from gwtfp2p.flow.messages import (
    Advert,
    BackwardEntry,
    Cancel,
    Envelope,
    FlowTable,
    ForwardEntry,
    Message,
    PushBack,
    Refresh,
)

INF = math.inf
TABLE_HORIZON_PERIODS = 6  # a peer's flow table older than this many table periods is not relied on


@dataclass
class Neighbour:
    """What a node knows of one neighbour: its stage, the edge cost, its advert and flow table."""

    node_id: str
    stage: int
    cost: float | None = None
    advert: dict[str, float] = field(default_factory=dict)
    spare: int = 0
    table: FlowTable | None = None
    table_tick: int = -1
    backoff_until: int = -1
    res_in: dict[str, int] = field(default_factory=dict)  # its residual distances (residual.py)
    res_out: dict[str, int] = field(default_factory=dict)
    res_blocked: tuple[tuple[str, int, int], ...] = ()  # (holder, its tick, hops) of blocked holders
    res_xin: dict[str, int] = field(default_factory=dict)
    res_xout: dict[str, int] = field(default_factory=dict)
    res_wants: tuple[tuple[str, int, int, int], ...] = ()  # (holder, its tick, hops, units routed) wanting more
    res_paths: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)  # (kind, sink) -> its way


@dataclass
class InUnit:
    """A unit on the edge prev → me; ``up_cost`` is the cost from its source to me."""

    edge_id: str
    prev: str
    sink: str
    up_cost: float
    epoch: int
    refreshed: int
    unmatched_since: int
    out_id: str | None = None
    awaiting: str | None = None  # proposal id of a swap whose commit is on its way
    awaiting_until: int = -1
    probed: int = -1  # tick at which a late refresh was asked for (``SoftState._expire``)


@dataclass
class OutUnit:
    """A unit on the edge me → next; ``down_cost`` is the cost from me to its sink via next."""

    edge_id: str
    next: str
    sink: str
    epoch: int
    refreshed: int
    in_id: str | None
    confirmed: bool = False
    complete: bool = False
    down_cost: float = INF
    building: bool = False  # a re-route under construction: not carrying its unit yet
    shadow_of: str | None = None  # the in-unit such a re-route is being built for (relays)
    probed: int = -1  # tick at which a late refresh was asked for (``SoftState._expire``)


@dataclass
class Pacing:
    """When a periodic notice goes out: at most once per ``period`` ticks, and after ``keepalive``
    periods even if it did not change (adverts, residual labels)."""

    period: int
    keepalive: int = 4
    last_tick: int = -(10**9)

    def due(self, now: int) -> bool:
        return now - self.last_tick >= self.period

    def stale(self, now: int) -> bool:
        return now - self.last_tick >= self.keepalive * self.period


@dataclass
class Tombstone:
    """A forwarding address for a unit this node handed to a peer."""

    holder: str
    epoch: int
    expires: int


class NodeCore:
    """Identity, neighbours, units and the outbox of one flow node."""

    def __init__(self, node_id: str, stage: int, n_stages: int, *, capacity: int, supply: int,
                 params: FlowParams, rng: random.Random, resources: NodeResources | None = None) -> None:
        self.node_id = node_id
        self.stage = stage
        self.n_stages = n_stages
        self.params = params
        self.resources = resources or NodeResources()
        self.memory_capacity = capacity  # units that fit in memory (a holder: units it wants)
        self.wanted = supply
        self.capacity = self.resources.capacity(capacity, params.iteration_budget_s)
        self.supply = self.resources.capacity(supply, params.iteration_budget_s)
        self.rng = rng
        self.now = 0
        self.neighbours: dict[str, Neighbour] = {}
        self.ins: dict[str, InUnit] = {}
        self.outs: dict[str, OutUnit] = {}
        self.tombstones: dict[str, Tombstone] = {}
        self.moved_off: dict[str, tuple[str, int]] = {}  # out-unit id -> (next hop a peer's move took it off, tick)
        self.outbox: list[Envelope] = []
        self.reserved = 0
        self.pending = None  # the one outstanding proposal (growth request or move)
        self.temperature = params.temperature_relay
        self.routing_version = 0
        self.flow_first = False  # a holder nearby waits for an augmenting step: no capacity-filling cost moves
        self.held_back = False  # a data holder leaves capacity to a poorer holder: no growth (fairness.py)
        self.messages_sent = 0
        self._edge_counter = 0
        self._dirty_forward: set[str] = set()
        self._dirty_backward: set[str] = set()
        self.phase = rng.randrange(1_000_000)
        self._roles: tuple[list[Neighbour], list[Neighbour], list[Neighbour]] | None = None

    # -- identity and neighbourhood -------------------------------------------------------
    @property
    def is_data_holder(self) -> bool:
        return self.stage == 0

    @property
    def next_stage(self) -> int:
        return 0 if self.stage == self.n_stages else self.stage + 1

    @property
    def prev_stage(self) -> int:
        return self.n_stages if self.stage == 0 else self.stage - 1

    def next_neighbours(self) -> list[Neighbour]:
        return self._by_role()[0]

    def prev_neighbours(self) -> list[Neighbour]:
        return self._by_role()[1]

    def peers(self) -> list[Neighbour]:
        return self._by_role()[2]

    def fresh_tables(self) -> list[tuple[Neighbour, FlowTable]]:
        """Same-stage peers with their last flow table, where it is recent enough to rely on."""
        horizon = TABLE_HORIZON_PERIODS * self.params.table_period_ticks
        return [(p, p.table) for p in self.peers() if p.table is not None and self.now - p.table_tick <= horizon]

    def neighbours_changed(self) -> None:
        """Call after adding or removing a neighbour or changing an edge cost."""
        self._roles = None

    def _by_role(self) -> tuple[list[Neighbour], list[Neighbour], list[Neighbour]]:
        """(next stage, previous stage, same stage) neighbours sorted by id, cached."""
        if self._roles is None:
            ordered = [self.neighbours[k] for k in sorted(self.neighbours)]
            self._roles = (
                [n for n in ordered if n.stage == self.next_stage and n.cost is not None],
                [n for n in ordered if n.stage == self.prev_stage and n.cost is not None],
                [n for n in ordered if n.stage == self.stage and n.node_id != self.node_id],
            )
        return self._roles

    def cost_to(self, node_id: str) -> float | None:
        neighbour = self.neighbours.get(node_id)
        return None if neighbour is None else neighbour.cost

    def cost_scale(self) -> float:
        """Mean known edge cost: the unit in which gains and temperatures are compared."""
        costs = [n.cost for n in self.neighbours.values() if n.cost is not None]
        return (sum(costs) / len(costs)) if costs else 1.0

    def every(self, period_ticks: int) -> bool:
        """True on this node's own phase of a periodic action."""
        return (self.now + self.phase) % period_ticks == 0

    # -- capacity ------------------------------------------------------------------------
    def set_resources(self, resources: NodeResources) -> None:
        """New per-unit times: the time-bounded capacity and supply are recomputed."""
        self.resources = resources
        self.set_bounds(self.memory_capacity, self.wanted)

    def set_bounds(self, memory_capacity: int, supply: int) -> None:
        budget = self.params.iteration_budget_s
        self.memory_capacity, self.wanted = max(0, memory_capacity), max(0, supply)
        self.capacity = self.resources.capacity(self.memory_capacity, budget)
        self.supply = self.resources.capacity(self.wanted, budget)

    def load(self) -> int:
        """Units this node carries (or has promised to): its uplink's load."""
        return len(self.outs) if self.is_data_holder else len(self.ins) + self.reserved

    def marginal_cost(self) -> float:
        """What one more unit through this node waits on its uplink (0 without an uplink model)."""
        return marginal_cost_s(self.resources.uplink_s_per_unit, self.load())

    def spare(self) -> int:
        if self.is_data_holder:
            return max(1, self.supply)
        return max(0, self.capacity - len(self.ins) - self.reserved)

    def demand(self) -> int:
        """Units a data holder still wants to send."""
        if not self.is_data_holder:
            return 0
        return max(0, self.supply - len(self.outs))

    def routed_outs(self) -> list[OutUnit]:
        """Out-units that carry a routed unit: confirmed, complete, not a re-route under construction."""
        return [o for o in self.outs.values() if o.confirmed and o.complete and not o.building]

    def has_spare_path(self) -> bool:
        """A next-stage neighbour advertises a path to this node (as a sink) through spare capacity."""
        return any(n.spare > 0 and n.advert.get(self.node_id, INF) < INF for n in self.next_neighbours())

    # -- messages ------------------------------------------------------------------------
    def send(self, dst: str, message: Message) -> None:
        self.outbox.append(Envelope(dst, message))
        self.messages_sent += 1

    def take_outbox(self) -> list[Envelope]:
        self.flush_dirty()
        out, self.outbox = self.outbox, []
        return out

    def new_edge_id(self) -> str:
        self._edge_counter += 1
        return f"{self.node_id}#{self._edge_counter}"

    def changed(self) -> None:
        self.routing_version += 1

    # -- remaining costs and eager propagation ---------------------------------------------
    def remaining_of(self, unit: InUnit) -> tuple[float, bool]:
        """(cost from me to the sink, complete?) for an in-unit."""
        if self.is_data_holder:
            return 0.0, unit.sink == self.node_id
        out = self.outs.get(unit.out_id) if unit.out_id else None
        if out is None or not out.confirmed:
            return INF, False
        return out.down_cost, out.complete

    def forward_entry(self, out: OutUnit) -> ForwardEntry:
        cost = self.cost_to(out.next) or 0.0
        source = out.in_id or out.shadow_of
        if source is None:
            up = cost
        else:
            unit = self.ins.get(source)
            up = (unit.up_cost if unit else INF) + cost
        return ForwardEntry(out.edge_id, out.sink, up, out.epoch)

    def backward_entry(self, unit: InUnit) -> BackwardEntry:
        remaining, complete = self.remaining_of(unit)
        return BackwardEntry(unit.edge_id, remaining, complete, unit.epoch)

    def mark_forward(self, out_id: str) -> None:
        self._dirty_forward.add(out_id)

    def mark_backward(self, in_id: str) -> None:
        self._dirty_backward.add(in_id)

    def flush_dirty(self) -> None:
        """Send one Refresh per neighbour for every unit whose costs or completeness changed."""
        if not self._dirty_forward and not self._dirty_backward:
            return
        forward: dict[str, list[ForwardEntry]] = defaultdict(list)
        backward: dict[str, list[BackwardEntry]] = defaultdict(list)
        for out_id in sorted(self._dirty_forward):
            out = self.outs.get(out_id)
            if out is not None and out.confirmed:
                forward[out.next].append(self.forward_entry(out))
        for in_id in sorted(self._dirty_backward):
            unit = self.ins.get(in_id)
            if unit is not None:
                backward[unit.prev].append(self.backward_entry(unit))
        self._dirty_forward.clear()
        self._dirty_backward.clear()
        for dst in sorted(set(forward) | set(backward)):
            self.send(dst, Refresh(self.node_id, tuple(forward[dst]), tuple(backward[dst])))

    # -- unit operations -----------------------------------------------------------------
    def match(self, in_id: str, out_id: str) -> None:
        self.ins[in_id].out_id = out_id
        self.outs[out_id].in_id = in_id
        self.changed()

    def drop_in(self, in_id: str, *, push_back: bool) -> None:
        """Forget an in-unit; cancel its downstream part; optionally tell prev to re-route it."""
        unit = self.ins.pop(in_id, None)
        if unit is None:
            return
        if unit.out_id is not None:
            out = self.outs.pop(unit.out_id, None)
            if out is not None:
                self.send(out.next, Cancel(self.node_id, (out.edge_id,)))
        if push_back:
            self.send(unit.prev, PushBack(self.node_id, (in_id,)))
        self.changed()

    def drop_out(self, out_id: str, *, cancel: bool) -> None:
        """Forget an out-unit; its matched in-unit becomes unrouted demand again."""
        out = self.outs.pop(out_id, None)
        if out is None:
            return
        if cancel:
            self.send(out.next, Cancel(self.node_id, (out_id,)))
        if out.in_id is not None and out.in_id in self.ins:
            unit = self.ins[out.in_id]
            unit.out_id = None
            unit.unmatched_since = self.now
            self.mark_backward(unit.edge_id)
        self.changed()

    def outstanding(self) -> list[InUnit]:
        """In-units of a relay that still need a next hop (not waiting on a swap)."""
        if self.is_data_holder:
            return []
        return [u for u in self.ins.values() if u.out_id is None and u.awaiting is None]

    def advert(self) -> Advert:
        """Cost to each known sink through a next hop with spare capacity (inf when none)."""
        if self.is_data_holder:
            return Advert(self.node_id, ((self.node_id, 0.0),), self.spare())
        sinks = sorted({s for n in self.next_neighbours() for s in n.advert})
        full = self.spare() <= 0
        extra = self.marginal_cost()
        costs = []
        for sink in sinks:
            best = INF
            if not full:
                for n in self.next_neighbours():
                    if n.spare > 0 and n.advert.get(sink, INF) < INF:
                        best = min(best, n.cost + n.advert[sink])
            costs.append((sink, best + extra))
        return Advert(self.node_id, tuple(costs), self.spare())

"""Soft state: periodic refreshes, expiry, cancel / push-back and forwarding after moves.

Every unit is refreshed by its owner in both directions; what is not refreshed within the TTL
is dropped, so reservations never leak when messages are lost. Refreshes also carry costs and
completeness, and an ``epoch`` that orders ownership changes; a node that handed a unit over
answers with the new holder's address (its tombstone) instead of cancelling it.
"""

from __future__ import annotations

from collections.abc import Callable

from gwtfp2p.flow.core import InUnit, NodeCore, OutUnit
from gwtfp2p.flow.messages import Cancel, Moved, MovedEntry, PushBack, Refresh

COST_EPS = 1e-9


class SoftState:
    def __init__(self, core: NodeCore) -> None:
        self.core = core

    def tick(self) -> None:
        c = self.core
        if c.every(c.params.refresh_period_ticks):
            for out in c.outs.values():
                if out.confirmed:
                    c.mark_forward(out.edge_id)
            for in_id in c.ins:
                c.mark_backward(in_id)
        self._expire()

    def _expire(self) -> None:
        """Drop what its neighbour stopped refreshing. A unit late by one TTL is not dropped yet: our own
        refresh of it goes out at once (a neighbour that no longer holds it answers PushBack or Cancel), and
        it is dropped only after a second TTL with no refresh. Under message loss a working unit is not torn
        down for a few lost refreshes; a neighbour that is gone is dropped by ``lose_neighbour``."""
        c = self.core
        self._expire_late(c.ins, lambda _u: True, lambda i: c.drop_in(i, push_back=False), c.mark_backward)
        self._expire_late(c.outs, lambda u: u.confirmed, lambda o: c.drop_out(o, cancel=True), c.mark_forward)
        for unit in c.ins.values():
            if unit.awaiting is not None and c.now >= unit.awaiting_until:
                unit.awaiting, unit.unmatched_since = None, c.now
        for edge_id in [e for e, t in c.tombstones.items() if t.expires <= c.now]:
            del c.tombstones[edge_id]

    def _expire_late(self, table: dict, live: Callable, drop: Callable[[str], None],
                     ask: Callable[[str], None]) -> None:
        """For each ``live`` unit of ``table`` late by a TTL: ``drop`` it when already asked, else ``ask``."""
        c = self.core
        ttl = c.params.soft_state_ttl_ticks
        for key in sorted(k for k, u in table.items() if live(u) and c.now - u.refreshed > ttl):
            unit = table.get(key)  # an earlier drop may have cascaded to it
            if unit is not None and self._due(unit, ttl):
                drop(key)
            elif unit is not None and unit.probed < unit.refreshed:
                unit.probed = c.now
                ask(key)

    def _due(self, unit: InUnit | OutUnit, ttl: int) -> bool:
        """Asked for a refresh (after the one it last had) and a TTL went by since without one."""
        return unit.probed >= unit.refreshed and self.core.now - unit.probed > ttl

    def on_refresh(self, msg: Refresh) -> None:
        c = self.core
        if msg.sender not in c.neighbours:
            return
        moved, push_back, cancel = [], [], []
        for entry in msg.forward:
            unit = c.ins.get(entry.edge_id)
            if unit is None:
                (moved if entry.edge_id in c.tombstones else push_back).append(entry.edge_id)
            elif entry.epoch >= unit.epoch:
                if unit.prev != msg.sender:
                    c.changed()  # a move upstream handed the unit's out-end to another node: prev changed
                unit.prev, unit.epoch, unit.refreshed = msg.sender, entry.epoch, c.now
                if abs(entry.up_cost - unit.up_cost) > COST_EPS:
                    unit.up_cost = entry.up_cost
                    if unit.out_id is not None:
                        c.mark_forward(unit.out_id)
        for entry in msg.backward:
            out = c.outs.get(entry.edge_id)
            if out is None:
                (moved if entry.edge_id in c.tombstones else cancel).append(entry.edge_id)
            elif entry.epoch >= out.epoch:
                self._update_out(out, msg.sender, entry.epoch, entry.remaining_cost, entry.complete)
        if moved:
            c.send(msg.sender, Moved(c.node_id, tuple(
                MovedEntry(e, c.tombstones[e].holder, c.tombstones[e].epoch) for e in moved)))
        if push_back:
            c.send(msg.sender, PushBack(c.node_id, tuple(push_back)))
        if cancel:
            c.send(msg.sender, Cancel(c.node_id, tuple(cancel)))

    def _update_out(self, out, sender: str, epoch: int, remaining: float, complete: bool) -> None:
        c = self.core
        edge = c.cost_to(sender)
        if edge is None:
            return
        if out.next != sender or not out.confirmed:
            # A move downstream (take-over, swap, exchange) handed the unit to ``sender``, whose Refresh may
            # arrive before the giver's Moved: the next hop changed, so the routing did (routing_table(),
            # and what caches it by routing_version: FlowDriver.routes() and the DHT record's summary).
            c.changed()
        out.next, out.epoch, out.refreshed, out.confirmed = sender, epoch, c.now, True
        down = edge + remaining
        if abs(down - out.down_cost) > COST_EPS or complete != out.complete:
            if out.complete != complete:
                c.changed()
            out.down_cost, out.complete = down, complete
            if out.in_id is not None:
                c.mark_backward(out.in_id)

    def on_cancel(self, msg: Cancel) -> None:
        c = self.core
        for edge_id in msg.edge_ids:
            unit = c.ins.get(edge_id)
            if unit is not None and unit.prev == msg.sender:
                c.drop_in(edge_id, push_back=False)

    def on_push_back(self, msg: PushBack) -> None:
        c = self.core
        for edge_id in msg.edge_ids:
            out = c.outs.get(edge_id)
            if out is not None and out.next == msg.sender:
                c.drop_out(edge_id, cancel=False)

    def on_moved(self, msg: Moved) -> None:
        c = self.core
        for entry in msg.entries:
            holder_cost = c.cost_to(entry.holder)
            out = c.outs.get(entry.edge_id)
            if out is not None and out.next == msg.sender and entry.epoch > out.epoch:
                if holder_cost is None:
                    c.drop_out(entry.edge_id, cancel=False)
                else:
                    old_edge = c.cost_to(out.next) or 0.0
                    c.moved_off[out.edge_id] = (out.next, c.now)  # reroute.py: no cost re-route back there
                    out.next, out.epoch, out.refreshed = entry.holder, entry.epoch, c.now
                    out.down_cost += holder_cost - old_edge
                    c.mark_forward(out.edge_id)
                    c.changed()
            unit = c.ins.get(entry.edge_id)
            if unit is not None and unit.prev == msg.sender and entry.epoch > unit.epoch:
                if holder_cost is None:
                    c.drop_in(entry.edge_id, push_back=False)
                else:
                    unit.prev, unit.epoch, unit.refreshed = entry.holder, entry.epoch, c.now
                    c.mark_backward(unit.edge_id)
                    c.changed()

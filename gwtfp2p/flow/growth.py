"""Flow growth: cost-to-sink adverts, and requests that extend unrouted units one hop.

A node with unrouted demand (a data holder below its supply, a relay with an in-unit lacking an
out-unit) asks the next-stage neighbour with the cheapest edge + advertised cost to the sink
for up to ``request_batch`` units. The receiver accepts what its capacity and advert still allow
and refuses the rest with its fresh advert. Unroutable units are pushed back after a TTL.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from gwtfp2p.flow.core import INF, InUnit, Neighbour, NodeCore, OutUnit, Pacing
from gwtfp2p.flow.messages import Accept, Advert, Reject, Request


@dataclass
class PendingRequest:
    """The one outstanding growth request of this node."""

    to: str
    sink: str
    unresolved: set[str] = field(default_factory=set)
    deadline: int = 0
    sent: Request | None = None  # the request as sent (asked again once, for what is unanswered at the deadline)
    retried: bool = False


class Adverts:
    """Sends this node's advert to the previous stage when it changes (at most every period)."""

    def __init__(self, core: NodeCore) -> None:
        self.core = core
        self.last_sent: Advert | None = None
        self.pacing = Pacing(core.params.advert_period_ticks)

    def tick(self) -> None:
        c = self.core
        if not self.pacing.due(c.now):
            return
        advert = c.advert()
        if self._same(advert, self.last_sent) and not self.pacing.stale(c.now):
            return
        for neighbour in c.prev_neighbours():
            c.send(neighbour.node_id, advert)
        self.last_sent, self.pacing.last_tick = advert, c.now

    @staticmethod
    def _same(a: Advert, b: Advert | None) -> bool:
        """Adverts that differ only in the amount of spare capacity are not worth sending."""
        return b is not None and a.costs == b.costs and (a.spare > 0) == (b.spare > 0)

    def on_advert(self, msg: Advert) -> None:
        neighbour = self.core.neighbours.get(msg.sender)
        if neighbour is not None:
            neighbour.advert = dict(msg.costs)
            neighbour.spare = msg.spare


class Growth:
    """Requests, accepts and refusals of new units; expiry of stuck ones."""

    def __init__(self, core: NodeCore) -> None:
        self.core = core

    # -- periodic ------------------------------------------------------------------------
    def tick(self) -> None:
        self._expire_request()
        self._expire_outstanding()
        if self.core.pending is None:
            self.grow()

    def _expire_request(self) -> None:
        c = self.core
        pending = c.pending
        if not isinstance(pending, PendingRequest) or c.now < pending.deadline:
            return
        if self._ask_again(pending):
            return
        for edge_id in sorted(pending.unresolved):
            out = c.outs.get(edge_id)
            if out is not None and not out.confirmed:
                c.drop_out(edge_id, cancel=True)
        self._backoff(pending.to)
        c.pending = None

    def _ask_again(self, pending: PendingRequest) -> bool:
        """A request unanswered at its deadline is sent once more (its Request or the Accept may have been
        lost; a duplicate is answered again) before its out-units are cancelled. True if it was."""
        c = self.core
        sent = pending.sent
        if pending.retried or sent is None or pending.to not in c.neighbours:
            return False
        ids = [i for i, e in enumerate(sent.edge_ids) if e in pending.unresolved and e in c.outs
               and not c.outs[e].confirmed]
        if not ids:
            return False
        pending.retried, pending.deadline = True, c.now + c.params.proposal_timeout_ticks
        c.send(pending.to, Request(c.node_id, sent.sink, tuple(sent.edge_ids[i] for i in ids),
                                   tuple(sent.up_costs[i] for i in ids), sent.expected_cost))
        return True

    def _expire_outstanding(self) -> None:
        c = self.core
        ttl = c.params.outstanding_ttl_ticks
        for unit in c.outstanding():
            if c.now - unit.unmatched_since >= ttl:
                c.drop_in(unit.edge_id, push_back=True)

    def _backoff(self, node_id: str) -> None:
        neighbour = self.core.neighbours.get(node_id)
        if neighbour is not None:
            neighbour.backoff_until = self.core.now + self.core.params.reject_backoff_ticks

    def best_next(self, sink: str, exclude: str | None = None) -> tuple[Neighbour, float] | None:
        """The next-stage neighbour with spare capacity minimizing edge + advertised cost."""
        c = self.core
        best: tuple[Neighbour, float] | None = None
        for n in c.next_neighbours():
            if n.node_id == exclude or n.spare <= 0 or n.backoff_until > c.now:
                continue
            cost = n.cost + n.advert.get(sink, INF)
            if cost < INF and (best is None or cost < best[1]):
                best = (n, cost)
        return best

    def grow(self) -> None:
        """Request a next hop for the oldest unrouted units of one sink."""
        c = self.core
        if c.is_data_holder and c.held_back:
            return  # leaving capacity to a poorer holder (fairness.py)
        if c.is_data_holder:
            units: list[InUnit | None] = [None] * c.demand()
            sink = c.node_id
        else:
            by_sink: dict[str, list[InUnit]] = defaultdict(list)
            for unit in sorted(c.outstanding(), key=lambda u: (u.unmatched_since, u.edge_id)):
                by_sink[unit.sink].append(unit)
            if not by_sink:
                return
            sink = min(by_sink, key=lambda s: (by_sink[s][0].unmatched_since, s))
            units = list(by_sink[sink])
        if not units:
            return
        choice = self.best_next(sink)
        if choice is None:
            return
        neighbour, expected = choice
        self.request(neighbour, sink, units[: min(c.params.request_batch, neighbour.spare)],
                     expected - neighbour.cost)

    def request(self, neighbour: Neighbour, sink: str, units: list[InUnit | None],
                expected_cost: float, match: bool = True) -> list[str]:
        """Create requested out-units for ``units`` and send one Request; returns the edge ids.

        ``match=False`` leaves the new out-units unmatched (a re-route being built beside the
        chain that still carries the unit).
        """
        c = self.core
        edge_ids, up_costs = [], []
        for unit in units:
            edge_id = c.new_edge_id()
            in_id = unit.edge_id if unit is not None else None
            c.outs[edge_id] = OutUnit(edge_id, neighbour.node_id, sink, 0, c.now, None)
            if in_id is not None and match:
                c.match(in_id, edge_id)
            edge_ids.append(edge_id)
            up_costs.append((unit.up_cost if unit is not None else 0.0) + neighbour.cost)
        sent = Request(c.node_id, sink, tuple(edge_ids), tuple(up_costs), expected_cost)
        c.send(neighbour.node_id, sent)
        c.pending = PendingRequest(neighbour.node_id, sink, set(edge_ids),
                                   c.now + c.params.proposal_timeout_ticks, sent)
        neighbour.spare = max(0, neighbour.spare - len(edge_ids))
        return edge_ids

    # -- handlers ------------------------------------------------------------------------
    def on_request(self, msg: Request) -> None:
        c = self.core
        sender = c.neighbours.get(msg.sender)
        if sender is None or sender.stage != c.prev_stage or len(msg.up_costs) != len(msg.edge_ids):
            return
        if c.is_data_holder:
            ok = msg.sink == c.node_id
            room = 2 * c.supply - len(c.ins)
        else:
            my_cost = dict(c.advert().costs).get(msg.sink, INF)
            ok = my_cost < INF and my_cost <= msg.expected_cost * (1 + 1e-9) + 1e-9
            room = c.spare()
        accepted = []
        for edge_id, up_cost in zip(msg.edge_ids, msg.up_costs, strict=False):
            if edge_id in c.ins:
                accepted.append(edge_id)  # a duplicate request: answer it again
            elif ok and len(accepted) < room:
                c.ins[edge_id] = InUnit(edge_id, msg.sender, msg.sink, up_cost, 0, c.now, c.now)
                accepted.append(edge_id)
                c.changed()
        refused = tuple(e for e in msg.edge_ids if e not in set(accepted))
        if accepted:
            c.send(msg.sender, Accept(c.node_id, tuple(accepted)))
        if refused:
            c.send(msg.sender, Reject(c.node_id, refused, c.advert()))

    def on_accept(self, msg: Accept) -> None:
        c = self.core
        sender_is_sink = c.neighbours.get(msg.sender) is not None and c.neighbours[msg.sender].stage == 0
        for edge_id in msg.edge_ids:
            out = c.outs.get(edge_id)
            if out is None or out.next != msg.sender:
                continue
            out.confirmed, out.refreshed = True, c.now
            if sender_is_sink and out.sink == msg.sender:
                out.complete, out.down_cost = True, c.cost_to(msg.sender) or 0.0
                if out.in_id is not None:
                    c.mark_backward(out.in_id)
            c.changed()
        self._resolve(msg.sender, msg.edge_ids)

    def on_reject(self, msg: Reject) -> None:
        c = self.core
        neighbour = c.neighbours.get(msg.sender)
        if neighbour is not None:
            neighbour.advert, neighbour.spare = dict(msg.advert.costs), msg.advert.spare
        for edge_id in msg.edge_ids:
            out = c.outs.get(edge_id)
            if out is not None and out.next == msg.sender and not out.confirmed:
                c.drop_out(edge_id, cancel=False)
        self._resolve(msg.sender, msg.edge_ids)

    def _resolve(self, sender: str, edge_ids: tuple[str, ...]) -> None:
        pending = self.core.pending
        if isinstance(pending, PendingRequest) and pending.to == sender:
            pending.unresolved.difference_update(edge_ids)
            if not pending.unresolved:
                self.core.pending = None

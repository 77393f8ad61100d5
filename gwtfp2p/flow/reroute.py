"""Re-routing by make-before-break: how a node moves one of its units onto a cheaper downstream path.

When a next-stage neighbour advertises a path to the unit's sink that is cheaper than the one
the unit uses by more than a margin, the node builds a second chain through it while the old
one keeps carrying the unit; it switches only once the new chain is complete and still cheaper,
and cancels it otherwise. This is how flow is attracted to newcomers and freed capacity: a
multi-hop change that single-node moves cannot make, with no gap in the routing meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass

from gwtfp2p.flow.core import INF, Neighbour, NodeCore, OutUnit
from gwtfp2p.flow.growth import Growth
from gwtfp2p.flow.moves import MoveExecutor

PIN_PERIODS = 8  # augmenting walks a moved unit stays out of cost re-routes for (augment.py)


def pin_ticks(core: NodeCore) -> int:
    """How long a unit a step (or a peer's takeover) moved stays out of cost re-routes: ``PIN_PERIODS`` walks."""
    return PIN_PERIODS * 2 * core.params.residual_period_ticks * (core.n_stages + 1)


@dataclass
class Rebuild:
    old_out: str
    new_out: str
    in_id: str | None  # None for a data holder's own unit
    deadline: int
    for_flow: bool = False  # an augmenting step (augment.py): switch whatever the cost


class Rerouter:
    """At most one re-route under construction per node; failed units back off."""

    def __init__(self, core: NodeCore, growth: Growth, moves: MoveExecutor) -> None:
        self.core = core
        self.growth = growth
        self.moves = moves
        self.current: Rebuild | None = None
        self.backoff: dict[str, int] = {}  # old out-unit id -> tick before which it is not retried
        self.pinned: dict[str, int] = {}  # out-unit id -> tick before which no cost re-route moves it
        self.left_for_flow: dict[str, set[str]] = {}  # in-unit id -> next hops an augmenting step moved it off
        self.failures = 0  # consecutive failed re-routes: the node waits 2^failures periods
        self.quiet_until = 0
        self._memo: tuple | None = None

    def tick(self) -> None:
        if len(self.core.moved_off) > len(self.core.outs):  # forget units gone meanwhile (expired ones are ignored)
            self.core.moved_off = {k: v for k, v in self.core.moved_off.items() if k in self.core.outs}
        if self.current is not None:
            self._advance(self.current)
        elif (self.core.pending is None and self.core.params.reroute_margin > 0
              and self.core.now >= self.quiet_until and not self.core.flow_first):
            self._maybe_start()

    # -- starting ------------------------------------------------------------------------------
    def _maybe_start(self) -> None:
        c = self.core
        if c.outstanding() or c.demand() > 0:
            return
        signature = (c.routing_version, hash(tuple((n.node_id, n.spare > 0, tuple(sorted(n.advert.items())))
                                                   for n in c.next_neighbours())))
        if signature == self._memo:
            return
        self._memo = signature
        best = None
        for out in sorted(c.outs.values(), key=lambda o: o.edge_id):
            if not (out.confirmed and out.complete) or self.backoff.get(out.edge_id, -1) > c.now:
                continue
            if self.pinned.get(out.edge_id, -1) > c.now:
                continue
            if not c.is_data_holder and (out.in_id is None or out.in_id in self.moves.locked):
                continue
            choice = self.growth.best_next(out.sink, exclude=out.next)
            if choice is None or self._moved_off(out.edge_id) == choice[0].node_id:
                continue
            saving = out.down_cost - choice[1]
            if saving > c.params.reroute_margin * out.down_cost and (best is None or saving > best[0]):
                best = (saving, out, choice)
        if best is not None:
            self._start(best[1], *best[2])

    def _moved_off(self, out_id: str) -> str | None:
        """The next hop a peer's move (a takeover, softstate.py) took this unit off within the pin span: a cost
        re-route does not take it back there, which would undo a takeover an augmenting step asked for before
        the blocked holder could use the freed slot."""
        c = self.core
        moved = c.moved_off.get(out_id)
        return moved[0] if moved is not None and c.now - moved[1] < pin_ticks(c) else None

    def start_for_flow(self, out: OutUnit, neighbour: Neighbour) -> bool:
        """Move ``out``'s unit off its next hop onto ``neighbour``'s path with spare capacity (an augmenting
        step: no cost margin). False if this node is busy or the unit cannot move now."""
        c = self.core
        if self.current is not None or not (out.confirmed and out.complete):
            return False
        if not c.is_data_holder and (out.in_id is None or out.in_id in self.moves.locked):
            return False
        advert = neighbour.advert.get(out.sink, INF)
        if neighbour.spare <= 0 or advert == INF or neighbour.backoff_until > c.now:
            return False
        if out.in_id is not None:
            left = self.left_for_flow.setdefault(out.in_id, set())
            if neighbour.node_id in left:
                return False  # back to where a step took it from: undoing that step frees nothing new
            left.add(out.next)
        self._start(out, neighbour, neighbour.cost + advert)
        self.current.for_flow = True
        return True

    def _start(self, out: OutUnit, neighbour, expected_total: float) -> None:
        c = self.core
        unit = c.ins.get(out.in_id) if out.in_id is not None else None
        new_ids = self.growth.request(neighbour, out.sink, [unit], expected_total - neighbour.cost, match=False)
        new = c.outs[new_ids[0]]
        new.building, new.shadow_of = True, out.in_id
        if out.in_id is not None:
            self.moves.locked.add(out.in_id)
        timeout = 4 * (c.n_stages + 1) * c.params.proposal_timeout_ticks
        self.current = Rebuild(out.edge_id, new.edge_id, out.in_id, c.now + timeout)

    # -- finishing -----------------------------------------------------------------------------
    def _advance(self, rebuild: Rebuild) -> None:
        c = self.core
        old, new = c.outs.get(rebuild.old_out), c.outs.get(rebuild.new_out)
        carried = rebuild.in_id is None or (rebuild.in_id in c.ins and c.ins[rebuild.in_id].out_id == rebuild.old_out)
        if new is None:
            self._end(rebuild, failed=True)
        elif not carried:
            self._adopt(rebuild, new)
        elif new.confirmed and new.complete:
            if old is None or rebuild.for_flow or new.down_cost < old.down_cost:
                self._switch(rebuild, new)
            else:
                c.drop_out(new.edge_id, cancel=True)
                self._end(rebuild, failed=True)
        elif c.now >= rebuild.deadline:
            c.drop_out(new.edge_id, cancel=True)
            self._end(rebuild, failed=True)

    def _adopt(self, rebuild: Rebuild, new: OutUnit) -> None:
        """The old chain broke meanwhile: the unit takes the new chain at once, if it still exists."""
        c = self.core
        unit = c.ins.get(rebuild.in_id) if rebuild.in_id is not None else None
        if unit is not None and unit.out_id is None:
            new.building, new.shadow_of = False, None
            c.match(unit.edge_id, new.edge_id)
            c.mark_backward(unit.edge_id)
        else:
            c.drop_out(new.edge_id, cancel=True)
        self._end(rebuild, failed=False)

    def _switch(self, rebuild: Rebuild, new: OutUnit) -> None:
        c = self.core
        old = c.outs.get(rebuild.old_out)
        if old is not None:
            old.in_id = None
            c.drop_out(old.edge_id, cancel=True)
        new.building, new.shadow_of = False, None
        if rebuild.in_id is not None:
            c.match(rebuild.in_id, new.edge_id)
            c.mark_backward(rebuild.in_id)
        if rebuild.for_flow:  # a cost re-route must not take back what the step freed before it is used
            self.pinned[new.edge_id] = c.now + pin_ticks(c)
        c.changed()
        self._end(rebuild, failed=False)

    def _end(self, rebuild: Rebuild, failed: bool) -> None:
        c = self.core
        if rebuild.in_id is not None:
            self.moves.locked.discard(rebuild.in_id)
        self.failures = min(self.failures + 1, 6) if failed else 0
        wait = c.params.refresh_period_ticks * 2**self.failures
        self.quiet_until = c.now + wait
        if failed:
            self.backoff[rebuild.old_out] = c.now + 4 * wait
        self.backoff = {k: v for k, v in self.backoff.items() if v > c.now and k in c.outs}
        self.pinned = {k: v for k, v in self.pinned.items() if v > c.now and k in c.outs}
        self.left_for_flow = {k: v for k, v in self.left_for_flow.items() if k in c.ins}
        self.current = None

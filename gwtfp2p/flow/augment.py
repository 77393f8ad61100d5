"""Augmenting steps: a blocked data holder has one of its own units moved so that it can grow.

A data holder with demand, no next hop advertising a path with spare capacity, and a finite residual
label (residual.py) sends an ``Augment`` walk along its labels' minimum: forward to a node a new unit
would enter, or backward to the node P that sends a full relay X one of the holder's units. The walk
stops at the first P whose unit on that edge can leave X for the next hop its labels point to, when
that hop advertises a path with spare capacity: P moves it there by make-before-break
(``Rerouter.start_for_flow``, no cost margin), and X's old chain is cancelled, freeing a slot at X
and on its way to the holder. The holder's shortest augmenting path then has one backward edge
fewer; the next walk (one per ``augment_period_ticks``) goes on from there, and the last step is
ordinary growth. Flow never drops meanwhile (every step is make-before-break), and a walk that finds
stale labels simply ends; the holder walks again later.
"""

from __future__ import annotations

from gwtfp2p.flow.annealing import Annealer
from gwtfp2p.flow.core import INF, Neighbour, NodeCore
from gwtfp2p.flow.growth import Growth
from gwtfp2p.flow.messages import Augment
from gwtfp2p.flow.reroute import Rerouter
from gwtfp2p.flow.residual import ResidualDistances
from gwtfp2p.flow.ways import hop_limit, reroute_hops, takeover_offer

NEW_UNIT = ""  # ``Augment.edge_id`` of a walk that arrives forward: a new unit would enter the receiver


def augment_period_ticks(core: NodeCore) -> int:
    """Time for one step to finish and the labels to follow before the holder walks again."""
    return 2 * core.params.residual_period_ticks * (core.n_stages + 1)


class Augmenter:
    """Starts walks at a blocked holder, passes them on at relays, and starts the step at their end."""

    def __init__(self, core: NodeCore, growth: Growth, rerouter: Rerouter, residual: ResidualDistances,
                 annealer: Annealer) -> None:
        self.core = core
        self.annealer = annealer
        self.growth = growth
        self.rerouter = rerouter
        self.residual = residual
        self.next_walk = 0
        self.steps_started = 0

    def tick(self) -> None:
        c = self.core
        if (not c.params.augment or not c.is_data_holder or c.now < self.next_walk or c.pending is not None
                or c.held_back):
            return
        if (not self.residual.augmentable() or not self.residual.own_label_settled(c.params.walk_settle_ticks)
                or self.growth.best_next(c.node_id) is not None):
            return
        self.next_walk = c.now + augment_period_ticks(c)
        self._forward(c.node_id, hop_limit(c.n_stages), None, pure=False)

    def on_augment(self, msg: Augment) -> None:
        c = self.core
        sender = c.neighbours.get(msg.sender)
        if sender is None or not 0 < msg.budget <= hop_limit(c.n_stages):
            return
        if c.is_data_holder and msg.edge_id == NEW_UNIT:
            return  # a walk that reached the sink forward had nothing to displace
        if msg.edge_id == NEW_UNIT and sender.stage == c.prev_stage:
            self._arrive(msg.sink, msg.budget - 1, msg.pure)
        elif msg.edge_id != NEW_UNIT and sender.stage == c.stage and c.params.takeover_steps:
            if self.annealer.take_over_for_flow(sender, msg.edge_id):  # the sender's slot is freed
                self.steps_started += 1
        elif msg.edge_id != NEW_UNIT and sender.stage == c.next_stage:
            out = c.outs.get(msg.edge_id)
            if out is not None and out.next == msg.sender and out.sink == msg.sink:
                self._leave(out.edge_id, msg.sink, msg.budget - 1, msg.pure)

    def _arrive(self, sink: str, budget: int, pure: bool) -> None:
        """A new unit would enter here: take a spare slot and go on, displace a unit of ``sink``, or
        (not ``pure``) have another holder re-route one of its units from here."""
        c = self.core
        if c.spare() > 0 and self.growth.best_next(sink) is not None:
            return  # ordinary growth reaches the sink from here: nothing left to displace (stale labels)
        options = []
        back = self._best_back(sink, pure)
        if back is not None:
            options.append((back[1], 0, lambda: c.send(back[0].prev, Augment(c.node_id, sink, budget,
                                                                            back[0].edge_id, pure))))
        forward = self._best_forward(sink, None, pure) if c.spare() > 0 else None
        if forward is not None:
            options.append((forward[1], 1, lambda: self._forward(sink, budget, None, pure)))
        if not pure and c.spare() <= 0 and sink in self.residual.xouts and c.params.takeover_steps:
            offer = takeover_offer(c)
            if offer is not None:
                taken, peer = offer
                options.append((self.residual.xouts[sink], 3, lambda: c.send(
                    peer.node_id, Augment(c.node_id, sink, budget, taken.edge_id, pure))))
        if not pure and c.spare() <= 0 and sink in self.residual.xouts:
            other = self._best_other(sink)
            if other is not None:
                unit, hops = other
                deep = c.params.deep_cross
                options.append((hops + self.residual.xouts[sink] - 1, 2, lambda: c.send(
                    unit.prev, Augment(c.node_id, unit.sink, budget, unit.edge_id, not deep))))
        if options:
            min(options, key=lambda o: o[:2])[2]()

    def _leave(self, out_id: str, sink: str, budget: int, pure: bool) -> None:
        """Our unit on ``out_id`` should leave its next hop: move it now if a spare path exists, else walk on."""
        c = self.core
        out = c.outs[out_id]
        back = None if c.is_data_holder else self._best_back(sink, pure, only=out.in_id)
        forward = self._best_forward(sink, out.next, pure)
        if back is not None and (forward is None or back[1] < forward[1]):
            c.send(back[0].prev, Augment(c.node_id, sink, budget, back[0].edge_id, pure))
        elif forward is not None and forward[0].spare > 0 and forward[0].advert.get(sink, INF) < INF:
            if c.pending is None and self.rerouter.start_for_flow(out, forward[0]):
                self.steps_started += 1
        elif forward is not None:
            self._forward(sink, budget, out.next, pure)

    def _forward(self, sink: str, budget: int, exclude: str | None, pure: bool) -> None:
        choice = self._best_forward(sink, exclude, pure)
        if choice is not None and budget > 0:
            self.core.send(choice[0].node_id, Augment(self.core.node_id, sink, budget, NEW_UNIT, pure))

    def _best_forward(self, sink: str, exclude: str | None, pure: bool) -> tuple[Neighbour, float] | None:
        best = None
        for n in self.core.next_neighbours():
            hops = (n.res_in if pure else n.res_xin).get(sink, INF)
            if n.node_id != exclude and hops < INF and (best is None or hops < best[1]):
                best = (n, hops)
        return best

    def _best_back(self, sink: str, pure: bool, only: str | None = None):
        """The in-unit of ``sink`` (``only``: that one) whose sender is closest to the end, with its label."""
        c = self.core
        best = None
        for unit in sorted(c.ins.values(), key=lambda u: u.edge_id):
            if unit.sink != sink or (only is not None and unit.edge_id != only) or unit.out_id is None:
                continue
            prev = c.neighbours.get(unit.prev)
            hops = (prev.res_out if pure else prev.res_xout).get(sink, INF) if prev is not None else INF
            if hops < INF and (best is None or hops < best[1]):
                best = (unit, hops)
        return best

    def _best_other(self, sink: str):
        """Another holder's unit here that its holder could re-route (``residual.reroute_hops``), with its
        label."""
        c = self.core
        best = None
        for unit in sorted(c.ins.values(), key=lambda u: u.edge_id):
            if unit.sink == sink or unit.out_id is None:
                continue
            hops = reroute_hops(c, unit)
            if hops is not None and (best is None or hops < best[1]):
                best = (unit, hops)
        return best

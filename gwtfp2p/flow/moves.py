"""The move protocol between same-stage peers: take-over and swap, with single ownership.

Edge units change hands only by being given: the giver forgets a unit before sending it, so no
unit is ever carried twice; a lost message only loses a unit, which soft state then cleans up
and growth re-routes. The receiver of a proposal re-checks the gain with its own costs.
"""

from __future__ import annotations

from dataclasses import dataclass

from gwtfp2p.flow.core import InUnit, NodeCore, OutUnit, Tombstone
from gwtfp2p.flow.messages import (
    MoveAnswer,
    ProposeExchange,
    ProposeSwap,
    ProposeTakeover,
    Refresh,
    SwapCommit,
    TableUnit,
    UnitTransfer,
)
from gwtfp2p.flow.objective import gain as objective_gain

GAIN_TOLERANCE = 1e-6


@dataclass
class PendingMove:
    proposal_id: str
    to: str
    kind: str
    deadline: int
    mine_in: str | None = None
    mine_out: str | None = None


class MoveExecutor:
    def __init__(self, core: NodeCore) -> None:
        self.core = core
        self.locked: set[str] = set()
        self.avoid: dict[str, int] = {}
        self.expecting: dict[str, int] = {}  # exchange proposal id -> deadline of its reserved slot
        self._counter = 0

    # -- proposer side ---------------------------------------------------------------------
    def _new_pending(self, to: str, kind: str, **units) -> PendingMove:
        c = self.core
        self._counter += 1
        pending = PendingMove(f"{c.node_id}/{self._counter}", to, kind,
                              c.now + c.params.proposal_timeout_ticks, **units)
        c.pending = pending
        return pending

    def propose_takeover(self, peer: str, unit: TableUnit, costs: tuple[float, float], gain: float) -> None:
        c = self.core
        pending = self._new_pending(peer, "takeover")
        c.reserved += 1
        c.send(peer, ProposeTakeover(c.node_id, pending.proposal_id, unit.in_id, unit.out_id,
                                     costs[0], costs[1], gain, c.marginal_cost()))

    def propose_swap(self, peer: str, unit: TableUnit, mine: tuple[InUnit, OutUnit],
                     costs: tuple[float, float], gain: float) -> None:
        """Offer ``peer`` to swap next hops: ``costs`` are the peer's edge to our unit's next hop and ours to its
        unit's next hop (annealing.py ``_swaps``)."""
        c = self.core
        my_in, my_out = mine
        pending = self._new_pending(peer, "swap", mine_in=my_in.edge_id, mine_out=my_out.edge_id)
        self.locked.add(my_in.edge_id)
        old_out_cost = c.cost_to(my_out.next) or 0.0
        _their_cost_to_my_next, my_cost_to_their_next = costs
        c.send(peer, ProposeSwap(c.node_id, pending.proposal_id, my_out.sink, my_in.edge_id, my_out.edge_id,
                                 my_out.next, unit.in_id, unit.out_id, my_in.up_cost, old_out_cost,
                                 my_cost_to_their_next, my_out.down_cost - old_out_cost, gain))

    def propose_exchange(self, peer: str, unit: TableUnit, mine: TableUnit, costs: tuple[float, float],
                         gain: float) -> None:
        c = self.core
        pending = self._new_pending(peer, "exchange", mine_in=mine.in_id, mine_out=mine.out_id)
        self.locked.add(mine.in_id)
        c.send(peer, ProposeExchange(c.node_id, pending.proposal_id, unit.in_id, unit.out_id, costs[0], costs[1],
                                     mine, gain))

    def tick(self) -> None:
        c = self.core
        pending = c.pending
        if isinstance(pending, PendingMove) and c.now >= pending.deadline:
            self.end_pending(pending, rejected=True)
        self.avoid = {k: v for k, v in self.avoid.items() if v > c.now}
        for proposal_id in [p for p, deadline in self.expecting.items() if deadline <= c.now]:
            del self.expecting[proposal_id]
            c.reserved = max(0, c.reserved - 1)

    def end_pending(self, pending: PendingMove, rejected: bool) -> None:
        c = self.core
        if pending.kind == "takeover":
            c.reserved = max(0, c.reserved - 1)
        if pending.mine_in is not None:
            self.locked.discard(pending.mine_in)
        if rejected:
            self.avoid[pending.to] = c.now + c.params.reject_backoff_ticks
        c.pending = None

    def on_answer(self, msg: MoveAnswer) -> None:
        c = self.core
        pending = c.pending
        if not (isinstance(pending, PendingMove) and pending.proposal_id == msg.proposal_id):
            return  # late: whatever it handed over is cleaned up by soft state
        self.end_pending(pending, rejected=not msg.accepted)
        if not msg.accepted:
            return
        if pending.kind == "takeover" and msg.incoming and msg.outgoing:
            self._install_pair(msg.incoming, msg.outgoing)
        elif pending.kind == "swap" and msg.outgoing:
            self._commit_swap(pending, msg)
        elif pending.kind == "exchange" and msg.incoming and msg.outgoing:
            self._commit_exchange(pending, msg)

    def _give_pair(self, unit: InUnit, out: OutUnit, to: str) -> tuple[UnitTransfer, UnitTransfer]:
        """Forget a matched unit and return what its new holder needs (a tombstone stays here)."""
        c = self.core
        in_cost, out_cost = c.cost_to(unit.prev) or 0.0, c.cost_to(out.next) or 0.0
        incoming = UnitTransfer(unit.edge_id, unit.prev, unit.sink, unit.epoch + 1, unit.up_cost - in_cost)
        outgoing = UnitTransfer(out.edge_id, out.next, out.sink, out.epoch + 1, out.down_cost - out_cost,
                                out.complete)
        del c.ins[unit.edge_id]
        del c.outs[out.edge_id]
        expires = c.now + c.params.soft_state_ttl_ticks
        c.tombstones[unit.edge_id] = Tombstone(to, unit.epoch + 1, expires)
        c.tombstones[out.edge_id] = Tombstone(to, out.epoch + 1, expires)
        c.changed()
        return incoming, outgoing

    def _commit_exchange(self, pending: PendingMove, msg: MoveAnswer) -> None:
        c = self.core
        pair = self._my_pair(pending.mine_in, pending.mine_out, allow_locked=True)
        if pair is None:
            if c.spare() >= 1:
                self._install_pair(msg.incoming, msg.outgoing)
            return  # our unit changed meanwhile: the peer's reserved slot expires
        incoming, outgoing = self._give_pair(pair[0], pair[1], msg.sender)
        self._install_pair(msg.incoming, msg.outgoing, room_freed=True)
        c.send(msg.sender, SwapCommit(c.node_id, pending.proposal_id, outgoing, incoming))

    def _install_pair(self, incoming: UnitTransfer, outgoing: UnitTransfer, room_freed: bool = False) -> None:
        """Install a unit handed over by a peer and tell its prev and next where it is now."""
        c = self.core
        in_cost, out_cost = c.cost_to(incoming.peer), c.cost_to(outgoing.peer)
        if in_cost is None or out_cost is None or (c.spare() < 1 and not room_freed):
            return
        c.ins[incoming.edge_id] = InUnit(incoming.edge_id, incoming.peer, incoming.sink,
                                         incoming.cost + in_cost, incoming.epoch, c.now, c.now)
        c.outs[outgoing.edge_id] = OutUnit(outgoing.edge_id, outgoing.peer, outgoing.sink, outgoing.epoch,
                                           c.now, None, True, outgoing.complete, out_cost + outgoing.cost)
        c.match(incoming.edge_id, outgoing.edge_id)
        c.send(incoming.peer, Refresh(c.node_id, backward=(c.backward_entry(c.ins[incoming.edge_id]),)))
        c.send(outgoing.peer, Refresh(c.node_id, forward=(c.forward_entry(c.outs[outgoing.edge_id]),)))

    def _commit_swap(self, pending: PendingMove, msg: MoveAnswer) -> None:
        c = self.core
        unit = c.ins.get(pending.mine_in)
        old = c.outs.get(pending.mine_out)
        received = msg.outgoing
        new_cost = c.cost_to(received.peer)
        if unit is None or old is None or unit.out_id != old.edge_id or new_cost is None:
            return  # our side changed meanwhile: the received unit is left to expire
        old_cost = c.cost_to(old.next) or 0.0
        give = UnitTransfer(old.edge_id, old.next, old.sink, old.epoch + 1, old.down_cost - old_cost, old.complete)
        del c.outs[old.edge_id]
        c.tombstones[old.edge_id] = Tombstone(msg.sender, old.epoch + 1, c.now + c.params.soft_state_ttl_ticks)
        c.outs[received.edge_id] = OutUnit(received.edge_id, received.peer, received.sink, received.epoch,
                                           c.now, None, True, received.complete, new_cost + received.cost)
        c.match(unit.edge_id, received.edge_id)
        c.send(msg.sender, SwapCommit(c.node_id, pending.proposal_id, give))
        c.send(received.peer, Refresh(c.node_id, forward=(c.forward_entry(c.outs[received.edge_id]),)))
        c.mark_backward(unit.edge_id)

    # -- receiver side ---------------------------------------------------------------------
    def _my_pair(self, in_id: str, out_id: str, allow_locked: bool = False) -> tuple[InUnit, OutUnit] | None:
        c = self.core
        unit, out = c.ins.get(in_id), c.outs.get(out_id)
        if unit is None or out is None or unit.out_id != out_id or (in_id in self.locked and not allow_locked):
            return None
        if not (out.confirmed and out.complete) or unit.awaiting is not None:
            return None
        return unit, out

    def _answer(self, msg, accepted: bool, **transfers) -> None:
        self.core.send(msg.sender, MoveAnswer(self.core.node_id, msg.proposal_id, accepted, **transfers))

    def on_takeover(self, msg: ProposeTakeover) -> None:
        c = self.core
        pair = self._my_pair(msg.in_id, msg.out_id)
        if pair is None or isinstance(c.pending, PendingMove) or c.neighbours.get(msg.sender) is None:
            self._answer(msg, False)
            return
        unit, out = pair
        in_cost, out_cost = c.cost_to(unit.prev) or 0.0, c.cost_to(out.next) or 0.0
        old = unit.up_cost + out.down_cost
        new = old + msg.my_in_cost + msg.my_out_cost - in_cost - out_cost
        saved = c.resources.uplink_s_per_unit * (c.load() - 1) - msg.my_marginal_s
        gain = objective_gain([old], [new], c.params.max_path_weight) + saved
        if gain < msg.expected_gain - GAIN_TOLERANCE * max(1.0, abs(msg.expected_gain)):
            self._answer(msg, False)
            return
        incoming, outgoing = self._give_pair(unit, out, msg.sender)
        self._answer(msg, True, incoming=incoming, outgoing=outgoing)

    def on_swap(self, msg: ProposeSwap) -> None:
        c = self.core
        pair = self._my_pair(msg.theirs_in, msg.theirs_out)
        d_pb = c.cost_to(msg.mine_next)
        if (pair is None or isinstance(c.pending, PendingMove) or d_pb is None
                or pair[1].sink != msg.sink or pair[1].next == msg.mine_next):
            self._answer(msg, False)
            return
        unit, out = pair
        d_pa = c.cost_to(out.next) or 0.0
        rem_a = out.down_cost - d_pa
        their_old = msg.my_up_cost + msg.my_old_out_cost + msg.my_remaining
        their_new = msg.my_up_cost + msg.my_new_out_cost + rem_a
        my_old, my_new = unit.up_cost + out.down_cost, unit.up_cost + d_pb + msg.my_remaining
        gain = objective_gain([my_old, their_old], [my_new, their_new], c.params.max_path_weight)
        if gain < msg.expected_gain - GAIN_TOLERANCE * max(1.0, abs(msg.expected_gain)):
            self._answer(msg, False)
            return
        give = UnitTransfer(out.edge_id, out.next, out.sink, out.epoch + 1, rem_a, out.complete)
        del c.outs[out.edge_id]
        c.tombstones[out.edge_id] = Tombstone(msg.sender, out.epoch + 1, c.now + c.params.soft_state_ttl_ticks)
        unit.out_id = None
        unit.awaiting, unit.awaiting_until = msg.proposal_id, c.now + 2 * c.params.proposal_timeout_ticks
        c.changed()
        self._answer(msg, True, outgoing=give)

    def on_exchange(self, msg: ProposeExchange) -> None:
        c = self.core
        pair = self._my_pair(msg.in_id, msg.out_id)
        mine = msg.mine
        d_aq, d_qb = c.cost_to(mine.prev), c.cost_to(mine.next)
        if pair is None or isinstance(c.pending, PendingMove) or d_aq is None or d_qb is None:
            self._answer(msg, False)
            return
        unit, out = pair
        d_cq, d_qd = c.cost_to(unit.prev) or 0.0, c.cost_to(out.next) or 0.0
        u_old, m_old = unit.up_cost + out.down_cost, mine.up_cost + mine.down_cost
        u_new = u_old - d_cq - d_qd + msg.my_in_cost + msg.my_out_cost
        m_new = m_old - mine.in_cost - mine.out_cost + d_aq + d_qb
        gain = objective_gain([u_old, m_old], [u_new, m_new], c.params.max_path_weight)
        if gain < msg.expected_gain - GAIN_TOLERANCE * max(1.0, abs(msg.expected_gain)):
            self._answer(msg, False)
            return
        incoming, outgoing = self._give_pair(unit, out, msg.sender)
        c.reserved += 1
        self.expecting[msg.proposal_id] = c.now + 2 * c.params.proposal_timeout_ticks
        self._answer(msg, True, incoming=incoming, outgoing=outgoing)

    def on_commit(self, msg: SwapCommit) -> None:
        c = self.core
        if msg.incoming is not None:
            if self.expecting.pop(msg.proposal_id, None) is not None:
                c.reserved = max(0, c.reserved - 1)
                self._install_pair(msg.incoming, msg.outgoing)
            return
        received = msg.outgoing
        unit = next((u for u in c.ins.values() if u.awaiting == msg.proposal_id), None)
        cost = c.cost_to(received.peer)
        if unit is None or cost is None:
            return  # too late: the unit is left to expire at its holder
        unit.awaiting = None
        c.outs[received.edge_id] = OutUnit(received.edge_id, received.peer, received.sink, received.epoch,
                                           c.now, None, True, received.complete, cost + received.cost)
        c.match(unit.edge_id, received.edge_id)
        c.send(received.peer, Refresh(c.node_id, forward=(c.forward_entry(c.outs[received.edge_id]),)))
        c.mark_backward(unit.edge_id)

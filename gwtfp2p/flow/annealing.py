"""Local improvement by simulated annealing between same-stage peers.

Relays share flow tables with their same-stage peers and propose moves: take over a peer's unit
(prev → peer → next becomes prev → me → next), swap the next hops of two units with the same
sink, or re-route one of their own units through a cheaper next hop (make before break). The
best move is proposed when it improves the objective; a worse one with probability exp(gain/T).
The receiver re-checks a move with its own costs. T cools per executed move, reheats on churn.
While a blocked holder's flag holds cost-driven moves, only swaps and exchanges go on: they keep
every node's load, so they take no capacity an augmenting step freed (``FlowParams.swaps_under_flags``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gwtfp2p.flow.core import InUnit, Neighbour, NodeCore, OutUnit
from gwtfp2p.flow.growth import Growth
from gwtfp2p.flow.messages import FlowTable, TableUnit
from gwtfp2p.flow.moves import MoveExecutor, PendingMove
from gwtfp2p.flow.objective import gain1, gain2


@dataclass(frozen=True)
class Candidate:
    kind: str  # "takeover" | "swap" | "exchange"
    gain: float
    peer: str = ""
    unit: TableUnit | None = None
    mine: tuple[InUnit | None, OutUnit] | None = None
    costs: tuple[float, float] = (0.0, 0.0)
    mine_row: TableUnit | None = None


class Annealer:
    """Flow-table gossip and move selection (the move protocol itself lives in moves.py)."""

    def __init__(self, core: NodeCore, growth: Growth, moves: MoveExecutor) -> None:
        self.core = core
        self.growth = growth
        self.moves = moves
        self._memo: dict[str, tuple[tuple, Candidate | None]] = {}
        self._table_cache: tuple[tuple, FlowTable] | None = None
        self._last_table: FlowTable | None = None
        self._last_table_tick = -(10**9)

    # -- gossip ----------------------------------------------------------------------------
    def table(self) -> FlowTable:
        """This node's flow table (built at most once per tick and routing version)."""
        c = self.core
        key = (c.now, c.routing_version, c.spare())
        if self._table_cache is not None and self._table_cache[0] == key:
            return self._table_cache[1]
        table = self._build_table()
        self._table_cache = (key, table)
        return table

    def _build_table(self) -> FlowTable:
        c = self.core
        units = []
        for unit, out in self.my_units():
            in_cost, out_cost = c.cost_to(unit.prev), c.cost_to(out.next)
            if in_cost is None or out_cost is None:
                continue
            units.append(TableUnit(unit.edge_id, unit.prev, out.edge_id, out.next, out.sink,
                                   in_cost, out_cost, unit.up_cost, out.down_cost))
        costs = tuple((n.node_id, n.cost) for n in c.next_neighbours() + c.prev_neighbours())
        return FlowTable(c.node_id, c.spare(), tuple(units), costs, c.load(), c.resources.uplink_s_per_unit)

    def on_table(self, msg: FlowTable) -> None:
        neighbour = self.core.neighbours.get(msg.sender)
        if neighbour is not None and neighbour.stage == self.core.stage:
            neighbour.table, neighbour.table_tick = msg, self.core.now

    def my_units(self) -> list[tuple[InUnit, OutUnit]]:
        """Matched, confirmed, complete units not locked by a move."""
        c = self.core
        pairs = []
        for in_id in sorted(c.ins):
            unit = c.ins[in_id]
            out = c.outs.get(unit.out_id) if unit.out_id else None
            if out is not None and out.confirmed and out.complete and in_id not in self.moves.locked:
                pairs.append((unit, out))
        return pairs

    # -- periodic --------------------------------------------------------------------------
    def tick(self) -> None:
        c = self.core
        if c.is_data_holder:
            return
        self._gossip_table()
        if c.pending is not None or c.outstanding() or c.rng.random() >= c.params.improve_probability:
            return
        if not c.flow_first:
            self._improve_with_peer()
        elif c.params.swaps_under_flags:
            self._improve_with_peer(keep_loads=True)

    def _gossip_table(self) -> None:
        """Send the flow table to same-stage peers when it changed, else as a slow keep-alive."""
        c = self.core
        period = c.params.table_period_ticks
        if c.now - self._last_table_tick < period:
            return
        table = self.table()
        if table == self._last_table and c.now - self._last_table_tick < 4 * period:
            return
        for peer in c.peers():
            c.send(peer.node_id, table)
        self._last_table, self._last_table_tick = table, c.now

    def forget(self) -> None:
        """Drop remembered evaluations (the neighbourhood changed)."""
        self._memo.clear()

    def _pick_peer(self) -> tuple[Neighbour, FlowTable] | None:
        tables = self._fresh_tables()
        return self.core.rng.choice(tables) if tables else None

    def _improve_with_peer(self, keep_loads: bool = False) -> None:
        """Evaluate the moves with one random peer; ``keep_loads``: only those that leave every node's load as
        it is (swaps, exchanges), not a takeover, which fills this node's spare capacity."""
        choice = self._pick_peer()
        if choice is None:
            return
        peer, table = choice
        self._improve(peer.node_id, lambda: self._best_of(
            None if keep_loads else self._takeovers(peer, table), self._swaps(peer, table),
            self._exchanges(peer, table)), hash((table, keep_loads)))

    @staticmethod
    def _best_of(*candidates: Candidate | None) -> Candidate | None:
        found = [m for m in candidates if m is not None]
        return max(found, key=lambda m: m.gain) if found else None

    def _improve(self, key: str, best_fn, extra: int = 0) -> None:
        """Evaluate (or recall) the best move of one kind and execute it when it is accepted."""
        c = self.core
        scale = c.cost_scale()
        signature = (c.routing_version, c.spare() > 0, extra)
        memo = self._memo.get(key)
        if memo is not None and memo[0] == signature:
            best = memo[1]  # nothing changed since: only a Metropolis draw can differ
        else:
            best = best_fn()
            self._memo[key] = (signature, best)
        if best is None:
            return
        if best.gain > c.params.gain_epsilon * scale or self._metropolis(best.gain, scale):
            self._execute(best)

    def _metropolis(self, gain: float, scale: float) -> bool:
        """Accept a worse move with probability exp(gain / T); never a (near) zero-gain one."""
        c = self.core
        if not math.isfinite(gain) or gain >= -c.params.gain_epsilon * scale:
            return False
        accept = c.rng.random() < math.exp(gain / (c.temperature * scale))
        c.temperature = max(c.params.min_temperature, c.temperature * c.params.cooling)
        return accept

    def _execute(self, move: Candidate) -> None:
        self._memo.clear()
        if move.kind == "takeover":
            self.moves.propose_takeover(move.peer, move.unit, move.costs, move.gain)
        elif move.kind == "exchange":
            self.moves.propose_exchange(move.peer, move.unit, move.mine_row, move.costs, move.gain)
        else:
            self.moves.propose_swap(move.peer, move.unit, move.mine, move.costs, move.gain)

    # -- candidates ------------------------------------------------------------------------
    def _fresh_tables(self) -> list[tuple[Neighbour, FlowTable]]:
        return [(p, table) for p, table in self.core.fresh_tables() if p.node_id not in self.moves.avoid]

    def _takeover(self, peer: Neighbour, table: FlowTable, u: TableUnit) -> Candidate | None:
        """Taking over the peer's unit ``u`` (prev -> peer -> next becomes prev -> me -> next), with its
        gain; None when a link is missing."""
        c = self.core
        my_in, my_out = c.cost_to(u.prev), c.cost_to(u.next)
        if my_in is None or my_out is None:
            return None
        uplink = table.uplink_s_per_unit * (table.load - 1) - c.marginal_cost()  # the peer's wait saved
        old = u.up_cost + u.down_cost
        gain = gain1(old, old + my_in + my_out - u.in_cost - u.out_cost, c.params.max_path_weight) + uplink
        return Candidate("takeover", gain, peer.node_id, u, costs=(my_in, my_out))

    def _takeovers(self, peer: Neighbour, table: FlowTable) -> Candidate | None:
        if self.core.spare() < 1:
            return None
        return self._best_of(*(self._takeover(peer, table, u) for u in table.units))

    def take_over_for_flow(self, peer: Neighbour, in_id: str) -> bool:
        """Take over the peer's unit ``in_id`` whatever its gain (an augmenting step asked, augment.py):
        the peer's slot is freed for a blocked holder. False when it cannot be proposed now."""
        c = self.core
        table = peer.table
        if c.is_data_holder or c.spare() < 1 or c.pending is not None or table is None:
            return False
        unit = next((u for u in table.units if u.in_id == in_id), None)
        move = None if unit is None else self._takeover(peer, table, unit)
        if move is None:
            return False
        self._execute(move)
        return True

    def _swaps(self, peer: Neighbour, table: FlowTable) -> Candidate | None:
        c = self.core
        weight = c.params.max_path_weight
        their_costs = dict(table.costs)
        best, best_gain = None, -math.inf
        for unit, out in self.my_units():
            d_pa = c.cost_to(out.next)
            d_qa = their_costs.get(out.next)
            if d_pa is None or d_qa is None:
                continue
            rem_a = out.down_cost - d_pa
            my_old = unit.up_cost + out.down_cost
            for u in table.units:
                if out.sink != u.sink or out.next == u.next:
                    continue
                d_pb = c.cost_to(u.next)
                if d_pb is None:
                    continue
                their_old = u.up_cost + u.down_cost
                my_new = unit.up_cost + d_pb + u.down_cost - u.out_cost
                their_new = u.up_cost + d_qa + rem_a
                gain = gain2(my_old, their_old, my_new, their_new, weight)
                if gain > best_gain:
                    best, best_gain = (u, unit, out, d_qa, d_pb), gain
        if best is None:
            return None
        u, unit, out, d_qa, d_pb = best
        return Candidate("swap", best_gain, peer.node_id, u, (unit, out), costs=(d_qa, d_pb))

    def _exchanges(self, peer: Neighbour, table: FlowTable) -> Candidate | None:
        """Whole-unit exchanges: loads stay, so they help where capacity binds (any sinks)."""
        c = self.core
        weight = c.params.max_path_weight
        their_costs = dict(table.costs)
        mine = self.table().units
        best, best_gain = None, -math.inf
        for m in mine:
            d_aq, d_qb = their_costs.get(m.prev), their_costs.get(m.next)
            if d_aq is None or d_qb is None:
                continue
            m_old = m.up_cost + m.down_cost
            m_new = m_old - m.in_cost - m.out_cost + d_aq + d_qb
            for u in table.units:
                if u.prev == m.prev and u.next == m.next:
                    continue
                d_cp, d_pd = c.cost_to(u.prev), c.cost_to(u.next)
                if d_cp is None or d_pd is None:
                    continue
                u_old = u.up_cost + u.down_cost
                u_new = u_old - u.in_cost - u.out_cost + d_cp + d_pd
                gain = gain2(m_old, u_old, m_new, u_new, weight)
                if gain > best_gain:
                    best, best_gain = (u, m, d_cp, d_pd), gain
        if best is None:
            return None
        u, m, d_cp, d_pd = best
        return Candidate("exchange", best_gain, peer.node_id, u, costs=(d_cp, d_pd), mine_row=m)

__all__ = ["Annealer", "Candidate", "PendingMove"]

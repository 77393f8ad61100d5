"""Local improvement by simulated annealing between same-stage peers.

Relays share flow tables with their same-stage peers and propose moves: take over a peer's unit
(prev → peer → next becomes prev → me → next), swap the next hops of two units with the same
sink, or re-route one of their own units through a cheaper next hop (make before break). The
best move is proposed when it improves the objective; a worse one with probability exp(gain/T).
The receiver re-checks a move with its own costs. T cools per executed move, reheats on churn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gwtfp2p.flow.core import InUnit, Neighbour, NodeCore, OutUnit
from gwtfp2p.flow.growth import Growth
from gwtfp2p.flow.messages import FlowTable, TableUnit
from gwtfp2p.flow.moves import MoveExecutor, PendingMove
from gwtfp2p.flow.objective import gain as objective_gain


@dataclass(frozen=True)
class Candidate:
    kind: str  # "takeover" | "swap" | "reroute"
    gain: float
    peer: str = ""
    unit: TableUnit | None = None
    mine: tuple[InUnit | None, OutUnit] | None = None
    costs: tuple[float, float] = (0.0, 0.0)
    via: Neighbour | None = None
    expected: float = 0.0


class Annealer:
    """Flow-table gossip and move selection (the move protocol itself lives in moves.py)."""

    def __init__(self, core: NodeCore, growth: Growth, moves: MoveExecutor) -> None:
        self.core = core
        self.growth = growth
        self.moves = moves
        self._memo: dict[str, tuple[tuple, Candidate | None]] = {}
        self._last_table: FlowTable | None = None
        self._last_table_tick = -(10**9)

    # -- gossip ----------------------------------------------------------------------------
    def table(self) -> FlowTable:
        c = self.core
        units = []
        for unit, out in self.my_units():
            in_cost, out_cost = c.cost_to(unit.prev), c.cost_to(out.next)
            if in_cost is None or out_cost is None:
                continue
            units.append(TableUnit(unit.edge_id, unit.prev, out.edge_id, out.next, out.sink,
                                   in_cost, out_cost, unit.up_cost, out.down_cost))
        costs = tuple((n.node_id, n.cost) for n in c.next_neighbours() + c.prev_neighbours())
        return FlowTable(c.node_id, c.spare(), tuple(units), costs)

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
        self._improve_with_peer()

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

    def _maybe_reroute_only(self) -> None:
        c = self.core
        if c.pending is None and c.demand() == 0 and c.rng.random() < c.params.improve_probability:
            self._improve("reroute", self._reroutes)

    def _pick_peer(self) -> tuple[Neighbour, FlowTable] | None:
        tables = self._fresh_tables()
        return self.core.rng.choice(tables) if tables else None

    def _improve_with_peer(self) -> None:
        choice = self._pick_peer()
        if choice is None:
            return
        peer, table = choice
        self._improve(peer.node_id, lambda: self._best_of(self._takeovers(peer, table), self._swaps(peer, table)),
                      hash(table))

    @staticmethod
    def _best_of(*candidates: Candidate | None) -> Candidate | None:
        found = [m for m in candidates if m is not None]
        return max(found, key=lambda m: m.gain) if found else None

    def _improve(self, key: str, best_fn, extra: int = 0) -> None:
        """Evaluate (or recall) the best move of one kind and execute it when it is accepted."""
        c = self.core
        scale = c.cost_scale()
        signature = (c.routing_version, c.spare() > 0, extra, self._advert_signature() if key == "reroute" else 0)
        memo = self._memo.get(key)
        if memo is not None and memo[0] == signature:
            best = memo[1]  # nothing changed since: only a Metropolis draw can differ
        else:
            best = best_fn()
            self._memo[key] = (signature, best)
        if best is None:
            return
        if best.gain > c.params.gain_epsilon * scale or (best.kind != "reroute" and self._metropolis(best.gain, scale)):
            self._execute(best)

    def _advert_signature(self) -> int:
        return hash(tuple((n.node_id, n.spare > 0, tuple(sorted(n.advert.items())))
                          for n in self.core.next_neighbours()))

    def _metropolis(self, gain: float, scale: float) -> bool:
        """Accept a worse move with probability exp(gain / T); never a (near) zero-gain one."""
        c = self.core
        if not math.isfinite(gain) or gain >= -c.params.gain_epsilon * scale:
            return False
        accept = c.rng.random() < math.exp(gain / (c.temperature * scale))
        c.temperature = max(c.params.min_temperature, c.temperature * c.params.cooling)
        return accept

    def _execute(self, move: Candidate) -> None:
        c = self.core
        self._memo.clear()
        if move.kind == "reroute":
            self.growth.reroute(move.mine[1], move.via, move.expected)
        elif move.kind == "takeover":
            self.moves.propose_takeover(move.peer, move.unit, move.costs, move.gain)
        else:
            self.moves.propose_swap(move.peer, move.unit, move.mine, move.costs, move.gain)

    # -- candidates ------------------------------------------------------------------------
    def _fresh_tables(self) -> list[tuple[Neighbour, FlowTable]]:
        c = self.core
        horizon = 6 * c.params.table_period_ticks
        return [(p, p.table) for p in c.peers()
                if p.table is not None and c.now - p.table_tick <= horizon and p.node_id not in self.moves.avoid]

    def _takeovers(self, peer: Neighbour, table: FlowTable) -> Candidate | None:
        c = self.core
        if c.spare() < 1:
            return None
        weight = c.params.max_path_weight
        best, best_gain = None, -math.inf
        for u in table.units:
            my_in, my_out = c.cost_to(u.prev), c.cost_to(u.next)
            if my_in is None or my_out is None:
                continue
            old = u.up_cost + u.down_cost
            gain = objective_gain([old], [old + my_in + my_out - u.in_cost - u.out_cost], weight)
            if gain > best_gain:
                best, best_gain = (u, my_in, my_out), gain
        if best is None:
            return None
        return Candidate("takeover", best_gain, peer.node_id, best[0], costs=(best[1], best[2]))

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
                gain = objective_gain((my_old, their_old), (my_new, their_new), weight)
                if gain > best_gain:
                    best, best_gain = (u, unit, out, d_qa, d_pb), gain
        if best is None:
            return None
        u, unit, out, d_qa, d_pb = best
        return Candidate("swap", best_gain, peer.node_id, u, (unit, out), costs=(d_qa, d_pb))

    def _reroutes(self) -> Candidate | None:
        c = self.core
        weight = c.params.max_path_weight
        margin = c.params.reroute_margin * c.cost_scale()
        found: list[Candidate] = []
        for out_id in sorted(c.outs):
            out = c.outs[out_id]
            if not (out.confirmed and out.complete):
                continue
            if not c.is_data_holder and (out.in_id is None or out.in_id in self.moves.locked):
                continue
            choice = self.growth.best_next(out.sink, exclude=out.next)
            if choice is None:
                continue
            neighbour, alternative = choice
            if alternative - out.down_cost < -margin:
                up = c.ins[out.in_id].up_cost if out.in_id is not None else 0.0
                gain = objective_gain([up + out.down_cost], [up + alternative], weight)
                found.append(Candidate("reroute", gain, mine=(None, out), via=neighbour,
                                       expected=alternative - neighbour.cost))
        return self._best_of(*found)


__all__ = ["Annealer", "Candidate", "PendingMove"]

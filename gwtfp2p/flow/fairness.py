"""Fairness between data holders: max-min, the oracle's rule, kept by the holders themselves.

When demand exceeds what the stages carry, growth hands capacity to whichever holder asks first.
The oracle's rule is max-min after the maximum flow: no holder that wants more should route two
units fewer than another holder that shares its capacity. Holders that want more and see no path
with spare capacity say so in their ``Residual`` labels with the units they route (residual.py,
``wants``). A data holder A that hears of such a holder B:

* holds its own growth back while it routes at least one unit more than B (growing would widen
  the gap, and the capacity it would take is what B's steps may need);
* gives up one unit (the one whose first hop is closest, by B's residual labels, to B, then the
  costliest) when it routes two or more units more than B, once per count of B: its chain's
  capacity is freed for B;
* takes its growth up again when B did not gain within ``fair_patience_ticks`` (the freed
  capacity was no use to B), so the maximum flow comes first, as in the oracle.

Pure bookkeeping on the node's state; the unit given up is cancelled like any other.
"""

from __future__ import annotations

import logging

from gwtfp2p.flow.core import INF, NodeCore
from gwtfp2p.flow.residual import ResidualDistances

logger = logging.getLogger(__name__)


class FairShare:
    """A data holder's side of max-min fairness: hold back, give up one unit, and time out both."""

    def __init__(self, core: NodeCore, residual: ResidualDistances) -> None:
        self.core = core
        self.residual = residual
        self.waiting: dict[str, tuple[int, int]] = {}  # poorer holder -> (its count, our tick we began to wait)
        self.yield_floor: dict[str, int] = {}  # poorer holder -> its count from which we may give up a unit again
        self.units_given_up = 0
        self.gave_up_for: set[str] = set()

    def tick(self) -> None:
        c = self.core
        if not c.is_data_holder or not c.params.fair_share:
            c.held_back = False
            return
        mine = len(c.routed_outs())
        poorer = {h: w[2] for h, w in self.residual.wants.items() if h != c.node_id and w[2] + 1 <= mine}
        for holder, count in poorer.items():
            self.waiting[holder] = self._waited(holder, count)
        patience = c.params.fair_patience_ticks
        stepping = {sink for n in (*c.prev_neighbours(), *c.next_neighbours()) for sink, _, _ in n.res_blocked}
        c.held_back = any(c.now - self.waiting[h][1] < patience and (h in stepping or h in self.gave_up_for)
                          for h in poorer)
        if c.pending is not None or self._could_grow():
            return  # give nothing up while this holder itself still grows: the flow comes first
        for holder, count in sorted(poorer.items(), key=lambda e: (e[1], e[0])):
            if mine >= count + 2 and count >= self.yield_floor.get(holder, 0):
                self._give_up(holder, count)
                break

    def _could_grow(self) -> bool:
        """A path with spare capacity, or an augmenting step, is open to this holder."""
        return self.core.has_spare_path() or self.residual.augmentable()

    def _waited(self, holder: str, count: int) -> tuple[int, int]:
        """Since when we wait for ``holder`` at ``count``: a gain starts a new wait; a loss does not, nor
        a notice that lapsed for a while (kept, so that patience runs out even when notices flicker)."""
        known = self.waiting.get(holder)
        if known is None or count > known[0]:
            return count, self.core.now
        return count, known[1]

    def _give_up(self, holder: str, count: int) -> None:
        """Give up one unit: the one whose first hop is closest to ``holder`` by its residual labels, then
        the costliest. The next one only once ``holder`` routes more than it does now."""
        c = self.core
        units = c.routed_outs()

        def closeness(out) -> tuple[float, float, str]:
            first = c.neighbours.get(out.next)
            hops = first.res_xout.get(holder, INF) if first is not None else INF
            return hops, -out.down_cost, out.edge_id

        if not units:
            return
        out = min(units, key=closeness)
        self.yield_floor[holder] = count + 1
        self.gave_up_for.add(holder)
        self.waiting[holder] = (count, c.now)
        c.held_back = True
        c.drop_out(out.edge_id, cancel=True)
        self.units_given_up += 1
        logger.debug("%s gives up unit %s for %s (%d units, it routes %d)", c.node_id, out.edge_id, holder,
                     len(units), count)

"""Residual distances: how many hops each node is from an augmenting path's end, per sink.

The flow's growth follows adverts of paths with spare capacity only, so it stops at a blocking flow
(docs/flow-tight.md). Per sink (data holder) h a node keeps a distance vector over h's *residual
graph*, where besides a forward edge to a next-stage neighbour a path may take a backward edge along one
of h's own units (that unit is then re-routed); ways.py computes the labels. This module sends them in
``Residual`` messages to both neighbour stages, keeps the neighbours' labels (refusing malformed ones),
and carries the blocked holders' flags and the wanting holders' notices. Labels above the hop limit count
as none. Nothing here moves a unit: it is what an augmenting step follows, and a local test that a
holder's flow is at its maximum.
"""

from __future__ import annotations

from collections.abc import Iterable

from gwtfp2p.flow.core import NodeCore, Pacing
from gwtfp2p.flow.messages import Residual
from gwtfp2p.flow.ways import IN, KINDS, OUT, Labels, Path, Routes, best, distances, hop_limit, max_path, routes, visits


def flag_ttl_ticks(core: NodeCore) -> int:
    """How long a blocked holder's flag lives without a newer tick from it (a few residual periods)."""
    return 4 * core.params.residual_period_ticks


def want_ttl_ticks(core: NodeCore) -> int:
    """How long a wanting holder's notice lives without a newer tick (it re-stamps every keep-alive)."""
    return 6 * Pacing(core.params.residual_period_ticks).keepalive * core.params.residual_period_ticks


MAX_UNITS = 1_000_000  # a holder's routed count above this is refused (untrusted input)
Want = tuple[int, int, int]  # (the holder's tick when it last said so, hops to it, units it routes)
Notice = tuple[int, ...]  # (the holder's tick when it last said so, hops to it, anything it carries)


def keep_newest(seen: dict[str, tuple[Notice, int]], offers: Iterable[tuple[str, Notice]], now: int,
                ttl: int, forget_ticks: int) -> dict[str, Notice]:
    """Merge notices passed on by neighbours into ``seen`` (holder -> (notice, our tick when its stamp last
    advanced)): an offer replaces what we know only with a newer stamp, and a notice whose stamp stopped
    advancing for ``ttl`` ticks is no longer returned, so it ends everywhere soon after its holder stops
    sending it. An ended notice is remembered ``forget_ticks`` longer: a neighbour still passing on the same
    stamp cannot bring it back (without that, stale copies bounced between neighbours until their hop
    counts ran out, ~150 ticks on an 8-stage swarm). Returns holder -> live notice."""
    for holder, notice in offers:
        known = seen.get(holder)
        if known is None or notice[0] > known[0][0]:
            seen[holder] = (notice, now)
    for holder in [h for h, (_, tick) in seen.items() if now - tick > ttl + forget_ticks]:
        del seen[holder]
    return {holder: notice for holder, (notice, tick) in seen.items() if now - tick <= ttl}


def forget_ticks(core: NodeCore) -> int:
    """How long an ended notice's stamp is remembered: longer than a copy takes to cross the hop limit
    (one hop per two residual periods). A holder restarting with a lower tick is heard again after it."""
    return 2 * hop_limit(core.n_stages) * core.params.residual_period_ticks


def _paths(offered: dict[str, dict[str, tuple[int, Path]]]) -> tuple[tuple[str, str, Path], ...]:
    """The paths of offered loop-free labels, as a ``Residual`` carries them."""
    return tuple(sorted((kind, sink, path) for kind in KINDS for sink, (_, path) in offered[kind].items() if path))


class ResidualDistances:
    """Recomputes this node's labels and sends them to both neighbour stages when they change
    (at most once per residual period, and again every four periods).

    With them goes ``blocked``: the holders that could gain a unit only by an augmenting step, with
    the holder's tick when it last said so and the hops to it. A node that knows one puts flow first
    (``NodeCore.flow_first``): it starts no cost-driven move that fills capacity (re-route, takeover),
    which could take back the capacity a step freed before the holder uses it; load-keeping swaps go on
    (annealing.py). A flag whose holder's tick stops advancing ends within a few periods."""

    def __init__(self, core: NodeCore) -> None:
        self.core = core
        self.ins: Labels = {}
        self.outs: Labels = {}
        self.xins: Labels = {}
        self.xouts: Labels = {}
        self.blocked: dict[str, tuple[int, int]] = {}
        self._seen: dict[str, tuple[Notice, int]] = {}  # sink -> ((holder's tick, hops), our tick when it advanced)
        self.wants: dict[str, Want] = {}
        self._wants_seen: dict[str, tuple[Notice, int]] = {}  # holder -> (its notice, our tick when it advanced)
        self._own_want: Want | None = None
        self._own_label: int | None = None  # a data holder's own walk label, and our tick since it has had it
        self._own_label_since = 0
        self.last_sent: tuple | None = None
        self.pacing = Pacing(core.params.residual_period_ticks)

    def tick(self) -> None:
        c = self.core
        if not self.pacing.due(c.now):
            return
        ways: dict[str, Routes] | None = None
        if c.params.loop_free_labels:
            ways = dict(zip(KINDS, (*routes(c), *routes(c, cross=True)), strict=True))
            bests = {kind: best(ways[kind]) for kind in KINDS}
            self.ins, self.outs, self.xins, self.xouts = ({sink: h for sink, (h, _) in bests[kind].items()}
                                                          for kind in KINDS)
        else:
            (self.ins, self.outs), (self.xins, self.xouts) = distances(c), distances(c, cross=True)
        own_label = self.xouts.get(c.node_id) if c.is_data_holder else None
        if own_label != self._own_label:
            self._own_label, self._own_label_since = own_label, c.now
        self.blocked = self._blocked()
        c.flow_first = bool(self.blocked)
        self.wants = self._wants()
        labels = (ways or (self.ins, self.outs, self.xins, self.xouts), self.blocked, self.wants)
        if labels == self.last_sent and not self.pacing.stale(c.now):
            return
        own = dict(zip(KINDS, (self.ins, self.outs, self.xins, self.xouts), strict=True))
        common = self._message(own, () if ways is None else _paths(bests))
        for neighbour in (*c.prev_neighbours(), *c.next_neighbours()):
            offered = None if ways is None else self._offered(ways, bests, neighbour.node_id)
            c.send(neighbour.node_id, common if offered is None or offered is bests else self._message(
                {kind: {sink: h for sink, (h, _) in offered[kind].items()} for kind in KINDS}, _paths(offered)))
        self.last_sent, self.pacing.last_tick = labels, c.now

    @staticmethod
    def _offered(ways: dict[str, Routes], bests: dict[str, dict[str, tuple[int, Path]]],
                 neighbour: str) -> dict[str, dict[str, tuple[int, Path]]]:
        """Our labels as offered to ``neighbour``: the ways that do not come back through the vertex it would
        reach us from (its unit leaving it, for ``ins``; arriving at it, for ``outs``); ``bests`` itself
        when none of our shortest ways does."""
        avoid = {kind: (OUT if kind.endswith("in") else IN) + neighbour for kind in KINDS}
        if not any(visits(path, sink, avoid[kind]) for kind in KINDS for sink, (_, path) in bests[kind].items()):
            return bests
        return {kind: best(ways[kind], avoid[kind]) for kind in KINDS}

    def _message(self, labels: dict[str, Labels], paths: tuple[tuple[str, str, Path], ...]) -> Residual:
        hops = {kind: tuple(sorted(labels[kind].items())) for kind in KINDS}
        return Residual(self.core.node_id, hops["in"], hops["out"],
                        tuple(sorted((k, t, h) for k, (t, h) in self.blocked.items())), hops["xin"], hops["xout"],
                        tuple(sorted((k, *w) for k, w in self.wants.items())), paths)

    def _blocked(self) -> dict[str, tuple[int, int]]:
        """Holders that want more, cannot grow and could by a step: sink -> (the holder's tick when it last
        said so, our hops to it). A holder's own flag carries its tick; we keep the newest tick a neighbour
        passed on (where our label for that sink is finite) and drop a flag whose tick stopped advancing
        for ``flag_ttl_ticks``, so a holder's flag ends everywhere soon after the holder stops raising it."""
        c = self.core
        limit = hop_limit(c.n_stages)
        if (c.is_data_holder and c.params.augment and c.demand() > 0
                and self.own_label_settled(c.params.flag_settle_ticks) and not c.has_spare_path()):
            self._seen[c.node_id] = ((c.now, 0), c.now)
        offers = ((sink, (stamp, hops + 1)) for neighbour in (*c.prev_neighbours(), *c.next_neighbours())
                  for sink, stamp, hops in neighbour.res_blocked
                  if hops < limit and (sink in self.xins or sink in self.xouts))
        return keep_newest(self._seen, offers, c.now, flag_ttl_ticks(c), forget_ticks(c))

    def _wants(self) -> dict[str, Want]:
        """Holders that want more units and see no path with spare capacity, with the units they route
        (fairness.py): a data holder's own notice is re-stamped when its count changes and at every
        keep-alive; a node keeps the newest tick a neighbour passed on, within the hop limit, and drops a
        notice whose tick stopped advancing for ``want_ttl_ticks``."""
        c = self.core
        limit = hop_limit(c.n_stages)
        if c.is_data_holder:
            self._own_want = self._own_notice()
            if self._own_want is not None:
                self._wants_seen[c.node_id] = (self._own_want, c.now)
            else:
                self._wants_seen.pop(c.node_id, None)
        offers = ((sink, (stamp, hops + 1, count)) for neighbour in (*c.prev_neighbours(), *c.next_neighbours())
                  for sink, stamp, hops, count in neighbour.res_wants if sink != c.node_id and hops < limit)
        return keep_newest(self._wants_seen, offers, c.now, want_ttl_ticks(c), forget_ticks(c))

    def _own_notice(self) -> Want | None:
        c = self.core
        if not c.params.fair_share or c.demand() <= 0:
            return None
        if c.has_spare_path():
            return None
        count = len(c.routed_outs())
        last = self._own_want
        if last is not None and last[2] == count and not self.pacing.stale(c.now):
            return last
        return (c.now, 0, count)

    def on_residual(self, msg: Residual) -> None:
        """Keep a neighbour's labels; out-of-range hop counts are refused (untrusted input)."""
        neighbour = self.core.neighbours.get(msg.sender)
        if neighbour is None:
            return
        limit = hop_limit(self.core.n_stages)
        if any(not 0 <= hops <= limit for _, hops in (*msg.ins, *msg.outs, *msg.xins, *msg.xouts)):
            return
        if any(kind not in KINDS or len(path) > max_path(limit) for kind, _, path in msg.paths):
            return
        if any(not 0 <= hops <= limit or stamp < 0 for _, stamp, hops in msg.blocked):
            return
        if any(not 0 <= hops <= limit or stamp < 0 or not 0 <= count <= MAX_UNITS
               for _, stamp, hops, count in msg.wants):
            return
        neighbour.res_in, neighbour.res_out = dict(msg.ins), dict(msg.outs)
        neighbour.res_xin, neighbour.res_xout = dict(msg.xins), dict(msg.xouts)
        neighbour.res_paths = {(kind, sink): path for kind, sink, path in msg.paths}
        neighbour.res_blocked = msg.blocked
        neighbour.res_wants = msg.wants

    def own_label_settled(self, ticks: int) -> bool:
        """A data holder's own walk label (recomputed with the others) is finite and has kept its value
        ``ticks`` ticks."""
        c = self.core
        return self._own_label is not None and c.now - self._own_label_since >= ticks

    def augmentable(self, cross: bool = True) -> bool:
        """A data holder with demand that could route one unit more by moving its own units (``cross``:
        or by having another holder re-route one of its units)."""
        c = self.core
        return c.is_data_holder and c.demand() > 0 and c.node_id in (self.xouts if cross else self.outs)

"""Residual distances: how many hops each node is from an augmenting path's end, per sink.

The flow's growth follows adverts of paths with spare capacity only, so it stops at a blocking flow
(docs/flow-tight.md). This module keeps, per sink (data holder) h, a distance vector over h's
*residual graph*, where besides a forward edge to a next-stage neighbour a path may take a backward
edge along one of h's own units (that unit is then re-routed). A node X holds two labels per sink:

* ``outs[h]``, from a unit leaving X: ``1 + ins[h]`` of a next-stage neighbour (forward), or, when X
  carries a unit of h from P, ``1 + outs[h]`` of P (that unit's segment through X is taken out, and
  P re-routes it);
* ``ins[h]``, from a unit arriving at X: ``outs[h]`` when X has spare capacity, or ``1 + outs[h]`` of
  a P that sends X a unit of h (the newcomer takes that unit's slot and its tail; P re-routes it).

The holder h is the end (``ins[h] = 0``); its ``outs[h]`` is the length of its shortest augmenting
path, finite exactly when h could route one unit more by moving only its own units. Labels travel in
``Residual`` messages to both neighbour stages; labels above the hop limit count as none, which ends
counting to infinity on the residual graph's cycles. Nothing here moves a unit: it is what an
augmenting step (issue 15) will follow, and a local test that a holder's flow is at its maximum.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from gwtfp2p.flow.core import InUnit, Neighbour, NodeCore, Pacing
from gwtfp2p.flow.messages import Residual

TABLE_HORIZON_PERIODS = 6  # a peer's flow table older than this many table periods is not relied on
HOP_LIMIT_PER_STAGE = 4  # hop limit = this × (stages + 1): a path may visit each stage a few times


def hop_limit(n_stages: int) -> int:
    return HOP_LIMIT_PER_STAGE * (n_stages + 1)


def max_path(limit: int) -> int:
    return MAX_PATH_PER_HOP * limit + 2


def flag_ttl_ticks(core: NodeCore) -> int:
    """How long a blocked holder's flag lives without a newer tick from it (a few residual periods)."""
    return 4 * core.params.residual_period_ticks


def want_ttl_ticks(core: NodeCore) -> int:
    """How long a wanting holder's notice lives without a newer tick (it re-stamps every keep-alive)."""
    return 6 * Pacing(core.params.residual_period_ticks).keepalive * core.params.residual_period_ticks


MAX_PATH_PER_HOP = 3  # a way's path: at most two vertices per hop, and the re-routes it displaces
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


Labels = dict[str, int]


Path = tuple[str, ...]  # the split vertices a label's way visits: IN + id (a unit arriving), OUT + id (leaving)
Routes = dict[str, dict[str, tuple[int, Path]]]  # sink -> the neighbour a way comes through -> (hops, path)
END = ""  # the "neighbour" of a way that enters its holder as the sink (a path's end, never a way back)
IN, OUT = "<", ">"
KINDS = ("in", "out", "xin", "xout")  # the label kinds a ``Residual`` carries paths for


def _route(routes: Routes, sink: str, via: str, hops: int, path: Path, limit: int) -> None:
    ways = routes.setdefault(sink, {})
    if hops <= limit and len(path) <= max_path(limit) and hops < ways.get(via, (limit + 1,))[0]:
        ways[via] = (hops, path)


def _extend(into: Routes, ways: Routes, vertex: str, extra: int, limit: int, free: bool) -> None:
    """Ways of ``ways`` entered from ``vertex`` (at ``extra`` hops more); ``free`` (loop-free labels): with
    their paths, those that do not visit it again."""
    for sink, by_via in ways.items():
        for via, (hops, path) in by_via.items():
            if not free:
                _route(into, sink, via, hops + extra, (), limit)
            elif not visits(path, sink, vertex):
                _route(into, sink, via, hops + extra, (vertex, *path), limit)


def visits(path: Path, sink: str, vertex: str) -> bool:
    """Whether a way of ``sink`` visits ``vertex`` of ``sink``'s residual graph: on its own part, or on the
    part of a chained displacement that comes back to ``sink`` (re-routes of other holders are listed with
    their holder, ``g|<X``; see ``_displacing``)."""
    return vertex in path or f"{sink}|{vertex}" in path


def best(routes: Routes, avoid: str | None = None) -> dict[str, tuple[int, Path]]:
    """Per sink the shortest way that does not visit the vertex ``avoid``: a neighbour is offered no way that
    leads back through itself (path vector), so labels on the residual graph's cycles do not count up one
    round trip at a time to the hop limit when the way they stood for is gone."""
    found: dict[str, tuple[int, Path]] = {}
    for sink, ways in routes.items():
        for hops, path in ways.values():
            if (avoid is None or not visits(path, sink, avoid)) and hops < found.get(sink, (math.inf,))[0]:
                found[sink] = (hops, path)
    return found


def labels_of(routes: Routes) -> Labels:
    return {sink: hops for sink, (hops, _) in best(routes).items()}


def distances(core: NodeCore, cross: bool = False) -> tuple[Labels, Labels]:
    """This node's (ins, outs) labels from its units and its neighbours' last labels (pure); see
    ``routes``."""
    ins, outs = routes(core, cross)
    return labels_of(ins), labels_of(outs)


def _neighbour_ways(core: NodeCore, neighbour: Neighbour, kind: str, via: str) -> Routes:
    labels = {"in": neighbour.res_in, "out": neighbour.res_out, "xin": neighbour.res_xin,
              "xout": neighbour.res_xout}[kind]
    return {sink: {via: (hops, neighbour.res_paths.get((kind, sink), ()))} for sink, hops in labels.items()}


def routes(core: NodeCore, cross: bool = False) -> tuple[Routes, Routes]:
    """This node's (ins, outs) ways per sink, each by the neighbour it comes through, with its path.

    ``cross``: the labels a walk follows, which also let a newcomer into a full relay X by displacing
    another holder g's unit from P, when g could re-route it (P's pure label for g is finite; with
    ``deep_cross`` its walk label, so g's re-route may displace a third holder's unit in turn): that costs
    1 + P's label for g, and the newcomer goes on from X by X's own ``outs``.
    """
    limit, free = hop_limit(core.n_stages), core.params.loop_free_labels
    me_in, me_out = IN + core.node_id, OUT + core.node_id
    kind_in, kind_out = ("xin", "xout") if cross else ("in", "out")
    outs: Routes = {}
    for neighbour in core.next_neighbours():
        via = END if neighbour.stage == 0 else neighbour.node_id  # a holder entered forward is a path's end
        _extend(outs, _neighbour_ways(core, neighbour, kind_in, via), me_out, 1, limit, free)
    if core.is_data_holder:
        own = {core.node_id: {core.node_id: (0, (me_in,) if free else ())}}
        return own, {s: w for s, w in outs.items() if s == core.node_id}
    back: Routes = {}
    for unit in core.ins.values():
        prev = core.neighbours.get(unit.prev)
        if prev is not None:
            ways = _neighbour_ways(core, prev, kind_out, prev.node_id)
            _extend(back, {unit.sink: ways[unit.sink]} if unit.sink in ways else {}, me_in, 1, limit, free)
    _extend(outs, back, me_out, 0, limit, free)  # X_out -> X_in (0 hops) -> the unit's sender
    ins: Routes = {}
    if core.spare() > 0:
        _extend(ins, outs, me_in, 0, limit, free)
    for sink, by_via in back.items():
        for via, (hops, path) in by_via.items():
            _route(ins, sink, via, hops, path, limit)
    if cross and core.spare() <= 0:
        _displacing(core, ins, outs, limit, free)
    return ins, outs


def _displacing(core: NodeCore, ins: Routes, outs: Routes, limit: int, free: bool) -> None:
    """A full relay's walk labels: a newcomer takes the slot of another holder g's unit (g re-routes it,
    or a same-stage peer takes it over) and goes on by our ``outs``. The way's path holds g's re-route
    too, so that a chain of displacements that comes back here is not taken (it would count up)."""
    me_in = IN + core.node_id
    displace = displacements(core)
    taken = core.params.takeover_steps and takeover_offer(core) is not None
    for sink in list(outs):
        others = [(hops, tuple(v if "|" in v else f"{g}|{v}" for v in path)) for g, (hops, path) in displace.items()
                  if g != sink and not visits(path, g, me_in) and not visits(path, sink, me_in)]
        if taken:
            others.append((1, ()))
        if not others:
            continue
        cost, g_path = min(others)
        for via, (hops, path) in outs[sink].items():
            if not free:
                _route(ins, sink, via, hops + cost, (), limit)
            elif not visits(path, sink, me_in):
                _route(ins, sink, via, hops + cost, (me_in, *path, *g_path), limit)


def reroute_hops(core: NodeCore, unit: InUnit) -> int | None:
    """Hops for holder g to re-route ``unit`` (one of g's, arriving here) away from this node: its sender's
    label for g, the pure one, or with ``deep_cross`` the walk one (g's re-route may then displace a third
    holder's unit in turn); None when the sender is unknown or sees no way."""
    prev = core.neighbours.get(unit.prev)
    if prev is None:
        return None
    return (prev.res_xout if core.params.deep_cross else prev.res_out).get(unit.sink)


def takeover_offer(core: NodeCore) -> tuple[InUnit, Neighbour] | None:
    """One of this node's units that a same-stage peer could take over (its last flow table shows spare
    capacity and links to the unit's previous and next hop), and that peer: the slot a newcomer gets
    when the peer takes the unit over, the unit keeping its path on both sides. Of several, the one
    that adds the least to the unit's path cost."""
    horizon = TABLE_HORIZON_PERIODS * core.params.table_period_ticks
    peers = [(peer, dict(peer.table.costs)) for peer in core.peers()
             if peer.table is not None and core.now - peer.table_tick <= horizon and peer.table.spare > 0]
    best: tuple[float, str, str, InUnit, Neighbour] | None = None
    for unit in core.ins.values():
        out = core.outs.get(unit.out_id) if unit.out_id else None
        mine = (core.cost_to(unit.prev), core.cost_to(out.next)) if out is not None else (None, None)
        if out is None or not (out.confirmed and out.complete) or None in mine:
            continue
        for peer, costs in peers:
            if unit.prev in costs and out.next in costs:
                added = costs[unit.prev] + costs[out.next] - mine[0] - mine[1]  # the path's cost grows by this
                key = (added, unit.edge_id, peer.node_id)
                if best is None or key < best[:3]:
                    best = (*key, unit, peer)
    return None if best is None else (best[3], best[4])


def displacements(core: NodeCore) -> dict[str, tuple[int, Path]]:
    """Per holder g: the fewest hops for one of g's units here to leave by g's re-route (1 +
    ``reroute_hops``), with the way g's re-route takes; only units that go on from here count."""
    limit = hop_limit(core.n_stages)
    found: dict[str, tuple[int, Path]] = {}
    kind = "xout" if core.params.deep_cross else "out"
    for unit in core.ins.values():
        hops = reroute_hops(core, unit) if unit.out_id is not None else None
        if hops is not None and hops + 1 <= limit and hops + 1 < found.get(unit.sink, (math.inf,))[0]:
            found[unit.sink] = (hops + 1, core.neighbours[unit.prev].res_paths.get((kind, unit.sink), ()))
    return found


class ResidualDistances:
    """Recomputes this node's labels and sends them to both neighbour stages when they change
    (at most once per residual period, and again every four periods).

    With them goes ``blocked``: the holders that could gain a unit only by an augmenting step, with
    the holder's tick when it last said so and the hops to it. A node that knows one puts flow first
    (``NodeCore.flow_first``): it starts no cost-driven move (re-route or annealing), which could take
    back the capacity a step freed before the holder uses it. A flag whose holder's tick stops
    advancing ends within a few periods."""

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
        self.last_sent: tuple | None = None
        self.pacing = Pacing(core.params.residual_period_ticks)

    def tick(self) -> None:
        c = self.core
        if not self.pacing.due(c.now):
            return
        ways = dict(zip(KINDS, (*routes(c), *routes(c, cross=True)), strict=True))
        bests = {kind: best(ways[kind]) for kind in KINDS}
        self.ins, self.outs, self.xins, self.xouts = ({sink: h for sink, (h, _) in bests[kind].items()}
                                                      for kind in KINDS)
        self.blocked = self._blocked()
        c.flow_first = bool(self.blocked)
        self.wants = self._wants()
        labels = (ways if c.params.loop_free_labels else (self.ins, self.outs, self.xins, self.xouts),
                  self.blocked, self.wants)
        if labels == self.last_sent and not self.pacing.stale(c.now):
            return
        common = self._message(bests)
        for neighbour in (*c.prev_neighbours(), *c.next_neighbours()):
            offered = self._offered(ways, bests, neighbour.node_id)
            c.send(neighbour.node_id, common if offered is bests else self._message(offered))
        self.last_sent, self.pacing.last_tick = labels, c.now

    @staticmethod
    def _offered(ways: dict[str, Routes], bests: dict[str, dict[str, tuple[int, Path]]],
                 neighbour: str) -> dict[str, dict[str, tuple[int, Path]]]:
        """Our labels as offered to ``neighbour``: the ways that do not come back through the vertex it would
        reach us from (its unit leaving it, for ``ins``; arriving at it, for ``outs``); ``bests`` itself
        when none of our shortest ways does."""
        avoid = {kind: (OUT if kind.endswith("in") else IN) + neighbour for kind in KINDS}
        if not any(avoid[kind] in path for kind in KINDS for _, path in bests[kind].values()):
            return bests
        return {kind: best(ways[kind], avoid[kind]) for kind in KINDS}

    def _message(self, offered: dict[str, dict[str, tuple[int, Path]]]) -> Residual:
        hops = {kind: tuple(sorted((sink, h) for sink, (h, _) in offered[kind].items())) for kind in KINDS}
        paths = tuple(sorted((kind, sink, path) for kind in KINDS for sink, (_, path) in offered[kind].items() if path))
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
        if (c.is_data_holder and c.params.augment and c.demand() > 0 and c.node_id in self.xouts
                and not c.has_spare_path()):
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

    def augmentable(self, cross: bool = True) -> bool:
        """A data holder with demand that could route one unit more by moving its own units (``cross``:
        or by having another holder re-route one of its units)."""
        c = self.core
        return c.is_data_holder and c.demand() > 0 and c.node_id in (self.xouts if cross else self.outs)

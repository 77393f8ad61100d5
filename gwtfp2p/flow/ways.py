"""Residual ways: a node's labels per sink over each holder's residual graph, from its units and its
neighbours' last labels (pure functions of the node's state; residual.py sends and keeps them).

A node X holds two labels per sink h:

* ``outs[h]``, from a unit leaving X: ``1 + ins[h]`` of a next-stage neighbour (forward), or, when X
  carries a unit of h from P, ``1 + outs[h]`` of P (that unit's segment through X is taken out, and
  P re-routes it);
* ``ins[h]``, from a unit arriving at X: ``outs[h]`` when X has spare capacity, or ``1 + outs[h]`` of
  a P that sends X a unit of h (the newcomer takes that unit's slot and its tail; P re-routes it).

The holder h is the end (``ins[h] = 0``); its ``outs[h]`` is the length of its shortest augmenting
path. The walk labels (``cross``) may also displace another holder's unit at a full relay. Each way is kept
by the neighbour it comes through; with ``FlowParams.loop_free_labels`` also with its path, the split
vertices it visits, and no way through the node itself is taken (a path vector).
"""

from __future__ import annotations

import math

from gwtfp2p.flow.core import InUnit, Neighbour, NodeCore

HOP_LIMIT_PER_STAGE = 4  # hop limit = this × (stages + 1): a path may visit each stage a few times
MAX_PATH_PER_HOP = 3  # a way's path: at most two vertices per hop, and the re-routes it displaces


def hop_limit(n_stages: int) -> int:
    return HOP_LIMIT_PER_STAGE * (n_stages + 1)


def max_path(limit: int) -> int:
    return MAX_PATH_PER_HOP * limit + 2


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


def _extend(into: Routes, ways: Routes, vertex: str, extra: int, limit: int) -> None:
    """Ways of ``ways`` entered from ``vertex`` (at ``extra`` hops more), those that do not visit it again."""
    for sink, by_via in ways.items():
        for via, (hops, path) in by_via.items():
            if not visits(path, sink, vertex):
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


def _better(labels: Labels, sink: str, hops: int, limit: int) -> None:
    if hops <= limit and hops < labels.get(sink, limit + 1):
        labels[sink] = hops


def distances(core: NodeCore, cross: bool = False) -> tuple[Labels, Labels]:
    """This node's (ins, outs) labels by the default rule: hop counts only, no paths (they may count up
    along the residual graph's cycles until the hop limit; ``routes`` does not)."""
    limit = hop_limit(core.n_stages)
    outs: Labels = {}
    for neighbour in core.next_neighbours():
        for sink, hops in (neighbour.res_xin if cross else neighbour.res_in).items():
            _better(outs, sink, hops + 1, limit)
    if core.is_data_holder:
        return {core.node_id: 0}, {s: h for s, h in outs.items() if s == core.node_id}
    back: Labels = {}
    for unit in core.ins.values():
        prev = core.neighbours.get(unit.prev)
        labels = None if prev is None else prev.res_xout if cross else prev.res_out
        if labels is not None and unit.sink in labels:
            _better(back, unit.sink, labels[unit.sink] + 1, limit)
    for sink, hops in back.items():
        _better(outs, sink, hops, limit)
    ins: Labels = dict(outs) if core.spare() > 0 else {}
    for sink, hops in back.items():
        _better(ins, sink, hops, limit)
    if cross and core.spare() <= 0:
        displace = [(g, hops) for g, (hops, _) in displacements(core).items()]
        taken = core.params.takeover_steps and takeover_offer(core) is not None
        for sink, hops in outs.items():
            others = [cost for g, cost in displace if g != sink] + ([1] if taken else [])
            if others:
                _better(ins, sink, hops + min(others), limit)
    return ins, outs


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
    limit = hop_limit(core.n_stages)
    me_in, me_out = IN + core.node_id, OUT + core.node_id
    kind_in, kind_out = ("xin", "xout") if cross else ("in", "out")
    outs: Routes = {}
    for neighbour in core.next_neighbours():
        via = END if neighbour.stage == 0 else neighbour.node_id  # a holder entered forward is a path's end
        _extend(outs, _neighbour_ways(core, neighbour, kind_in, via), me_out, 1, limit)
    if core.is_data_holder:
        own = {core.node_id: {core.node_id: (0, (me_in,))}}
        return own, {s: w for s, w in outs.items() if s == core.node_id}
    back: Routes = {}
    for unit in core.ins.values():
        prev = core.neighbours.get(unit.prev)
        if prev is not None:
            ways = _neighbour_ways(core, prev, kind_out, prev.node_id)
            _extend(back, {unit.sink: ways[unit.sink]} if unit.sink in ways else {}, me_in, 1, limit)
    _extend(outs, back, me_out, 0, limit)  # X_out -> X_in (0 hops) -> the unit's sender
    ins: Routes = {}
    if core.spare() > 0:
        _extend(ins, outs, me_in, 0, limit)
    for sink, by_via in back.items():
        for via, (hops, path) in by_via.items():
            _route(ins, sink, via, hops, path, limit)
    if cross and core.spare() <= 0:
        _displacing(core, ins, outs, limit)
    return ins, outs


def _displacing(core: NodeCore, ins: Routes, outs: Routes, limit: int) -> None:
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
            if not visits(path, sink, me_in):
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
    peers = [(peer, dict(table.costs)) for peer, table in core.fresh_tables() if table.spare > 0]
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
